//! A gRPC summarization service on tonic with flightdeck in front.
//!
//! The service, written out by hand instead of generated (no `protoc`
//! needed; the messages derive `prost::Message`):
//!
//! ```proto
//! package flightdeck.example.v1;
//! service Summarizer {
//!   // Slow and paid per call: identical concurrent calls are coalesced.
//!   rpc Summarize(SummarizeRequest) returns (Summary);
//!   // Server streaming: passed through untouched, never coalesced.
//!   rpc StreamSummary(SummarizeRequest) returns (stream SummaryChunk);
//! }
//! message SummarizeRequest { string document = 1; uint32 max_words = 2; }
//! message Summary { string text = 1; uint64 execution = 2; }
//! message SummaryChunk { uint32 index = 1; string text = 2; }
//! ```
//!
//! One layer sits on `Server::builder().layer(..)`:
//! `SingleFlightLayer::builder().keys(keys)` — our errors become trailers-only
//! responses with a real `grpc-status` (UNAVAILABLE, RESOURCE_EXHAUSTED,
//! DEADLINE_EXCEEDED), only the allowlisted unary method is keyed (by its
//! message bytes), and shared responses keep their trailers, where gRPC
//! puts `grpc-status`.
//!
//! The stage policy is the `summarize` stage of the same configuration
//! file as the axum example (`examples/flightdeck.toml`, or the file named
//! by `FLIGHTDECK_CONFIG`), so every mode and `on-wait-failure` policy can
//! be tried over gRPC. Without `REDIS_URL` every stage runs LOCAL_ONLY.
//!
//! ```text
//! cargo run -p flightdeck-examples --example tonic        # LOCAL_ONLY on 127.0.0.1:50051
//! REDIS_URL=redis://<your-redis-host>:6379 cargo run -p flightdeck-examples --example tonic
//! curl -s 127.0.0.1:9464/metrics | grep singleflight_            # Prometheus
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck::core::http::FlightBody;
use flightdeck::core::BoxError;
use flightdeck::key::grpc::GrpcKeyExtractor;
use flightdeck::redis::{RedisBackend, RedisConfig};
use flightdeck::{Mode, SingleFlightConfig, SingleFlightLayer};
use http::uri::PathAndQuery;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::{service_fn, ServiceBuilder};

/// `flightdeck.example.v1.SummarizeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummarizeRequest {
    /// The text to summarize.
    #[prost(string, tag = "1")]
    pub(crate) document: String,
    /// The longest summary wanted.
    #[prost(uint32, tag = "2")]
    pub(crate) max_words: u32,
}

/// `flightdeck.example.v1.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    /// The summary.
    #[prost(string, tag = "1")]
    pub(crate) text: String,
    /// Which model call produced it (1 = the first).
    #[prost(uint64, tag = "2")]
    pub(crate) execution: u64,
}

/// `flightdeck.example.v1.SummaryChunk`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryChunk {
    /// Position in the stream.
    #[prost(uint32, tag = "1")]
    pub(crate) index: u32,
    /// One word of the summary.
    #[prost(string, tag = "2")]
    pub(crate) text: String,
}

/// The service's name.
pub(crate) const SERVICE: &str = "flightdeck.example.v1.Summarizer";
/// The unary method's path.
pub(crate) const SUMMARIZE: &str = "/flightdeck.example.v1.Summarizer/Summarize";
/// The server-streaming method's path.
pub(crate) const STREAM_SUMMARY: &str = "/flightdeck.example.v1.Summarizer/StreamSummary";

/// The configuration file shipped with the examples.
pub(crate) const DEFAULT_CONFIG: &str = include_str!("flightdeck.toml");

/// The largest request message accepted (and hashed into the key).
const MAX_MESSAGE: usize = 64 * 1024;

/// How long a starting node waits for Redis before it serves without it.
const REDIS_WAIT: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // flightdeck's warnings (degraded mode, breaker transitions, fallbacks),
    // filtered by RUST_LOG (default info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // As the axum example: fred's per-connection warnings off
                // (flightdeck's own lines report an outage once).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fred=error")),
        )
        .init();
    let listen: SocketAddr = std::env::var("LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:50051".to_owned())
        .parse()?;
    let mut opts = Options::local(Duration::from_millis(1500));
    if let Ok(path) = std::env::var("FLIGHTDECK_CONFIG") {
        opts.config = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read FLIGHTDECK_CONFIG={path}: {e}"))?;
    }
    opts.redis_url = std::env::var("REDIS_URL").ok();
    opts.listen = listen;
    opts.metrics_listen = std::env::var("METRICS_LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:9464".to_owned())
        .parse()?;
    let node = run(opts).await?;
    println!(
        "Summarizer on {}, metrics on http://{}/metrics (stage summarize: {})",
        node.addr,
        node.metrics_addr,
        node.flights
            .stage("summarize")
            .map_or(Mode::Bypass, |s| s.mode())
    );
    // Call ourselves once, like a client would.
    let mut client = SummarizerClient::connect(node.addr).await?;
    let reply = client
        .summarize(SummarizeRequest {
            document: "flightdeck coalesces identical concurrent calls into one".into(),
            max_words: 4,
        })
        .await?;
    println!("Summarize → {:?}", reply.into_inner());
    let mut stream = client
        .stream_summary(SummarizeRequest {
            document: "streams pass through flightdeck untouched".into(),
            max_words: 5,
        })
        .await?
        .into_inner();
    while let Some(chunk) = stream.message().await? {
        println!("StreamSummary → {chunk:?}");
    }
    println!("serving; Ctrl-C stops");
    tokio::signal::ctrl_c().await?;
    println!(
        "Summarize executions: {}, StreamSummary executions: {}",
        node.model.summarize_calls.load(Ordering::SeqCst),
        node.model.stream_calls.load(Ordering::SeqCst)
    );
    Ok(())
}

/// How to start one node.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The configuration file's text (TOML).
    pub(crate) config: String,
    /// Redis for the distributed stages; `None` runs every stage
    /// LOCAL_ONLY.
    pub(crate) redis_url: Option<String>,
    /// How long the simulated model takes per call.
    pub(crate) model_latency: Duration,
    /// Overrides the file's execution budget of one model call (then
    /// DEADLINE_EXCEEDED).
    pub(crate) execution_timeout: Option<Duration>,
    /// Overrides the file's concurrent model calls (then
    /// RESOURCE_EXHAUSTED).
    pub(crate) bulkhead_limit: Option<usize>,
    /// Where to listen (port 0 picks a free one).
    pub(crate) listen: SocketAddr,
    /// Where to serve `/metrics` over HTTP/1 (port 0 picks a free one).
    pub(crate) metrics_listen: SocketAddr,
}

impl Options {
    /// The shipped configuration without Redis (LOCAL_ONLY), on a free
    /// loopback port.
    pub(crate) fn local(model_latency: Duration) -> Self {
        Self {
            config: DEFAULT_CONFIG.to_owned(),
            redis_url: None,
            model_latency,
            execution_timeout: None,
            bulkhead_limit: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// The expensive dependency, counting its calls.
#[derive(Debug, Default)]
pub(crate) struct Model {
    latency: Duration,
    /// Real `Summarize` executions.
    pub(crate) summarize_calls: AtomicU64,
    /// Real `StreamSummary` executions.
    pub(crate) stream_calls: AtomicU64,
}

impl Model {
    fn words(doc: &str, max: u32) -> Vec<String> {
        doc.split_whitespace()
            .take(max.max(1) as usize)
            .map(str::to_owned)
            .collect()
    }

    async fn summarize(&self, req: SummarizeRequest) -> Result<Summary, Status> {
        let execution = self.summarize_calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.latency).await;
        if req.document.trim().is_empty() {
            // A business error: shared with every duplicate, never retried.
            return Err(Status::invalid_argument("the document is empty"));
        }
        Ok(Summary {
            text: Self::words(&req.document, req.max_words).join(" "),
            execution,
        })
    }
}

/// The flightdeck layer type of this service.
pub(crate) type FlightLayer = SingleFlightLayer<GrpcKeyExtractor>;

/// A running node.
#[derive(Debug)]
pub(crate) struct Node {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Its model's counters.
    pub(crate) model: Arc<Model>,
    /// Its flightdeck layer (stage handles).
    pub(crate) flights: FlightLayer,
    /// The server task.
    pub(crate) server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// Where `/metrics` is served.
    pub(crate) metrics_addr: SocketAddr,
    metrics_server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
        self.metrics_server.abort();
    }
}

/// Starts one node on `opts.listen`.
pub(crate) async fn run(opts: Options) -> Result<Node, BoxError> {
    let mut config = SingleFlightConfig::from_toml(&opts.config)?;
    if let Some(stage) = config.stages.get_mut("summarize") {
        if let Some(t) = opts.execution_timeout {
            stage.execution_timeout = Some(t);
        }
        if let Some(limit) = opts.bulkhead_limit {
            stage.bulkhead.limit = limit;
            stage.bulkhead.degraded_limit = Some(limit.div_ceil(4));
        }
    }
    // Only the unary method is keyed; the stream is not on the allowlist.
    let keys = GrpcKeyExtractor::builder()
        .method(SUMMARIZE, "summarize")
        .message_cap(MAX_MESSAGE)
        .build()?;
    let mut flights = SingleFlightLayer::builder().keys(keys).config(config);
    flights = match &opts.redis_url {
        Some(url) => {
            // Created even while Redis is down: the node starts degraded
            // and goes distributed once Redis answers.
            let backend = RedisBackend::new(RedisConfig::new(url.clone()))?;
            if let Err(e) = backend.ready(REDIS_WAIT).await {
                eprintln!("starting without Redis for now: {e}");
            }
            flights.backend("redis", backend)
        }
        None => flights.local_only(),
    };
    let flights = flights.build()?;
    let stack = ServiceBuilder::new()
        .layer(flights.clone())
        // The key layer re-attaches the message it read; tonic's routes
        // take their own body type.
        .map_request(|req: http::Request<FlightBody<tonic::body::Body>>| {
            req.map(tonic::body::Body::new)
        })
        .into_inner();

    let model = Arc::new(Model {
        latency: opts.model_latency,
        ..Model::default()
    });
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let addr = listener.local_addr()?;
    let router = Server::builder()
        .layer(stack)
        .add_service(SummarizerServer {
            model: model.clone(),
        });
    let server = tokio::spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));

    // Prometheus scrapes plain HTTP: `/metrics` on a port of its own.
    let metrics = prometheus();
    let metrics_app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                metrics.map_or_else(
                    || "another metrics recorder is installed\n".to_owned(),
                    |h| h.render(),
                )
            }
        }),
    );
    let metrics_listener = tokio::net::TcpListener::bind(opts.metrics_listen).await?;
    let metrics_addr = metrics_listener.local_addr()?;
    let metrics_server =
        tokio::spawn(async move { axum::serve(metrics_listener, metrics_app).await });
    Ok(Node {
        addr,
        model,
        flights,
        server,
        metrics_addr,
        metrics_server,
    })
}

/// The Prometheus recorder (`metrics-exporter-prometheus` without its
/// HTTP listener), installed once per process, with histogram buckets.
pub(crate) fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.001, 0.01, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
            ];
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_duration".to_owned()), &buckets)
                .ok()?
                .install_recorder()
                .ok()?;
            let h = handle.clone();
            // Upkeep (draining histogram buffers) is ours to run.
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                h.run_upkeep();
            });
            Some(handle)
        })
        .clone()
}

/// The server side of `Summarizer`, as `tonic-build` would generate it.
#[derive(Debug, Clone)]
pub(crate) struct SummarizerServer {
    model: Arc<Model>,
}

impl tonic::server::NamedService for SummarizerServer {
    const NAME: &'static str = SERVICE;
}

impl<B> tower::Service<http::Request<B>> for SummarizerServer
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let model = self.model.clone();
        match req.uri().path() {
            SUMMARIZE => Box::pin(async move {
                let method = service_fn(move |req: tonic::Request<SummarizeRequest>| {
                    let model = model.clone();
                    async move {
                        let summary = model.summarize(req.into_inner()).await?;
                        let mut resp = tonic::Response::new(summary);
                        resp.metadata_mut()
                            .insert("x-model", "summarizer-v2".parse().expect("ascii"));
                        Ok::<_, Status>(resp)
                    }
                });
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default())
                    .max_decoding_message_size(MAX_MESSAGE);
                Ok(grpc.unary(method, req).await)
            }),
            STREAM_SUMMARY => Box::pin(async move {
                let method = service_fn(move |req: tonic::Request<SummarizeRequest>| {
                    let model = model.clone();
                    async move {
                        model.stream_calls.fetch_add(1, Ordering::SeqCst);
                        let req = req.into_inner();
                        let words = Model::words(&req.document, req.max_words);
                        let (tx, rx) = tokio::sync::mpsc::channel(4);
                        tokio::spawn(async move {
                            for (index, text) in words.into_iter().enumerate() {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                let chunk = SummaryChunk {
                                    index: index as u32,
                                    text,
                                };
                                if tx.send(Ok::<_, Status>(chunk)).await.is_err() {
                                    break; // the client went away
                                }
                            }
                        });
                        Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx)))
                    }
                });
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default())
                    .max_decoding_message_size(MAX_MESSAGE);
                Ok(grpc.server_streaming(method, req).await)
            }),
            _ => Box::pin(async move {
                Ok(Status::new(Code::Unimplemented, "no such method").into_http())
            }),
        }
    }
}

/// The client side of `Summarizer`, as `tonic-build` would generate it.
#[derive(Debug, Clone)]
pub(crate) struct SummarizerClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl SummarizerClient {
    /// Connects to a node.
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// `Summarize`.
    pub(crate) async fn summarize(
        &mut self,
        req: impl tonic::IntoRequest<SummarizeRequest>,
    ) -> Result<tonic::Response<Summary>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
        self.grpc
            .unary(
                req.into_request(),
                PathAndQuery::from_static(SUMMARIZE),
                ProstCodec::default(),
            )
            .await
    }

    /// `StreamSummary`.
    pub(crate) async fn stream_summary(
        &mut self,
        req: impl tonic::IntoRequest<SummarizeRequest>,
    ) -> Result<tonic::Response<tonic::Streaming<SummaryChunk>>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
        self.grpc
            .server_streaming(
                req.into_request(),
                PathAndQuery::from_static(STREAM_SUMMARY),
                ProstCodec::default(),
            )
            .await
    }
}
