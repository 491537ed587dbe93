//! Key extraction for flightdeck: which requests are "the same work".
//!
//! The key decides who may share a result. A key that is too loose hands one
//! user's answer to another; one that is too strict merges nothing. This
//! crate computes it once, at the top of the stack: [`KeyLayer`] runs a
//! [`KeyExtractor`] on each request and stores its [`Decision`] on the
//! request, either a [`FlightKey`](flightdeck_core::FlightKey) (for HTTP, in
//! the request's extensions) or a [`NotCoalescable`] marker saying why not.
//! Every flightdeck layer below looks for the `FlightKey` only: no key, no
//! coalescing, the request passes straight through.
//!
//! Extractors:
//!
//! - [`key_fn`]: a closure, for any request type (with [`Keyed`] or your own
//!   [`KeySlot`]).
//! - [`http::HttpKeyExtractor`] (feature `http`): routes → stages, method,
//!   authority, path, normalized query, selected headers, optional body
//!   hashing, `Idempotency-Key`, tenant scope secure by default.
//! - [`grpc::GrpcKeyExtractor`] (feature `grpc`): allowlisted unary
//!   methods, message bytes, `grpc-encoding`, selected metadata.
//!
//! Keys never show raw input: stage names are validated identifiers,
//! everything else is named by a BLAKE3 digest built with
//! [`KeyEncoder`](flightdeck_core::KeyEncoder) (versioned, domain-separated,
//! length-prefixed), so keys are safe in Redis key names and logs. The HTTP
//! and gRPC extractors hash a request's fields only when the digest is
//! first needed ([`KeyEncoder::finish_key_lazy`](flightdeck_core::KeyEncoder::finish_key_lazy)):
//! a flight that stays in the process compares the fields themselves.
//!
//! Errors (a body that fails to read, a conflicting `Idempotency-Key`) are
//! returned as `BoxError`s of the types in [`error`]; for HTTP and gRPC,
//! `flightdeck_core::http::ErrorResponseLayer` turns them into 400 / 422 or
//! the matching `grpc-status`.
//!
//! ```
//! use flightdeck_core::{KeyEncoder, StageName};
//! use flightdeck_key::{key_fn, KeyLayer, Keyed};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), flightdeck_core::BoxError> {
//! let stage = StageName::new("lookup").unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(KeyLayer::new(key_fn(move |req: &Keyed<u64>| {
//!         // Odd ids are never coalesced.
//!         (req.get_ref() % 2 == 0).then(|| {
//!             KeyEncoder::new()
//!                 .field(&req.get_ref().to_le_bytes())
//!                 .finish_key(stage.clone(), None)
//!         })
//!     })))
//!     .service(service_fn(|req: Keyed<u64>| async move {
//!         Ok::<_, std::convert::Infallible>(req.key().is_some())
//!     }));
//! assert!(svc.clone().oneshot(Keyed::new(2)).await?);
//! assert!(!svc.oneshot(Keyed::new(3)).await?);
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "http")]
#[macro_use]
mod macros;

pub mod error;
mod extract;
pub mod future;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod layer;
mod service;

pub use crate::extract::{
    key_fn, Decision, Extracted, Extraction, FnExtractor, KeyExtractor, KeySlot, Keyed,
    NamedStages, NotCoalescable, Reason,
};
pub use crate::layer::KeyLayer;
pub use crate::service::Key;
