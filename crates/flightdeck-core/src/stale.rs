//! Answering anyway: when a result past its freshness may still answer.
//!
//! A stage that replays finished results to new callers (its replay TTL) may
//! also keep them a while longer, to answer with them when the fresh
//! answer would cost a wait or a failure. Each window is off (zero) by
//! default; a stage turns on only what it asks for:
//!
//! - [`revalidate`](StaleWindows::revalidate) (`stale-while-revalidate`):
//!   a result past its freshness answers at once while exactly one
//!   refresh runs (RFC 5861, Varnish's grace, nginx's `updating`);
//! - [`if_error`](StaleWindows::if_error) (`stale-if-error`): a result
//!   answers when the work fails with a class the stage names, and
//!   [`retry_after`](StaleWindows::retry_after) keeps a failing key from
//!   running its work again on every request;
//! - [`soft_timeout`](StaleWindows::soft_timeout): callers still waiting
//!   past it get the stale result while the work goes on;
//! - [`early_refresh`](StaleWindows::early_refresh): a hot result is
//!   refreshed by one caller before it expires.
//!
//! [`Failures`] says which outcomes of the work a stale result may answer
//! for ([`ErrorFailures`]; `http::HttpFailures` for HTTP and gRPC).
//!
//! An answer given from a stale result carries a [`Stale`] (in a
//! response's extensions for HTTP), saying why and how old it is.

use std::fmt;
use std::time::Duration;

use crate::error::{BoxError, ErrorClass};

/// How long, past its freshness, a stored result may still answer, and
/// when. All zero (off) by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaleWindows {
    /// Past freshness, for this long: answer with the stale result at
    /// once and run one refresh.
    pub revalidate: Duration,
    /// Past freshness, for this long: answer with the stale result when
    /// the work fails with a class the stage names.
    pub if_error: Duration,
    /// After a failure answered with a stale result, how long the stale
    /// result keeps answering before one caller runs the work again.
    pub retry_after: Duration,
    /// Callers still waiting for the work after this long get the stale
    /// result (the work goes on, bounded by the execution timeout).
    /// Zero: off.
    pub soft_timeout: Duration,
    /// How long before a result's freshness ends one caller may refresh
    /// it early (chosen at random, more likely as the end nears and the
    /// longer the work takes). Zero: off.
    pub early_refresh: Duration,
}

impl StaleWindows {
    /// Every window off.
    pub const OFF: Self = Self {
        revalidate: Duration::ZERO,
        if_error: Duration::ZERO,
        retry_after: Duration::ZERO,
        soft_timeout: Duration::ZERO,
        early_refresh: Duration::ZERO,
    };

    /// Whether any window is on.
    pub fn any(&self) -> bool {
        *self != Self::OFF
    }

    /// How long past its freshness a result must be kept for any window
    /// to use it: the longer of [`revalidate`](Self::revalidate) and
    /// [`if_error`](Self::if_error) (a soft timeout uses either).
    pub fn keep_stale(&self) -> Duration {
        self.revalidate.max(self.if_error)
    }
}

/// Why a stale result answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StaleReason {
    /// Past freshness, within `stale-while-revalidate`: a refresh runs.
    Revalidate,
    /// The work failed (or is throttled after failing), within
    /// `stale-if-error`.
    Error,
    /// The work ran past `soft-timeout`.
    SoftTimeout,
    /// The coordination backend is unavailable and this node kept a copy.
    RedisDown,
    /// The caller's wait for the flight ran past `wait-timeout`, within
    /// `stale-if-error` (the work did not fail: nothing is throttled).
    WaitTimeout,
}

impl StaleReason {
    /// The label value (`revalidate` | `error` | `soft_timeout` |
    /// `redis_down` | `wait_timeout`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Revalidate => "revalidate",
            Self::Error => "error",
            Self::SoftTimeout => "soft_timeout",
            Self::RedisDown => "redis_down",
            Self::WaitTimeout => "wait_timeout",
        }
    }
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Marks an answer given from a stale result: why, and its age (since
/// the work that produced it finished, by the clock of the store that
/// kept it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale {
    /// Why the stale result answered.
    pub reason: StaleReason,
    /// How old the result is.
    pub age: Duration,
}

/// Which outcomes of the work a stale result may answer for
/// (`stale-if-error`), judged on the work's shared form `S` or its error.
///
/// [`ErrorFailures`] judges errors only (an execution timeout, a full
/// bulkhead, a dependency unavailable); `flightdeck_core::http::HttpFailures`
/// (feature `http`) adds HTTP 5xx and 429 and the gRPC statuses
/// `UNAVAILABLE`, `DEADLINE_EXCEEDED` and `RESOURCE_EXHAUSTED`. Any
/// `Fn(Result<&S, &BoxError>) -> bool` is one too, for the rest.
pub trait Failures<S>: Send + Sync + 'static {
    /// Whether `outcome` failed in a way a stale result may answer for.
    fn failed(&self, outcome: Result<&S, &BoxError>) -> bool;
}

impl<S, F> Failures<S> for F
where
    F: Fn(Result<&S, &BoxError>) -> bool + Send + Sync + 'static,
{
    fn failed(&self, outcome: Result<&S, &BoxError>) -> bool {
        self(outcome)
    }
}

/// Errors whose class says the work could not be done now (an
/// execution timeout: [`ErrorClass::DeadlineExceeded`]; a full bulkhead:
/// [`ErrorClass::TooManyRequests`]; [`ErrorClass::Unavailable`] and
/// [`ErrorClass::Overloaded`]) are failures; every value is an answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorFailures;

impl ErrorFailures {
    /// Whether `err` is a failure a stale result may answer for.
    pub fn error_failed(err: &BoxError) -> bool {
        matches!(
            ErrorClass::of(err.as_ref()),
            ErrorClass::DeadlineExceeded
                | ErrorClass::TooManyRequests
                | ErrorClass::Unavailable
                | ErrorClass::Overloaded
        )
    }
}

impl<S> Failures<S> for ErrorFailures {
    fn failed(&self, outcome: Result<&S, &BoxError>) -> bool {
        outcome.err().is_some_and(Self::error_failed)
    }
}

/// XFetch (Vattani, Chierichetti and Lowenstein, VLDB 2015): whether a
/// caller `left` before its copy's freshness ends refreshes it now, for
/// work that takes `took`: with probability `exp(-left / took)`, drawn
/// from the crate's one source of randomness, so that a simulation
/// replays it.
pub fn xfetch(left: Duration, took: Duration) -> bool {
    if took.is_zero() {
        return left.is_zero();
    }
    let u = crate::random::range_f64(f64::MIN_POSITIVE, 1.0);
    -took.as_secs_f64() * u.ln() >= left.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_keep_is_the_longer_window() {
        assert!(!StaleWindows::default().any());
        let w = StaleWindows {
            revalidate: Duration::from_secs(5),
            if_error: Duration::from_secs(60),
            ..StaleWindows::OFF
        };
        assert!(w.any());
        assert_eq!(w.keep_stale(), Duration::from_secs(60));
        assert_eq!(StaleReason::SoftTimeout.to_string(), "soft_timeout");
        assert_eq!(StaleReason::WaitTimeout.to_string(), "wait_timeout");
    }

    #[test]
    fn error_failures_judge_by_class() {
        use crate::error::DeadlineExceeded;
        let timeout: BoxError = Box::new(DeadlineExceeded::new("execution"));
        let other: BoxError = "boom".into();
        assert!(Failures::<u8>::failed(&ErrorFailures, Err(&timeout)));
        assert!(!Failures::<u8>::failed(&ErrorFailures, Err(&other)));
        assert!(!Failures::<u8>::failed(&ErrorFailures, Ok(&1)));
        let by_value = |o: Result<&u8, &BoxError>| o.is_ok_and(|v| *v > 1);
        assert!(by_value.failed(Ok(&2)));
    }
}
