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

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
pub mod metric;
pub mod share;
pub mod source;

pub use error::{BoxError, ErrorClass, SharedError};
pub use key::{Digest, FlightKey, KeyEncoder, StageName};
pub use share::{CloneShare, Serves, Share, Shareable, SharedForm, Unshareable};
pub use source::{FromExtension, KeySource};

/// The number an opaque id writes to a hasher (never 0): for ids that show
/// their number only through `Hash`, such as tokio's `runtime::Id`, so
/// that it can be kept in an atomic and compared with one load (the local
/// layer's timers and the breaker ask "is this the runtime that runs my
/// timer?").
pub fn id_number(id: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    /// Keeps what the id writes.
    struct Keep(u64);
    impl Hasher for Keep {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0 = bytes
                .iter()
                .fold(self.0, |n, &b| n.rotate_left(8) ^ u64::from(b));
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }
    let mut keep = Keep(0);
    id.hash(&mut keep);
    keep.0.max(1)
}
