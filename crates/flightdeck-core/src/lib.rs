//! The shared vocabulary of flightdeck.
//!
//! Every flightdeck layer speaks in these terms, so that the layers can be
//! stacked without knowing each other:
//!
//! - [`FlightKey`]: which requests are "the same work" (stage, tenant scope,
//!   digest). Keys travel as request extensions.
//! - [`StageName`]: the kind of work, with its own policy.
//! - [`KeySource`]: how the layers read a request's key.
//! - [`Share`]: how one response is handed to many waiters
//!   ([`CloneShare`], and `http::HttpShare` behind the `http` feature),
//!   and [`Serves`]: which requests a shared result may serve (`Vary`).
//! - [`error`]: the small error types all layers return, and the
//!   [`ErrorClass`] that maps them to HTTP and gRPC statuses.
//! - [`metric`]: the metric names, in one place.
//! - [`stale`]: when a result past its freshness may still answer.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod error;
#[doc(hidden)]
pub mod expiring;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
pub mod metric;
#[doc(hidden)]
pub mod random;
mod received;
#[doc(hidden)]
pub mod rt;
pub mod share;
pub mod source;
pub mod stale;
#[doc(hidden)]
pub mod time;

pub use error::{BoxError, ErrorClass, SharedError};
pub use key::{Digest, FlightKey, KeyEncoder, StageName};
pub use received::Received;
pub use share::{CloneShare, Serves, Share, Shareable, SharedForm, Unshareable};
pub use source::{FromExtension, KeySource};
pub use stale::{Failures, Stale, StaleReason, StaleWindows};
