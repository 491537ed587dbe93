//! examples/loadgen.rs, small: 2 nodes × 4 callers × 20 keys for 3 s
//! against its own redis-server, with Redis frozen for 1 s in the middle.
//! It finishes, coalesces (fewer executions than requests) and writes its
//! SVG report. No timing is asserted.

#[allow(dead_code)]
#[path = "../examples/loadgen.rs"]
mod loadgen;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_with_a_fault_writes_its_report() {
    let out = std::env::temp_dir().join(format!("flightdeck-loadgen-{}.svg", std::process::id()));
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
    let summary = tokio::time::timeout(std::time::Duration::from_secs(60), loadgen::run(args))
        .await
        .expect("the run ends")
        .unwrap();
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
