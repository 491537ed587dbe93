//! deploy/: the Grafana dashboard and the Prometheus alerts use only the
//! metric names the code emits (histograms may add `_bucket`, `_sum`,
//! `_count`), and the alerts cover what must never be silent. promtool
//! checks and unit-tests the rules themselves (scripts/test).

use std::collections::BTreeSet;

use flightdeck::breaker::metric as breaker;
use flightdeck::bulkhead::metric as bulkhead;
use flightdeck::core::metric as m;

/// Every metric name flightdeck records.
const EMITTED: &[&str] = &[
    m::LOCAL_OWNER_TOTAL,
    m::LOCAL_WAITER_TOTAL,
    m::LOCAL_REPLAY_TOTAL,
    m::LOCAL_REJECTED_TOTAL,
    m::LOCAL_UNSHARED_TOTAL,
    m::LOCAL_CANCELLED_TOTAL,
    m::LOCAL_PANIC_TOTAL,
    m::REQUEST_TOTAL,
    m::UNKEYED_TOTAL,
    m::WAIT_TIMEOUT_TOTAL,
    m::ACTIVE_FLIGHTS,
    m::WAIT_DURATION,
    m::EXECUTION_DURATION,
    m::OWNER_TOTAL,
    m::FOLLOWER_TOTAL,
    m::HIT_TOTAL,
    m::TAKEOVER_TOTAL,
    m::RESULT_WRITE_FAILURE_TOTAL,
    m::HEARTBEAT_LOST_TOTAL,
    m::FENCED_TOTAL,
    m::RESULT_LOST_TOTAL,
    m::COMMIT_REPLICAS_TOTAL,
    m::READONLY_REPLAY_TOTAL,
    m::UNKNOWN_ACTION_TOTAL,
    m::COORDINATION_ERROR_TOTAL,
    m::DISTRIBUTED_REQUEST_TOTAL,
    m::DISTRIBUTED_FAILURE_TOTAL,
    m::LOCAL_FALLBACK_TOTAL,
    m::FALLBACK_EXECUTION_TOTAL,
    m::EXECUTION_TOTAL,
    m::MISS_TOTAL,
    m::OWNER_FAILURE_TOTAL,
    m::BYPASS_TOTAL,
    m::FAIL_FAST_TOTAL,
    m::WAIT_FAILURE_TOTAL,
    m::DEGRADED,
    m::DEGRADED_DURATION,
    m::MODE,
    m::STALE_SERVED_TOTAL,
    m::REFRESH_TOTAL,
    m::STALE_AGE_SECONDS,
    m::HIT_FOR_PASS_TOTAL,
    breaker::CIRCUIT_OPEN_TOTAL,
    breaker::CIRCUIT_STATE,
    breaker::CIRCUIT_REJECTED_TOTAL,
    bulkhead::BULKHEAD_REJECTED_TOTAL,
    bulkhead::BULKHEAD_DEGRADED,
];

/// The `singleflight_*` names a file mentions.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("singleflight_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn check(path: &str, text: &str) -> BTreeSet<String> {
    let names = names_in(text);
    assert!(!names.is_empty(), "{path} mentions no metric");
    for name in &names {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| EMITTED.contains(b)))
            .unwrap_or(name);
        assert!(
            EMITTED.contains(&base),
            "{path} uses {name}, which flightdeck does not emit"
        );
    }
    names
}

#[test]
fn dashboard_uses_emitted_metric_names() {
    let names = check(
        "deploy/grafana/flightdeck.json",
        include_str!("../deploy/grafana/flightdeck.json"),
    );
    for needed in [
        m::REQUEST_TOTAL,
        m::EXECUTION_TOTAL,
        m::FOLLOWER_TOTAL,
        m::DEGRADED,
        breaker::CIRCUIT_STATE,
        "singleflight_wait_duration_bucket",
        "singleflight_execution_duration_bucket",
        m::STALE_SERVED_TOTAL,
        "singleflight_stale_age_seconds_bucket",
    ] {
        assert!(names.contains(needed), "the dashboard shows {needed}");
    }
    // Executions are counted, never derived from other counters.
    let dashboard = include_str!("../deploy/grafana/flightdeck.json");
    assert!(
        !dashboard.contains("singleflight_local_owner_total"),
        "no executions as requests minus followers"
    );
}

#[test]
fn alerts_use_emitted_metric_names_and_cover_the_silent_failures() {
    let names = check(
        "deploy/prometheus/alerts.yml",
        include_str!("../deploy/prometheus/alerts.yml"),
    );
    for needed in [
        m::DEGRADED,
        m::WAIT_TIMEOUT_TOTAL,
        m::RESULT_WRITE_FAILURE_TOTAL,
        m::RESULT_LOST_TOTAL,
        m::UNKNOWN_ACTION_TOTAL,
        m::STALE_SERVED_TOTAL,
    ] {
        assert!(names.contains(needed), "an alert watches {needed}");
    }
    check(
        "deploy/prometheus/alerts_test.yml",
        include_str!("../deploy/prometheus/alerts_test.yml"),
    );
}
