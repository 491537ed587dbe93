//! One stage's state (built with the layer, shared by every service) and
//! its runtime handle: the mode (kill switch), the breakers, the bulkhead,
//! the degraded state (of the whole store, and of each shard of a sharded
//! one), and the stage's metrics. The metric handles and their labels are
//! `counters`; the public [`StageHandle`] is `handle`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use flightdeck_breaker::{Breaker, CircuitState};
use flightdeck_bulkhead::{BulkheadHandle, BulkheadLayer};
use flightdeck_core::metric::{self, records, Handles};
use flightdeck_core::{SharedForm, StageName};
use flightdeck_distributed::backend::Shard;
use flightdeck_distributed::{
    Backend, DistributedFlights, FailureClass, FlightId, GuardedBackend, ShardBreakers,
};
use flightdeck_local::LocalFlights;
use metrics::{Level, Metadata};
use tokio::time::Instant;

use crate::config::StageConfig;
use crate::error::ModeError;
use crate::mode::Mode;

mod counters;
mod handle;

use counters::{class_index, Bundle, CLASSES};
pub(crate) use counters::{Fallback, Path, WaitAction};
pub(crate) use handle::Idle;
pub use handle::StageHandle;

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
    /// The bulkhead's degraded lane, nested outside it, for the
    /// executions of flights whose shard is degraded.
    pub(crate) lane: BulkheadLayer,
}

/// The degraded state of one named shard of the stage's backend.
struct ShardState {
    breaker: Breaker,
    /// When its current degraded period started.
    since: Option<Instant>,
}

/// `singleflight_degraded{stage, shard}` of a named shard.
fn shard_gauge(ctl: &Control, shard: &Shard) -> metrics::Gauge {
    metrics::gauge!(
        metric::DEGRADED,
        metric::LABEL_STAGE => ctl.name.as_str().to_owned(),
        metric::LABEL_SHARD => shard.to_string()
    )
}

fn is_open(state: CircuitState) -> bool {
    matches!(
        state,
        CircuitState::Open | CircuitState::HalfOpen | CircuitState::ForcedOpen
    )
}

/// The runtime side of a stage, reachable through a [`StageHandle`].
///
/// The degraded state is kept per shard of the backend: `degraded` (and
/// the bulkhead's own degraded limit) for the whole store, judged by the
/// whole-store breaker `breaker`; `shards` for each named shard, judged by
/// its own breaker (its flights' executions then go through the
/// bulkhead's degraded lane).
pub(crate) struct Control {
    pub(crate) name: StageName,
    pub(crate) cfg: StageConfig,
    mode: AtomicU8,
    /// The stage's backend, to tell a flight's shard.
    backend: Option<Arc<dyn Backend>>,
    /// Whether that backend spreads flights over shards.
    sharded: bool,
    pub(crate) breaker: Breaker,
    breakers: ShardBreakers,
    bulkhead: BulkheadHandle,
    degraded: AtomicBool,
    degraded_since: Mutex<Option<Instant>>,
    shards: Mutex<BTreeMap<Shard, ShardState>>,
    /// Named shards degraded now: zero keeps the per-execution check to
    /// one load.
    shards_degraded: AtomicUsize,
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

/// How often a stage over a sharded backend forgets the shards that no
/// longer serve flights (see [`Control::retire_gone_shards`]).
const SHARD_CHECK: Duration = Duration::from_secs(5);

impl Control {
    pub(crate) fn new(
        name: StageName,
        cfg: StageConfig,
        backend: Option<Arc<dyn Backend>>,
        breakers: ShardBreakers,
        bulkhead: BulkheadHandle,
        peers: Peers,
    ) -> Self {
        let ctl = Self {
            mode: AtomicU8::new(cfg.mode.to_u8()),
            name,
            cfg,
            sharded: backend.as_ref().is_some_and(|b| b.sharded()),
            backend,
            breaker: breakers.whole().clone(),
            breakers,
            bulkhead,
            degraded: AtomicBool::new(false),
            degraded_since: Mutex::new(None),
            shards: Mutex::new(BTreeMap::new()),
            shards_degraded: AtomicUsize::new(0),
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
    ///
    /// Each named shard's breaker is followed the same way, from when it
    /// is created (see [`add_shard`](Self::add_shard)).
    pub(crate) fn watch(self: &Arc<Self>) {
        use tokio::sync::broadcast::error::RecvError;
        let me = Arc::downgrade(self);
        self.breakers.on_shard(move |shard, breaker| {
            if let Some(ctl) = me.upgrade() {
                ctl.add_shard(shard, breaker);
            }
        });
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut events = self.breaker.subscribe();
        let mut looking = !self.publish();
        let sharded = self.sharded;
        let ctl = Arc::downgrade(self);
        drop(rt.spawn(async move {
            let mut poll = tokio::time::interval(RECORDER_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut check = tokio::time::interval(SHARD_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    _ = check.tick(), if sharded => match ctl.upgrade() {
                        Some(ctl) => ctl.retire_gone_shards(),
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

    /// A named shard's breaker was created: its degraded state is kept
    /// from now on (published at 0), following its transitions from a
    /// task as [`watch`](Self::watch) does for the whole-store breaker.
    fn add_shard(self: &Arc<Self>, shard: &Shard, breaker: &Breaker) {
        use tokio::sync::broadcast::error::RecvError;
        let mut events = breaker.subscribe();
        {
            let mut shards = self.shards();
            if shards.contains_key(shard) {
                return;
            }
            shards.insert(
                shard.clone(),
                ShardState {
                    breaker: breaker.clone(),
                    since: None,
                },
            );
            shard_gauge(self, shard).set(0.0);
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let ctl = Arc::downgrade(self);
            let shard = shard.clone();
            drop(rt.spawn(async move {
                loop {
                    match events.recv().await {
                        Ok(_) | Err(RecvError::Lagged(_)) => match ctl.upgrade() {
                            Some(ctl) => ctl.sync_shard(&shard),
                            None => return,
                        },
                        Err(RecvError::Closed) => return,
                    }
                }
            }));
        }
        // A transition before the subscription is not missed.
        self.sync_shard(shard);
    }

    fn shards(&self) -> MutexGuard<'_, BTreeMap<Shard, ShardState>> {
        self.shards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of a flight of this stage.
    pub(crate) fn shard_of(&self, flight: &FlightId) -> Shard {
        self.backend
            .as_ref()
            .map_or(Shard::WHOLE, |b| b.shard(flight))
    }

    /// Whether the stage's backend spreads flights over shards: its
    /// flights then carry their id to the points that judge them by shard.
    #[inline]
    pub(crate) fn sharded(&self) -> bool {
        self.sharded
    }

    /// Whether `flight`'s shard is a named shard that is degraded now (its
    /// executions go through the bulkhead's degraded lane).
    #[inline]
    pub(crate) fn in_degraded_shard(&self, flight: &FlightId) -> bool {
        if self.shards_degraded.load(Ordering::Acquire) == 0 {
            return false;
        }
        let shard = self.shard_of(flight);
        !shard.is_whole()
            && self
                .shards()
                .get(&shard)
                .is_some_and(|st| st.since.is_some())
    }

    /// A breaker refused a flight (of `flight`, when its shard is known):
    /// follows the breaker that refused it, but only until the stage (or
    /// that shard) is known to be degraded (for a backend that is not
    /// sharded, the per-call cost while degraded is one load).
    #[inline]
    pub(crate) fn enter_degraded(&self, flight: Option<&FlightId>) {
        if !self.degraded.load(Ordering::Acquire) {
            self.sync_degraded();
        }
        if let Some(flight) = flight {
            if !self.degraded.load(Ordering::Acquire) {
                let shard = self.shard_of(flight);
                if !shard.is_whole() {
                    self.sync_shard(&shard);
                }
            }
        }
    }

    /// Follows a named shard's breaker, as [`sync_degraded`](Self::sync_degraded)
    /// does the whole store's: its gauge, its degraded period, the logs;
    /// while it is degraded, its flights' executions go through the
    /// bulkhead's degraded lane.
    fn sync_shard(&self, shard: &Shard) {
        let mut shards = self.shards();
        let Some(st) = shards.get_mut(shard) else {
            return;
        };
        let open = is_open(st.breaker.state());
        match (open, st.since) {
            (true, None) => {
                st.since = Some(Instant::now());
                self.shards_degraded.fetch_add(1, Ordering::AcqRel);
                shard_gauge(self, shard).set(1.0);
                tracing::warn!(
                    stage = %self.name,
                    %shard,
                    mode = %self.mode(),
                    bulkhead_limit = self.bulkhead.degraded_lane().handle().limit(),
                    "stage degraded on one shard: its coordination breaker is open; its flights are {}",
                    match self.mode() {
                        Mode::DistributedOnly => "failing fast",
                        _ => "coalescing in this process only",
                    }
                );
            }
            (false, Some(start)) => {
                st.since = None;
                self.shard_recovered(shard, start, "its coordination breaker closed");
            }
            _ => {}
        }
    }

    /// Forgets the named shards the backend no longer serves flights from
    /// ([`Backend::shards`]: a primary replaced in a failover, say): their
    /// breakers are dropped, and a degraded period ends (nothing would
    /// ever probe their breakers again, so they would stay degraded, and
    /// alerting, for good). A shard that comes back starts closed.
    pub(crate) fn retire_gone_shards(&self) {
        let Some(serving) = self.backend.as_ref().and_then(|b| b.shards()) else {
            return;
        };
        for shard in self.breakers.retire(&serving) {
            let Some(st) = self.shards().remove(&shard) else {
                continue;
            };
            if let Some(start) = st.since {
                self.shard_recovered(&shard, start, "it no longer serves any flight");
            }
        }
    }

    /// A named shard's degraded period that began at `start` ended
    /// (`why`): counted, timed, logged.
    fn shard_recovered(&self, shard: &Shard, start: Instant, why: &str) {
        self.shards_degraded.fetch_sub(1, Ordering::AcqRel);
        let lasted = start.elapsed();
        shard_gauge(self, shard).set(0.0);
        metrics::histogram!(
            metric::DEGRADED_DURATION,
            metric::LABEL_STAGE => self.name.as_str().to_owned(),
            metric::LABEL_SHARD => shard.to_string()
        )
        .record(lasted.as_secs_f64());
        tracing::warn!(
            stage = %self.name,
            %shard,
            degraded_for = ?lasted,
            "shard left degraded mode: {why}"
        );
    }

    /// Follows every breaker: the whole store's and each named shard's.
    fn sync_all(&self) {
        self.sync_degraded();
        let named: Vec<Shard> = self.shards().keys().cloned().collect();
        for shard in named {
            self.sync_shard(&shard);
        }
    }

    /// The shards degraded now: [`Shard::WHOLE`] for the whole store,
    /// then each named shard.
    fn degraded_shards(&self) -> Vec<(Shard, Instant)> {
        self.sync_all();
        let whole = *self
            .degraded_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        whole
            .map(|since| (Shard::WHOLE, since))
            .into_iter()
            .chain(
                self.shards()
                    .iter()
                    .filter_map(|(s, st)| st.since.map(|since| (s.clone(), since))),
            )
            .collect()
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
