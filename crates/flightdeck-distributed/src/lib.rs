//! Distributed single-flight (L2): one execution per key across every
//! process of a deployment.
//!
//! [`DistributedFlights`] coordinates through a [`Backend`] (Redis in
//! `flightdeck-redis`, in memory in `flightdeck-test`).
//! [`DistributedFlights::run`] asks the backend for the flight of a key and
//! becomes its:
//!
//! - **owner**: runs the request through your [`Execute`] with the
//!   [`FencingToken`] ([`Role::Owner`]; a [`Fence`] hands it to the
//!   request), keeps the lease alive with heartbeats **until the commit or
//!   abandon has returned**, and sends the commit as it hands the value to
//!   its callers; the commit's answer (and any retries) is awaited in the
//!   background. The commit wakes the followers; small results travel
//!   inside the notice. Generations never repeat or go back for a key, and
//!   every commit, heartbeat and abandon is checked against the token and
//!   the generation, so a stale owner's write is fenced.
//! - **follower**: waits for the completion notice or polls with jitter;
//!   when the owner's lease expires without a commit, exactly one follower
//!   takes over. Every flight takes a subscription before its first call
//!   when the backend has one in force ([`Backend::join_subscription`]:
//!   the Redis backend's inbox); a follower with one sends that one call
//!   and waits, one without subscribes and re-checks first.
//! - **hit**: replays the stored result (a cached failure of the owner is an
//!   answer too: `RemoteFailure`).
//!
//! **Who decides what.** L2 holds the request at every point where
//! coordination can fail, so it asks a [`Fallback`] there, with a typed
//! failure: before acquire (run here, or fail), while following (answer now,
//! or keep following: L2 never runs the work while another node may hold
//! the lease), after following ended (run here, or fail). The
//! `flightdeck` facade's modes are one small `Fallback`; [`Propagate`]
//! answers every failure with its typed error. An owner's business error,
//! another node's stored result and a failed commit are answers, never
//! failures, by construction.
//!
//! **Leases nobody holds.** A token this node gives up on while it may hold
//! a lease (its acquire timed out and may still run on the backend; a flight
//! dropped mid-acquire) is released in the background as soon as the
//! backend answers, so no caller anywhere waits on a lease whose holder
//! walked away.
//!
//! **Answering anyway.** With the policy's
//! [`stale_windows`](DistributedPolicy::stale_windows), the store keeps
//! results past their freshness and a flight asks for them: past
//! freshness, within `stale-while-revalidate`, every caller on every node
//! is answered the kept result at once while exactly one refresh runs (the
//! one granted the flight's lease, in the background); within
//! `stale-if-error` the kept result answers when the work fails (judged by
//! [`Execute::failures`]) and the store throttles the next refresh for
//! `stale-retry-after` on every node; past `soft-timeout` a caller still
//! waiting gets it while the work goes on; and near the end of freshness
//! one caller refreshes a hit early (XFetch). Ages are the store's.
//! [`DistributedFlights::run_answered`] says how a caller was answered
//! ([`Answered`]: a stale answer's reason and age, a hit's age).
//!
//! **The breaker** guards a backend as a decorator ([`GuardedBackend`]): an
//! open circuit is one more failure before acquire, asked once per flight.
//!
//! [`DistributedFlightLayer`] is a thin `tower` shell over it (behind the
//! local single-flight layer, only the local leader of a key reaches it, so
//! N local duplicates send one acquire).
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{CloneShare, FlightKey, StageName};
//! use flightdeck_distributed::{DistributedFlightLayer, DistributedPolicy, PostcardCodec};
//! use flightdeck_test::MemoryBackend;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("score").unwrap();
//! let layer = DistributedFlightLayer::new(
//!     MemoryBackend::new(),
//!     DistributedPolicy::new().lease(Duration::from_secs(3)).heartbeat(Duration::from_secs(1)),
//!     CloneShare::<String>::new(),
//!     PostcardCodec::<String>::new(),
//!     move |req: &String| Some(FlightKey::from_bytes(stage.clone(), req)),
//! )
//! .unwrap();
//! let flights = layer.flights().clone();
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|req: String| async move {
//!         Ok::<_, std::convert::Infallible>(req.to_uppercase())
//!     }));
//! // The first call owns and commits (in the background), the second
//! // replays the stored result.
//! assert_eq!(svc.clone().oneshot("hi".to_owned()).await.unwrap(), "HI");
//! flights.idle().await;
//! assert_eq!(svc.oneshot("hi".to_owned()).await.unwrap(), "HI");
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod breaker;
mod cached_failure;
pub mod codec;
pub mod error;
pub mod fallback;
mod flights;
mod follow;
pub mod future;
mod layer;
mod lease_release;
mod lost_results;
mod metrics;
mod owner;
pub mod policy;
mod service;
mod stale;
mod start;
mod work;

pub use backend::{
    Acquired, Backend, BackendError, BackendErrorKind, FencingToken, FlightId, Notice, OwnerToken,
    Subscription,
};
pub use breaker::{BackendBreakers, GuardedBackend};
#[cfg(feature = "http")]
pub use codec::HttpCodec;
pub use codec::{Envelope, PostcardCodec, ResultCodec};
pub use fallback::{FailureClass, Fallback, Propagate, Verdict, WaitEnded};
pub use flights::DistributedFlights;
pub use layer::DistributedFlightLayer;
pub use policy::{DistributedPolicy, PolicyError};
pub use service::DistributedFlight;
pub use stale::Answered;
pub use start::{Admitted, FlightFuture};
#[cfg(feature = "http")]
pub use work::ExtensionFence;
pub use work::{Execute, Fence, KeptEnd, KeptHere, NoFence, RefreshMark, Role};
