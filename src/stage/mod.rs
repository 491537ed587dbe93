//! One stage's state (built with the layer, shared by every service) and
//! its runtime handle: the mode (kill switch), the breakers, the bulkhead,
//! the degraded state (of the whole store, and of each shard of a sharded
//! one), and the stage's metrics. The metric handles and their labels are
//! `counters`; the public [`StageHandle`] is `handle`.
//!
//! The breakers and the degraded state they make are the guarded
//! backend's ([`BackendBreakers`]): it publishes which shards are degraded
//! on one channel, and the stage follows it to move what shows it (the
//! gauges, the logs, the bulkhead's degraded limit and lane), nothing
//! more. Two layers of one stage in one process share its series: the
//! degraded gauge shows whether any of them is degraded, and none resets
//! another's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::collections::BTreeMap;

use flightdeck_breaker::OpenSince;
use flightdeck_bulkhead::{BulkheadHandle, BulkheadLayer};
use flightdeck_core::metric::{self, records, Handles};
use flightdeck_core::{SharedForm, StageName};
use flightdeck_distributed::backend::Shard;
use flightdeck_distributed::{
    Backend, BackendBreakers, DistributedFlights, FailureClass, FlightId, GuardedBackend,
};
use flightdeck_local::LocalFlights;
use metrics::{Level, Metadata};
use tokio::time::Instant;

use crate::config::StageConfig;
use crate::error::ModeError;
use crate::mode::Mode;
use crate::readers::DynCodec;

mod counters;
mod handle;

use counters::{class_index, Bundle, CLASSES};
pub(crate) use counters::{FallbackReason, Path, RefreshOutcome, WaitAction};
pub use handle::StageHandle;
pub(crate) use handle::{Idle, Purge, Purger};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A stage's coordination: its backend (shared by the stages that name
/// it) behind the stage's breaker.
pub(crate) type Coordination<C> = DistributedFlights<GuardedBackend<Arc<dyn Backend>>, C>;

/// Everything one stage needs, built once with the layer.
pub(crate) struct Stage<R, Sh: SharedForm> {
    pub(crate) ctl: Arc<Control>,
    /// The layer's request readers (the owner's fencing token goes
    /// through them).
    pub(crate) readers: R,
    /// The layer's share adapter, with the stage's sharing settings.
    pub(crate) share: Sh,
    pub(crate) local: LocalFlights<Sh::Shared>,
    pub(crate) distributed: Option<Coordination<DynCodec<Sh::Shared>>>,
    pub(crate) bulkhead: BulkheadLayer,
    /// The bulkhead's degraded lane, nested outside it, for the
    /// executions of flights whose shard is degraded.
    pub(crate) lane: BulkheadLayer,
    /// The stage's kept copies, when a stale window or hit-for-pass is on.
    pub(crate) stale: Option<crate::stale::StaleSetup<Sh::Shared>>,
}

/// Degraded layers by stage and shard, in this process. Several layers of
/// one stage (two routers, a layer rebuilt while the old one still runs)
/// share the `singleflight_degraded` series: it shows whether any of them
/// is degraded, so that none hides another's state (a count would break
/// the alerts' `== 1`, a layer's own 0 or 1 would overwrite the others').
static DEGRADED_LAYERS: Mutex<BTreeMap<(String, Shard), usize>> = Mutex::new(BTreeMap::new());

/// Moves this layer's share of `shard`'s degraded gauge by `delta` (one
/// layer more or less degraded; 0: publishes the series) and shows whether
/// any layer of the stage is degraded on it, under the recorder in force
/// (`r` while registering under a new one).
fn show_degraded_layers(
    stage: &StageName,
    shard: &Shard,
    delta: isize,
    r: Option<&dyn metrics::Recorder>,
) {
    let mut layers = DEGRADED_LAYERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = (stage.as_str().to_owned(), shard.clone());
    let count = layers.entry(key.clone()).or_insert(0);
    *count = count.saturating_add_signed(delta);
    let any = if *count > 0 { 1.0 } else { 0.0 };
    if *count == 0 {
        layers.remove(&key);
    }
    let mut labels = vec![metrics::Label::new(
        metric::LABEL_STAGE,
        stage.as_str().to_owned(),
    )];
    if let Some(name) = shard.name() {
        labels.push(metrics::Label::new(metric::LABEL_SHARD, name.to_owned()));
    }
    let key = metrics::Key::from_parts(metric::DEGRADED, labels);
    // Set under the lock: the last value set is the count's.
    match r {
        Some(r) => r.register_gauge(&key, &METADATA).set(any),
        None => metrics::with_recorder(|r| r.register_gauge(&key, &METADATA).set(any)),
    }
}

/// A layer that goes away while degraded is degraded no more: its share
/// of the gauges goes with it.
impl Drop for Control {
    fn drop(&mut self) {
        let shown = std::mem::take(&mut *self.shown());
        for (shard, since) in shown {
            if since.is_some() {
                show_degraded_layers(&self.name, &shard, -1, None);
            }
        }
    }
}

/// A change of the degraded set that the logs and the duration histogram
/// tell (after the gauges and the bulkhead moved, out of the lock).
enum Change {
    Entered(Shard),
    /// A degraded period ended: its breaker closed, or (`gone`) the shard
    /// no longer serves any flight.
    Left {
        shard: Shard,
        since: Instant,
        gone: bool,
    },
}

/// The runtime side of a stage, reachable through a [`StageHandle`].
///
/// The degraded state is the guarded backend's, per shard
/// ([`BackendBreakers::watch`]); `shown` is what the gauges, the logs and
/// the bulkhead show of it now, brought up to date by [`sync`](Self::sync).
pub(crate) struct Control {
    pub(crate) name: StageName,
    pub(crate) cfg: StageConfig,
    mode: AtomicU8,
    /// The stage's backend, to tell a flight's shard.
    backend: Option<Arc<dyn Backend>>,
    /// Whether that backend spreads flights over shards.
    sharded: bool,
    pub(crate) breakers: BackendBreakers,
    bulkhead: BulkheadHandle,
    /// The degraded set as shown (gauges, bulkhead, logs).
    shown: Mutex<OpenSince<Shard>>,
    /// The breakers' version `shown` was taken at (see
    /// [`BackendBreakers::version`]).
    shown_version: AtomicU64,
    /// Whether the whole store is shown degraded.
    degraded: AtomicBool,
    /// Why the backend was not connected when the layer was built: told
    /// once, by the first log line of the stage's degraded state.
    starting: Mutex<Option<String>>,
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
    /// `starting`: why the backend was not connected at build (the whole
    /// store's breaker was tripped for it).
    pub(crate) fn new(
        name: StageName,
        cfg: StageConfig,
        backend: Option<Arc<dyn Backend>>,
        breakers: BackendBreakers,
        bulkhead: BulkheadHandle,
        peers: Peers,
        starting: Option<String>,
    ) -> Self {
        let ctl = Self {
            mode: AtomicU8::new(cfg.mode.to_u8()),
            name,
            cfg,
            sharded: backend.as_ref().is_some_and(|b| b.sharded()),
            backend,
            breakers,
            bulkhead,
            shown: Mutex::new(OpenSince::new()),
            // Never a version: the first `sync` shows the breakers' state.
            shown_version: AtomicU64::new(u64::MAX),
            degraded: AtomicBool::new(false),
            starting: Mutex::new(starting),
            metrics: Handles::new(),
            peers,
        };
        // Registers the handles (publishing the gauges) under the recorder
        // in force now; another one installed later gets them at its first
        // use or within a second (see `watch`).
        ctl.publish();
        ctl.sync();
        ctl
    }

    /// Runs `f` with the stage's handles under the recorder in force.
    #[inline]
    fn metrics<R>(&self, f: impl FnOnce(&Bundle) -> R) -> R {
        self.metrics.with(|r| Bundle::register(r, self), f)
    }

    /// Makes sure the recorder in force has the stage's metrics (and its
    /// breakers', bulkhead's and flights'), with this layer's share of the
    /// gauges. Returns whether that recorder records anything (false for
    /// the no-op recorder in force before one is installed).
    pub(crate) fn publish(&self) -> bool {
        self.metrics(|m| records(&m.degraded_duration))
    }

    /// Follows the breakers' degraded set from a task (when built inside a
    /// tokio runtime), so that a change nobody's request sees (a breaker
    /// forced by hand, a probe that closed it, the backend's first
    /// connection) still moves the bulkhead, the gauges and the logs at
    /// once. The task holds the stage weakly and ends with the breakers.
    ///
    /// Until a recorder is in force, the task also looks for one every
    /// [`RECORDER_POLL`] and publishes the stage's metrics under it: a
    /// recorder installed after the layer was built (the usual order when
    /// the exporter is set up with the routes) exports the stage's mode,
    /// degraded state and zeroed counters before the first request, not
    /// at its first event. Over a sharded backend it forgets, every
    /// [`SHARD_CHECK`], the shards that no longer serve flights.
    pub(crate) fn watch(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut changes = self.breakers.watch();
        let mut looking = !self.publish();
        let sharded = self.sharded;
        let ctl = Arc::downgrade(self);
        drop(rt.spawn(async move {
            let mut poll = tokio::time::interval(RECORDER_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut check = tokio::time::interval(SHARD_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                // Biased: a fixed order (tokio picks at random otherwise),
                // so a simulation replays from its seed.
                tokio::select! {
                    biased;
                    changed = changes.changed() => match (changed, ctl.upgrade()) {
                        (Ok(()), Some(ctl)) => ctl.sync(),
                        _ => return,
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
    #[inline]
    pub(crate) fn count_fallback(&self, why: FallbackReason) {
        let i = match why {
            FallbackReason::Coordination(class) => class_index(class),
            FallbackReason::WaitFailure => CLASSES.len(),
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
    /// bulkhead). Returns whether the recorder in force records its
    /// duration (see [`record_execution`](Self::record_execution)): when
    /// none does, its start is not worth a clock read.
    pub(crate) fn count_execution(&self, path: Path) -> bool {
        let i = Path::ALL.iter().position(|p| *p == path).unwrap_or(0);
        self.metrics(|m| {
            m.execution[i].increment(1);
            if path == Path::Fallback {
                m.fallback_execution.increment(1);
            }
            m.timed
        })
    }

    /// A caller was answered from a stale result `age` old.
    pub(crate) fn count_stale(&self, stale: flightdeck_core::Stale) {
        let i = counters::STALE_REASONS
            .iter()
            .position(|r| *r == stale.reason)
            .unwrap_or(0);
        self.metrics(|m| {
            m.stale_served[i].increment(1);
            m.stale_age.record(stale.age.as_secs_f64());
        });
    }

    /// A background refresh of a kept result ended.
    pub(crate) fn count_refresh(&self, outcome: RefreshOutcome) {
        let i = RefreshOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.metrics(|m| m.refresh[i].increment(1));
    }

    /// A caller ran its own request at once: its key's last response could
    /// not be shared.
    pub(crate) fn count_hit_for_pass(&self) {
        self.metrics(|m| m.hit_for_pass.increment(1));
    }

    /// A real execution ended after `took`: one sample per execution.
    pub(crate) fn record_execution(&self, took: Duration) {
        self.metrics(|m| m.execution_duration.record(took.as_secs_f64()));
    }

    fn shown(&self) -> MutexGuard<'_, OpenSince<Shard>> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of a flight of this stage.
    fn shard_of(&self, flight: &FlightId) -> Shard {
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
        if !self.breakers.any_degraded() {
            return false;
        }
        let shard = self.shard_of(flight);
        !shard.is_whole() && self.breakers.is_degraded(&shard)
    }

    /// Brings what shows the degraded state (the gauges, the bulkhead,
    /// the logs) up to the breakers' (two atomic loads when it is).
    #[inline]
    pub(crate) fn sync(&self) {
        if self.breakers.version() != self.shown_version.load(Ordering::Acquire) {
            self.sync_slow();
        }
    }

    #[cold]
    fn sync_slow(&self) {
        // Registered under the recorder in force first, out of the lock:
        // registering publishes this layer's share of the gauges as shown.
        self.metrics(|_| ());
        let mut changes = Vec::new();
        {
            let mut shown = self.shown();
            let version = self.breakers.version();
            let now = self.breakers.degraded();
            let shards = shown.keys().chain(now.keys()).cloned();
            let shards: std::collections::BTreeSet<Shard> = shards.collect();
            for shard in shards {
                let before = shown.get(&shard).copied();
                let after = now.get(&shard).copied();
                match (before.flatten(), after) {
                    (None, Some(Some(_))) => {
                        self.show_degraded(&shard, true);
                        changes.push(Change::Entered(shard));
                    }
                    (Some(since), Some(None)) => {
                        self.show_degraded(&shard, false);
                        let gone = false;
                        changes.push(Change::Left { shard, since, gone });
                    }
                    (Some(since), None) => {
                        self.show_degraded(&shard, false);
                        let gone = true;
                        changes.push(Change::Left { shard, since, gone });
                    }
                    // A shard's first appearance publishes its gauge.
                    (None, Some(None)) if before.is_none() => {
                        show_degraded_layers(&self.name, &shard, 0, None);
                    }
                    _ => {}
                }
            }
            *shown = now;
            self.shown_version.store(version, Ordering::Release);
        }
        for change in changes {
            self.tell(change);
        }
    }

    /// Moves this layer's share of `shard`'s gauge, and for the whole
    /// store the bulkhead's degraded limit (under the `shown` lock, so
    /// that a registration under a new recorder sees them as shown).
    fn show_degraded(&self, shard: &Shard, degraded: bool) {
        show_degraded_layers(&self.name, shard, if degraded { 1 } else { -1 }, None);
        if shard.is_whole() {
            self.degraded.store(degraded, Ordering::Release);
            self.bulkhead.set_degraded(degraded);
        }
    }

    /// Logs a change of the degraded set, and records how long a degraded
    /// period that ended lasted.
    fn tell(&self, change: Change) {
        let mode = self.mode();
        let then = match mode {
            Mode::DistributedOnly => "failing fast",
            _ => "coalescing in this process only",
        };
        match change {
            Change::Entered(shard) if shard.is_whole() => {
                let starting = self
                    .starting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                let limit = self.bulkhead.limit();
                match starting {
                    Some(why) => tracing::warn!(
                        stage = %self.name,
                        %mode,
                        bulkhead_limit = limit,
                        "starting degraded: {why}; {then} until it connects"
                    ),
                    None => tracing::warn!(
                        stage = %self.name,
                        %mode,
                        bulkhead_limit = limit,
                        "stage degraded: coordination breaker open; {then}"
                    ),
                }
            }
            Change::Entered(shard) => tracing::warn!(
                stage = %self.name,
                %shard,
                %mode,
                bulkhead_limit = self.bulkhead.degraded_lane().handle().limit(),
                "stage degraded on one shard: its coordination breaker is open; its flights are {then}"
            ),
            Change::Left { shard, since, gone } => {
                let lasted = since.elapsed();
                let secs = lasted.as_secs_f64();
                if shard.is_whole() {
                    self.metrics(|m| m.degraded_duration.record(secs));
                    tracing::warn!(
                        stage = %self.name,
                        degraded_for = ?lasted,
                        "stage left degraded mode: coordination breaker closed"
                    );
                    return;
                }
                metrics::histogram!(
                    metric::DEGRADED_DURATION,
                    metric::LABEL_STAGE => self.name.as_str().to_owned(),
                    metric::LABEL_SHARD => shard.to_string()
                )
                .record(secs);
                let why = if gone {
                    "it no longer serves any flight"
                } else {
                    "its coordination breaker closed"
                };
                tracing::warn!(
                    stage = %self.name,
                    %shard,
                    degraded_for = ?lasted,
                    "shard left degraded mode: {why}"
                );
            }
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
        if !self.breakers.retire(&serving).is_empty() {
            self.sync();
        }
    }

    /// The shards degraded now, each with since when: [`Shard::WHOLE`] for
    /// the whole store, then each named shard.
    pub(crate) fn degraded_shards(&self) -> Vec<(Shard, Instant)> {
        self.sync();
        self.shown()
            .iter()
            .filter_map(|(shard, since)| since.map(|since| (shard.clone(), since)))
            .collect()
    }

    /// Whether the whole store is shown degraded.
    pub(crate) fn whole_degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    /// Publishes the degraded gauges of the shards shown (whether any
    /// layer of the stage is degraded on each), and the breakers'
    /// metrics, under `r`: a registration under a new recorder.
    fn publish_shown(&self, r: &dyn metrics::Recorder) {
        let shards: Vec<Shard> = self.shown().keys().cloned().collect();
        for shard in &shards {
            show_degraded_layers(&self.name, shard, 0, Some(r));
        }
        self.breakers.whole().publish_metrics();
        for (_, breaker) in self.breakers.named() {
            breaker.publish_metrics();
        }
    }
}
