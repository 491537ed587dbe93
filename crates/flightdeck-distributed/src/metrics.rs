//! L2's metric handles, per stage, registered once per recorder (see
//! `flightdeck_core::metric::Handles`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use flightdeck_core::metric::{self, Handles};
use flightdeck_core::stale::{Stale, StaleReason};
use flightdeck_core::StageName;
use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder};

use crate::backend::BackendErrorKind;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The backend calls, for the `op` label of coordination errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Recheck,
    Heartbeat,
    Commit,
    Abandon,
    Release,
    Subscribe,
    Invalidate,
    WaitReplicas,
}

impl Op {
    const ALL: [Op; 9] = [
        Op::Acquire,
        Op::Recheck,
        Op::Heartbeat,
        Op::Commit,
        Op::Abandon,
        Op::Release,
        Op::Subscribe,
        Op::Invalidate,
        Op::WaitReplicas,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            // Counted as the acquire it is on the wire.
            Op::Recheck => "acquire",
            Op::Heartbeat => "heartbeat",
            Op::Commit => "commit",
            Op::Abandon => "abandon",
            Op::Release => "release",
            Op::Subscribe => "subscribe",
            Op::Invalidate => "invalidate",
            Op::WaitReplicas => "wait_replicas",
        }
    }
}

const KINDS: [BackendErrorKind; 3] = [
    BackendErrorKind::Unavailable,
    BackendErrorKind::Protocol,
    BackendErrorKind::OutcomeUnknown,
];

/// What happened to a token this node gave up on (the `result` label of
/// `singleflight_orphan_release_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orphan {
    /// It held a lease, now released.
    Released,
    /// It held no lease (its acquire never ran, or the lease had gone).
    NotOwner,
    /// Not retried: the list was full, or the backend never answered
    /// before the lease would have expired on its own.
    Dropped,
}

impl Orphan {
    const ALL: [Orphan; 3] = [Orphan::Released, Orphan::NotOwner, Orphan::Dropped];

    const fn as_str(self) -> &'static str {
        match self {
            Orphan::Released => "released",
            Orphan::NotOwner => "not_owner",
            Orphan::Dropped => "dropped",
        }
    }
}

/// How a wait for replicas after a commit ended (the `result` label of
/// `singleflight_commit_replicas_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replicas {
    /// Enough replicas acknowledged the commit.
    Acked,
    /// Fewer did before the timeout.
    Short,
    /// The wait failed (or the backend has no replicas to ask).
    Failed,
}

impl Replicas {
    const ALL: [Replicas; 3] = [Replicas::Acked, Replicas::Short, Replicas::Failed];

    const fn as_str(self) -> &'static str {
        match self {
            Replicas::Acked => "acked",
            Replicas::Short => "short",
            Replicas::Failed => "failed",
        }
    }
}

/// The reasons of stale answers L2 gives (the `reason` label of
/// `singleflight_stale_served_total`).
const STALE_REASONS: [StaleReason; 4] = [
    StaleReason::Revalidate,
    StaleReason::Error,
    StaleReason::SoftTimeout,
    StaleReason::WaitTimeout,
];

/// How a refresh that ran in the background ended (the `outcome` label
/// of `singleflight_refresh_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// Its result got into the store (its commit was answered, not
    /// fenced).
    Committed,
    /// The work failed (as the stage's judge of failures says).
    Failed,
    /// Its lease was lost (another node took the flight over, or it was
    /// invalidated), or the store fenced its commit (counted in
    /// `singleflight_fenced_total` too).
    Fenced,
    /// Cut by its bound, or it answered nothing to store.
    Abandoned,
    /// Its result never got into the store: the commit's attempts ran out
    /// (counted in `singleflight_result_write_failure_total` too), or it
    /// could not be stored at all (too large, or it did not encode).
    WriteFailed,
}

impl Refresh {
    const ALL: [Refresh; 5] = [
        Refresh::Committed,
        Refresh::Failed,
        Refresh::Fenced,
        Refresh::Abandoned,
        Refresh::WriteFailed,
    ];

    const fn as_str(self) -> &'static str {
        match self {
            Refresh::Committed => "committed",
            Refresh::Failed => "failed",
            Refresh::Fenced => "fenced",
            Refresh::Abandoned => "abandoned",
            Refresh::WriteFailed => "write_failed",
        }
    }
}

/// The handles of one stage under one recorder.
pub(crate) struct Bundle {
    pub(crate) request: Counter,
    pub(crate) owner: Counter,
    pub(crate) follower: Counter,
    pub(crate) hit: Counter,
    pub(crate) miss: Counter,
    pub(crate) takeover: Counter,
    pub(crate) owner_failure: Counter,
    pub(crate) wait_timeout: Counter,
    pub(crate) result_write_failure: Counter,
    pub(crate) heartbeat_lost: Counter,
    pub(crate) fenced: Counter,
    pub(crate) result_lost: Counter,
    replicas: [Counter; Replicas::ALL.len()],
    pub(crate) wait: Histogram,
    /// Recorded by the `tower` shell only (the facade times real
    /// executions itself).
    pub(crate) execution: Histogram,
    unknown_backend: Counter,
    unknown_codec: Counter,
    errors: [[Counter; Op::ALL.len()]; KINDS.len()],
    orphans: [Counter; Orphan::ALL.len()],
    stale_served: [Counter; STALE_REASONS.len()],
    stale_age: Histogram,
    refresh: [Counter; Refresh::ALL.len()],
}

impl Bundle {
    fn register(stage: &StageName, r: &dyn Recorder) -> Self {
        let key = |name: &'static str, extra: &[(&'static str, &'static str)]| {
            let mut labels = vec![Label::new(
                metric::LABEL_STAGE,
                metrics::SharedString::const_str(stage.as_str()),
            )];
            labels.extend(extra.iter().map(|(k, v)| Label::new(*k, *v)));
            Key::from_parts(name, labels)
        };
        let counter = |name, extra: &[(&'static str, &'static str)]| {
            r.register_counter(&key(name, extra), &METADATA)
        };
        Self {
            request: counter(metric::DISTRIBUTED_REQUEST_TOTAL, &[]),
            owner: counter(metric::OWNER_TOTAL, &[]),
            follower: counter(metric::FOLLOWER_TOTAL, &[]),
            hit: counter(metric::HIT_TOTAL, &[]),
            miss: counter(metric::MISS_TOTAL, &[]),
            takeover: counter(metric::TAKEOVER_TOTAL, &[]),
            owner_failure: counter(metric::OWNER_FAILURE_TOTAL, &[]),
            wait_timeout: counter(metric::WAIT_TIMEOUT_TOTAL, &[]),
            result_write_failure: counter(metric::RESULT_WRITE_FAILURE_TOTAL, &[]),
            heartbeat_lost: counter(metric::HEARTBEAT_LOST_TOTAL, &[]),
            fenced: counter(metric::FENCED_TOTAL, &[]),
            result_lost: counter(metric::RESULT_LOST_TOTAL, &[]),
            replicas: Replicas::ALL
                .map(|o| counter(metric::COMMIT_REPLICAS_TOTAL, &[("result", o.as_str())])),
            wait: r.register_histogram(&key(metric::WAIT_DURATION, &[]), &METADATA),
            execution: r.register_histogram(&key(metric::EXECUTION_DURATION, &[]), &METADATA),
            unknown_backend: counter(metric::UNKNOWN_ACTION_TOTAL, &[("reason", "backend")]),
            unknown_codec: counter(metric::UNKNOWN_ACTION_TOTAL, &[("reason", "codec")]),
            errors: KINDS.map(|kind| {
                Op::ALL.map(|op| {
                    counter(
                        metric::COORDINATION_ERROR_TOTAL,
                        &[("kind", kind.as_str()), ("op", op.as_str())],
                    )
                })
            }),
            orphans: Orphan::ALL
                .map(|o| counter(metric::ORPHAN_RELEASE_TOTAL, &[("result", o.as_str())])),
            stale_served: STALE_REASONS
                .map(|w| counter(metric::STALE_SERVED_TOTAL, &[("reason", w.as_str())])),
            stale_age: r.register_histogram(&key(metric::STALE_AGE_SECONDS, &[]), &METADATA),
            refresh: Refresh::ALL
                .map(|o| counter(metric::REFRESH_TOTAL, &[("outcome", o.as_str())])),
        }
    }

    /// A failed backend call; protocol errors also count as unknown
    /// actions (an alert: version skew?).
    pub(crate) fn coordination_error(&self, kind: BackendErrorKind, op: Op) {
        let k = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        let o = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        self.errors[k][o].increment(1);
        if kind == BackendErrorKind::Protocol {
            self.unknown_backend.increment(1);
        }
    }

    /// A stored result that does not decode.
    pub(crate) fn undecodable(&self) {
        self.unknown_codec.increment(1);
    }

    /// A wait for replicas after a commit.
    pub(crate) fn replicas(&self, what: Replicas) {
        let i = Replicas::ALL.iter().position(|o| *o == what).unwrap_or(0);
        self.replicas[i].increment(1);
    }

    /// An answer given from a stale result.
    pub(crate) fn stale(&self, stale: Stale) {
        if let Some(i) = STALE_REASONS.iter().position(|r| *r == stale.reason) {
            self.stale_served[i].increment(1);
        }
        self.stale_age.record(stale.age.as_secs_f64());
    }

    /// A refresh that ran in the background ended.
    pub(crate) fn refresh(&self, how: Refresh) {
        let i = Refresh::ALL.iter().position(|o| *o == how).unwrap_or(0);
        self.refresh[i].increment(1);
    }

    pub(crate) fn orphan(&self, what: Orphan) {
        let i = Orphan::ALL.iter().position(|o| *o == what).unwrap_or(0);
        self.orphans[i].increment(1);
    }
}

/// One stage's handles, under every recorder seen.
pub(crate) struct StageMetrics {
    stage: StageName,
    handles: Handles<Bundle>,
}

impl StageMetrics {
    /// Runs `f` with the handles of the recorder in force.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Bundle) -> R) -> R {
        self.handles.with(|r| Bundle::register(&self.stage, r), f)
    }
}

/// Handles per stage: the first stage seen is read without a lock (most
/// layers serve one stage), the others through a map.
#[derive(Default)]
pub(crate) struct Registry {
    first: OnceLock<Arc<StageMetrics>>,
    others: RwLock<HashMap<StageName, Arc<StageMetrics>>>,
}

impl Registry {
    pub(crate) fn get(&self, stage: &StageName) -> Arc<StageMetrics> {
        let first = self.first.get_or_init(|| new_stage(stage));
        if first.stage == *stage {
            return Arc::clone(first);
        }
        if let Some(m) = self
            .others
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(stage)
        {
            return Arc::clone(m);
        }
        let mut w = self.others.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(w.entry(stage.clone()).or_insert_with(|| new_stage(stage)))
    }
}

fn new_stage(stage: &StageName) -> Arc<StageMetrics> {
    Arc::new(StageMetrics {
        stage: stage.clone(),
        handles: Handles::new(),
    })
}
