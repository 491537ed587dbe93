//! An "AI scoring" service on axum with flightdeck in front of the model.
//!
//! `POST /v1/score` sends an answer to a (simulated) model that takes a
//! while and costs money per call. Users double-click, gateways retry, a
//! batch job re-submits: identical requests arriving together run the model
//! once and share the score. The stage policy comes from a configuration
//! file (`examples/flightdeck.toml`, or the file named by
//! `FLIGHTDECK_CONFIG`):
//!
//! - with `REDIS_URL` set, the `score` stage is HYBRID: duplicates are
//!   merged across every process that shares the Redis, and a Redis outage
//!   falls back to merging inside each process (logged, counted, and shown
//!   by `singleflight_degraded`);
//! - without it, the stage runs LOCAL_ONLY (no Redis needed).
//!
//! `GET /metrics` serves every flightdeck metric in the Prometheus text
//! format (`metrics-exporter-prometheus`, built without its HTTP listener
//! and TLS stack). `GET /v1/usage` tells how often the model really ran.
//!
//! `PUT /v1/model/down` makes the model fail (the scoring handler answers
//! 503 without calling it) until `PUT /v1/model/up`: with the stage's
//! `stale-if-error` and `stale-while-revalidate` keys on (see
//! `flightdeck.toml`), watch callers get the last good score meanwhile.
//!
//! ```text
//! cargo run -p flightdeck-examples --example axum           # LOCAL_ONLY on 127.0.0.1:3000
//! REDIS_URL=redis://<your-redis-host>:6379 cargo run -p flightdeck-examples --example axum
//! curl -s -XPOST localhost:3000/v1/score -H 'content-type: application/json' \
//!      -d '{"question":"q1","answer":"a tower layer"}'
//! curl -s localhost:3000/metrics | grep singleflight_
//! curl -s -XPUT localhost:3000/v1/model/down   # the model fails (503) until
//! curl -s -XPUT localhost:3000/v1/model/up
//! ```
//!
//! With `cache-status = true` in the stage's table, `curl -si` shows how
//! each answer came (`Cache-Status`, and `Age` on a stale one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use flightdeck::core::BoxError;
use flightdeck::distributed::FencingToken;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::redis::{RedisBackend, RedisConfig};
use flightdeck::{Mode, SingleFlightConfig, SingleFlightLayer};
use http::{header, Method, StatusCode};
use http_body_util::BodyExt;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The configuration file shipped with the example.
pub(crate) const DEFAULT_CONFIG: &str = include_str!("flightdeck.toml");

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging(std::io::stdout);
    let config = match std::env::var("FLIGHTDECK_CONFIG") {
        Ok(path) => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read FLIGHTDECK_CONFIG={path}: {e}"))?,
        Err(_) => DEFAULT_CONFIG.to_owned(),
    };
    let addr: SocketAddr = std::env::var("LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let node = run(Options {
        config,
        redis_url: std::env::var("REDIS_URL").ok(),
        listen: addr,
        ..Options::local(Duration::from_millis(1500))
    })
    .await?;
    println!(
        "AI scoring on http://{} (stage score: {}); POST /v1/score, GET /metrics, GET /v1/usage; Ctrl-C stops",
        node.addr,
        node.mode()
    );
    tokio::signal::ctrl_c().await?;
    println!(
        "model calls: {}, cost: ${:.3}",
        node.model.calls.load(Ordering::SeqCst),
        node.model.cost_micro_usd.load(Ordering::Relaxed) as f64 / 1e6
    );
    Ok(())
}

/// The log filter when `RUST_LOG` is unset: `info`, but the Redis client
/// (fred) at `error` only. fred logs every broken connection at `warn`
/// (`Broadcasting error … Connection closed`), once per connection and
/// reconnect attempt; during an outage flightdeck's own `warn` lines say
/// it once (stage degraded, breaker open) and name the stage. (fred logs
/// through `log`: its lines reach the subscriber through
/// `tracing-subscriber`'s `tracing-log` bridge, which `init` installs;
/// tests/fred_log_filter.rs shows the filter at work.)
pub(crate) const LOG_DEFAULT: &str = "info,fred=error";

/// Logs through `tracing-subscriber`, filtered by `RUST_LOG` (default
/// [`LOG_DEFAULT`]): flightdeck's warnings on entering and leaving
/// degraded mode, breaker transitions, mode switches. For example:
///
/// ```text
/// WARN flightdeck::stage: stage degraded: coordination breaker open; coalescing in this process only stage=score mode=hybrid bulkhead_limit=8
/// ```
pub(crate) fn init_logging<W>(writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_DEFAULT));
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .try_init();
}

/// How to start one node of the service.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The configuration file's text (TOML).
    pub(crate) config: String,
    /// Redis for HYBRID; `None` runs the stages LOCAL_ONLY.
    pub(crate) redis_url: Option<String>,
    /// How long the simulated model takes.
    pub(crate) model_latency: Duration,
    /// Where to listen (port 0 picks a free one).
    pub(crate) listen: SocketAddr,
}

impl Options {
    /// LOCAL_ONLY on a free loopback port with the shipped configuration.
    pub(crate) fn local(model_latency: Duration) -> Self {
        Self {
            config: DEFAULT_CONFIG.to_owned(),
            redis_url: None,
            model_latency,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// The expensive dependency: a model that scores an answer.
#[derive(Debug, Default)]
pub(crate) struct Model {
    latency: Duration,
    /// Real model calls.
    pub(crate) calls: AtomicU64,
    /// What they cost, in micro-dollars.
    pub(crate) cost_micro_usd: AtomicU64,
    /// Set by `PUT /v1/model/down`: the scoring handler answers 503.
    pub(crate) down: AtomicBool,
    /// Requests the handler refused with 503 while the model was down.
    pub(crate) refused: AtomicU64,
}

/// One call: $0.002.
const COST_PER_CALL_MICRO_USD: u64 = 2_000;

impl Model {
    async fn score(&self, answer: &[u8]) -> (u64, f64) {
        let nth = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.cost_micro_usd
            .fetch_add(COST_PER_CALL_MICRO_USD, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        // A stand-in for the model's judgement: stable for a given answer.
        let h = answer.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        });
        (nth, (h % 1000) as f64 / 100.0)
    }
}

/// The flightdeck layer of this service (its stage handles are the kill
/// switch and the breaker's controls).
pub(crate) type FlightLayer = SingleFlightLayer;

/// The largest answer the service accepts, and hashes into the key.
const MAX_BODY: usize = 64 * 1024;

/// How long a starting node waits for Redis before it serves without it.
const REDIS_WAIT: Duration = Duration::from_secs(1);

/// A running node.
#[derive(Debug)]
pub(crate) struct Node {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Its model (call and cost counters).
    pub(crate) model: Arc<Model>,
    /// Its flightdeck layer.
    pub(crate) flights: FlightLayer,
    /// The server task.
    pub(crate) server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Node {
    /// The `score` stage's current mode.
    pub(crate) fn mode(&self) -> Mode {
        self.flights
            .stage("score")
            .map_or(Mode::Bypass, |s| s.mode())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts one node: loads the configuration, connects to Redis when a URL
/// is given, binds and serves.
pub(crate) async fn run(opts: Options) -> Result<Node, BoxError> {
    let config = SingleFlightConfig::from_toml(&opts.config)?;
    // The key: the route names the stage, the JSON body (up to 64 KiB) is
    // hashed, `Accept*` headers count, and requests with credentials are
    // scoped per user (two users never share a score).
    let keys = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(MAX_BODY))
        .build()?;
    // The stages, and the file's key settings (`[single-flight.keys]`:
    // leave the host name out, the scope secret's variable).
    let mut flights = SingleFlightLayer::builder().keys(keys).config(config);
    flights = match &opts.redis_url {
        Some(url) => {
            // Created even while Redis is down: the node then starts
            // degraded (HYBRID serves from this process, DISTRIBUTED_ONLY
            // fails fast) and goes distributed once Redis answers.
            let backend = RedisBackend::new(RedisConfig::new(url.clone()))?;
            if let Err(e) = backend.ready(REDIS_WAIT).await {
                eprintln!("starting without Redis for now: {e}");
            }
            flights.backend("redis", backend)
        }
        // No Redis: every distributed stage runs in this process only.
        None => flights.local_only(),
    };
    let flights = flights.build()?;
    let model = Arc::new(Model {
        latency: opts.model_latency,
        ..Model::default()
    });
    let app = app(flights.clone(), model.clone());
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(Node {
        addr,
        model,
        flights,
        server,
    })
}

/// The router: the scoring route behind flightdeck, metrics and usage
/// beside it.
pub(crate) fn app(flights: FlightLayer, model: Arc<Model>) -> Router {
    let metrics = prometheus();
    // One layer: keys, single-flight, and our errors as responses (503
    // coordination down in DISTRIBUTED_ONLY, 429 bulkhead full, 504
    // timeouts).
    let scoring = Router::new()
        .route("/v1/score", post(score))
        .with_state(model.clone())
        .layer(flights);
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics {
                        Some(h) => (
                            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                            h.render(),
                        )
                            .into_response(),
                        None => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "another metrics recorder is installed",
                        )
                            .into_response(),
                    }
                }
            }),
        )
        .route("/v1/usage", get(usage))
        .route("/v1/model/down", put(model_down))
        .route("/v1/model/up", put(model_up))
        .with_state(model)
        .merge(scoring)
}

/// The Prometheus recorder, installed once per process. Histograms get
/// buckets (wait and execution latencies are seconds, from sub-millisecond
/// replays to minute-long reports).
pub(crate) fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            const BUCKETS: [f64; 14] = [
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
            ];
            const STALE_AGE_BUCKETS: [f64; 10] =
                [0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_duration".to_owned()), &BUCKETS)
                .ok()?
                // The age of stale answers: up to the replay TTL plus a
                // stale-if-error window (minutes).
                .set_buckets_for_metric(
                    Matcher::Full("singleflight_stale_age_seconds".to_owned()),
                    &STALE_AGE_BUCKETS,
                )
                .ok()?
                .install_recorder()
                .ok()?;
            // Without the exporter's HTTP listener, upkeep (draining
            // histogram buffers) is ours to run.
            let h = handle.clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                h.run_upkeep();
            });
            Some(handle)
        })
        .clone()
}

/// `POST /v1/score`: the expensive call. Runs once per flight.
async fn score(State(model): State<Arc<Model>>, req: Request) -> Response {
    // The owner of a distributed flight gets a fencing token: a real
    // service would pass `generation` along with its writes.
    let generation = req.extensions().get::<FencingToken>().map(|t| t.generation);
    // Bounded: a body over the key's cap is not coalesced and reaches the
    // handler as it came, so the handler bounds it too.
    let answer = match axum::body::to_bytes(Body::new(req.into_body()), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the answer is over 64 KiB, or unreadable",
            )
                .into_response()
        }
    };
    if model.down.load(Ordering::SeqCst) {
        model.refused.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            "the model is down (PUT /v1/model/up brings it back)",
        )
            .into_response();
    }
    let (execution, score) = model.score(&answer).await;
    let mut resp = (
        [(header::CONTENT_TYPE, "application/json")],
        format!(
            "{{\"score\":{score:.2},\"model\":\"grader-v3\",\"execution\":{execution},\"cost_usd\":0.002}}"
        ),
    )
        .into_response();
    if let Some(g) = generation {
        resp.headers_mut().insert("x-flight-generation", g.into());
    }
    resp
}

/// `GET /v1/usage`: how often the model really ran, what it cost, and
/// how many requests found it down.
async fn usage(State(model): State<Arc<Model>>) -> String {
    let calls = model.calls.load(Ordering::SeqCst);
    let cost = model.cost_micro_usd.load(Ordering::Relaxed) as f64 / 1e6;
    let refused = model.refused.load(Ordering::SeqCst);
    let down = model.down.load(Ordering::SeqCst);
    format!(
        "{{\"model_calls\":{calls},\"cost_usd\":{cost:.3},\"model_down\":{down},\"refused_while_down\":{refused}}}\n"
    )
}

/// `PUT /v1/model/down`: from now on the scoring handler answers 503
/// (as a provider's outage would) without calling the model.
async fn model_down(State(model): State<Arc<Model>>) -> &'static str {
    model.down.store(true, Ordering::SeqCst);
    "model down: POST /v1/score answers 503 until PUT /v1/model/up\n"
}

/// `PUT /v1/model/up`: the model answers again.
async fn model_up(State(model): State<Arc<Model>>) -> &'static str {
    model.down.store(false, Ordering::SeqCst);
    "model up\n"
}

/// Sends one scoring request; returns the status and the body.
#[allow(dead_code)] // used by the tests
pub(crate) async fn score_once(
    client: &HttpClient,
    addr: SocketAddr,
    answer: &str,
) -> Result<(StatusCode, bytes::Bytes), BoxError> {
    // Every node is reached under the service's one name (as behind a
    // load balancer): the authority is part of the key.
    score_as(client, addr, Some("scoring.internal"), answer).await
}

/// A test client.
#[allow(dead_code)] // used by the tests
pub(crate) type HttpClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// Sends one scoring request with the given `Host` (`None`: the node's own
/// address, as a client that reaches it directly); returns the status and
/// the body.
#[allow(dead_code)] // used by the tests
pub(crate) async fn score_as(
    client: &HttpClient,
    addr: SocketAddr,
    host: Option<&str>,
    answer: &str,
) -> Result<(StatusCode, bytes::Bytes), BoxError> {
    let mut req = http::Request::post(format!("http://{addr}/v1/score"))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(host) = host {
        req = req.header(header::HOST, host);
    }
    let req = req.body(Body::from(format!(
        "{{\"question\":\"q1\",\"answer\":{answer:?}}}"
    )))?;
    let resp = client.request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
