//! Errors of a flight itself: the work's outcome as a waiter sees it,
//! and the bounds a stage puts on flights, waiters and executions.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{BoxError, ErrorClass};
use crate::key::StageName;

macro_rules! stage_error {
    ($(#[$m:meta])* $name:ident, $msg:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            stage: Option<StageName>,
        }

        impl $name {
            /// Creates the error for a stage (if known).
            pub fn new(stage: Option<StageName>) -> Self {
                Self { stage }
            }

            /// The stage the error happened in, if known.
            pub fn stage(&self) -> Option<&StageName> {
                self.stage.as_ref()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match &self.stage {
                    Some(s) => write!(f, concat!($msg, " (stage {})"), s),
                    None => f.write_str($msg),
                }
            }
        }

        impl StdError for $name {}
    };
}

/// A request's key names a stage that has no policy: the key rules and
/// the configuration disagree (a typo in a config file?). Never silently
/// bypassed: answered 500 / `INTERNAL` with this message, which names the
/// stage. A layer built with both the key rules and the policies refuses
/// to build instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStage {
    stage: StageName,
}

impl UnknownStage {
    /// Creates the error.
    pub fn new(stage: StageName) -> Self {
        Self { stage }
    }

    /// The stage the key named.
    pub fn stage(&self) -> &StageName {
        &self.stage
    }
}

impl fmt::Display for UnknownStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no policy for stage {:?}: the key rules name it, the configuration does not",
            self.stage.as_str()
        )
    }
}

impl StdError for UnknownStage {}

stage_error!(
    /// The work panicked. Every waiter of the flight gets this error; the
    /// key is free again for the next call.
    WorkPanicked,
    "work panicked"
);

stage_error!(
    /// The flight ended without a result for this waiter (its work was
    /// cancelled, e.g. the runtime shut down). Safe to retry.
    FlightAbandoned,
    "flight abandoned"
);

stage_error!(
    /// The bulkhead of a stage is full (and its queue, if any, too).
    BulkheadFull,
    "bulkhead full"
);

stage_error!(
    /// The work is in progress on another node and the stage is configured
    /// to answer "in progress" instead of waiting.
    InProgress,
    "work in progress elsewhere"
);

stage_error!(
    /// An `Idempotency-Key` was reused with a different request payload
    /// (IETF `draft-ietf-httpapi-idempotency-key-header`): the request is
    /// rejected instead of being given the first request's result. The
    /// message never contains the key itself.
    IdempotencyConflict,
    "idempotency key reused with a different request"
);

/// A waiter gave up after its wait timeout. The flight itself goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitTimeout {
    stage: Option<StageName>,
    waited: Duration,
}

impl WaitTimeout {
    /// Creates the error.
    pub fn new(stage: Option<StageName>, waited: Duration) -> Self {
        Self { stage, waited }
    }

    /// How long the waiter waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wait timed out after {:?}", self.waited)?;
        if let Some(s) = &self.stage {
            write!(f, " (stage {s})")?;
        }
        Ok(())
    }
}

impl StdError for WaitTimeout {}

macro_rules! limit_error {
    ($(#[$m:meta])* $name:ident, $msg:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            stage: Option<StageName>,
            limit: usize,
        }

        impl $name {
            /// Creates the error.
            pub fn new(stage: Option<StageName>, limit: usize) -> Self {
                Self { stage, limit }
            }

            /// The limit that was hit.
            pub fn limit(&self) -> usize {
                self.limit
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($msg, " (limit {})"), self.limit)?;
                if let Some(s) = &self.stage {
                    write!(f, " (stage {s})")?;
                }
                Ok(())
            }
        }

        impl StdError for $name {}
    };
}

limit_error!(
    /// The maximum number of concurrent flights was reached; the request
    /// was rejected instead of starting one more.
    TooManyFlights,
    "too many flights"
);

limit_error!(
    /// The maximum number of waiters on one flight was reached.
    TooManyWaiters,
    "too many waiters"
);

/// The error of the one execution, shared with every waiter of the flight.
///
/// `Display` shows the inner error's message; `source()` is the inner error,
/// so [`find`](super::find) reaches the original type.
#[derive(Clone)]
pub struct SharedError(Arc<BoxError>);

impl SharedError {
    /// Wraps an error for sharing.
    pub fn new(err: impl Into<BoxError>) -> Self {
        Self(Arc::new(err.into()))
    }

    /// The inner error.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &**self.0
    }
}

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedError").field(&self.0).finish()
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for SharedError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&**self.0)
    }
}

/// The owner of a flight on another node failed, and the stage caches
/// failures (`failure_ttl`): every follower and later hit gets this error,
/// with the owner's [`ErrorClass`] (so it answers with the owner's HTTP
/// status and gRPC code, see [`ErrorClass::of`]) and message.
///
/// ```
/// use flightdeck_core::error::{BoxError, ErrorClass, RemoteFailure};
///
/// let err: BoxError = Box::new(RemoteFailure::new(ErrorClass::TooManyRequests, "bulkhead full"));
/// assert_eq!(ErrorClass::of(&*err).http_status(), 429);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFailure {
    class: ErrorClass,
    message: String,
}

impl RemoteFailure {
    /// Creates the error from the owner's class and message.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// The class of the owner's error.
    pub fn class(&self) -> ErrorClass {
        self.class
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

impl StdError for RemoteFailure {}
