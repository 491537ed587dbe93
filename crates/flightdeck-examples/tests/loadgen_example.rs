//! examples/loadgen.rs, small: 2 nodes × 4 callers × 20 keys for a few
//! seconds against its own redis-server, with Redis frozen or the model
//! failing for a window in the middle; and a churn of distinct keys
//! without Redis. The runs finish and count what they must; no timing is
//! asserted.

#[allow(dead_code)]
#[path = "../examples/loadgen.rs"]
mod loadgen;

use std::time::Duration;

fn out(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "flightdeck-loadgen-{name}-{}.svg",
        std::process::id()
    ))
}

async fn run(args: loadgen::Args) -> loadgen::Summary {
    tokio::time::timeout(Duration::from_secs(60), loadgen::run(args))
        .await
        .expect("the run ends")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_with_a_fault_writes_its_report() {
    let out = out("fault");
    let args = loadgen::Args {
        nodes: 2,
        concurrency: 4,
        keys: 20,
        duration: 3,
        latency_ms: 20,
        fault: true,
        fault_at: 1,
        fault_for: 1,
        out: out.to_string_lossy().into_owned(),
        ..loadgen::Args::default()
    };
    let summary = run(args).await;
    assert!(summary.requests > 0);
    assert!(summary.executions > 0);
    assert!(
        summary.executions < summary.requests,
        "duplicates were merged: {summary:?}"
    );
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(
        svg.starts_with("<svg"),
        "an SVG: {}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.contains("executions in local fallback"));
    let _ = std::fs::remove_file(&out);
}

/// The model fails from 1.5 s to 3 s: the summary has a row per phase, the
/// failures fall in the window, and they are told apart by whether the key
/// had been answered before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_window_is_reported_per_phase() {
    let out = out("fail");
    let args = loadgen::Args {
        nodes: 2,
        concurrency: 4,
        keys: 20,
        duration: 4,
        latency_ms: 20,
        result_ttl_ms: 300,
        fail_at: Some(Duration::from_millis(1500)),
        fail_for: Duration::from_millis(1500),
        out: out.to_string_lossy().into_owned(),
        ..loadgen::Args::default()
    };
    let s = run(args).await;
    let names: Vec<&str> = s.phases.iter().map(|p| p.name).collect();
    assert_eq!(names, ["before", "during", "after"], "{s:?}");
    let [before, during, after] = &s.phases[..] else {
        unreachable!()
    };
    assert!(before.requests > 0 && during.requests > 0 && after.requests > 0);
    // A request counts in the phase it started in: one that started just
    // before the window may meet the failing model, and one that started
    // just after it may still join a flight that failed in it; each
    // caller has one request out at a time.
    let callers = 2 * 4;
    assert!(before.failed <= callers, "{before:?}");
    assert!(after.failed <= callers, "{after:?}");
    assert!(during.failed > 0, "the model failed: {during:?}");
    assert!(
        during.failed_had_result > 0 && during.failed_had_result <= during.failed,
        "hot keys had answers before the window: {during:?}"
    );
    assert!(during.failed_node_had_result <= during.failed_had_result);
    assert!(during.max_executions_per_key >= 1);
    // Nothing serves stale on this stage: no window is on.
    assert_eq!(before.stale + during.stale + after.stale, 0, "{s:?}");
    // Every error is counted in the phase its request started in.
    assert_eq!(s.errors, before.failed + during.failed + after.failed);
    // The replay TTL (300 ms) expires keys during the run: they ran again.
    assert!(s.refreshes.expiries > 20, "{:?}", s.refreshes);
    assert!(s.hit_p99_ns > 0 && s.warm_p99_ns > 0);
    let line = s.line();
    assert!(line.contains("during_failed_had_result="), "{line}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains("model failing") && svg.contains("stale answers"));
    let _ = std::fs::remove_file(&out);
}

/// `--churn N --local-only`: N requests, each to a key of its own, and no
/// Redis; every key runs once and the RSS is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_runs_every_key_once_without_redis() {
    let out = out("churn");
    let args = loadgen::Args {
        nodes: 1,
        concurrency: 8,
        duration: 30,
        latency_ms: 0,
        local_only: true,
        churn: Some(5_000),
        out: out.to_string_lossy().into_owned(),
        ..loadgen::Args::default()
    };
    let s = run(args).await;
    assert_eq!(s.requests, 5_000, "{s:?}");
    assert_eq!(s.errors, 0);
    assert_eq!(s.phases[0].keys_executed, 5_000);
    assert_eq!(s.phases[0].max_executions_per_key, 1);
    if cfg!(target_os = "linux") {
        assert!(s.rss_kib.0 > 0 && s.rss_kib.1 > 0, "{s:?}");
    }
    let _ = std::fs::remove_file(&out);
}

#[test]
fn durations_and_stage_keys_are_read_or_refused_by_name() {
    let ms = Duration::from_millis(1);
    assert_eq!(
        loadgen::parse_duration("200ms", ms),
        Ok(Duration::from_millis(200))
    );
    assert_eq!(
        loadgen::parse_duration("1m30s", ms),
        Ok(Duration::from_secs(90))
    );
    assert_eq!(
        loadgen::parse_duration("250", ms),
        Ok(Duration::from_millis(250))
    );
    assert_eq!(
        loadgen::parse_duration("3", Duration::from_secs(1)),
        Ok(Duration::from_secs(3))
    );
    assert!(loadgen::parse_duration("3h", ms).is_err());
    assert!(loadgen::parse_duration("s", ms).is_err());

    let args = loadgen::Args {
        stage: vec![("no-such-key".to_owned(), "\"5s\"".to_owned())],
        ..loadgen::Args::default()
    };
    let err = loadgen::stage_config(&args).unwrap_err().to_string();
    assert!(err.contains("no-such-key"), "{err}");
    let args = loadgen::Args {
        stage: vec![("wait-timeout".to_owned(), "\"5s\"".to_owned())],
        ..loadgen::Args::default()
    };
    loadgen::stage_config(&args).unwrap();
}

/// `--split` with grace on: expiries are answered stale, and the summary
/// carries the stale answers' p99 and the hits' on the same timeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_run_reports_stale_answers_against_hits() {
    let out = out("split");
    let args = loadgen::Args {
        nodes: 2,
        concurrency: 4,
        keys: 20,
        duration: 3,
        // Longer than the slack within which an answer still counts as
        // a hit: expiries are answered stale while it runs.
        latency_ms: 200,
        result_ttl_ms: 300,
        stage: vec![("stale-while-revalidate".to_owned(), "\"10s\"".to_owned())],
        split: true,
        out: out.to_string_lossy().into_owned(),
        ..loadgen::Args::default()
    };
    let s = run(args).await;
    let stale: u64 = s.phases.iter().map(|p| p.stale).sum();
    assert!(stale > 0, "expiries answered stale: {s:?}");
    let (stale_p99, hit_p99) = s.split.expect("--split measures");
    assert!(stale_p99 > 0 && hit_p99 > 0, "{s:?}");
    assert!(s.line().contains(" stale_p99_us="), "{}", s.line());
    let _ = std::fs::remove_file(&out);
}
