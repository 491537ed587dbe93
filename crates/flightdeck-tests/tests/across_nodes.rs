//! Two nodes of one service, each reached on its own port, over one
//! Redis: identical requests spread across them run the work once. The
//! port is not part of the key (nginx's `$host`), so nothing in the
//! configuration has to say that the nodes are one service.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::{Mode, SingleFlightLayer, StageConfig};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// One node: its own layer and backend connection, its own server on a
/// free loopback port, the shared run counter.
async fn node(redis: &RedisServer, runs: &Arc<AtomicUsize>) -> SocketAddr {
    let keys = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(64 * 1024))
        .scope_secret("across-nodes-test-secret")
        .build()
        .unwrap();
    let backend = RedisBackend::new(RedisConfig::new(redis.url())).unwrap();
    backend
        .ready(Duration::from_secs(5))
        .await
        .expect("the test's Redis answers");
    let flights = SingleFlightLayer::builder()
        .keys(keys)
        .stage(
            "score",
            StageConfig::new().mode(Mode::Hybrid).backend("redis"),
        )
        .backend("redis", backend)
        .build()
        .unwrap();
    let runs = runs.clone();
    let app = Router::new()
        .route(
            "/v1/score",
            post(move |body: String| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    format!("score of {body}")
                }
            }),
        )
        .layer(flights);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_two_ports_run_fifty_identical_requests_once() {
    let redis = RedisServer::start().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let nodes = [node(&redis, &runs).await, node(&redis, &runs).await];
    assert_ne!(nodes[0].port(), nodes[1].port());

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..50 {
        let (client, barrier) = (client.clone(), barrier.clone());
        // Each request names the node it reached, port included, as a
        // client does.
        let addr = nodes[i % 2];
        calls.spawn(async move {
            let req = Request::post(format!("http://{addr}/v1/score"))
                .header("content-type", "text/plain")
                .body(Body::from("42"))
                .unwrap();
            barrier.wait().await;
            let resp = client.request(req).await.unwrap();
            let status = resp.status();
            (status, resp.into_body().collect().await.unwrap().to_bytes())
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        let mut all = Vec::new();
        while let Some(done) = calls.join_next().await {
            all.push(done.unwrap());
        }
        all
    })
    .await
    .expect("every request answered within 30 s");
    for (status, body) in all {
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"score of 42");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one execution across both nodes"
    );
}
