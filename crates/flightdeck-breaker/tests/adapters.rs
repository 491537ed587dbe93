//! The breaker, bulkhead and budget mounted in real axum and tonic servers
//! on loopback: their errors reach clients as HTTP 503 / 429 / 504 and
//! grpc-status UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED
//! (through `flightdeck_core::http::ErrorResponseLayer`), never as
//! connection or stream resets.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use flightdeck_breaker::{Breaker, BreakerConfig};
use flightdeck_budget::BudgetLayer;
use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
use flightdeck_core::http::ErrorResponseLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{Layer, Service, ServiceBuilder};

/// Delays every call of the inner service, so a budget can run out.
#[derive(Clone)]
struct Slow<S>(S, Duration);

impl<S, R> Service<R> for Slow<S>
where
    S: Service<R> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let fut = self.0.call(req);
        let delay = self.1;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            fut.await
        })
    }
}

#[derive(Clone)]
struct SlowLayer(Duration);

impl<S> Layer<S> for SlowLayer {
    type Service = Slow<S>;
    fn layer(&self, inner: S) -> Slow<S> {
        Slow(inner, self.0)
    }
}

async fn serve_axum(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// One HTTP/1.1 GET over a fresh loopback connection: (status, body).
async fn http_get(addr: SocketAddr) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

async fn handler() -> &'static str {
    tokio::time::sleep(Duration::from_millis(20)).await;
    "ok"
}

#[tokio::test]
async fn axum_breaker_open_is_503() {
    let breaker = Breaker::new("redis", BreakerConfig::default()).unwrap();
    let app = Router::new().route("/", get(handler)).layer(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(breaker.layer()),
    );
    let addr = serve_axum(app).await;
    assert_eq!(http_get(addr).await.0, 200);
    breaker.force_open();
    let (status, body) = http_get(addr).await;
    assert_eq!(status, 503);
    assert_eq!(body, "circuit open (breaker redis)\n");
}

#[tokio::test]
async fn axum_bulkhead_full_is_429() {
    let bulkhead = BulkheadLayer::from_config(BulkheadConfig::new(4).degraded_limit(0));
    let app = Router::new().route("/", get(handler)).layer(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(bulkhead.clone()),
    );
    let addr = serve_axum(app).await;
    assert_eq!(http_get(addr).await.0, 200);
    bulkhead.handle().set_degraded(true);
    let (status, body) = http_get(addr).await;
    assert_eq!(status, 429);
    assert_eq!(body, "bulkhead full\n");
}

#[tokio::test]
async fn axum_budget_exhausted_is_504() {
    let app = Router::new().route("/", get(handler)).layer(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(BudgetLayer::new(Duration::from_millis(50)))
            .layer(SlowLayer(Duration::from_secs(30))),
    );
    let addr = serve_axum(app).await;
    let (status, body) = http_get(addr).await;
    assert_eq!(status, 504);
    assert_eq!(body, "deadline exceeded (execution)\n");
}

/// Serves tonic's health service behind `layer`; returns a connected client.
async fn serve_tonic<L, ResBody>(layer: L) -> HealthClient<tonic::transport::Channel>
where
    L: Layer<tonic::service::Routes> + Clone + Send + Sync + 'static,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn tonic_breaker_open_is_unavailable() {
    let breaker = Breaker::new("redis", BreakerConfig::default()).unwrap();
    let mut client = serve_tonic(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(breaker.layer())
            .into_inner(),
    )
    .await;
    client
        .check(check())
        .await
        .expect("closed breaker lets calls through");
    breaker.force_open();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "circuit open (breaker redis)");
}

#[tokio::test]
async fn tonic_bulkhead_full_is_resource_exhausted() {
    let bulkhead = BulkheadLayer::from_config(BulkheadConfig::new(4).degraded_limit(0));
    let mut client = serve_tonic(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(bulkhead.clone())
            .into_inner(),
    )
    .await;
    client.check(check()).await.unwrap();
    bulkhead.handle().set_degraded(true);
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "bulkhead full");
}

#[tokio::test]
async fn tonic_budget_exhausted_is_deadline_exceeded() {
    // No grpc-timeout from the client here: tonic's server enforces that
    // header itself (answering CANCELLED), so the stage total is what runs
    // out. Reading grpc-timeout is covered by flightdeck-budget's tests.
    let mut client = serve_tonic(
        ServiceBuilder::new()
            .layer(ErrorResponseLayer::new())
            .layer(BudgetLayer::new(Duration::from_millis(100)))
            .layer(SlowLayer(Duration::from_secs(30)))
            .into_inner(),
    )
    .await;
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(status.message(), "deadline exceeded (execution)");
}
