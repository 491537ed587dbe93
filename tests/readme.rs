//! The README's "Testing your service" snippet, run as it is written
//! there (the test below checks the README still shows exactly this code).
#![cfg(feature = "testing")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use flightdeck::core::BoxError;
use flightdeck::key::http::HttpKeyExtractor;
use flightdeck::testing::{body_text, MemoryBackend};
use flightdeck::{Mode, SingleFlightLayer, StageConfig};
use http::Request;
use tokio::task::JoinSet;
use tower::ServiceExt;

// README:begin
#[tokio::test(start_paused = true)]
async fn fifty_calls_one_execution() -> Result<(), BoxError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let keys = HttpKeyExtractor::builder()
        .default_stage("report")
        .build()?;
    let hybrid = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    let flights = SingleFlightLayer::http(keys)
        .stage("report", hybrid)
        .backend("mem", MemoryBackend::new())
        .build()?;
    let report = get(move || async move {
        counter.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        "the report"
    });
    let app = Router::new().route("/report", report).layer(flights);
    let mut calls = JoinSet::new();
    for _ in 0..50 {
        let req = Request::get("/report").body(Body::empty())?;
        calls.spawn(app.clone().oneshot(req));
    }
    while let Some(resp) = calls.join_next().await {
        assert_eq!(body_text(resp??).await?, "the report");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}
// README:end

#[test]
fn the_readme_shows_this_code() {
    let me = include_str!("readme.rs");
    let begin = me.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = me.find("// README:end").unwrap();
    let readme = include_str!("../README.md");
    assert!(
        readme.contains(&me[begin..end]),
        "README.md's testing snippet differs from tests/readme.rs"
    );
}
