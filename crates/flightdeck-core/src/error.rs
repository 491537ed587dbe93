//! Error types shared by every flightdeck layer.
//!
//! Layers return `BoxError`; these small types are what you downcast to
//! (`err.is::<WaitTimeout>()`) or find in the `source()` chain with
//! [`find`]. The HTTP and gRPC adapters map them to responses through
//! [`ErrorClass`], in one place.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::key::StageName;

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
    /// unknown error): HTTP 500, gRPC `INTERNAL`.
    Internal,
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
            Self::Internal => 500,
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
            Self::Internal => 13,
            Self::InvalidRequest => 3,
            Self::Unprocessable => 9,
        }
    }

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
    if e.is::<WaitTimeout>() || e.is::<DeadlineExceeded>() {
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
    {
        Some(ErrorClass::Unavailable)
    } else if e.is::<InProgress>() {
        Some(ErrorClass::InProgress)
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

/// The request body could not be read while computing the flight key (the
/// client went away, a malformed chunk, ...). Carries the body's error as its
/// source; the message does not repeat it, so it is safe to send to clients.
#[derive(Debug)]
pub struct RequestBodyError {
    source: BoxError,
}

impl RequestBodyError {
    /// Wraps the body's error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for RequestBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("failed to read the request body")
    }
}

impl StdError for RequestBodyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A request header has a value the layer cannot use (e.g. a malformed
/// `grpc-timeout`): the client's mistake, answered with 400 /
/// `INVALID_ARGUMENT`. Layers with their own error type put this one in its
/// `source()` chain so the one mapping applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidHeader {
    name: String,
    problem: &'static str,
}

impl InvalidHeader {
    /// The header `name` is unusable because of `problem`.
    pub fn new(name: impl Into<String>, problem: &'static str) -> Self {
        Self {
            name: name.into(),
            problem,
        }
    }

    /// The header's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &'static str {
        self.problem
    }
}

impl fmt::Display for InvalidHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} header: {}", self.name, self.problem)
    }
}

impl StdError for InvalidHeader {}

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

/// A circuit breaker is open and rejected the call without running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    name: Arc<str>,
}

impl CircuitOpen {
    /// Creates the error for the named breaker.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self { name: name.into() }
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "circuit open (breaker {})", self.name)
    }
}

impl StdError for CircuitOpen {}

/// A time budget ran out before or during a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineExceeded {
    phase: &'static str,
}

impl DeadlineExceeded {
    /// Creates the error for the named phase (`"coordination"`,
    /// `"execution"`, `"result"`, `"request"`).
    pub const fn new(phase: &'static str) -> Self {
        Self { phase }
    }

    /// The phase that ran out of time.
    pub fn phase(&self) -> &'static str {
        self.phase
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "deadline exceeded ({})", self.phase)
    }
}

impl StdError for DeadlineExceeded {}

/// The coordination layer (e.g. Redis) could not be reached before the work
/// was acquired. Carries the underlying error as its source.
#[derive(Debug)]
pub struct CoordinationUnavailable {
    source: BoxError,
}

impl CoordinationUnavailable {
    /// Wraps the underlying error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for CoordinationUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination unavailable: {}", self.source)
    }
}

impl StdError for CoordinationUnavailable {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The coordination layer answered something this version does not
/// understand: an unknown script action, a malformed reply, a stored result
/// with an unknown version or codec, bytes that do not decode. Distinct from
/// [`CoordinationUnavailable`] so that a fallback can also raise an alert.
#[derive(Debug)]
pub struct ProtocolError {
    message: String,
    source: Option<BoxError>,
}

impl ProtocolError {
    /// A protocol error described by `message` (no raw keys or payloads).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// A protocol error caused by `source`.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// What was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination protocol error: {}", self.message)
    }
}

impl StdError for ProtocolError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// A write to the coordination layer may or may not have happened (the
/// connection dropped or the call timed out after it was sent). Retry only
/// with the same owner token, which the scripts treat idempotently.
#[derive(Debug)]
pub struct OutcomeUnknown {
    source: BoxError,
}

impl OutcomeUnknown {
    /// Wraps the underlying error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination outcome unknown: {}", self.source)
    }
}

impl StdError for OutcomeUnknown {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The owner lost its lease while the work ran (another node may own the
/// flight now) and the stage cancels work on lease loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    stage: Option<StageName>,
    generation: u64,
}

impl LeaseLost {
    /// Creates the error for the generation that was lost.
    pub fn new(stage: Option<StageName>, generation: u64) -> Self {
        Self { stage, generation }
    }

    /// The generation (fencing token) that was lost.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease lost (generation {})", self.generation)?;
        if let Some(s) = &self.stage {
            write!(f, " (stage {s})")?;
        }
        Ok(())
    }
}

impl StdError for LeaseLost {}

/// The error of the one execution, shared with every waiter of the flight.
///
/// `Display` shows the inner error's message; `source()` is the inner error,
/// so [`find`] reaches the original type.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Mine;
    impl fmt::Display for Mine {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("mine")
        }
    }
    impl StdError for Mine {}

    #[test]
    fn coordination_errors_are_unavailable() {
        let p = ProtocolError::with_source("bad reply", Mine);
        assert_eq!(ErrorClass::of(&p).http_status(), 503);
        assert!(find::<Mine>(&p).is_some());
        assert_eq!(p.to_string(), "coordination protocol error: bad reply");
        let u = OutcomeUnknown::new(Mine);
        assert_eq!(ErrorClass::of(&u).grpc_code(), 14);
        let l = LeaseLost::new(None, 3);
        assert_eq!(l.to_string(), "lease lost (generation 3)");
        assert_eq!(ErrorClass::of(&l), ErrorClass::Unavailable);
    }

    #[test]
    fn find_walks_shared_errors() {
        let shared: BoxError = Box::new(SharedError::new(Mine));
        assert!(find::<Mine>(&*shared).is_some());
        assert_eq!(shared.to_string(), "mine");
        assert_eq!(ErrorClass::of(&*shared), ErrorClass::Internal);
    }

    #[test]
    fn classes_map_to_statuses() {
        let open: BoxError = Box::new(SharedError::new(CircuitOpen::new("redis")));
        assert_eq!(ErrorClass::of(&*open), ErrorClass::Unavailable);
        assert_eq!(ErrorClass::of(&*open).http_status(), 503);
        assert_eq!(ErrorClass::of(&*open).grpc_code(), 14);
        let t = WaitTimeout::new(None, Duration::from_secs(1));
        assert_eq!(ErrorClass::of(&t).http_status(), 504);
        let full = BulkheadFull::new(None);
        assert_eq!(ErrorClass::of(&full).http_status(), 429);
        assert_eq!(ErrorClass::of(&full).grpc_code(), 8);
        assert_eq!(ErrorClass::of(&TooManyWaiters::new(None, 3)).grpc_code(), 8);
        let conflict = IdempotencyConflict::new(None);
        assert_eq!(ErrorClass::of(&conflict).http_status(), 422);
        assert_eq!(ErrorClass::of(&conflict).grpc_code(), 9);
        let body = RequestBodyError::new(Mine);
        assert_eq!(ErrorClass::of(&body).http_status(), 400);
        assert_eq!(ErrorClass::of(&body).grpc_code(), 3);
        assert!(find::<Mine>(&body).is_some());
    }

    #[test]
    fn messages_are_lowercase_and_name_the_stage() {
        let s = StageName::new("score").unwrap();
        assert_eq!(
            TooManyFlights::new(Some(s.clone()), 4).to_string(),
            "too many flights (limit 4) (stage score)"
        );
        assert_eq!(
            WorkPanicked::new(Some(s)).to_string(),
            "work panicked (stage score)"
        );
        assert_eq!(
            CircuitOpen::new("redis").to_string(),
            "circuit open (breaker redis)"
        );
    }
}
