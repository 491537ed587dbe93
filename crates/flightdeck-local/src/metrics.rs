//! The layer's metrics, with their keys built once per stage.
//!
//! The `metrics` macros build a `Key` (allocating its label list) on every
//! call; on a path that costs a few hundred nanoseconds in all, that
//! matters. The keys are built once per stage and handed to whatever
//! recorder is installed at the time of the call, so a recorder installed
//! later still sees everything.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use flightdeck_core::{metric, StageName};
use metrics::{Key, Label, Level, Metadata};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Metric keys of one stage.
pub(crate) struct StageMetrics {
    owner: Key,
    waiter: Key,
    replay: Key,
    rejected: Key,
    unshared: Key,
    cancelled: Key,
    panic: Key,
    wait_timeout: Key,
    active: Key,
    wait: Key,
    exec: Key,
}

impl StageMetrics {
    fn new(stage: &StageName) -> Self {
        let key = |name: &'static str| {
            Key::from_parts(
                name,
                vec![Label::new(
                    metric::LABEL_STAGE,
                    metrics::SharedString::from(Arc::clone(stage.as_arc())),
                )],
            )
        };
        Self {
            owner: key(metric::LOCAL_OWNER_TOTAL),
            waiter: key(metric::LOCAL_WAITER_TOTAL),
            replay: key(metric::LOCAL_REPLAY_TOTAL),
            rejected: key(metric::LOCAL_REJECTED_TOTAL),
            unshared: key(metric::LOCAL_UNSHARED_TOTAL),
            cancelled: key(metric::LOCAL_CANCELLED_TOTAL),
            panic: key(metric::LOCAL_PANIC_TOTAL),
            wait_timeout: key(metric::WAIT_TIMEOUT_TOTAL),
            active: key(metric::ACTIVE_FLIGHTS),
            wait: key(metric::WAIT_DURATION),
            exec: key(metric::EXECUTION_DURATION),
        }
    }

    fn count(key: &Key) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }

    pub(crate) fn waiter(&self) {
        Self::count(&self.waiter);
    }
    pub(crate) fn replay(&self) {
        Self::count(&self.replay);
    }
    pub(crate) fn rejected(&self) {
        Self::count(&self.rejected);
    }
    pub(crate) fn unshared(&self) {
        Self::count(&self.unshared);
    }
    pub(crate) fn cancelled(&self) {
        Self::count(&self.cancelled);
    }
    pub(crate) fn panicked(&self) {
        Self::count(&self.panic);
    }
    pub(crate) fn wait_timeout(&self) {
        Self::count(&self.wait_timeout);
    }
    /// A flight started: one owner, one more active flight (one recorder
    /// lookup for both).
    pub(crate) fn started(&self) {
        metrics::with_recorder(|r| {
            r.register_counter(&self.owner, &METADATA).increment(1);
            r.register_gauge(&self.active, &METADATA).increment(1.0);
        });
    }
    /// A flight ended: one active flight less, and its execution time when
    /// the work ran to the end.
    pub(crate) fn ended(&self, executed_secs: Option<f64>) {
        metrics::with_recorder(|r| {
            r.register_gauge(&self.active, &METADATA).decrement(1.0);
            if let Some(secs) = executed_secs {
                r.register_histogram(&self.exec, &METADATA).record(secs);
            }
        });
    }
    pub(crate) fn waited(&self, secs: f64) {
        metrics::with_recorder(|r| r.register_histogram(&self.wait, &METADATA).record(secs));
    }
}

/// Metric keys per stage, built on first use.
///
/// The first stage seen is kept apart, read without a lock: most layers
/// serve one stage, and a lock plus a string hash per call is most of what
/// a lookup costs.
#[derive(Default)]
pub(crate) struct Registry {
    first: OnceLock<(StageName, Arc<StageMetrics>)>,
    stages: RwLock<HashMap<StageName, Arc<StageMetrics>, foldhash::fast::RandomState>>,
}

/// Stages a layer keeps metric keys for; more are served uncached.
const MAX_CACHED_STAGES: usize = 1024;

impl Registry {
    pub(crate) fn stage(&self, stage: &StageName) -> Arc<StageMetrics> {
        let (name, m) = self
            .first
            .get_or_init(|| (stage.clone(), Arc::new(StageMetrics::new(stage))));
        if Arc::ptr_eq(name.as_arc(), stage.as_arc()) || name == stage {
            return Arc::clone(m);
        }
        if let Some(m) = self
            .stages
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(stage)
        {
            return Arc::clone(m);
        }
        let m = Arc::new(StageMetrics::new(stage));
        let mut w = self.stages.write().unwrap_or_else(|e| e.into_inner());
        if w.len() < MAX_CACHED_STAGES {
            w.entry(stage.clone()).or_insert_with(|| Arc::clone(&m));
        }
        m
    }
}
