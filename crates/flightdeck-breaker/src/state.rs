//! Breaker states and the transition events.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CircuitState {
    /// Calls go through and are recorded (possibly only a share of them
    /// while a ramp is running, see [`Breaker::ramp_share`](crate::Breaker::ramp_share)).
    Closed,
    /// Calls are rejected until the (jittered) wait has passed.
    Open,
    /// A bounded number of probe calls go through; the rest are rejected.
    HalfOpen,
    /// Forced open by hand: every call is rejected until reset.
    ForcedOpen,
    /// Forced closed by hand: every call goes through, nothing is recorded,
    /// until reset.
    ForcedClosed,
}

impl CircuitState {
    /// The value of the state gauge: 0 closed, 1 open, 2 half-open,
    /// 3 forced open, 4 forced closed.
    pub const fn gauge_value(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::Open => 1.0,
            Self::HalfOpen => 2.0,
            Self::ForcedOpen => 3.0,
            Self::ForcedClosed => 4.0,
        }
    }

    /// Lowercase name, as used in logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::ForcedOpen => "forced_open",
            Self::ForcedClosed => "forced_closed",
        }
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum TransitionReason {
    /// The failure rate over the window reached the threshold.
    FailureRate {
        /// The rate that was observed.
        rate: f64,
        /// Calls in the window when it was observed.
        calls: u32,
    },
    /// Too many failures in a row.
    ConsecutiveFailures(u32),
    /// The open wait passed; probing starts.
    WaitElapsed,
    /// Enough probes succeeded.
    ProbesSucceeded,
    /// A probe failed.
    ProbeFailed,
    /// Changed by hand through the handle.
    Manual,
    /// The dependency is known to be back (see
    /// [`Breaker::recover`](crate::Breaker::recover)).
    Recovered,
}

/// One state change of a breaker, as sent to subscribers.
#[derive(Debug, Clone)]
pub struct Transition {
    /// The breaker's name.
    pub breaker: Arc<str>,
    /// State before.
    pub from: CircuitState,
    /// State after.
    pub to: CircuitState,
    /// Why.
    pub reason: TransitionReason,
    /// When (tokio's clock).
    pub at: Instant,
    /// For transitions to [`CircuitState::Open`]: how long it stays open
    /// (growth and jitter applied).
    pub open_for: Option<Duration>,
}
