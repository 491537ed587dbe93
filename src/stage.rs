//! One stage's state (built with the layer, shared by every service) and
//! its runtime handle: the mode (kill switch), the breaker, the bulkhead,
//! the degraded state.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use flightdeck_breaker::{Breaker, CircuitState};
use flightdeck_bulkhead::{BulkheadHandle, BulkheadLayer};
use flightdeck_core::{metric, SharedForm, StageName};
use flightdeck_distributed::DistributedFlightLayer;
use flightdeck_local::LocalFlightLayer;
use metrics::{Key, Label, Level, Metadata};
use tokio::time::Instant;

use crate::config::StageConfig;
use crate::error::ModeError;
use crate::mode::Mode;
use crate::service::KeyedKeys;
use crate::share::{FlownShare, KeepShared};
use crate::ticket::{SharedBackend, TicketKeys};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The L2 layer of a stage.
pub(crate) type L2<Sh, C> = DistributedFlightLayer<SharedBackend, KeepShared<Sh>, C, TicketKeys>;

/// Everything one stage needs, built once with the layer.
pub(crate) struct Stage<Sh: SharedForm, C> {
    pub(crate) ctl: Arc<Control>,
    pub(crate) l1: LocalFlightLayer<KeyedKeys, FlownShare<Sh::Shared>>,
    pub(crate) l2: Option<L2<Sh, C>>,
    pub(crate) bulkhead: BulkheadLayer,
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
    keys: Keys,
}

struct Keys {
    label: Label,
    request: Counter,
    miss: Counter,
    owner_failure: Counter,
    bypass: Counter,
    fallback_execution: Counter,
    degraded: Key,
    degraded_duration: Key,
    mode: Key,
    fallback: [Counter; Fallback::ALL.len()],
}

/// A per-stage counter: the key is built with the layer, the recorder's
/// handle is taken at the first increment (so a recorder installed after
/// the layer was built is still used) and kept, so that counting on the hot
/// path is one load and the handle's increment.
struct Counter {
    key: Key,
    handle: OnceLock<metrics::Counter>,
}

impl Counter {
    fn new(key: Key) -> Self {
        Self {
            key,
            handle: OnceLock::new(),
        }
    }

    #[inline]
    fn increment(&self) {
        self.handle
            .get_or_init(|| metrics::with_recorder(|r| r.register_counter(&self.key, &METADATA)))
            .increment(1);
    }
}

/// Why a HYBRID leader ran locally (the `reason` label of
/// `singleflight_local_fallback_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    CircuitOpen,
    Unavailable,
    OutcomeUnknown,
    Protocol,
    WaitFailure,
}

impl Fallback {
    const ALL: [Fallback; 5] = [
        Self::CircuitOpen,
        Self::Unavailable,
        Self::OutcomeUnknown,
        Self::Protocol,
        Self::WaitFailure,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpen => "circuit_open",
            Self::Unavailable => "unavailable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Protocol => "protocol",
            Self::WaitFailure => "wait_failure",
        }
    }

    pub(crate) fn from_kind(kind: &'static str) -> Self {
        match kind {
            "unavailable" => Self::Unavailable,
            "outcome_unknown" => Self::OutcomeUnknown,
            _ => Self::Protocol,
        }
    }
}

impl Keys {
    fn new(stage: &StageName) -> Self {
        let label = Label::new(
            metric::LABEL_STAGE,
            metrics::SharedString::const_str(stage.as_str()),
        );
        let key = |name: &'static str| Key::from_parts(name, vec![label.clone()]);
        let counter = |name: &'static str| Counter::new(key(name));
        Self {
            request: counter(metric::REQUEST_TOTAL),
            miss: counter(metric::MISS_TOTAL),
            owner_failure: counter(metric::OWNER_FAILURE_TOTAL),
            bypass: counter(metric::BYPASS_TOTAL),
            fallback_execution: counter(metric::FALLBACK_EXECUTION_TOTAL),
            degraded: key(metric::DEGRADED),
            degraded_duration: key(metric::DEGRADED_DURATION),
            mode: key(metric::MODE),
            fallback: Fallback::ALL.map(|f| {
                Counter::new(Key::from_parts(
                    metric::LOCAL_FALLBACK_TOTAL,
                    vec![label.clone(), Label::new("reason", f.as_str())],
                ))
            }),
            label,
        }
    }
}

/// Which per-stage counter to move.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Count {
    /// Every request with a key for this stage, whatever its mode (the
    /// denominator of the merge ratio).
    Request,
    Miss,
    OwnerFailure,
    Bypass,
}

impl Control {
    pub(crate) fn new(
        name: StageName,
        cfg: StageConfig,
        has_backend: bool,
        breaker: Breaker,
        bulkhead: BulkheadHandle,
    ) -> Self {
        let keys = Keys::new(&name);
        let ctl = Self {
            mode: AtomicU8::new(cfg.mode.to_u8()),
            name,
            cfg,
            has_backend,
            breaker,
            bulkhead,
            degraded: AtomicBool::new(false),
            degraded_since: Mutex::new(None),
            keys,
        };
        ctl.gauge(&ctl.keys.mode, f64::from(ctl.mode().to_u8()));
        ctl.gauge(&ctl.keys.degraded, 0.0);
        ctl
    }

    /// Follows the breaker's transitions from a task (when built inside a
    /// tokio runtime), so that a transition nobody's request sees (forced
    /// by hand, or the open wait ending) still switches the bulkhead, the
    /// gauge and the logs at once. The task holds the stage weakly and ends
    /// with the breaker.
    pub(crate) fn watch(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut events = self.breaker.subscribe();
        let ctl = Arc::downgrade(self);
        drop(rt.spawn(async move {
            loop {
                match events.recv().await {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
                match ctl.upgrade() {
                    Some(ctl) => ctl.sync_degraded(),
                    None => return,
                }
            }
        }));
    }

    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    #[inline]
    pub(crate) fn count(&self, what: Count) {
        match what {
            Count::Request => &self.keys.request,
            Count::Miss => &self.keys.miss,
            Count::OwnerFailure => &self.keys.owner_failure,
            Count::Bypass => &self.keys.bypass,
        }
        .increment();
    }

    /// Counts one local fallback and its execution.
    #[inline]
    pub(crate) fn count_fallback(&self, why: Fallback) {
        self.keys.fallback[why as usize].increment();
        self.keys.fallback_execution.increment();
    }

    /// Follows the breaker, but only until the stage is known to be
    /// degraded (the per-call cost while degraded is one load).
    #[inline]
    pub(crate) fn enter_degraded(&self) {
        if !self.degraded.load(Ordering::Acquire) {
            self.sync_degraded();
        }
    }

    /// Counts `name` with the stage label and one more label (rare events:
    /// the key is built on the spot).
    pub(crate) fn count_with(&self, name: &'static str, label: &'static str, value: &'static str) {
        let key = Key::from_parts(
            name,
            vec![self.keys.label.clone(), Label::new(label, value)],
        );
        metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
    }

    fn gauge(&self, key: &Key, value: f64) {
        metrics::with_recorder(|r| r.register_gauge(key, &METADATA).set(value));
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
                self.gauge(&self.keys.degraded, 1.0);
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
                self.gauge(&self.keys.degraded, 0.0);
                let lasted = start.elapsed();
                metrics::with_recorder(|r| {
                    r.register_histogram(&self.keys.degraded_duration, &METADATA)
                        .record(lasted.as_secs_f64())
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
        self.ctl.gauge(&self.ctl.keys.mode, f64::from(mode.to_u8()));
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
