//! Deciding which results count against the breaker.
//!
//! The breaker sees the whole `Result` of every admitted call and asks a
//! [`Classify`] what it means. The default, [`ErrIsFailure`], counts every
//! `Err` as a failure. [`TransientErrors`] counts only errors that say the
//! dependency itself is unhealthy (connection errors, timeouts, Redis
//! `LOADING`/`READONLY`/`CLUSTERDOWN`/…), so business errors never open the
//! circuit. Any `Fn(Result<&Res, &BoxError>) -> Outcome` is a classifier too.
//!
//! ```
//! use flightdeck_breaker::{Outcome, Classify};
//! use flightdeck_core::BoxError;
//!
//! // A response-aware classifier: HTTP-like 5xx codes count as failures.
//! let classify = |r: Result<&u16, &BoxError>| match r {
//!     Ok(code) if *code >= 500 => Outcome::Failure,
//!     Ok(_) => Outcome::Success,
//!     Err(_) => Outcome::Failure,
//! };
//! assert_eq!(classify.classify(Ok(&503)), Outcome::Failure);
//! assert_eq!(classify.classify(Ok(&200)), Outcome::Success);
//! ```

use std::error::Error as StdError;
use std::io;

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::BoxError;

/// What one call's result means to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The dependency worked.
    Success,
    /// The dependency failed: counts towards opening the circuit.
    Failure,
    /// Neither: the call is not recorded (a half-open probe slot is freed).
    Ignore,
}

/// Classifies the result of a call (see the module docs).
pub trait Classify<Res> {
    /// Classifies one result. The error is the inner service's error,
    /// already converted into a [`BoxError`]; downcast it to match on types.
    fn classify(&self, result: Result<&Res, &BoxError>) -> Outcome;
}

impl<F, Res> Classify<Res> for F
where
    F: Fn(Result<&Res, &BoxError>) -> Outcome,
{
    fn classify(&self, result: Result<&Res, &BoxError>) -> Outcome {
        self(result)
    }
}

/// The default classifier: `Ok` is a success, every `Err` a failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrIsFailure;

impl<Res> Classify<Res> for ErrIsFailure {
    fn classify(&self, result: Result<&Res, &BoxError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }
    }
}

/// Counts only errors that mean "the dependency is unhealthy"; other errors
/// (the dependency answered, the request was wrong) count as successes.
///
/// Looks through the whole `source()` chain for:
/// - `std::io::Error` of a connection or timeout kind (refused, reset,
///   aborted, not connected, broken pipe, timed out, unexpected EOF);
/// - `tokio::time::error::Elapsed` and flightdeck's `DeadlineExceeded`;
/// - an error whose message starts with a Redis server error that means the
///   node cannot serve: `LOADING`, `READONLY`, `CLUSTERDOWN`, `MASTERDOWN`,
///   `TRYAGAIN`, `BUSY`, `NOREPLICAS`; or mentions a timeout or a closed
///   connection.
///
/// `MOVED`, `ASK`, `WRONGTYPE`, `NOSCRIPT` and business errors are not
/// counted: they are answers, not outages.
#[derive(Debug, Clone, Copy, Default)]
pub struct TransientErrors;

const REDIS_UNAVAILABLE: &[&str] = &[
    "LOADING",
    "READONLY",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "TRYAGAIN",
    "BUSY",
    "NOREPLICAS",
];

impl TransientErrors {
    /// True when `err` (or an error in its source chain) is transient.
    pub fn is_transient(err: &(dyn StdError + 'static)) -> bool {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
        while let Some(e) = cur {
            if Self::one(e) {
                return true;
            }
            cur = e.source();
        }
        false
    }

    fn one(e: &(dyn StdError + 'static)) -> bool {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            use io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | BrokenPipe
                    | TimedOut
                    | UnexpectedEof
            ) {
                return true;
            }
        }
        if e.is::<tokio::time::error::Elapsed>() || e.is::<DeadlineExceeded>() {
            return true;
        }
        let msg = e.to_string();
        let head = msg.trim_start();
        if REDIS_UNAVAILABLE
            .iter()
            .any(|p| head == *p || (head.starts_with(p) && head[p.len()..].starts_with([' ', ':'])))
        {
            return true;
        }
        let lower = head.to_ascii_lowercase();
        lower.contains("timed out")
            || lower.contains("timeout")
            || lower.contains("connection refused")
            || lower.contains("connection reset")
            || lower.contains("connection closed")
    }
}

impl<Res> Classify<Res> for TransientErrors {
    fn classify(&self, result: Result<&Res, &BoxError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(e) if Self::is_transient(&**e) => Outcome::Failure,
            Err(_) => Outcome::Success,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(msg: &str) -> BoxError {
        msg.to_owned().into()
    }

    #[test]
    fn default_counts_every_error() {
        assert_eq!(ErrIsFailure.classify(Ok(&1)), Outcome::Success);
        assert_eq!(
            Classify::<i32>::classify(&ErrIsFailure, Err(&err("x"))),
            Outcome::Failure
        );
    }

    #[test]
    fn transient_counts_outages_not_answers() {
        let c = TransientErrors;
        let fail = |e: BoxError| Classify::<()>::classify(&c, Err(&e));
        assert_eq!(
            fail(io::Error::from(io::ErrorKind::ConnectionRefused).into()),
            Outcome::Failure
        );
        assert_eq!(
            fail(err("LOADING Redis is loading the dataset in memory")),
            Outcome::Failure
        );
        assert_eq!(
            fail(err("READONLY You can't write against a read only replica.")),
            Outcome::Failure
        );
        assert_eq!(
            fail(err("CLUSTERDOWN The cluster is down")),
            Outcome::Failure
        );
        assert_eq!(fail(err("request timed out")), Outcome::Failure);
        assert_eq!(
            fail(DeadlineExceeded::new("coordination").into()),
            Outcome::Failure
        );
        assert_eq!(fail(err("MOVED 3999 127.0.0.1:6381")), Outcome::Success);
        assert_eq!(
            fail(err("WRONGTYPE Operation against a key")),
            Outcome::Success
        );
        assert_eq!(fail(err("LOADINGX is not a redis error")), Outcome::Success);
        assert_eq!(fail(err("user not found")), Outcome::Success);
        // Found through a wrapper's source chain.
        let wrapped: BoxError = Box::new(flightdeck_core::error::CoordinationUnavailable::new(
            io::Error::from(io::ErrorKind::ConnectionReset),
        ));
        assert_eq!(fail(wrapped), Outcome::Failure);
    }
}
