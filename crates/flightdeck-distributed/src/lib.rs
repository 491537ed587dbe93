//! Distributed single-flight (L2): one execution per key across every
//! process of a deployment.
//!
//! [`DistributedFlightLayer`] coordinates through a [`Backend`] (Redis in
//! `flightdeck-redis`, in memory in `flightdeck-testkit`). For each request
//! with a [`FlightKey`](flightdeck_core::FlightKey) it asks the backend to
//! acquire the flight:
//!
//! - **owner**: runs the inner service with the [`FencingToken`] in the
//!   request, renews the lease every heartbeat (a lost lease is counted and
//!   traced; the later commit is fenced, or the work is cancelled if the
//!   stage says so), then commits the encoded result, which wakes followers.
//! - **follower**: subscribes, re-checks, then waits for the completion
//!   notice (small results come inline) or polls with jitter; when the
//!   owner's lease expires without a commit, exactly one follower takes
//!   over.
//! - **hit**: replays the stored result.
//!
//! The layer is meant to sit behind the local single-flight layer
//! (`LocalFlightLayer → DistributedFlightLayer → service`): only the local
//! leader of a key reaches it, so N local duplicates send one acquire.
//! Backend failures come back as typed errors of `flightdeck-core`
//! (`CoordinationUnavailable`, `ProtocolError`, `OutcomeUnknown`,
//! `WaitTimeout`) for the facade to act on; a failed commit never fails the
//! request.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{CloneShare, FlightKey, StageName};
//! use flightdeck_distributed::{DistributedFlightLayer, DistributedPolicy, KeyFn, PostcardCodec};
//! use flightdeck_testkit::MemoryBackend;
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
//!     KeyFn::new(move |req: &String| Some(FlightKey::from_bytes(stage.clone(), req))),
//! )
//! .unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|req: String| async move {
//!         Ok::<_, std::convert::Infallible>(req.to_uppercase())
//!     }));
//! // The first call owns and commits, the second replays the stored result.
//! assert_eq!(svc.clone().oneshot("hi".to_owned()).await.unwrap(), "HI");
//! assert_eq!(svc.oneshot("hi".to_owned()).await.unwrap(), "HI");
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod codec;
pub mod error;
mod flow;
pub mod future;
mod layer;
pub mod policy;
pub mod request;
mod service;

pub use backend::{
    Acquired, Backend, BackendError, BackendErrorKind, FencingToken, FlightId, Notice, OwnerToken,
    Subscription,
};
#[cfg(feature = "http")]
pub use codec::HttpCodec;
pub use codec::{Envelope, PostcardCodec, ResultCodec};
pub use layer::DistributedFlightLayer;
pub use policy::{DistributedPolicy, PolicyError};
#[cfg(feature = "http")]
pub use request::ExtensionKey;
pub use request::{FlightRequest, KeyFn};
pub use service::DistributedFlight;
