//! Quickstart: 100 identical requests, one execution.
//!
//! An axum app whose slow "scoring" handler counts how often it really runs,
//! behind flightdeck's one layer (a LOCAL_ONLY stage). It binds a free loopback port, sends N
//! concurrent identical requests to itself over real HTTP, prints a summary
//! and exits. Needs no Redis.
//!
//! ```text
//! cargo run --example quickstart            # N = 100
//! cargo run --example quickstart -- 500     # N = 500
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use flightdeck::{BoxError, HttpKeyExtractor, Route, SingleFlightLayer};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // flightdeck's warnings (degraded mode, breaker transitions, fallbacks),
    // filtered by RUST_LOG (default info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => match arg.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(
                    format!("the request count must be a positive number, got {arg:?}").into(),
                )
            }
        },
        None => 100,
    };
    let s = run(n).await?;
    println!(
        "flightdeck quickstart: {n} concurrent GET /score over HTTP on {}",
        s.addr
    );
    println!(
        "  successful responses: {}/{n}, distinct bodies: {}",
        s.ok, s.distinct_bodies
    );
    println!(
        "  handler executions:   {} (without flightdeck: {n})",
        s.executions
    );
    println!("  wall time:            {:?}", s.elapsed);
    println!("requests={n} executions={}", s.executions);
    Ok(())
}

/// What one quickstart run observed.
#[derive(Debug)]
pub(crate) struct Summary {
    /// Where the app listened.
    pub(crate) addr: std::net::SocketAddr,
    /// Responses with a 2xx status.
    pub(crate) ok: usize,
    /// Distinct response bodies (1 when everybody shared one result).
    pub(crate) distinct_bodies: usize,
    /// How often the handler really ran.
    pub(crate) executions: usize,
    /// Wall time of the burst.
    pub(crate) elapsed: Duration,
}

/// Starts the app on a free loopback port and sends it `n` concurrent
/// identical requests over HTTP.
pub(crate) async fn run(n: usize) -> Result<Summary, BoxError> {
    // The expensive call: pretend it is a model that takes 500 ms.
    let executions = Arc::new(AtomicUsize::new(0));
    async fn score(State(executions): State<Arc<AtomicUsize>>) -> String {
        let nth = executions.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        format!("{{\"score\":0.93,\"execution\":{nth}}}")
    }

    // Key: the route decides the stage; method, path, normalized query and
    // the Accept* headers go into the digest, and requests carrying
    // credentials are scoped per user (secure by default).
    let keys = HttpKeyExtractor::builder()
        .route(Route::get("/score", "score"))
        .build()?;
    // The stages: every one in this process (no Redis), `score` with the
    // defaults.
    let flights = SingleFlightLayer::builder()
        .keys(keys)
        .local_only()
        .build()?;

    // One layer: keys, single-flight, and our errors as 503/504 responses.
    let app = Router::new()
        .route("/score", get(score))
        .with_state(executions.clone())
        .layer(flights);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let started = Instant::now();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let client = client.clone();
        let barrier = barrier.clone();
        let uri = format!("http://{addr}/score");
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let resp = client.get(uri.parse()?).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        }));
    }
    let mut ok = 0;
    let mut bodies = std::collections::BTreeSet::new();
    for t in tasks {
        let (status, body) = t.await??;
        if status.is_success() {
            ok += 1;
        }
        bodies.insert(body);
    }
    let elapsed = started.elapsed();
    server.abort();

    Ok(Summary {
        addr,
        ok,
        distinct_bodies: bodies.len(),
        executions: executions.load(Ordering::SeqCst),
        elapsed,
    })
}
