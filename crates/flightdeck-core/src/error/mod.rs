//! Error types shared by every flightdeck layer.
//!
//! Layers return `BoxError`; these small types are what you downcast to
//! (`err.is::<WaitTimeout>()`) or find in the `source()` chain with
//! [`find`]. The HTTP and gRPC adapters map them to responses through
//! [`ErrorClass`], in one place.

use std::error::Error as StdError;

mod coordination;
mod flight;
mod request;
#[cfg(test)]
mod tests;

pub use self::coordination::*;
pub use self::flight::*;
pub use self::request::*;

/// The boxed error type used by flightdeck's generic layers.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Finds the first error of type `E` in `err` or its `source()` chain.
///
/// Errors shared with waiters are wrapped in [`SharedError`], so a plain
/// `downcast_ref` on the outer error does not see the inner service's error;
/// this does.
pub fn find<'a, E: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

/// How an error should be reported to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A dependency (the coordination layer, a breaker) is unavailable:
    /// HTTP 503, gRPC `UNAVAILABLE`.
    Unavailable,
    /// A bound of ours was hit (flights, waiters): HTTP 503, gRPC
    /// `RESOURCE_EXHAUSTED`.
    Overloaded,
    /// Too many concurrent executions for a stage: HTTP 429, gRPC
    /// `RESOURCE_EXHAUSTED`.
    TooManyRequests,
    /// A deadline or wait timeout passed: HTTP 504, gRPC `DEADLINE_EXCEEDED`.
    DeadlineExceeded,
    /// The work is running elsewhere and the stage returns instead of
    /// waiting: HTTP 202, gRPC `UNAVAILABLE` (retry later).
    InProgress,
    /// The work failed in a way the client cannot act on (a panic, an
    /// unknown error): HTTP 500, gRPC `INTERNAL`. The message is never
    /// sent: it may carry internals.
    Internal,
    /// The service is configured wrong (a request keyed into a stage that
    /// has no policy): HTTP 500, gRPC `INTERNAL`, with a message that
    /// names what is missing, so whoever reads the response can fix it.
    Misconfigured,
    /// The request itself is broken (e.g. its body failed to read): HTTP 400,
    /// gRPC `INVALID_ARGUMENT`.
    InvalidRequest,
    /// The request is well-formed but contradicts an earlier one (an
    /// `Idempotency-Key` reused with a different payload): HTTP 422, gRPC
    /// `FAILED_PRECONDITION`.
    Unprocessable,
}

impl ErrorClass {
    /// The HTTP status code for this class.
    pub const fn http_status(self) -> u16 {
        match self {
            Self::Unavailable | Self::Overloaded => 503,
            Self::TooManyRequests => 429,
            Self::DeadlineExceeded => 504,
            Self::InProgress => 202,
            Self::Internal | Self::Misconfigured => 500,
            Self::InvalidRequest => 400,
            Self::Unprocessable => 422,
        }
    }

    /// The gRPC status code (as in `grpc-status`) for this class.
    pub const fn grpc_code(self) -> u8 {
        match self {
            Self::Unavailable | Self::InProgress => 14,
            Self::Overloaded | Self::TooManyRequests => 8,
            Self::DeadlineExceeded => 4,
            Self::Internal | Self::Misconfigured => 13,
            Self::InvalidRequest => 3,
            Self::Unprocessable => 9,
        }
    }

    /// A stable name for the class, as it is stored with a cached failure
    /// (and as logs may show it): `unavailable`, `overloaded`,
    /// `too_many_requests`, `deadline_exceeded`, `in_progress`,
    /// `internal`, `misconfigured`, `invalid_request`, `unprocessable`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Overloaded => "overloaded",
            Self::TooManyRequests => "too_many_requests",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::InProgress => "in_progress",
            Self::Internal => "internal",
            Self::Misconfigured => "misconfigured",
            Self::InvalidRequest => "invalid_request",
            Self::Unprocessable => "unprocessable",
        }
    }

    /// The class of a [`name`](Self::name); `None` for a name this version
    /// does not know (a newer one's class).
    ///
    /// ```
    /// use flightdeck_core::ErrorClass;
    ///
    /// let class = ErrorClass::TooManyRequests;
    /// assert_eq!(ErrorClass::from_name(class.name()), Some(class));
    /// assert_eq!(ErrorClass::from_name("teapot"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Every class, for [`from_name`](Self::from_name).
    const ALL: [Self; 9] = [
        Self::Unavailable,
        Self::Overloaded,
        Self::TooManyRequests,
        Self::DeadlineExceeded,
        Self::InProgress,
        Self::Internal,
        Self::Misconfigured,
        Self::InvalidRequest,
        Self::Unprocessable,
    ];

    /// Classifies an error by the first flightdeck error in its chain;
    /// anything else is [`ErrorClass::Internal`].
    pub fn of(err: &(dyn StdError + 'static)) -> Self {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
        while let Some(e) = cur {
            if let Some(class) = classify_one(e) {
                return class;
            }
            cur = e.source();
        }
        Self::Internal
    }
}

fn classify_one(e: &(dyn StdError + 'static)) -> Option<ErrorClass> {
    if let Some(remote) = e.downcast_ref::<RemoteFailure>() {
        // Another node's owner failed: answer as it did.
        Some(remote.class())
    } else if e.is::<WaitTimeout>() || e.is::<DeadlineExceeded>() {
        Some(ErrorClass::DeadlineExceeded)
    } else if e.is::<TooManyFlights>() || e.is::<TooManyWaiters>() {
        Some(ErrorClass::Overloaded)
    } else if e.is::<BulkheadFull>() {
        Some(ErrorClass::TooManyRequests)
    } else if e.is::<CircuitOpen>()
        || e.is::<CoordinationUnavailable>()
        || e.is::<FlightAbandoned>()
        || e.is::<ProtocolError>()
        || e.is::<OutcomeUnknown>()
        || e.is::<LeaseLost>()
        || e.is::<OwnerGone>()
    {
        Some(ErrorClass::Unavailable)
    } else if e.is::<InProgress>() {
        Some(ErrorClass::InProgress)
    } else if e.is::<UnknownStage>() {
        Some(ErrorClass::Misconfigured)
    } else if e.is::<WorkPanicked>() {
        Some(ErrorClass::Internal)
    } else if e.is::<RequestBodyError>() || e.is::<InvalidHeader>() {
        Some(ErrorClass::InvalidRequest)
    } else if e.is::<IdempotencyConflict>() {
        Some(ErrorClass::Unprocessable)
    } else {
        None
    }
}
