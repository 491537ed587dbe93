//! The facade over HTTP services: the owner's fencing token reaches the
//! handler through the request extensions, waiters get the same buffered
//! response, and a DISTRIBUTED_ONLY stage with an open breaker answers 503
//! through `ErrorResponseLayer`. Against a real `redis-server`.

#![cfg(feature = "http")]

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{fast, metrics_on, redis_backend};
use flightdeck::core::error::{BoxError, BulkheadFull};
use flightdeck::core::http::ErrorResponseLayer;
use flightdeck::core::{FlightKey, StageName};
use flightdeck::distributed::FencingToken;
use flightdeck::{GenericSingleFlightLayer, Mode};
use flightdeck_harness::RedisServer;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, ServiceBuilder, ServiceExt};

fn request(stage: &str, path: &str) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .uri(path)
        .body(Full::new(Bytes::new()))
        .unwrap();
    req.extensions_mut()
        .insert(FlightKey::from_bytes(StageName::new(stage).unwrap(), path));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sees_its_fencing_token_and_every_caller_the_same_body() {
    metrics_on();
    let redis = RedisServer::start().unwrap();
    let layer = GenericSingleFlightLayer::http()
        .backend("redis", redis_backend(redis.url()).await)
        .stage("http-fence", fast(Mode::Hybrid))
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = {
        let seen = seen.clone();
        service_fn(move |req: Request<Full<Bytes>>| {
            let generation = req.extensions().get::<FencingToken>().map(|t| t.generation);
            seen.lock().unwrap().push(generation);
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"report"))))
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new())
        .layer(layer)
        .service(inner);

    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let svc = svc.clone();
        set.spawn(async move {
            let resp = svc.oneshot(request("http-fence", "/r/1")).await.unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        });
    }
    while let Some(r) = set.join_next().await {
        let (status, body) = r.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"report");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one execution");
    assert!(matches!(seen[0], Some(g) if g >= 1), "fenced: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_with_an_open_breaker_answers_503() {
    metrics_on();
    let redis = RedisServer::start().unwrap();
    let layer = GenericSingleFlightLayer::http()
        .backend("redis", redis_backend(redis.url()).await)
        .stage("http-open", fast(Mode::DistributedOnly))
        .build()
        .unwrap();
    layer.stage("http-open").unwrap().breaker().force_open();
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new())
        .layer(layer)
        .service(service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"never"))))
        }));

    let resp = svc
        .clone()
        .oneshot(request("http-open", "/r/2"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The same over gRPC: a trailers-only answer with UNAVAILABLE (14),
    // never a stream reset.
    let mut grpc = request("http-open", "/pkg.Svc/Method");
    grpc.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    let resp = svc.oneshot(grpc).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["grpc-status"], "14");
    assert_eq!(redis.command_calls("eval").unwrap(), 0);
}

/// A failure cached by one node answers on another with the owner's
/// status: the owner's work fails with a full bulkhead (429 /
/// `RESOURCE_EXHAUSTED`), and a node that follows its flight, or replays
/// the cached failure later, answers 429 too, never a 500, without
/// running the work itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_cached_by_one_node_answers_with_its_status_on_another() {
    metrics_on();
    let redis = RedisServer::start().unwrap();
    let stage = "http-cached-fail";
    let mut cfg = fast(Mode::Hybrid);
    cfg.failure_ttl = Duration::from_secs(10);
    let layer = |backend| {
        GenericSingleFlightLayer::http()
            .backend("redis", backend)
            .stage(stage, cfg.clone())
            .build()
            .unwrap()
    };
    let owner = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new())
        .layer(layer(redis_backend(redis.url()).await))
        .service(service_fn(|_req: Request<Full<Bytes>>| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Err::<Response<Full<Bytes>>, BoxError>(Box::new(BulkheadFull::new(None)))
        }));
    let ran = Arc::new(Mutex::new(0));
    let other = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new())
        .layer(layer(redis_backend(redis.url()).await))
        .service(service_fn({
            let ran = ran.clone();
            move |_req: Request<Full<Bytes>>| {
                *ran.lock().unwrap() += 1;
                async { Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ran")))) }
            }
        }));

    let owned = tokio::spawn(owner.oneshot(request(stage, "/busy")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let followed = other
        .clone()
        .oneshot(request(stage, "/busy"))
        .await
        .unwrap();
    assert_eq!(
        followed.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the follower"
    );
    let owned = owned.await.unwrap().unwrap();
    assert_eq!(owned.status(), StatusCode::TOO_MANY_REQUESTS, "the owner");

    // Later, the cached failure replayed: over HTTP, and over gRPC with
    // RESOURCE_EXHAUSTED (8).
    let replayed = other
        .clone()
        .oneshot(request(stage, "/busy"))
        .await
        .unwrap();
    assert_eq!(replayed.status(), StatusCode::TOO_MANY_REQUESTS, "a hit");
    let mut grpc = request(stage, "/busy");
    grpc.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    let replayed = other.oneshot(grpc).await.unwrap();
    assert_eq!(replayed.headers()["grpc-status"], "8", "a hit over gRPC");
    assert_eq!(*ran.lock().unwrap(), 0, "never run on the other node");
}
