//! A user's first hour: the one layer the README shows, the mistakes that
//! fail at build time (with the stage and the field), and a service that
//! runs without Redis.
#![cfg(all(feature = "http", feature = "testing"))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use flightdeck::config::ConfigError;
use flightdeck::core::http::ErrorResponseLayer;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::key::KeyLayer;
use flightdeck::testing::{body_text, MemoryBackend};
use flightdeck::{
    GenericSingleFlightLayer, Mode, SingleFlightConfig, SingleFlightLayer, StageConfig,
};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};

fn score_keys() -> HttpKeyExtractor {
    HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(64 * 1024))
        .build()
        .unwrap()
}

/// The layer over `score_keys()` whose stages run local-only by default.
fn local_by_default() -> SingleFlightLayer {
    SingleFlightLayer::builder()
        .keys(score_keys())
        .default_policy(StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap()
}

/// The handler: counts its runs, takes a while.
fn scoring(runs: &Arc<AtomicUsize>) -> Router {
    let runs = runs.clone();
    Router::new().route(
        "/v1/score",
        post(move |body: String| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                format!("score of {body}")
            }
        }),
    )
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_layer_as_the_readme_shows_coalesces_real_http_requests() {
    let runs = Arc::new(AtomicUsize::new(0));
    let flights = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap();
    let addr = serve(scoring(&runs).layer(flights)).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        calls.spawn(async move {
            let req = Request::post(format!("http://{addr}/v1/score"))
                .header("content-type", "text/plain")
                .body(Body::from("42"))
                .unwrap();
            let resp = client.request(req).await.unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        });
    }
    while let Some(done) = calls.join_next().await {
        let (status, body) = done.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"score of 42");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn invalid(err: &ConfigError) -> (Option<&str>, &str) {
    match err {
        ConfigError::Invalid { stage, field, .. } => (stage.as_deref(), field.as_ref()),
        other => panic!("expected an invalid value, got {other}"),
    }
}

#[test]
fn a_stage_the_key_rules_name_without_a_policy_is_a_build_error() {
    // A typo in the configuration: "scroe".
    let err = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("scroe", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap_err();
    assert_eq!(invalid(&err), (Some("score"), "stage"));
    assert!(err.to_string().contains("no policy"), "{err}");

    // The same from a config file.
    let cfg = SingleFlightConfig::default();
    let err = SingleFlightLayer::builder()
        .keys(score_keys())
        .config(cfg)
        .build()
        .unwrap_err();
    assert_eq!(invalid(&err), (Some("score"), "stage"));
}

#[test]
fn a_misspelt_stage_is_a_build_error_beside_a_default_policy_too() {
    // "scroe" is configured, the rules name "score": the default policy
    // (or the local-only switch's defaults) would run "score" and leave
    // the configured policy unused in silence.
    for local_only in [false, true] {
        let mut builder = SingleFlightLayer::builder()
            .keys(score_keys())
            .stage("scroe", StageConfig::new().mode(Mode::LocalOnly));
        builder = if local_only {
            builder.local_only()
        } else {
            builder.default_policy(StageConfig::new().mode(Mode::LocalOnly))
        };
        let err = builder.build().unwrap_err();
        assert_eq!(invalid(&err), (Some("score"), "stage"), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("\"scroe\"") && text.contains("typo"),
            "{text}"
        );
    }
    // A configured stage unlike any the rules name is no typo: it builds.
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("reports", StageConfig::new().mode(Mode::LocalOnly))
        .default_policy(StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::LocalOnly);
}

/// A request body that arrives `after` its head.
struct SlowBody {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    data: Option<bytes::Bytes>,
}

impl http_body::Body for SlowBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::ready!(std::future::Future::poll(self.sleep.as_mut(), cx));
        std::task::Poll::Ready(self.data.take().map(|d| Ok(http_body::Frame::data(d))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_requests_timeout_counts_from_its_head_not_from_its_hashed_body() {
    let runs = Arc::new(AtomicUsize::new(0));
    let flights = local_by_default();
    // The work takes 300 ms; the body comes 200 ms after the head, and the
    // caller gives the whole request 400 ms: it cannot be answered in time.
    let app = scoring(&runs).layer(flights);
    let start = tokio::time::Instant::now();
    let body = SlowBody {
        sleep: Box::pin(tokio::time::sleep(Duration::from_millis(200))),
        data: Some(bytes::Bytes::from_static(b"7")),
    };
    let resp = app
        .oneshot(
            Request::post("/v1/score")
                .header("x-request-timeout", "400ms")
                .body(Body::new(body))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_default_policy_is_an_explicit_choice() {
    let runs = Arc::new(AtomicUsize::new(0));
    let flights = local_by_default();
    assert_eq!(flights.stage("score").unwrap().mode(), Mode::LocalOnly);
    let app = scoring(&runs).layer(flights);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let req = Request::post("/v1/score").body(Body::from("7")).unwrap();
        calls.spawn(app.clone().oneshot(req));
    }
    while let Some(resp) = calls.join_next().await {
        assert_eq!(
            body_text(resp.unwrap().unwrap()).await.unwrap(),
            "score of 7"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unknown_stage_at_run_time_answers_with_a_body_naming_it() {
    // Layers composed by hand cannot check the rules against the stages:
    // the request is answered, naming the stage, and never bypassed.
    let runs = Arc::new(AtomicUsize::new(0));
    let flights = GenericSingleFlightLayer::http()
        .stage("scroe", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap();
    let app = scoring(&runs).layer(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(KeyLayer::new(score_keys()))
            .layer(flights),
    );
    let resp = app
        .oneshot(Request::post("/v1/score").body(Body::from("1")).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = body_text(resp).await.unwrap();
    assert!(body.contains("\"score\""), "{body}");
    assert!(body.contains("no policy"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn local_only_and_bypass_stages_need_no_backend() {
    // The config names a backend that is not registered: fine for stages
    // that do not coordinate, refused for those that do.
    let local = StageConfig::new().mode(Mode::LocalOnly).backend("redis");
    let bypass = StageConfig::new().mode(Mode::Bypass).backend("redis");
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", local.clone())
        .stage("other", bypass)
        .build()
        .unwrap();
    let handle = layer.stage("score").unwrap();
    // Without a backend, a distributed mode is refused, not half-applied.
    assert!(handle.set_mode(Mode::Hybrid).is_err());
    assert_eq!(handle.mode(), Mode::LocalOnly);
    assert!(layer
        .stage("other")
        .unwrap()
        .set_mode(Mode::LocalOnly)
        .is_ok());

    for mode in [Mode::Hybrid, Mode::DistributedOnly] {
        let err = SingleFlightLayer::builder()
            .keys(score_keys())
            .stage("score", local.clone().mode(mode))
            .build()
            .unwrap_err();
        assert_eq!(invalid(&err), (Some("score"), "backend"));
    }
    // Registered, it is used.
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .backend("redis", MemoryBackend::new())
        .stage("score", local.mode(Mode::Hybrid))
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::Hybrid);
}

#[cfg(feature = "toml")]
#[tokio::test(start_paused = true)]
async fn one_switch_runs_every_stage_local_only() {
    let cfg = SingleFlightConfig::from_toml(
        r#"
        [single-flight.stages.score]
        mode = "hybrid"
        backend = "redis"
        [single-flight.stages.search]
        mode = "distributed-only"
        backend = "redis"
        [single-flight.stages.off]
        mode = "bypass"
        "#,
    )
    .unwrap();
    let keys = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(1024))
        .route(Route::new(Method::GET, "/v1/search", "search"))
        .route(Route::new(Method::GET, "/v1/off", "off"))
        .build()
        .unwrap();
    let layer = SingleFlightLayer::builder()
        .keys(keys)
        .config(cfg)
        .local_only()
        .build()
        .unwrap();
    let mode = |s: &str| layer.stage(s).unwrap().mode();
    assert_eq!(
        (mode("score"), mode("search"), mode("off")),
        (Mode::LocalOnly, Mode::LocalOnly, Mode::Bypass)
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = scoring(&runs)
        .route(
            "/v1/search",
            get(move || {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "found"
                }
            }),
        )
        .layer(layer);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let req = Request::get("/v1/search").body(Body::empty()).unwrap();
        calls.spawn(app.clone().oneshot(req));
    }
    while let Some(resp) = calls.join_next().await {
        assert_eq!(body_text(resp.unwrap().unwrap()).await.unwrap(), "found");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
