//! The layer's metrics, with their keys built once per stage.
//!
//! The `metrics` macros build a `Key` (allocating its label list) on every
//! call; on a path that costs a few hundred nanoseconds in all, that
//! matters. The keys are built once per stage and handed to whatever
//! recorder is installed at the time of the call, so a recorder installed
//! later still sees everything.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

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

    pub(crate) fn owner(&self) {
        Self::count(&self.owner);
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
    pub(crate) fn active(&self, delta: f64) {
        metrics::with_recorder(|r| r.register_gauge(&self.active, &METADATA).increment(delta));
    }
    pub(crate) fn waited(&self, secs: f64) {
        metrics::with_recorder(|r| r.register_histogram(&self.wait, &METADATA).record(secs));
    }
    pub(crate) fn executed(&self, secs: f64) {
        metrics::with_recorder(|r| r.register_histogram(&self.exec, &METADATA).record(secs));
    }
}

/// Metric keys per stage, built on first use.
#[derive(Default)]
pub(crate) struct Registry {
    stages: RwLock<HashMap<StageName, Arc<StageMetrics>, foldhash::fast::RandomState>>,
}

/// Stages a layer keeps metric keys for; more are served uncached.
const MAX_CACHED_STAGES: usize = 1024;

impl Registry {
    pub(crate) fn stage(&self, stage: &StageName) -> Arc<StageMetrics> {
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
