//! Errors of the L2 layer that are not in `flightdeck-core` (those are
//! `CoordinationUnavailable`, `ProtocolError`, `OutcomeUnknown`,
//! `LeaseLost`, `WaitTimeout`).
//!
//! ```
//! use flightdeck_core::error::{find, BoxError};
//! use flightdeck_distributed::error::RemoteFailure;
//!
//! let err: BoxError = Box::new(RemoteFailure::new("database on fire"));
//! assert_eq!(find::<RemoteFailure>(&*err).unwrap().message(), "database on fire");
//! ```

use std::fmt;
use std::time::Duration;

/// The owner of a flight on another node failed, and the stage caches
/// failures (`failure_ttl`): every follower and later hit gets this error
/// with the owner's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFailure {
    message: String,
}

impl RemoteFailure {
    /// Creates the error from the stored message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The owner's error message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the owner's work failed: {}", self.message)
    }
}

impl std::error::Error for RemoteFailure {}

/// A backend call did not answer within the policy's `call_timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTimedOut {
    op: &'static str,
    after: Duration,
}

impl CallTimedOut {
    /// Creates the error for the named call.
    pub fn new(op: &'static str, after: Duration) -> Self {
        Self { op, after }
    }

    /// The backend call (`acquire`, `heartbeat`, `commit`, ...).
    pub fn op(&self) -> &'static str {
        self.op
    }
}

impl fmt::Display for CallTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend {} timed out after {:?}", self.op, self.after)
    }
}

impl std::error::Error for CallTimedOut {}
