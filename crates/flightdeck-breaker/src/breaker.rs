//! The shared state machine behind every clone of a breaker.
//!
//! One file of ~800 lines on purpose: the handle ([`Breaker`]), the state
//! under its lock (`Inner`) and every transition (`Core`) share private
//! fields. Split across files, those fields would have to be visible to the
//! whole crate, and the transitions would be read apart from the state and
//! the invariants they keep (one word mirrors the state for the lock-free
//! fast path; every transition goes through `set_state`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use flightdeck_core::error::CircuitOpen;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::classify::Outcome;
use crate::config::{BreakerConfig, BreakerConfigError};
use crate::layer::CircuitBreakerLayer;
use crate::metric;
use crate::state::{CircuitState, Transition, TransitionReason};
use crate::window::{Window, WindowStats};
use flightdeck_core::metric::Handles;
use flightdeck_core::time::{jittered, Backoff, FAR_FUTURE};

// Internal states, packed with the epoch into one atomic word so the closed
// fast path is a single load.
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const RAMPING: u64 = 3;
const FORCED_OPEN: u64 = 4;
const FORCED_CLOSED: u64 = 5;
/// The low byte of the state word: the state.
const TAG: u64 = 0xff;

const fn public(tag: u64) -> CircuitState {
    match tag {
        OPEN => CircuitState::Open,
        HALF_OPEN => CircuitState::HalfOpen,
        FORCED_OPEN => CircuitState::ForcedOpen,
        FORCED_CLOSED => CircuitState::ForcedClosed,
        _ => CircuitState::Closed,
    }
}

/// A circuit breaker: the state machine, shared by every clone, every layer
/// built from it and every service those layers produce. It is also the
/// handle to read, force, reset and watch the state.
///
/// Use it through [`CircuitBreakerLayer`], or directly with
/// [`try_acquire`](Self::try_acquire) and [`Permit::record`] to guard code
/// that is not a tower service.
///
/// ```
/// use flightdeck_breaker::{Breaker, BreakerConfig, CircuitState, Outcome};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("redis", BreakerConfig::default().consecutive_failures(2)).unwrap();
/// for _ in 0..2 {
///     breaker.try_acquire().unwrap().record(Outcome::Failure);
/// }
/// assert_eq!(breaker.state(), CircuitState::Open);
/// assert!(breaker.try_acquire().is_err());
/// breaker.reset();
/// assert_eq!(breaker.state(), CircuitState::Closed);
/// # }
/// ```
#[derive(Clone)]
pub struct Breaker {
    core: Arc<Core>,
}

struct Core {
    // Handed to the timer that ends the open wait (which must not keep the
    // breaker alive).
    me: Weak<Core>,
    name: Arc<str>,
    cfg: BreakerConfig,
    clock_on_admit: bool,
    word: AtomicU64,
    inner: Mutex<Inner>,
    events: broadcast::Sender<Transition>,
    // Called on every transition, under the lock (see `on_transition`).
    hooks: Mutex<Vec<Hook>>,
    // Built once: a rejected call (the hot path while open) must not
    // allocate a metric key; the counter handle is registered once per
    // recorder (so a recorder installed after the breaker is built is used).
    rejected: metrics::Key,
    rejected_counter: Handles<metrics::Counter>,
    // `Inner::open_until` as nanoseconds since `base`, published before the
    // state word: an open breaker rejects without taking the lock.
    base: Instant,
    open_until: AtomicU64,
    // The runtime whose task times the open wait (its id, see
    // `flightdeck_core::rt::runtime_id`; 0: none), published before the state word. On that
    // runtime the task is driven, so an open breaker rejects without
    // reading the clock.
    timed_on: AtomicU64,
}

/// Told every transition as it happens (see [`Breaker::on_transition`]).
pub(crate) type Hook = Box<dyn Fn(&Transition) + Send + Sync>;

static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

#[derive(Clone, Copy)]
struct Probe {
    seq: u64,
    started: Instant,
}

struct Inner {
    tag: u64,
    epoch: u64,
    window: Window,
    consecutive: u32,
    open_until: Instant,
    opens_in_row: u32,
    probes: Vec<Option<Probe>>,
    next_seq: u64,
    successes: u32,
    ramp_started: Instant,
    ramp_step: usize,
    ramp_count: u64,
}

/// Computes `Instant::now()` at most once, and only when needed.
struct LazyNow(Option<Instant>);

impl LazyNow {
    fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

impl Breaker {
    /// Creates a breaker after validating its settings.
    pub fn new(name: impl Into<Arc<str>>, cfg: BreakerConfig) -> Result<Self, BreakerConfigError> {
        cfg.validate()?;
        let now = Instant::now();
        let name = name.into();
        let (events, _) = broadcast::channel(64);
        let inner = Inner {
            tag: CLOSED,
            epoch: 0,
            window: Window::new(cfg.window, now),
            consecutive: 0,
            open_until: now,
            opens_in_row: 0,
            probes: vec![None; cfg.half_open_probes as usize],
            next_seq: 0,
            successes: 0,
            ramp_started: now,
            ramp_step: 0,
            ramp_count: 0,
        };
        metrics::gauge!(metric::CIRCUIT_STATE, metric::LABEL_BREAKER => name.to_string())
            .set(CircuitState::Closed.gauge_value());
        let rejected = metrics::Key::from_parts(
            metric::CIRCUIT_REJECTED_TOTAL,
            vec![metrics::Label::new(
                metric::LABEL_BREAKER,
                metrics::SharedString::from(Arc::clone(&name)),
            )],
        );
        Ok(Self {
            core: Arc::new_cyclic(|me| Core {
                me: me.clone(),
                clock_on_admit: cfg.slow_call.is_some(),
                name,
                cfg,
                word: AtomicU64::new(CLOSED),
                inner: Mutex::new(inner),
                events,
                hooks: Mutex::new(Vec::new()),
                rejected,
                rejected_counter: Handles::new(),
                base: now,
                open_until: AtomicU64::new(0),
                timed_on: AtomicU64::new(0),
            }),
        })
    }

    /// A layer that guards services with this breaker, classifying
    /// results with [`ErrIsFailure`](crate::ErrIsFailure).
    pub fn layer(&self) -> CircuitBreakerLayer {
        CircuitBreakerLayer::new(self.clone())
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The error a call this breaker refuses answers (it names the
    /// breaker; building it counts nothing).
    pub fn circuit_open(&self) -> CircuitOpen {
        CircuitOpen::new(Arc::clone(&self.core.name))
    }

    /// Makes sure the recorder in force exports this breaker: its state
    /// gauge at the current state, its counters at their values (zero
    /// before the first transition or rejection). Transitions and
    /// rejections register them anyway; this is for a scrape before the
    /// first one, under a recorder installed after the breaker was built.
    pub fn publish_metrics(&self) {
        let name = self.core.name.to_string();
        let gauge = metrics::gauge!(metric::CIRCUIT_STATE, metric::LABEL_BREAKER => name.clone());
        let mut state = self.state();
        gauge.set(state.gauge_value());
        // A transition between the read and the write wrote its own value
        // first: write the newest one again.
        while self.state() != state {
            state = self.state();
            gauge.set(state.gauge_value());
        }
        let _registered =
            metrics::counter!(metric::CIRCUIT_OPEN_TOTAL, metric::LABEL_BREAKER => name);
        self.core.rejected_counter.with(
            |r| r.register_counter(&self.core.rejected, &METADATA),
            |_| (),
        );
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.core.cfg
    }

    /// The current state. An open breaker whose wait has passed reports
    /// (and becomes) [`CircuitState::HalfOpen`].
    pub fn state(&self) -> CircuitState {
        let tag = self.core.word.load(Ordering::Acquire) & TAG;
        if tag != OPEN {
            return public(tag);
        }
        let mut inner = self.core.lock();
        self.core.advance_open(&mut inner, Instant::now());
        public(inner.tag)
    }

    /// While a ramp runs after closing: the share of calls let through now.
    pub fn ramp_share(&self) -> Option<f64> {
        let inner = self.core.lock();
        if inner.tag != RAMPING {
            return None;
        }
        let ramp = self.core.cfg.ramp.as_ref()?;
        let step = ramp_step_at(&inner, ramp.step, Instant::now());
        ramp.shares.get(step).copied()
    }

    /// When an open breaker starts probing (jitter included).
    pub fn open_until(&self) -> Option<Instant> {
        let inner = self.core.lock();
        (inner.tag == OPEN).then_some(inner.open_until)
    }

    /// Calls and failures in the window.
    pub fn stats(&self) -> WindowStats {
        let mut inner = self.core.lock();
        inner.window.stats(Instant::now)
    }

    /// Receives every transition from now on. A slow receiver loses the
    /// oldest events (it is told how many) rather than blocking the breaker.
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.core.events.subscribe()
    }

    /// Opens the circuit now, as a tripped window would: rejected calls
    /// for the open wait, then half-open probes decide. For a caller that
    /// knows the guarded dependency is down before any call failed (a
    /// backend with no connection at start). Does nothing unless the
    /// circuit is closed (or ramping).
    pub fn trip(&self) {
        let now = Instant::now();
        let mut inner = self.core.lock();
        if matches!(inner.tag, CLOSED | RAMPING) {
            self.core.open(&mut inner, now, TransitionReason::Manual);
        }
    }

    /// The guarded dependency is known to be back (a backend that had no
    /// connection made one): an open or half-open circuit closes now, as
    /// if its probes had succeeded (through its ramp, if it has one).
    /// Forced or closed circuits are left alone. Returns whether it
    /// closed.
    pub fn recover(&self) -> bool {
        let now = Instant::now();
        let mut inner = self.core.lock();
        if !matches!(inner.tag, OPEN | HALF_OPEN) {
            return false;
        }
        let from = public(inner.tag);
        self.core
            .close(&mut inner, now, from, TransitionReason::Recovered);
        true
    }

    /// Rejects every call until [`reset`](Self::reset).
    pub fn force_open(&self) {
        self.core.manual(FORCED_OPEN);
    }

    /// Lets every call through, recording nothing, until
    /// [`reset`](Self::reset).
    pub fn force_closed(&self) {
        self.core.manual(FORCED_CLOSED);
    }

    /// Back to closed with an empty window (no ramp), forgetting past
    /// openings.
    pub fn reset(&self) {
        self.core.manual(CLOSED);
    }

    /// Asks to run one call. `Err` means the circuit rejects it; `Ok` gives a
    /// permit to [`record`](Permit::record) the outcome with. Dropping the
    /// permit without recording (the call was cancelled) records nothing and
    /// frees a half-open probe slot.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit, CircuitOpen> {
        self.acquire(Ramped::Held)
    }

    /// Like [`try_acquire`](Self::try_acquire), but a ramp after closing
    /// holds nothing back: for callers that apply the ramp themselves (see
    /// [`ramp_holds_back`](Self::ramp_holds_back)) or have nowhere else to
    /// go while it runs.
    #[inline]
    pub fn try_acquire_past_ramp(&self) -> Result<Permit, CircuitOpen> {
        self.acquire(Ramped::Admitted)
    }

    /// While a ramp runs after closing: whether the ramp holds this call
    /// back (it admits exactly its share of the calls, spread evenly;
    /// counted like a rejection). `false` outside a ramp. The caller then
    /// asks [`try_acquire_past_ramp`](Self::try_acquire_past_ramp) for the
    /// calls it lets through.
    #[inline]
    pub fn ramp_holds_back(&self) -> bool {
        let word = self.core.word.load(Ordering::Acquire);
        word & TAG == RAMPING && Core::ramp_holds_back(&self.core)
    }

    #[inline]
    fn acquire(&self, ramped: Ramped) -> Result<Permit, CircuitOpen> {
        let word = self.core.word.load(Ordering::Acquire);
        match word & TAG {
            CLOSED => Ok(Permit {
                core: self.core.clone(),
                epoch: word >> 8,
                start: self.core.clock_on_admit.then(Instant::now),
                probe: None,
                counted: true,
            }),
            FORCED_CLOSED => Ok(Permit {
                core: self.core.clone(),
                epoch: word >> 8,
                start: None,
                probe: None,
                counted: false,
            }),
            FORCED_OPEN => Err(self.core.reject()),
            OPEN if self.core.still_open(Instant::now()) => Err(self.core.reject()),
            _ => Core::acquire_slow(&self.core, ramped),
        }
    }

    /// Rejects a call if that is all there is to tell: the breaker is
    /// forced open, or open and its wait not over (one atomic load, and a
    /// clock read unless the caller is on the runtime whose task ends the
    /// wait: no lock, no error built). Counted like a rejection by
    /// [`try_acquire`](Self::try_acquire).
    ///
    /// `false` says nothing about the call: ask `try_acquire`. This is the
    /// hot path of callers that have somewhere else to go while the breaker
    /// is open (the facade's HYBRID mode runs locally). The timer that
    /// ends the wait runs on the runtime where the breaker opened: a caller
    /// on that runtime trusts it (that runtime is being driven), a caller
    /// anywhere else reads the clock (that runtime may no longer be
    /// driven, and its timer would never fire).
    ///
    /// ```
    /// use flightdeck_breaker::{Breaker, BreakerConfig, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::new("redis", BreakerConfig::default().consecutive_failures(1)).unwrap();
    /// assert!(!breaker.try_reject());
    /// breaker.try_acquire().unwrap().record(Outcome::Failure);
    /// assert!(breaker.try_reject());
    /// let until = breaker.open_until().unwrap();
    /// tokio::time::sleep_until(until + std::time::Duration::from_millis(1)).await;
    /// assert!(!breaker.try_reject(), "the wait is over");
    /// assert!(breaker.try_acquire().unwrap().is_probe());
    /// # }
    /// ```
    #[inline]
    pub fn try_reject(&self) -> bool {
        let tag = self.core.word.load(Ordering::Acquire) & TAG;
        if tag == FORCED_OPEN
            || (tag == OPEN && (self.core.timed_here() || self.core.still_open(Instant::now())))
        {
            self.core.count_rejection();
            true
        } else {
            false
        }
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.core.name)
            .field(
                "state",
                &public(self.core.word.load(Ordering::Relaxed) & TAG),
            )
            .finish()
    }
}

fn ramp_step_at(inner: &Inner, step: Duration, now: Instant) -> usize {
    let elapsed = now.saturating_duration_since(inner.ramp_started);
    (elapsed.as_nanos() / step.as_nanos()).min(usize::MAX as u128) as usize
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a running ramp holds this call back (see
    /// [`Breaker::ramp_holds_back`]); a finished ramp ends here.
    #[inline(never)]
    fn ramp_holds_back(this: &Arc<Self>) -> bool {
        let now = Instant::now();
        let mut inner = this.lock();
        if inner.tag != RAMPING {
            return false;
        }
        let held = !Self::ramp_admits(this, &mut inner, now);
        drop(inner);
        if held {
            this.count_rejection();
        }
        held
    }

    /// Counts one call of the ramp's current step: whether it is admitted
    /// (the ramp ends, admitting everything, after its last step).
    fn ramp_admits(this: &Arc<Self>, inner: &mut Inner, now: Instant) -> bool {
        let ramp = this.cfg.ramp.as_ref().expect("ramping implies a ramp");
        let step = ramp_step_at(inner, ramp.step, now);
        match ramp.shares.get(step) {
            None => {
                inner.tag = CLOSED;
                this.store_word(inner);
                tracing::info!(breaker = %this.name, "ramp finished: all calls admitted");
                true
            }
            Some(&share) => {
                if step != inner.ramp_step {
                    inner.ramp_step = step;
                    inner.ramp_count = 0;
                }
                let n = inner.ramp_count as f64;
                inner.ramp_count += 1;
                // Admit exactly `share` of the calls of this step, spread
                // evenly, to within one call.
                ((n + 1.0) * share).floor() > (n * share).floor()
            }
        }
    }

    #[inline(never)]
    fn acquire_slow(this: &Arc<Self>, ramped: Ramped) -> Result<Permit, CircuitOpen> {
        let now = Instant::now();
        let mut inner = this.lock();
        this.advance_open(&mut inner, now);
        let admit = |probe: Option<(usize, u64)>, counted: bool, inner: &Inner| Permit {
            core: this.clone(),
            epoch: inner.epoch,
            start: (this.clock_on_admit || probe.is_some()).then_some(now),
            probe,
            counted,
        };
        let tag = inner.tag;
        match tag {
            CLOSED => return Ok(admit(None, true, &inner)),
            FORCED_CLOSED => return Ok(admit(None, false, &inner)),
            HALF_OPEN => {
                let timeout = this.cfg.probe_timeout;
                for slot in inner.probes.iter_mut() {
                    if slot.is_some_and(|p| now.saturating_duration_since(p.started) >= timeout) {
                        tracing::warn!(breaker = %this.name, "half-open probe did not finish in time; its slot is freed");
                        *slot = None;
                    }
                }
                if let Some(i) = inner.probes.iter().position(Option::is_none) {
                    let seq = inner.next_seq;
                    inner.next_seq += 1;
                    inner.probes[i] = Some(Probe { seq, started: now });
                    return Ok(admit(Some((i, seq)), true, &inner));
                }
            }
            RAMPING if ramped == Ramped::Admitted || Self::ramp_admits(this, &mut inner, now) => {
                return Ok(admit(None, true, &inner));
            }
            _ => {}
        }
        drop(inner);
        Err(this.reject())
    }

    /// Counts and builds a rejection.
    fn reject(&self) -> CircuitOpen {
        self.count_rejection();
        CircuitOpen::new(self.name.clone())
    }

    #[inline]
    fn count_rejection(&self) {
        self.rejected_counter.with(
            |r| r.register_counter(&self.rejected, &METADATA),
            |c| c.increment(1),
        );
    }

    /// Whether the caller runs on the runtime whose task ends the open
    /// wait: that runtime is being driven, so its task ends the wait on
    /// time (within the timer wheel's 1 ms), and until then "open" is true
    /// without a clock read. Anywhere else the clock decides.
    fn timed_here(&self) -> bool {
        let on = self.timed_on.load(Ordering::Relaxed);
        on != 0
            && tokio::runtime::Handle::try_current()
                .is_ok_and(|rt| flightdeck_core::rt::runtime_id(&rt) == on)
    }

    /// Whether an open breaker's wait is still running at `now` (read
    /// without the lock; the slow path decides the transition).
    fn still_open(&self, now: Instant) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        now.saturating_duration_since(self.base).as_nanos() < u128::from(until)
    }

    fn record(&self, permit: &Permit, outcome: Outcome) {
        if !permit.counted || (outcome == Outcome::Ignore && permit.probe.is_none()) {
            return;
        }
        let mut now = LazyNow(None);
        let slow = match (self.cfg.slow_call, permit.start) {
            (Some(threshold), Some(start)) => {
                now.get().saturating_duration_since(start) >= threshold
            }
            _ => false,
        };
        let failure = outcome == Outcome::Failure || (outcome == Outcome::Success && slow);
        let mut inner = self.lock();
        if inner.epoch != permit.epoch {
            // Admitted before the last transition: not about the present state.
            return;
        }
        if let Some((slot, seq)) = permit.probe {
            if inner.tag != HALF_OPEN || inner.probes[slot].map(|p| p.seq) != Some(seq) {
                return;
            }
            inner.probes[slot] = None;
            match outcome {
                Outcome::Ignore => {}
                _ if failure => self.open(&mut inner, now.get(), TransitionReason::ProbeFailed),
                _ => {
                    inner.successes += 1;
                    if inner.successes >= self.cfg.successes_needed() {
                        let reason = TransitionReason::ProbesSucceeded;
                        self.close(&mut inner, now.get(), CircuitState::HalfOpen, reason);
                    }
                }
            }
            return;
        }
        if inner.tag != CLOSED && inner.tag != RAMPING {
            return;
        }
        let needs_clock = inner.window.needs_clock();
        let at = if needs_clock { Some(now.get()) } else { None };
        inner.window.record(failure, || at.expect("clock read"));
        if !failure {
            inner.consecutive = 0;
            return;
        }
        inner.consecutive += 1;
        if let Some(k) = self.cfg.consecutive_failures {
            if inner.consecutive >= k {
                let n = inner.consecutive;
                self.open(
                    &mut inner,
                    now.get(),
                    TransitionReason::ConsecutiveFailures(n),
                );
                return;
            }
        }
        let stats = inner.window.stats(|| at.expect("clock read"));
        if stats.calls >= self.cfg.min_calls && stats.failure_rate() >= self.cfg.failure_rate {
            let reason = TransitionReason::FailureRate {
                rate: stats.failure_rate(),
                calls: stats.calls,
            };
            self.open(&mut inner, now.get(), reason);
        }
    }

    fn release_probe(&self, epoch: u64, slot: usize, seq: u64) {
        let mut inner = self.lock();
        if inner.epoch == epoch
            && inner.tag == HALF_OPEN
            && inner.probes[slot].map(|p| p.seq) == Some(seq)
        {
            inner.probes[slot] = None;
        }
    }

    fn advance_open(&self, inner: &mut Inner, now: Instant) {
        if inner.tag == OPEN && now >= inner.open_until {
            self.set_state(inner, HALF_OPEN, now);
            self.emit(
                CircuitState::Open,
                CircuitState::HalfOpen,
                TransitionReason::WaitElapsed,
                now,
                None,
            );
        }
    }

    fn open_wait(&self, opens_in_row: u32) -> Duration {
        let cfg = &self.cfg;
        let grown = Backoff::growing(cfg.wait_growth, cfg.wait_in_open, cfg.max_wait)
            .nth(cfg.wait_in_open, opens_in_row.saturating_sub(1));
        let (lo, hi) = cfg.jitter;
        jittered(grown, 1.0 + lo, 1.0 + hi)
    }

    fn open(&self, inner: &mut Inner, now: Instant, reason: TransitionReason) {
        let from = public(inner.tag);
        inner.opens_in_row = inner.opens_in_row.saturating_add(1);
        let wait = self.open_wait(inner.opens_in_row).min(FAR_FUTURE);
        inner.open_until = now + wait;
        let until = inner
            .open_until
            .saturating_duration_since(self.base)
            .as_nanos();
        self.open_until
            .store(u64::try_from(until).unwrap_or(u64::MAX), Ordering::Release);
        let timer = tokio::runtime::Handle::try_current().ok();
        let on = timer.as_ref().map_or(0, flightdeck_core::rt::runtime_id);
        self.timed_on.store(on, Ordering::Relaxed);
        self.set_state(inner, OPEN, now);
        if let Some(rt) = timer {
            self.time_open_wait(inner, &rt);
        }
        self.emit(from, CircuitState::Open, reason, now, Some(wait));
    }

    /// Inside a tokio runtime, a task ends the open wait at its deadline,
    /// so that the transition (and its event) comes on time even when no
    /// call asks, and callers on that runtime need not read the clock
    /// (see `timed_here`). Callers elsewhere read it: if this runtime is
    /// no longer driven, the wait still ends for them.
    fn time_open_wait(&self, inner: &Inner, rt: &tokio::runtime::Handle) {
        let core = self.me.clone();
        let (epoch, until) = (inner.epoch, inner.open_until);
        drop(rt.spawn(async move {
            tokio::time::sleep_until(until).await;
            if let Some(core) = core.upgrade() {
                let mut inner = core.lock();
                if inner.epoch == epoch {
                    core.advance_open(&mut inner, Instant::now());
                }
            }
        }));
    }

    fn close(&self, inner: &mut Inner, now: Instant, from: CircuitState, reason: TransitionReason) {
        inner.opens_in_row = 0;
        let tag = if self.cfg.ramp.is_some() {
            inner.ramp_started = now;
            inner.ramp_step = 0;
            inner.ramp_count = 0;
            RAMPING
        } else {
            CLOSED
        };
        self.set_state(inner, tag, now);
        self.emit(from, CircuitState::Closed, reason, now, None);
    }

    fn manual(&self, tag: u64) {
        let now = Instant::now();
        let mut inner = self.lock();
        let from = public(inner.tag);
        inner.opens_in_row = 0;
        self.set_state(&mut inner, tag, now);
        self.emit(from, public(tag), TransitionReason::Manual, now, None);
    }

    fn set_state(&self, inner: &mut Inner, tag: u64, now: Instant) {
        inner.tag = tag;
        inner.epoch += 1;
        inner.window.clear(now);
        inner.consecutive = 0;
        inner.probes.fill(None);
        inner.successes = 0;
        self.store_word(inner);
    }

    fn store_word(&self, inner: &Inner) {
        self.word
            .store((inner.epoch << 8) | inner.tag, Ordering::Release);
    }

    fn emit(
        &self,
        from: CircuitState,
        to: CircuitState,
        reason: TransitionReason,
        at: Instant,
        open_for: Option<Duration>,
    ) {
        let name = self.name.to_string();
        if matches!(to, CircuitState::Open | CircuitState::ForcedOpen) {
            tracing::warn!(breaker = %name, %from, %to, ?reason, ?open_for, "circuit breaker opened");
            metrics::counter!(metric::CIRCUIT_OPEN_TOTAL, metric::LABEL_BREAKER => name.clone())
                .increment(1);
        } else {
            tracing::info!(breaker = %name, %from, %to, ?reason, "circuit breaker transition");
        }
        metrics::gauge!(metric::CIRCUIT_STATE, metric::LABEL_BREAKER => name).set(to.gauge_value());
        let transition = Transition {
            breaker: self.name.clone(),
            from,
            to,
            reason,
            at,
            open_for,
        };
        for hook in self
            .hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            hook(&transition);
        }
        let _no_subscriber_is_fine = self.events.send(transition);
    }
}

/// Whether an acquisition is subject to a running ramp.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ramped {
    /// The ramp may hold it back.
    Held,
    /// The ramp admits it (the caller applied the ramp itself).
    Admitted,
}

/// Permission to run one call, from [`Breaker::try_acquire`].
///
/// Record the outcome with [`record`](Self::record). Dropping it unrecorded
/// means the call was cancelled: nothing is recorded, and a half-open probe
/// slot is freed at once.
pub struct Permit {
    core: Arc<Core>,
    epoch: u64,
    start: Option<Instant>,
    probe: Option<(usize, u64)>,
    counted: bool,
}

impl Permit {
    /// Records the call's outcome.
    #[inline]
    pub fn record(mut self, outcome: Outcome) {
        self.core.record(&self, outcome);
        // Recorded: the drop below must not free the slot a second time.
        self.probe = None;
    }

    /// True when this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        if let Some((slot, seq)) = self.probe {
            self.core.release_probe(self.epoch, slot, seq);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("breaker", &self.core.name)
            .field("probe", &self.probe.is_some())
            .finish()
    }
}

impl Breaker {
    /// True when nothing but the caller's handle holds this breaker.
    pub(crate) fn is_unused(&self) -> bool {
        Arc::strong_count(&self.core) == 1
    }

    /// Whether the circuit holds calls back now: open, half-open or forced
    /// open. Read without the lock (an open circuit whose wait has passed
    /// is open here, half-open for [`state`](Self::state): the same
    /// answer), so a hook may ask it.
    pub(crate) fn is_open(&self) -> bool {
        matches!(
            self.core.word.load(Ordering::Acquire) & TAG,
            OPEN | HALF_OPEN | FORCED_OPEN
        )
    }

    /// Calls `hook` with every transition from now on, as it happens:
    /// under the breaker's lock, so it must be quick and must not call the
    /// breaker (a registry keeps its open set with it).
    pub(crate) fn on_transition(&self, hook: Hook) {
        self.core
            .hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hook);
    }
}
