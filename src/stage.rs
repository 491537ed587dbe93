//! One stage's state (built with the layer, shared by every service) and
//! its runtime handle: the mode (kill switch), the breaker, the bulkhead,
//! the degraded state, and the stage's metrics.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flightdeck_breaker::{Breaker, CircuitState};
use flightdeck_bulkhead::{BulkheadHandle, BulkheadLayer};
use flightdeck_core::metric::{self, records, Handles};
use flightdeck_core::{SharedForm, StageName};
use flightdeck_distributed::{Backend, DistributedFlights, FailureClass, GuardedBackend};
use flightdeck_local::LocalFlights;
use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use tokio::time::Instant;

use crate::config::StageConfig;
use crate::error::ModeError;
use crate::mode::Mode;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A stage's coordination: its backend (shared by the stages that name
/// it) behind the stage's breaker.
pub(crate) type Coordination<C> = DistributedFlights<GuardedBackend<Arc<dyn Backend>>, C>;

/// Everything one stage needs, built once with the layer.
pub(crate) struct Stage<Sh: SharedForm, C> {
    pub(crate) ctl: Arc<Control>,
    /// The layer's share adapter, with the stage's sharing settings.
    pub(crate) share: Sh,
    pub(crate) local: LocalFlights<Sh::Shared>,
    pub(crate) distributed: Option<Coordination<C>>,
    pub(crate) bulkhead: BulkheadLayer,
}

/// Where a real execution of the inner service ran (the `path` label of
/// `singleflight_execution_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// As the owner of a distributed flight.
    Owner,
    /// In this process only: LOCAL_ONLY, a stage without backend, or a
    /// caller whose request a shared result did not serve.
    Local,
    /// HYBRID's local fallback (coordination failed or the breaker is open).
    Fallback,
    /// BYPASS: no coalescing at all.
    Bypass,
}

impl Path {
    const ALL: [Path; 4] = [Path::Owner, Path::Local, Path::Fallback, Path::Bypass];

    const fn as_str(self) -> &'static str {
        match self {
            Path::Owner => "owner",
            Path::Local => "local",
            Path::Fallback => "fallback",
            Path::Bypass => "bypass",
        }
    }
}

/// Why a HYBRID leader ran locally (the `reason` label of
/// `singleflight_local_fallback_total`): a coordination failure before
/// acquire, or a follower's wait that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    Coordination(FailureClass),
    WaitFailure,
}

const CLASSES: [FailureClass; 4] = [
    FailureClass::CircuitOpen,
    FailureClass::Unavailable,
    FailureClass::OutcomeUnknown,
    FailureClass::Protocol,
];

fn class_index(class: FailureClass) -> usize {
    CLASSES.iter().position(|c| *c == class).unwrap_or(0)
}

/// What a follower's caller got when its wait failed (the `action` label
/// of `singleflight_wait_failure_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitAction {
    Wait,
    InProgress,
    Fail,
    Local,
}

impl WaitAction {
    const ALL: [WaitAction; 4] = [
        WaitAction::Wait,
        WaitAction::InProgress,
        WaitAction::Fail,
        WaitAction::Local,
    ];

    const fn as_str(self) -> &'static str {
        match self {
            WaitAction::Wait => "wait",
            WaitAction::InProgress => "in_progress",
            WaitAction::Fail => "fail",
            WaitAction::Local => "local",
        }
    }
}

/// The handles of one stage under one recorder.
pub(crate) struct Bundle {
    request: Counter,
    bypass: Counter,
    fallback_execution: Counter,
    fallback: [Counter; CLASSES.len() + 1],
    fail_fast: [Counter; CLASSES.len()],
    distributed_failure: [Counter; CLASSES.len()],
    wait_failure: [Counter; WaitAction::ALL.len()],
    execution: [Counter; Path::ALL.len()],
    execution_duration: Histogram,
    degraded: Gauge,
    degraded_duration: Histogram,
    mode: Gauge,
}

impl Bundle {
    /// Registers the stage's handles with `r`, and publishes the gauges'
    /// values the stage keeps (so a recorder installed after the layer was
    /// built sees them at once).
    fn register(r: &dyn Recorder, ctl: &Control) -> Self {
        let stage = Label::new(
            metric::LABEL_STAGE,
            metrics::SharedString::const_str(ctl.name.as_str()),
        );
        let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![stage.clone()];
            labels.extend(extra.map(|(k, v)| Label::new(k, v)));
            Key::from_parts(name, labels)
        };
        let counter = |name, extra| r.register_counter(&key(name, extra), &METADATA);
        let by_class = |name| CLASSES.map(|c| counter(name, Some(("reason", c.as_str()))));
        let b = Self {
            request: counter(metric::REQUEST_TOTAL, None),
            bypass: counter(metric::BYPASS_TOTAL, None),
            fallback_execution: counter(metric::FALLBACK_EXECUTION_TOTAL, None),
            fallback: {
                let [a, b, c, d] = by_class(metric::LOCAL_FALLBACK_TOTAL);
                [
                    a,
                    b,
                    c,
                    d,
                    counter(
                        metric::LOCAL_FALLBACK_TOTAL,
                        Some(("reason", "wait_failure")),
                    ),
                ]
            },
            fail_fast: by_class(metric::FAIL_FAST_TOTAL),
            distributed_failure: CLASSES.map(|c| {
                counter(
                    metric::DISTRIBUTED_FAILURE_TOTAL,
                    Some(("kind", c.as_str())),
                )
            }),
            wait_failure: WaitAction::ALL
                .map(|a| counter(metric::WAIT_FAILURE_TOTAL, Some(("action", a.as_str())))),
            execution: Path::ALL
                .map(|p| counter(metric::EXECUTION_TOTAL, Some(("path", p.as_str())))),
            execution_duration: r
                .register_histogram(&key(metric::EXECUTION_DURATION, None), &METADATA),
            degraded: r.register_gauge(&key(metric::DEGRADED, None), &METADATA),
            degraded_duration: r
                .register_histogram(&key(metric::DEGRADED_DURATION, None), &METADATA),
            mode: r.register_gauge(&key(metric::MODE, None), &METADATA),
        };
        b.mode.set(f64::from(ctl.mode().to_u8()));
        b.degraded.set(if ctl.degraded.load(Ordering::Acquire) {
            1.0
        } else {
            0.0
        });
        // The stage's other parts, under the same recorder.
        ctl.breaker.publish_metrics();
        ctl.bulkhead.publish_metrics();
        (ctl.peers)();
        b
    }
}

/// The runtime side of a stage, reachable through a [`StageHandle`].
pub(crate) struct Control {
    pub(crate) name: StageName,
    pub(crate) cfg: StageConfig,
    mode: AtomicU8,
    has_backend: bool,
    pub(crate) breaker: Breaker,
    bulkhead: BulkheadHandle,
    degraded: AtomicBool,
    degraded_since: Mutex<Option<Instant>>,
    metrics: Handles<Bundle>,
    /// Publishes the metrics of the stage's flights (L1, L2) under the
    /// recorder in force.
    peers: Peers,
}

/// Publishes the metrics of a stage's flights (see [`Control::new`]).
pub(crate) type Peers = Box<dyn Fn() + Send + Sync>;

/// How often a stage built before any recorder looks for one (see
/// [`Control::watch`]).
const RECORDER_POLL: Duration = Duration::from_secs(1);

impl Control {
    pub(crate) fn new(
        name: StageName,
        cfg: StageConfig,
        has_backend: bool,
        breaker: Breaker,
        bulkhead: BulkheadHandle,
        peers: Peers,
    ) -> Self {
        let ctl = Self {
            mode: AtomicU8::new(cfg.mode.to_u8()),
            name,
            cfg,
            has_backend,
            breaker,
            bulkhead,
            degraded: AtomicBool::new(false),
            degraded_since: Mutex::new(None),
            metrics: Handles::new(),
            peers,
        };
        // Registers the handles (publishing the gauges) under the recorder
        // in force now; another one installed later gets them at its first
        // use or within a second (see `watch`).
        ctl.publish();
        ctl
    }

    /// Runs `f` with the stage's handles under the recorder in force.
    #[inline]
    fn metrics<R>(&self, f: impl FnOnce(&Bundle) -> R) -> R {
        self.metrics.with(|r| Bundle::register(r, self), f)
    }

    /// Makes sure the recorder in force has the stage's metrics (and its
    /// breaker's, bulkhead's and flights'), with the gauges' current
    /// values. Returns whether that recorder records anything (false for
    /// the no-op recorder in force before one is installed).
    pub(crate) fn publish(&self) -> bool {
        self.metrics(|m| records(&m.degraded_duration))
    }

    /// Follows the breaker's transitions from a task (when built inside a
    /// tokio runtime), so that a transition nobody's request sees (forced
    /// by hand, or the open wait ending) still switches the bulkhead, the
    /// gauge and the logs at once. The task holds the stage weakly and ends
    /// with the breaker.
    ///
    /// Until a recorder is in force, the task also looks for one every
    /// [`RECORDER_POLL`] and publishes the stage's metrics under it: a
    /// recorder installed after the layer was built (the usual order when
    /// the exporter is set up with the routes) exports the stage's mode,
    /// degraded state and zeroed counters before the first request, not
    /// at its first event.
    pub(crate) fn watch(self: &Arc<Self>) {
        use tokio::sync::broadcast::error::RecvError;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut events = self.breaker.subscribe();
        let mut looking = !self.publish();
        let ctl = Arc::downgrade(self);
        drop(rt.spawn(async move {
            let mut poll = tokio::time::interval(RECORDER_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    event = events.recv() => match event {
                        Ok(_) | Err(RecvError::Lagged(_)) => match ctl.upgrade() {
                            Some(ctl) => ctl.sync_degraded(),
                            None => return,
                        },
                        Err(RecvError::Closed) => return,
                    },
                    _ = poll.tick(), if looking => match ctl.upgrade() {
                        Some(ctl) => looking = !ctl.publish(),
                        None => return,
                    },
                }
            }
        }));
    }

    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    /// Every request with a key for this stage, whatever its mode (the
    /// denominator of the merge ratio).
    #[inline]
    pub(crate) fn count_request(&self) {
        self.metrics(|m| m.request.increment(1));
    }

    /// A request of a BYPASS stage.
    #[inline]
    pub(crate) fn count_bypass(&self) {
        self.metrics(|m| m.bypass.increment(1));
    }

    /// A HYBRID leader runs locally.
    pub(crate) fn count_fallback(&self, why: Fallback) {
        let i = match why {
            Fallback::Coordination(class) => class_index(class),
            Fallback::WaitFailure => CLASSES.len(),
        };
        self.metrics(|m| m.fallback[i].increment(1));
    }

    /// A DISTRIBUTED_ONLY leader fails fast.
    pub(crate) fn count_fail_fast(&self, class: FailureClass) {
        self.metrics(|m| m.fail_fast[class_index(class)].increment(1));
    }

    /// A coordination failure before acquire (not a refusal of the
    /// breaker).
    pub(crate) fn count_distributed_failure(&self, class: FailureClass) {
        self.metrics(|m| m.distributed_failure[class_index(class)].increment(1));
    }

    pub(crate) fn count_wait_failure(&self, action: WaitAction) {
        let i = WaitAction::ALL
            .iter()
            .position(|a| *a == action)
            .unwrap_or(0);
        self.metrics(|m| m.wait_failure[i].increment(1));
    }

    /// A real execution of the inner service starts (admitted by the
    /// bulkhead).
    pub(crate) fn count_execution(&self, path: Path) {
        let i = Path::ALL.iter().position(|p| *p == path).unwrap_or(0);
        self.metrics(|m| {
            m.execution[i].increment(1);
            if path == Path::Fallback {
                m.fallback_execution.increment(1);
            }
        });
    }

    /// A real execution ended after `took`: one sample per execution.
    pub(crate) fn record_execution(&self, took: Duration) {
        self.metrics(|m| m.execution_duration.record(took.as_secs_f64()));
    }

    /// Follows the breaker, but only until the stage is known to be
    /// degraded (the per-call cost while degraded is one load).
    #[inline]
    pub(crate) fn enter_degraded(&self) {
        if !self.degraded.load(Ordering::Acquire) {
            self.sync_degraded();
        }
    }

    /// Follows the breaker: entering degraded mode (breaker open, probing or
    /// forced open) switches the bulkhead to its degraded limit, sets the
    /// gauge and logs a warning; leaving it undoes that and records how
    /// long it lasted.
    pub(crate) fn sync_degraded(&self) {
        let open = matches!(
            self.breaker.state(),
            CircuitState::Open | CircuitState::HalfOpen | CircuitState::ForcedOpen
        );
        if open == self.degraded.load(Ordering::Acquire) {
            return;
        }
        let mut since = self
            .degraded_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match (open, *since) {
            (true, None) => {
                *since = Some(Instant::now());
                self.degraded.store(true, Ordering::Release);
                self.bulkhead.set_degraded(true);
                self.metrics(|m| m.degraded.set(1.0));
                tracing::warn!(
                    stage = %self.name,
                    mode = %self.mode(),
                    bulkhead_limit = self.bulkhead.limit(),
                    "stage degraded: coordination breaker open; {}",
                    match self.mode() {
                        Mode::DistributedOnly => "failing fast",
                        _ => "coalescing in this process only",
                    }
                );
            }
            (false, Some(start)) => {
                *since = None;
                self.degraded.store(false, Ordering::Release);
                self.bulkhead.set_degraded(false);
                let lasted = start.elapsed();
                self.metrics(|m| {
                    m.degraded.set(0.0);
                    m.degraded_duration.record(lasted.as_secs_f64());
                });
                tracing::warn!(
                    stage = %self.name,
                    degraded_for = ?lasted,
                    "stage left degraded mode: coordination breaker closed"
                );
            }
            _ => {}
        }
    }
}

/// A handle on one stage of a [`SingleFlightLayer`](crate::SingleFlightLayer):
/// switch its mode at run time (the kill switch), read whether it is
/// degraded and for how long, reach its breaker and bulkhead. Cheap to
/// clone.
///
/// Switching the mode never touches requests already in flight: each
/// request follows the mode it found when it arrived.
#[derive(Clone)]
pub struct StageHandle {
    pub(crate) ctl: Arc<Control>,
    pub(crate) idle: Option<Arc<dyn Idle>>,
}

/// Waits for a stage's background coordination.
pub(crate) trait Idle: Send + Sync {
    fn idle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

impl<C: Send + Sync + 'static> Idle for Coordination<C> {
    fn idle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(DistributedFlights::idle(self))
    }
}

impl StageHandle {
    /// The stage's name.
    pub fn name(&self) -> &StageName {
        &self.ctl.name
    }

    /// The stage's configuration, as built.
    pub fn config(&self) -> &StageConfig {
        &self.ctl.cfg
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.ctl.mode()
    }

    /// Switches the mode for new requests and returns the previous one.
    /// HYBRID and DISTRIBUTED_ONLY need a backend for the stage.
    pub fn set_mode(&self, mode: Mode) -> Result<Mode, ModeError> {
        if mode.is_distributed() && !self.ctl.has_backend {
            return Err(ModeError::new(self.ctl.name.clone(), mode));
        }
        let prev = Mode::from_u8(self.ctl.mode.swap(mode.to_u8(), Ordering::AcqRel));
        self.ctl.metrics(|m| m.mode.set(f64::from(mode.to_u8())));
        if prev != mode {
            tracing::warn!(stage = %self.ctl.name, from = %prev, to = %mode, "stage mode switched");
        }
        Ok(prev)
    }

    /// True while the stage is degraded (its coordination breaker is open
    /// or probing).
    pub fn is_degraded(&self) -> bool {
        self.ctl.sync_degraded();
        self.ctl.degraded.load(Ordering::Acquire)
    }

    /// How long the current degraded period has lasted, if the stage is
    /// degraded.
    pub fn degraded_for(&self) -> Option<Duration> {
        self.ctl.sync_degraded();
        self.ctl
            .degraded_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|s| s.elapsed())
    }

    /// The breaker guarding the stage's backend (read, force, reset).
    pub fn breaker(&self) -> &Breaker {
        &self.ctl.breaker
    }

    /// The stage's bulkhead.
    pub fn bulkhead(&self) -> &BulkheadHandle {
        &self.ctl.bulkhead
    }

    /// Resolves once the stage has no background coordination left:
    /// owners' commits and abandons (with their heartbeats), releases of
    /// leases this node gave up on. For graceful shutdown, and tests.
    pub async fn idle(&self) {
        if let Some(idle) = &self.idle {
            idle.idle().await;
        }
    }
}

impl fmt::Debug for StageHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageHandle")
            .field("stage", &self.ctl.name)
            .field("mode", &self.ctl.mode())
            .field("degraded", &self.ctl.degraded.load(Ordering::Acquire))
            .finish()
    }
}
