//! The README's snippets, run as they are written there (the tests below
//! check the README still shows exactly this code): "Testing your service",
//! and the app function that names the layer in its signature. The front
//! page of the crate docs leads with the README's axum snippet.
#![cfg(all(feature = "testing", feature = "toml"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use flightdeck::testing::MemoryBackend;
use flightdeck::{BoxError, HttpKeyExtractor, Route, SingleFlightConfig, SingleFlightLayer};
use http::Request;
use tokio::task::JoinSet;
use tower::ServiceExt;

// README:begin
#[tokio::test(start_paused = true)]
async fn fifty_calls_one_execution() -> Result<(), BoxError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let keys = HttpKeyExtractor::builder()
        .route(Route::get("/report", "report"))
        .build()?;
    // The service's own configuration, an in-memory backend under its
    // Redis backend's name.
    let config = SingleFlightConfig::from_toml(
        r#"
        [single-flight.stages.report]
        mode = "hybrid"
        backend = "redis"
        "#,
    )?;
    let flights = SingleFlightLayer::builder()
        .keys(keys)
        .config(config)
        .backend("redis", MemoryBackend::new())
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
        let body = axum::body::to_bytes(resp??.into_body(), 1024).await?;
        assert_eq!(&body[..], b"the report");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}
// README:end

/// The README's "name the layer" snippet (its `use` lines are the
/// module's).
mod named {
    // README:app:begin
    use axum::{routing::get, Router};
    use flightdeck::SingleFlightLayer;

    fn app(flights: SingleFlightLayer) -> Router {
        Router::new()
            .route("/report", get(|| async { "the report" }))
            .layer(flights)
    }
    // README:app:end

    /// The HTTP layer is nameable in a signature, and the app it builds
    /// coalesces.
    #[tokio::test(start_paused = true)]
    async fn an_app_function_takes_the_layer_by_name() -> Result<(), super::BoxError> {
        use super::*;
        let keys = HttpKeyExtractor::builder()
            .route(Route::get("/report", "report"))
            .build()?;
        let flights: SingleFlightLayer = SingleFlightLayer::builder()
            .keys(keys)
            .local_only()
            .build()?;
        let app = app(flights.clone());
        let resp = app
            .oneshot(Request::get("/report").body(Body::empty())?)
            .await?;
        let body = axum::body::to_bytes(resp.into_body(), 1024).await?;
        assert_eq!(&body[..], b"the report");
        assert_eq!(
            flights.stage("report").map(|s| s.mode()),
            Some(flightdeck::Mode::LocalOnly)
        );
        Ok(())
    }
}

/// The code between two markers of this file.
fn marked(begin: &str, end: &str) -> String {
    let me = include_str!("readme.rs");
    let from = me.find(begin).unwrap() + begin.len();
    let to = me.find(end).unwrap();
    // The app snippet sits in a module: the README shows it unindented.
    me[from..to]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_readme_shows_this_code() {
    let readme = include_str!("../README.md");
    let testing = include_str!("readme.rs");
    let begin = testing.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = testing.find("// README:end").unwrap();
    assert!(
        readme.contains(&testing[begin..end]),
        "README.md's testing snippet differs from tests/readme.rs"
    );
    let app = marked("// README:app:begin\n", "    // README:app:end");
    assert!(
        readme.contains(&format!("```rust\n{app}```")),
        "README.md's app snippet differs from tests/readme.rs:\n{app}"
    );
}

/// The crate docs' front page opens with the README's axum snippet.
#[test]
fn the_front_page_leads_with_the_readme_snippet() {
    let readme = include_str!("../README.md");
    let from = readme.find("```rust,no_run\nuse axum").unwrap() + "```rust,no_run\n".len();
    let to = from + readme[from..].find("```").unwrap();
    let snippet = &readme[from..to];
    let lib: String = include_str!("../src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    assert!(
        lib.contains(snippet),
        "src/lib.rs's front page does not show README.md's axum snippet"
    );
    // It comes first: in the page's first code block.
    let first = lib.find("```").unwrap();
    let first_end = first + 3 + lib[first + 3..].find("```").unwrap();
    let at = lib.find(snippet).unwrap();
    assert!(
        first < at && at < first_end,
        "the axum snippet is not the first example"
    );
}
