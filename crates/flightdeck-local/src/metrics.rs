//! The layer's metrics, with their handles registered once per stage and
//! recorder.
//!
//! The `metrics` macros build a `Key` (allocating its label list) and look
//! it up in the recorder on every call; on a path that costs about a hundred
//! nanoseconds in all, that matters. Instead, a stage's handles are
//! registered once per recorder (see `flightdeck_core::metric::Handles`:
//! whatever the order in which the recorder and the layer came), and every
//! event after that is a check of the recorder in force and one call on a
//! handle. The active flights' gauge moves only by this layer's own
//! increments and decrements (never set: two layers of one stage share
//! the series), each flight's under the recorder it started under.
//!
//! Execution times cost two clock reads per flight, a good part of a
//! flight's cost on a fast path. They are taken only when somebody records
//! them: a histogram handle converts its value only if a recorder stands
//! behind it, so a value that reads the clock when converted ([`Elapsed`])
//! reads it only then, and a probe recorded zero times ([`records`]) tells,
//! once per stage and recorder, whether the start is worth reading at all.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use flightdeck_core::metric::{records, Generation, Handles};
use flightdeck_core::{metric, StageName, Unshareable};
use metrics::{Counter, Gauge, Histogram, IntoF64, Key, Label, Level, Metadata, Recorder};
use tokio::time::Instant;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Metric handles of one stage.
pub(crate) struct StageMetrics {
    /// The stage they belong to (for the errors of waiters).
    pub(crate) stage: StageName,
    /// Whether the layer times its work (see [`Registry::new`]).
    time_work: bool,
    handles: Handles<Bundle>,
}

/// The handles of a stage under one recorder.
struct Bundle {
    owner: Counter,
    waiter: Counter,
    replay: Counter,
    rejected: Counter,
    unshared: [Counter; UNSHARED_REASONS.len()],
    cancelled: Counter,
    panic: Counter,
    wait_timeout: Counter,
    active: Gauge,
    wait: Histogram,
    exec: Histogram,
    /// Whether a recorder stands behind `exec` (so the start of an
    /// execution is worth a clock read).
    timed: bool,
}

/// The reasons counted apart; others are registered on each use.
const UNSHARED_REASONS: [Unshareable; 6] = [
    Unshareable::Stream,
    Unshareable::Oversize,
    Unshareable::SetCookie,
    Unshareable::CacheControl,
    Unshareable::VaryStar,
    Unshareable::Vary,
];

fn stage_key(stage: &StageName, name: &'static str, extra: Option<Label>) -> Key {
    let mut labels = vec![Label::new(
        metric::LABEL_STAGE,
        metrics::SharedString::const_str(stage.as_str()),
    )];
    labels.extend(extra);
    Key::from_parts(name, labels)
}

fn unshared_key(stage: &StageName, why: Unshareable) -> Key {
    stage_key(
        stage,
        metric::LOCAL_UNSHARED_TOTAL,
        Some(Label::new("reason", why.as_str())),
    )
}

/// The time since an instant, read from the clock only when a histogram
/// with a recorder behind it converts it.
struct Elapsed(Instant);

impl IntoF64 for Elapsed {
    fn into_f64(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A waiter's wait: from when it joined until its message was sent, or
/// until now when none was (`None`). Worked out only when a histogram with
/// a recorder behind it converts it: 10,000 waiters that wake at once do
/// not each subtract instants for nobody.
pub(crate) struct WaitTime {
    pub(crate) since: Instant,
    pub(crate) sent: Option<Instant>,
}

impl IntoF64 for WaitTime {
    fn into_f64(self) -> f64 {
        match self.sent {
            Some(sent) => sent.saturating_duration_since(self.since),
            None => self.since.elapsed(),
        }
        .as_secs_f64()
    }
}

impl Bundle {
    fn register(r: &dyn Recorder, m: &StageMetrics) -> Self {
        let stage = &m.stage;
        let key = |name: &'static str| stage_key(stage, name, None);
        let counter = |name| r.register_counter(&key(name), &METADATA);
        let exec = r.register_histogram(&key(metric::EXECUTION_DURATION), &METADATA);
        let active = r.register_gauge(&key(metric::ACTIVE_FLIGHTS), &METADATA);
        // Published at once, by an increment: the series is shared with
        // every other layer of the stage in the process, whose flights may
        // be running (setting it would wipe their count, and theirs would
        // then count out below zero). Flights of this layer already
        // running when a recorder is first seen are not in its gauge: each
        // flight counts in and out under the recorder it started under
        // (see `resolve`).
        active.increment(0.0);
        Self {
            owner: counter(metric::LOCAL_OWNER_TOTAL),
            waiter: counter(metric::LOCAL_WAITER_TOTAL),
            replay: counter(metric::LOCAL_REPLAY_TOTAL),
            rejected: counter(metric::LOCAL_REJECTED_TOTAL),
            unshared: UNSHARED_REASONS
                .map(|why| r.register_counter(&unshared_key(stage, why), &METADATA)),
            cancelled: counter(metric::LOCAL_CANCELLED_TOTAL),
            panic: counter(metric::LOCAL_PANIC_TOTAL),
            wait_timeout: counter(metric::WAIT_TIMEOUT_TOTAL),
            active,
            wait: r.register_histogram(&key(metric::WAIT_DURATION), &METADATA),
            timed: m.time_work && records(&exec),
            exec,
        }
    }
}

impl StageMetrics {
    fn new(stage: &StageName, time_work: bool) -> Self {
        Self {
            stage: stage.clone(),
            time_work,
            handles: Handles::new(),
        }
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&Bundle) -> R) -> R {
        self.handles.with(|r| Bundle::register(r, self), f)
    }

    /// Registers the handles under the recorder in force, if not done yet.
    pub(crate) fn publish(&self) {
        self.with(|_| ());
    }

    /// Looks up the recorder in force once for a flight: its generation
    /// (every later event of the flight is recorded under it, so the
    /// active gauge goes down under the recorder it went up under) and
    /// whether executions of this stage are timed (a recorder records
    /// them).
    #[inline]
    pub(crate) fn resolve(&self) -> (Generation, bool) {
        self.handles
            .resolve(|r| Bundle::register(r, self), |m| m.timed)
    }

    #[inline]
    fn with_generation<R>(&self, gen: Generation, f: impl FnOnce(&Bundle) -> R) -> R {
        self.handles
            .with_generation(gen, |r| Bundle::register(r, self), f)
    }

    #[inline]
    pub(crate) fn waiter(&self) {
        self.with(|m| m.waiter.increment(1));
    }
    #[inline]
    pub(crate) fn replay(&self) {
        self.with(|m| m.replay.increment(1));
    }
    #[inline]
    pub(crate) fn rejected(&self) {
        self.with(|m| m.rejected.increment(1));
    }
    /// A caller runs its own request: the result was not shared, for
    /// `why`.
    pub(crate) fn unshared(&self, why: Unshareable) {
        match UNSHARED_REASONS.iter().position(|r| *r == why) {
            Some(i) => self.with(|m| m.unshared[i].increment(1)),
            None => metrics::with_recorder(|r| {
                r.register_counter(&unshared_key(&self.stage, why), &METADATA)
                    .increment(1)
            }),
        }
    }
    #[inline]
    pub(crate) fn cancelled(&self) {
        self.with(|m| m.cancelled.increment(1));
    }
    #[inline]
    pub(crate) fn panicked(&self) {
        self.with(|m| m.panic.increment(1));
    }
    #[inline]
    pub(crate) fn wait_timeout(&self) {
        self.with(|m| m.wait_timeout.increment(1));
    }
    /// A flight started: one owner, one more active flight (under the
    /// generation the flight resolved).
    #[inline]
    pub(crate) fn started(&self, gen: Generation) {
        self.with_generation(gen, |m| {
            m.owner.increment(1);
            m.active.increment(1.0);
        });
    }
    /// A flight ended: one active flight less, and the time since its work
    /// began when the work ran to the end (under the generation the flight
    /// started under).
    #[inline]
    pub(crate) fn ended(&self, gen: Generation, began: Option<Instant>) {
        self.with_generation(gen, |m| {
            m.active.decrement(1.0);
            if let Some(began) = began {
                m.exec.record(Elapsed(began));
            }
        });
    }
    #[inline]
    pub(crate) fn waited(&self, waited: WaitTime) {
        self.with(|m| m.wait.record(waited));
    }
}

/// Metric handles per stage, registered on first use.
///
/// The first stage seen is kept apart, read without a lock and without
/// touching a reference count: most layers serve one stage, and a lock plus
/// a string hash per call is most of what a lookup costs.
pub(crate) struct Registry {
    /// Whether executions are timed (see [`Registry::new`]).
    time_work: bool,
    first: OnceLock<(StageName, Arc<StageMetrics>)>,
    stages: RwLock<HashMap<StageName, Arc<StageMetrics>, foldhash::fast::RandomState>>,
}

/// The metric handles of one stage: borrowed for the first stage, shared for
/// the others.
pub(crate) enum Metrics<'a> {
    First(&'a Arc<StageMetrics>),
    Other(Arc<StageMetrics>),
}

impl Metrics<'_> {
    /// Handles to keep: `None` for the first stage, which the registry
    /// keeps for good (so 10,000 waiters do not all count references to
    /// one shared value from two threads).
    pub(crate) fn keep(self) -> Option<Arc<StageMetrics>> {
        match self {
            Metrics::First(_) => None,
            Metrics::Other(m) => Some(m),
        }
    }
}

impl std::ops::Deref for Metrics<'_> {
    type Target = StageMetrics;
    fn deref(&self) -> &StageMetrics {
        match self {
            Metrics::First(m) => m,
            Metrics::Other(m) => m,
        }
    }
}

impl Registry {
    /// `time_work`: whether the layer times its work (the `tower` shell
    /// does; the facade times real executions itself).
    pub(crate) fn new(time_work: bool) -> Self {
        Self {
            time_work,
            first: OnceLock::new(),
            stages: RwLock::default(),
        }
    }

    /// The handles that [`Metrics::keep`] returned: `None` is the first
    /// stage.
    #[inline]
    pub(crate) fn kept<'a>(&'a self, kept: &'a Option<Arc<StageMetrics>>) -> &'a StageMetrics {
        match kept {
            Some(m) => m,
            None => {
                &self
                    .first
                    .get()
                    .expect("the first stage is registered before any is kept")
                    .1
            }
        }
    }

    #[inline]
    pub(crate) fn get(&self, stage: &StageName) -> Metrics<'_> {
        match self.first.get() {
            Some((name, m)) if name == stage => Metrics::First(m),
            _ => self.get_slow(stage),
        }
    }

    /// The first use of the layer, or a stage other than its first.
    #[cold]
    fn get_slow(&self, stage: &StageName) -> Metrics<'_> {
        let (name, m) = self.first.get_or_init(|| {
            (
                stage.clone(),
                Arc::new(StageMetrics::new(stage, self.time_work)),
            )
        });
        if name == stage {
            return Metrics::First(m);
        }
        if let Some(m) = self
            .stages
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(stage)
        {
            return Metrics::Other(Arc::clone(m));
        }
        // Registered out of the lock (the recorder is the user's code), and
        // kept for good: a process has at most `MAX_STAGE_NAMES` stages.
        let m = Arc::new(StageMetrics::new(stage, self.time_work));
        let mut w = self.stages.write().unwrap_or_else(|e| e.into_inner());
        Metrics::Other(Arc::clone(w.entry(stage.clone()).or_insert(m)))
    }
}

#[cfg(test)]
mod tests {
    use metrics::Recorder;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn the_probe_tells_a_recorded_histogram_and_records_nothing() {
        assert!(!records(&Histogram::noop()));

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let key = Key::from_name("probed");
        let histogram = recorder.register_histogram(&key, &METADATA);
        assert!(records(&histogram));
        let samples: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(k, _, _, v)| match v {
                DebugValue::Histogram(h) if k.key().name() == "probed" => Some(h.len()),
                _ => None,
            })
            .collect();
        assert!(samples.iter().all(|&n| n == 0), "{samples:?}");
    }

    #[test]
    fn a_stage_is_timed_only_with_a_recorder() {
        let stage = StageName::new("timed").unwrap();
        assert!(!StageMetrics::new(&stage, true).resolve().1);
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            assert!(StageMetrics::new(&stage, true).resolve().1);
            assert!(
                !StageMetrics::new(&stage, false).resolve().1,
                "unless the layer times no work"
            );
        });
    }
}
