//! flightdeck: composable tower layers that stop duplicate work.
//!
//! When many requests that mean the same thing arrive at once, only one of
//! them runs the expensive call; the others wait and share its result:
//! first inside one process (L1, [`local`]), then across every process of a
//! deployment through a coordination backend such as Redis (L2,
//! [`distributed`]).
//!
//! [`SingleFlightLayer`] puts it all together, per stage (a kind of work
//! with its own [`StageConfig`]):
//!
//! ```text
//! request ─ key ─ stage's Mode
//!   BYPASS            → inner service
//!   LOCAL_ONLY        → L1 → bulkhead → inner
//!   HYBRID / DIST_ONLY→ L1; only the L1 leader goes on:
//!       breaker open?        HYBRID: run locally (no backend call at all)
//!                            DIST_ONLY: fail fast, CircuitOpen (503 / UNAVAILABLE)
//!       L2 acquire           owner → bulkhead → inner → commit
//!                            follower → wait for the owner (push + poll, takeover)
//!                            hit → replay
//!       coordination failure before acquiring
//!                            HYBRID: run locally (counted, logged)
//!                            DIST_ONLY: fail fast (503 / UNAVAILABLE)
//! ```
//!
//! The failure table (seed 000 §5–§6) holds for HYBRID and
//! DISTRIBUTED_ONLY:
//!
//! | class | HYBRID | DISTRIBUTED_ONLY |
//! |---|---|---|
//! | before acquire (unavailable, timeout, outcome unknown) | local fallback, `singleflight_local_fallback_total{reason}` + `warn` | fail fast, `CoordinationUnavailable` / `OutcomeUnknown` (503) |
//! | protocol (garbage reply, codec mismatch) | local fallback + `singleflight_unknown_action_total` | fail fast, `ProtocolError` (503) |
//! | follower wait (polls fail, notice lost, owner slow) | never at once. [`OnWaitFailure`]: `in-progress` → `InProgress` (202) and `fail` → `CoordinationUnavailable` (503) answer at the first failed re-check; `wait` polls on until the wait timeout, taking over when the lease expires, then `WaitTimeout`; `local` (opt-in) runs locally after that wait, when the lease must have expired | same, without `local` |
//! | owner's business error | shared with the waiters, not retried, not a backend failure | same |
//! | after execution (commit failed) | the value is returned, the commit retried, never re-executed; `singleflight_result_write_failure_total` | same |
//!
//! **How the request survives L2.** L2 consumes the request it is given,
//! yet the local fallback needs it. Instead of asking for `Req: Clone`, the
//! facade hands L2 a [`Ticket`](ticket::Ticket): the key and a slot holding
//! the real request. The inner service L2 runs ([`ticket::SlotRunner`])
//! takes the request out of the slot, inserts the owner's fencing token
//! ([`Fence`]) and calls the real service behind the bulkhead. When L2
//! fails and the slot still holds the request, the work never ran here:
//! HYBRID runs it locally as the L1 leader, DISTRIBUTED_ONLY fails fast.
//! When the slot is empty, the work ran (owner path) and is never run again.
//! The backend wrapper ([`ticket::SharedBackend`]) also notes when an
//! acquire answered "follower", so a failure while following is handled as
//! a follower-wait failure. (A cleaner long-term design puts this fallback
//! hook into L2 itself, which owns the request at the decision point.)
//!
//! **The breaker** of a stage guards its backend and is checked before L2:
//! while it is open no call reaches the backend. It counts coordination
//! failures only (unavailable, outcome unknown, protocol); business errors,
//! a follower's wait timeout and successes are not failures. A leader's
//! call is judged by its first acquire's answer, so a half-open probe whose
//! work is slow still closes the breaker as soon as Redis answered. While it is
//! open or probing the stage is *degraded*: the bulkhead switches to its
//! degraded limit, the `singleflight_degraded{stage}` gauge is 1, a `warn`
//! is logged on entering and on leaving, and the period's length is
//! recorded in `singleflight_degraded_duration`. Half-open lets the
//! configured number of probe flights through to the backend; success
//! closes it, and an optional ramp returns traffic to distributed mode
//! gradually.
//!
//! **Deadlines** (the budget's slices, seed 000 §10): a request's own
//! deadline comes from its [`Fence`] ([`ExtensionFence`] reads
//! `grpc-timeout`, `x-request-timeout` and an outer `Deadline` extension;
//! implement [`Fence::deadline`] for other request types). A caller never
//! waits past it (a waiter leaving does not end the flight); a request
//! whose time is already up is answered `DeadlineExceeded` without touching
//! the work or the backend; each coordination round trip gets the stage's
//! `coordination-timeout` slice; an L1 leader following another node's
//! flight gives up at its deadline (never running the work here, never
//! counting it against the backend); the work runs within the smaller of
//! the stage's `execution-timeout` and what remains. The outcome is
//! `DeadlineExceeded` (504 / `DEADLINE_EXCEEDED`). A flight's coordination
//! follows its leader's deadline: callers that joined it share its outcome.
//!
//! **The kill switch**: [`SingleFlightLayer::stage`] returns a
//! [`StageHandle`] whose [`set_mode`](StageHandle::set_mode) switches the
//! stage's mode for new requests; requests in flight finish in the mode
//! they started with.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck::{Mode, SingleFlightBuilder, StageConfig};
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck_testkit::MemoryBackend;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("report").unwrap();
//! let mut cfg = StageConfig::new().mode(Mode::Hybrid).backend("main");
//! cfg.lease_timeout = Duration::from_secs(3);
//! cfg.heartbeat_interval = Duration::from_secs(1);
//! cfg.wait_timeout = Duration::from_secs(4);
//! let layer = SingleFlightBuilder::new(
//!     move |id: &u64| Some(FlightKey::from_bytes(stage.clone(), id.to_le_bytes())),
//!     CloneShare::<String>::new(),
//!     PostcardCodec::<String>::new(),
//! )
//! .backend("main", MemoryBackend::new())
//! .stage("report", cfg)
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
//! - [`core`]: keys, stages, result sharing, errors, HTTP/gRPC error
//!   mapping.
//! - [`key`]: request keys ([`key::KeyLayer`], HTTP and gRPC extractors).
//! - [`local`]: in-process single-flight ([`LocalFlightLayer`]).
//! - [`distributed`]: cross-node single-flight over a backend.
//! - [`breaker`], [`bulkhead`], [`budget`]: resilience layers.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
pub mod error;
pub mod future;
mod layer;
mod mode;
pub mod service;
pub mod share;
mod stage;
pub mod ticket;

pub use flightdeck_breaker as breaker;
pub use flightdeck_budget as budget;
pub use flightdeck_bulkhead as bulkhead;
pub use flightdeck_core as core;
pub use flightdeck_distributed as distributed;
pub use flightdeck_key as key;
pub use flightdeck_local as local;

pub use config::{BreakerSettings, BulkheadSettings, ConfigError, SingleFlightConfig, StageConfig};
pub use layer::{SingleFlightBuilder, SingleFlightLayer};
pub use mode::{Mode, OnWaitFailure, UnknownMode};
pub use service::SingleFlight;
pub use stage::StageHandle;
#[cfg(feature = "http")]
pub use ticket::ExtensionFence;
pub use ticket::{Fence, NoFence};

pub use flightdeck_core::{FlightKey, KeyEncoder, StageName};
pub use flightdeck_local::{FlightPolicy, LocalFlight, LocalFlightLayer, OnAbandon};
