//! One stage's metric handles under one recorder, and the labels they
//! carry (where an execution ran, why a leader fell back, what a failed
//! wait answered).

use flightdeck_core::metric::{self, records};
use flightdeck_core::StaleReason;
use flightdeck_distributed::FailureClass;
use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder};

use super::{Control, METADATA};

/// Where a real execution of the inner service ran (the `path` label of
/// `singleflight_execution_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// As the owner of a distributed flight.
    Owner,
    /// In this process only: LOCAL_ONLY, a stage without backend, or a
    /// caller whose request a shared result did not serve.
    Local,
    /// HYBRID's local fallback path (coordination failed, or the breaker
    /// refused or held back the flight).
    Fallback,
    /// BYPASS: no coalescing at all.
    Bypass,
}

impl Path {
    pub(super) const ALL: [Path; 4] = [Path::Owner, Path::Local, Path::Fallback, Path::Bypass];

    pub(super) const fn as_str(self) -> &'static str {
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
/// acquire (a breaker's refusal or ramp among them), or a follower's wait
/// that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FallbackReason {
    Coordination(FailureClass),
    WaitFailure,
}

pub(super) const CLASSES: [FailureClass; 4] = [
    FailureClass::CircuitOpen,
    FailureClass::Unavailable,
    FailureClass::OutcomeUnknown,
    FailureClass::Protocol,
];

#[inline]
pub(super) fn class_index(class: FailureClass) -> usize {
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
    pub(super) const ALL: [WaitAction; 4] = [
        WaitAction::Wait,
        WaitAction::InProgress,
        WaitAction::Fail,
        WaitAction::Local,
    ];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            WaitAction::Wait => "wait",
            WaitAction::InProgress => "in_progress",
            WaitAction::Fail => "fail",
            WaitAction::Local => "local",
        }
    }
}

/// Why a stale result answered, in label order.
pub(crate) const STALE_REASONS: [StaleReason; 5] = [
    StaleReason::Revalidate,
    StaleReason::Error,
    StaleReason::SoftTimeout,
    StaleReason::RedisDown,
    StaleReason::WaitTimeout,
];

/// How a background refresh of a kept result ended (the `outcome` label
/// of `singleflight_refresh_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefreshOutcome {
    /// Its result replaced the kept one.
    Committed,
    /// The work failed.
    Failed,
    /// A purge (or a newer result) came first: its result was dropped.
    Fenced,
    /// Cut (execution timeout) or cancelled before it answered.
    Abandoned,
}

impl RefreshOutcome {
    pub(super) const ALL: [RefreshOutcome; 4] = [
        RefreshOutcome::Committed,
        RefreshOutcome::Failed,
        RefreshOutcome::Fenced,
        RefreshOutcome::Abandoned,
    ];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            RefreshOutcome::Committed => "committed",
            RefreshOutcome::Failed => "failed",
            RefreshOutcome::Fenced => "fenced",
            RefreshOutcome::Abandoned => "abandoned",
        }
    }
}

/// The handles of one stage under one recorder.
pub(crate) struct Bundle {
    pub(super) request: Counter,
    pub(super) bypass: Counter,
    pub(super) fallback_execution: Counter,
    pub(super) fallback: [Counter; CLASSES.len() + 1],
    pub(super) fail_fast: [Counter; CLASSES.len()],
    pub(super) distributed_failure: [Counter; CLASSES.len()],
    pub(super) wait_failure: [Counter; WaitAction::ALL.len()],
    pub(super) execution: [Counter; Path::ALL.len()],
    pub(super) execution_duration: Histogram,
    /// Whether a recorder stands behind `execution_duration` (so an
    /// execution's start is worth a clock read).
    pub(super) timed: bool,
    pub(super) degraded_duration: Histogram,
    pub(super) mode: Gauge,
    pub(super) stale_served: [Counter; STALE_REASONS.len()],
    pub(super) stale_age: Histogram,
    pub(super) refresh: [Counter; RefreshOutcome::ALL.len()],
    pub(super) hit_for_pass: Counter,
}

impl Bundle {
    /// Registers the stage's handles with `r`, and publishes the gauges'
    /// values the stage keeps (so a recorder installed after the layer was
    /// built sees them at once).
    pub(super) fn register(r: &dyn Recorder, ctl: &Control) -> Self {
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
        let execution_duration =
            r.register_histogram(&key(metric::EXECUTION_DURATION, None), &METADATA);
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
            timed: records(&execution_duration),
            execution_duration,
            degraded_duration: r
                .register_histogram(&key(metric::DEGRADED_DURATION, None), &METADATA),
            mode: r.register_gauge(&key(metric::MODE, None), &METADATA),
            stale_served: STALE_REASONS
                .map(|w| counter(metric::STALE_SERVED_TOTAL, Some(("reason", w.as_str())))),
            stale_age: r.register_histogram(&key(metric::STALE_AGE_SECONDS, None), &METADATA),
            refresh: RefreshOutcome::ALL
                .map(|o| counter(metric::REFRESH_TOTAL, Some(("outcome", o.as_str())))),
            hit_for_pass: counter(metric::HIT_FOR_PASS_TOTAL, None),
        };
        b.mode.set(f64::from(ctl.mode().to_u8()));
        // The degraded gauges (whether any layer of the stage is degraded:
        // never this layer's own value alone), and each breaker.
        ctl.publish_shown(r);
        // The stage's other parts, under the same recorder.
        ctl.bulkhead.publish_metrics();
        (ctl.peers)();
        b
    }
}
