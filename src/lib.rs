//! flightdeck: composable tower layers that stop duplicate work.
//!
//! When many requests that mean the same thing arrive at once, only one of
//! them runs the expensive call; the others wait and share its result:
//! inside one process (L1), and across every process of a deployment
//! through Redis (L2). One layer, [`SingleFlightLayer`], carries the key
//! rules, the stages and the error responses (503, 429, 504):
//!
//! ```rust,no_run
//! # #[cfg(all(feature = "toml", feature = "redis"))]
//! # mod snippet {
//! use axum::{routing::post, Router};
//! use flightdeck::{HttpKeyExtractor, RedisBackend, RedisConfig, Route};
//! use flightdeck::{SingleFlightConfig, SingleFlightLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), flightdeck::BoxError> {
//!     let keys = HttpKeyExtractor::builder()
//!         .route(Route::post("/v1/score", "score").hash_body(64 * 1024))
//!         .build()?;
//!     let config = SingleFlightConfig::from_toml(&std::fs::read_to_string("flightdeck.toml")?)?;
//!     // Connects in the background: with Redis down the node starts
//!     // degraded and goes distributed once Redis answers.
//!     let url = std::env::var("REDIS_URL")?; // e.g. redis://redis.internal:6379
//!     let backend = RedisBackend::new(RedisConfig::new(url))?;
//!     let flights = SingleFlightLayer::builder()
//!         .keys(keys)
//!         .config(config) // a stage the rules name but the file does not is a build error
//!         .backend("redis", backend) // or .local_only(): every stage in this process only
//!         .build()?;
//!     let app = Router::new()
//!         .route("/v1/score", post(|body: String| async move { format!("scored {body}") }))
//!         .layer(flights);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! (Features `toml` and `redis`; the README has the whole tour: tonic,
//! metrics, testing with paused time.)
//!
//! - **Keys** ([`HttpKeyExtractor`], [`Route`]): which requests are the
//!   same work. For gRPC, `GrpcKeyExtractor` (feature `grpc`) given to
//!   the same builder.
//! - **Stages** ([`StageConfig`], or a [`SingleFlightConfig`] file): a kind
//!   of work with its own [`Mode`], timeouts, bulkhead and breaker.
//!   [`SingleFlightLayer::stage`] returns a [`StageHandle`] whose
//!   [`set_mode`](StageHandle::set_mode) is the kill switch: it switches
//!   the stage's mode for new requests; requests in flight finish in the
//!   mode they started with.
//! - **Backends** ([`RedisBackend`], feature `redis`; `MemoryBackend` in
//!   [`testing`], feature `testing`): what L2 coordinates through.
//! - **Answering anyway** (opt-in per stage: `stale-while-revalidate`,
//!   `stale-if-error`, `soft-timeout`, `early-refresh`, `hit-for-pass`):
//!   a copy of each key's last good result answers when the fresh answer
//!   would cost a wait or a failure, marked [`Stale`](core::Stale) and, with
//!   `cache-status`, told in `Cache-Status` and `Age` ([`stale`]).
//!   [`StageHandle::invalidate`] purges a key.
//!
//! | feature | what it adds |
//! |---|---|
//! | `http` (default) | [`SingleFlightLayer`] and the HTTP key rules |
//! | `grpc` | `GrpcKeyExtractor`: the layer of a tonic service |
//! | `redis` | [`RedisBackend`], [`RedisConfig`] |
//! | `toml`, `yaml` | [`SingleFlightConfig::from_toml`] / `from_yaml` |
//! | `testing` | [`testing`]: the in-memory backend, body helpers |
//!
//! # How it works: the data path, and who decides what
//!
//! ```text
//! request ─ key (KeySource) ─ stage ─ the stage's Mode, read on arrival
//!   BYPASS            → inner service
//!   LOCAL_ONLY        → L1 (LocalFlights::run) ─ leader → bulkhead → inner
//!   HYBRID / DIST_ONLY→ L1; only the L1 leader goes on, into
//!                       L2 (DistributedFlights::run) over the backend behind the stage's breaker:
//!       owner     → bulkhead → inner (fenced) → value to the callers at once,
//!                   commit in the background (heartbeats until it returned)
//!       follower  → wait for the owner (push + poll), take over on lease expiry
//!       hit       → replay the stored result
//!       coordination failure → L2 asks the stage's failure matrix (a Fallback)
//! ```
//!
//! - **L1** decides who runs: one leader per key, everybody else waits for
//!   its result (or runs its own when the result cannot be shared or does
//!   not serve them). Each caller leaves at its own deadline; the flight
//!   goes on while anyone waits, and when the last caller has left it is
//!   cancelled (LOCAL_ONLY) or finishes (HYBRID, DISTRIBUTED_ONLY: other
//!   nodes may be waiting on it): decided per flight by the mode its leader
//!   found on arrival.
//! - **L2** decides the role across nodes, and holds the request at every
//!   point where coordination can fail: there it asks the stage's
//!   [`Fallback`](distributed::Fallback), one small table from (mode,
//!   failure) to an answer. An owner's business error, another node's
//!   stored result (even a cached failure) and a failed commit are answers,
//!   never failures, by construction.
//! - **The breaker** is a decorator of the stage's backend
//!   ([`GuardedBackend`](distributed::GuardedBackend)): an open circuit is one
//!   more failure before acquire, refused before the flight is even named.
//!   It judges each flight by its first acquire's answer.
//! - **The bulkhead and the execution budget** wrap every real execution,
//!   whoever runs it (owner, LOCAL_ONLY leader, local fallback, a caller
//!   running its own request), and count it once
//!   (`singleflight_execution_total{path}`).
//!
//! # The failure matrix
//!
//! | class | HYBRID | DISTRIBUTED_ONLY |
//! |---|---|---|
//! | before acquire (unavailable, outcome unknown, breaker open) | local fallback, `singleflight_local_fallback_total{reason}` + `warn` | fail fast, `CoordinationUnavailable` / `OutcomeUnknown` / `CircuitOpen` (503) |
//! | protocol (garbage reply, codec mismatch) | local fallback + `singleflight_unknown_action_total` | fail fast, `ProtocolError` (503) |
//! | follower wait (polls fail, notice lost, owner slow or dead) | never at once. [`OnWaitFailure`]: `in-progress` → `InProgress` (202) and `fail` → `CoordinationUnavailable` (503) answer at the first failed re-check; `wait` polls on until the wait timeout, taking over when the lease expires, then `WaitTimeout`; `local` (opt-in) runs locally after that wait, when the lease must have expired | same, without `local` |
//! | owner's business error | shared with the waiters, not retried, not a backend failure | same |
//! | after execution (commit failed) | the value is returned, the commit retried in the background, never re-executed; `singleflight_result_write_failure_total` | same |
//!
//! While the breaker is open or probing the stage is *degraded*: the
//! bulkhead switches to its degraded limit, the `singleflight_degraded`
//! gauge is 1, a `warn` is logged on entering and on leaving, and the
//! period's length is recorded in `singleflight_degraded_duration`. A
//! stage whose backend is not connected yet when the layer is built is
//! degraded from that moment ("starting degraded: …"), and goes
//! distributed when the connection is made.
//!
//! **Per shard.** A sharded backend (Redis Cluster) says which shard
//! serves each flight, and coordination failures are judged per shard:
//! the stage's breaker is the template of one breaker per shard (named
//! `{stage}@{shard}`), so one primary's outage degrades only the flights
//! it serves, while the others keep coalescing across nodes. That shard
//! alone is degraded: `singleflight_degraded{stage, shard}` is 1 (the
//! series without `shard` is the whole store's),
//! [`StageHandle::degraded_shards`] lists it, its `warn` lines name it, and
//! only its flights fall back (HYBRID) or fail fast (DISTRIBUTED_ONLY).
//! Their executions go through the bulkhead's *degraded lane*
//! ([`BulkheadHandle::degraded_lane`](bulkhead::BulkheadHandle::degraded_lane)),
//! a second bulkhead nested outside the stage's: at most the degraded limit
//! (and rate) of them at once, while every other flight keeps the normal
//! limit. When the shard answers again, its half-open probe closes its
//! breaker and its flights coordinate again. The stage's own breaker
//! ([`StageHandle::breaker`]) still stands for the whole store: forced open
//! it degrades every shard.
//!
//! # Deadlines
//!
//! A request's own deadline comes from an [`Inbound`](budget::Inbound) of
//! the budget crate ([`SingleFlightLayer`] reads `grpc-timeout`,
//! `x-request-timeout` and an outer `BudgetLayer`'s `Deadline`). A caller
//! never waits past it, and a request whose time is up reaches neither the
//! work nor the backend; but no caller's deadline decides another's: the
//! flight goes on for the callers still waiting. Each coordination round
//! trip gets the stage's `coordination-timeout` (and at most an outer
//! budget's coordination slice); the work runs within the stage's
//! `execution-timeout` (an outer budget's execution slice bounds only its
//! own caller's wait, not the work others share). The outcome of a caller
//! out of time is `DeadlineExceeded` (504 / `DEADLINE_EXCEEDED`).
//!
//! # Any request type
//!
//! [`GenericSingleFlightLayer`] is the single-flight part alone, for a
//! request type of your own: a key closure, a share adapter and a codec.
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("report").unwrap();
//! let layer = GenericSingleFlightLayer::builder(
//!     move |id: &u64| Some(FlightKey::from_bytes(stage.clone(), id.to_le_bytes())),
//!     CloneShare::<String>::new(),
//!     PostcardCodec::<String>::new(),
//! )
//! .stage("report", StageConfig::new().mode(Mode::LocalOnly))
//! .build()
//! .unwrap();
//!
//! let svc = ServiceBuilder::new()
//!     .layer(layer.clone())
//!     .service(service_fn(|id: u64| async move {
//!         Ok::<_, std::convert::Infallible>(format!("report {id}"))
//!     }));
//! assert_eq!(svc.clone().oneshot(7).await.unwrap(), "report 7");
//!
//! // The kill switch: no coalescing for new requests of this stage.
//! let handle = layer.stage("report").unwrap();
//! handle.set_mode(Mode::Bypass).unwrap();
//! assert_eq!(svc.oneshot(8).await.unwrap(), "report 8");
//! # }
//! ```
//!
//! The layers also stand alone; this crate re-exports them:
//!
//! - [`core`] — keys, stages, result sharing, errors, HTTP/gRPC error
//!   mapping.
//! - [`key`] — request keys (`KeyLayer`, HTTP and gRPC extractors).
//! - [`local`] — in-process single-flight ([`LocalFlightLayer`],
//!   `LocalFlights`).
//! - [`distributed`] — cross-node single-flight over a backend.
//! - [`breaker`], [`bulkhead`], [`budget`] — resilience layers.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
pub mod error;
mod fallback;
pub mod future;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod inner_call;
mod kept;
mod layer;
mod leader;
mod mode;
pub mod readers;
mod service;
mod stage;
pub mod stale;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use flightdeck_breaker as breaker;
pub use flightdeck_budget as budget;
pub use flightdeck_bulkhead as bulkhead;
pub use flightdeck_core as core;
pub use flightdeck_distributed as distributed;
pub use flightdeck_key as key;
pub use flightdeck_local as local;
/// The Redis backend (`flightdeck-redis`), feature `redis`.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use flightdeck_redis as redis;

pub use config::{
    BreakerSettings, BulkheadSettings, ConfigError, KeySettings, SharingSettings,
    SingleFlightConfig, StageConfig,
};
pub use layer::{GenericSingleFlightLayer, GenericSingleFlightLayerBuilder, StageShare};
pub use service::GenericSingleFlight;

#[cfg(feature = "http")]
pub use http::{SingleFlight, SingleFlightLayer, SingleFlightLayerBuilder};
pub use mode::{Mode, OnWaitFailure, UnknownMode};
pub use stage::StageHandle;
pub use stale::{MarkAnswer, Served};

// The names users write, documented here, where they read them.
#[doc(inline)]
pub use flightdeck_core::{BoxError, FlightKey, KeyEncoder, StageName};
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[doc(inline)]
pub use flightdeck_key::grpc::{GrpcKeyExtractor, GrpcKeyExtractorBuilder};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[doc(inline)]
pub use flightdeck_key::http::{HttpKeyExtractor, HttpKeyExtractorBuilder, Route};
#[doc(inline)]
pub use flightdeck_local::{FlightPolicy, LocalFlightLayer, OnAbandon};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use flightdeck_redis::{RedisBackend, RedisConfig};
