//! A key of fields (what the HTTP extractor makes: the request's encoded
//! fields, hashed only when the digest is asked for) owns its bytes on the
//! heap: every flight must free them when it ends. Counted with an
//! instrumented global allocator, so this binary holds this one test (the
//! count is process-wide).

#![cfg(feature = "http")]

use std::alloc::System;

use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::{Mode, SingleFlightLayer, StageConfig};
use http::Request;
use http_body_util::BodyExt;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::ServiceExt;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

async fn requests(app: &Router, from: u32, n: u32) {
    for i in from..from + n {
        let req = Request::get(format!("/item/{i}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert!(resp.status().is_success());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, i.to_string());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_local_flight_frees_its_key_when_it_ends() {
    let keys = HttpKeyExtractor::builder()
        .route(Route::get("/item/{id}", "item"))
        .build()
        .unwrap();
    let layer = SingleFlightLayer::builder()
        .keys(keys)
        .stage("item", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/item/{id}", get(|Path(id): Path<String>| async { id }))
        .layer(layer);
    // Warm: the maps and the runtime have their capacity.
    requests(&app, 0, 100).await;
    let region = Region::new(GLOBAL);
    let n = 400;
    requests(&app, 100, n).await;
    let change = region.change();
    let kept = change.allocations as i64 - change.deallocations as i64;
    // Every request's key is a fresh one: a key kept by a finished flight
    // leaves at least one block per request behind.
    assert!(
        kept < i64::from(n) / 4,
        "{kept} blocks still allocated after {n} finished flights ({change:?})"
    );
}
