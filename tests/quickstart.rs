//! The quickstart, run as a test: a burst of identical requests over real
//! HTTP (axum + hyper on loopback) executes the handler once.

#[allow(dead_code)]
#[path = "../examples/quickstart.rs"]
mod quickstart;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_http_executes_once() {
    let s = quickstart::run(50).await.unwrap();
    assert_eq!(s.ok, 50, "every request succeeded");
    assert_eq!(s.distinct_bodies, 1, "everybody got the same body");
    assert_eq!(s.executions, 1);
}
