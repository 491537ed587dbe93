//! When a request's head was read, for layers that wait for its body.

use std::time::Duration;

use tokio::time::Instant;

/// When a request's head was read, carried with the request (in an
/// `http::Request`'s extensions) by a layer that then waited for its body:
/// the key layer, hashing a body into the key. A timeout the request
/// brings (`grpc-timeout`, `x-request-timeout`) counts from here, as a
/// server counts it from the request's arrival, and not from when the body
/// was read: a slow upload does not lengthen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received(Instant);

impl Received {
    /// Read now.
    pub fn now() -> Self {
        Self(Instant::now())
    }

    /// Read at `at`.
    pub const fn at(at: Instant) -> Self {
        Self(at)
    }

    /// When the head was read.
    pub const fn instant(&self) -> Instant {
        self.0
    }

    /// What is left of a `timeout` that counts from the head: nothing once
    /// it has passed.
    pub fn left_of(&self, timeout: Duration) -> Duration {
        timeout.saturating_sub(self.0.elapsed())
    }
}
