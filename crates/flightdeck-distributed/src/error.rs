//! Errors of the L2 layer that are not in `flightdeck-core` (those are
//! `CoordinationUnavailable`, `ProtocolError`, `OutcomeUnknown`,
//! `LeaseLost`, `WaitTimeout`), and [`RemoteFailure`], re-exported from
//! there (its class maps it to the owner's status).
//!
//! ```
//! use flightdeck_core::error::{find, BoxError};
//! use flightdeck_core::ErrorClass;
//! use flightdeck_distributed::error::RemoteFailure;
//!
//! let err: BoxError = Box::new(RemoteFailure::new(ErrorClass::Internal, "database on fire"));
//! assert_eq!(find::<RemoteFailure>(&*err).unwrap().message(), "database on fire");
//! ```

use std::fmt;
use std::time::Duration;

pub use flightdeck_core::error::RemoteFailure;

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
