//! What a local flight may do: its clocks and bounds.

use std::time::Duration;

/// What happens to a running flight when every caller waiting on it is
/// gone (client disconnects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnAbandon {
    /// Cancel the work: nobody wants the result.
    #[default]
    Cancel,
    /// Finish the work anyway: other nodes may wait on it, or its result is
    /// replayed to later callers.
    Finish,
}

/// The policy of a [`LocalFlightLayer`](crate::LocalFlightLayer).
///
/// Four clocks that are never confused:
///
/// - **wait timeout**: how long one caller waits for a shared result. A
///   waiter that times out leaves with [`WaitTimeout`]; the flight stays.
///   A waiter's wait counts from when it joined; the leader's from the end
///   of its work's first poll that returned pending.
/// - **flight TTL**: how long a running flight may be *joined*. After it,
///   new callers start a fresh flight (the old one still finishes for its
///   waiters). It counts from the end of the work's first pending poll, or
///   from when a caller first found the flight running, if that comes
///   first (so a leader that nobody polls does not hold its key for ever).
///   A flight that completes in its first poll never reads the clock for
///   it. Neither clock depends on whether metrics are recorded.
/// - **replay TTL**: how long a finished result is served to newcomers.
///   `0` (the default) is pure single-flight.
/// - the execution budget is not ours: put a budget or timeout layer
///   inside.
///
/// Bounds: `max_flights` running flights per layer and `max_waiters`
/// callers per flight (the leader included). Past them a call is rejected
/// with [`TooManyFlights`] / [`TooManyWaiters`]. A bound of `0` rejects
/// every call. A duration too long to add to an instant (such as
/// `Duration::MAX`) means "for ever".
///
/// [`WaitTimeout`]: flightdeck_core::error::WaitTimeout
/// [`TooManyFlights`]: flightdeck_core::error::TooManyFlights
/// [`TooManyWaiters`]: flightdeck_core::error::TooManyWaiters
#[derive(Debug, Clone)]
pub struct FlightPolicy {
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) flight_ttl: Duration,
    pub(crate) replay_ttl: Duration,
    pub(crate) on_abandon: OnAbandon,
    pub(crate) max_flights: usize,
    pub(crate) max_waiters: usize,
}

impl FlightPolicy {
    /// Defaults: wait timeout 35 s, flight TTL 30 s, replay TTL 0, cancel
    /// abandoned work, 10,000 flights, 10,000 waiters per flight.
    pub const fn new() -> Self {
        Self {
            wait_timeout: Some(Duration::from_secs(35)),
            flight_ttl: Duration::from_secs(30),
            replay_ttl: Duration::ZERO,
            on_abandon: OnAbandon::Cancel,
            max_flights: 10_000,
            max_waiters: 10_000,
        }
    }

    /// Sets how long each caller waits for a shared result (`None`: no
    /// limit; put a deadline elsewhere then). `Some(0)` fails every caller
    /// that joins a flight at once with `WaitTimeout` (a warning says so
    /// when the layer is built).
    pub const fn wait_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// Sets how long a running flight may be joined. `0` means no caller
    /// ever joins one (every caller runs its own work: the layer coalesces
    /// nothing, and says so with a warning when it is built); for no limit,
    /// give `Duration::MAX`.
    pub const fn flight_ttl(mut self, ttl: Duration) -> Self {
        self.flight_ttl = ttl;
        self
    }

    /// Sets how long a finished result is replayed to newcomers.
    pub const fn replay_ttl(mut self, ttl: Duration) -> Self {
        self.replay_ttl = ttl;
        self
    }

    /// Sets what happens when every waiter of a flight is gone.
    pub const fn on_abandon(mut self, on_abandon: OnAbandon) -> Self {
        self.on_abandon = on_abandon;
        self
    }

    /// Sets the maximum number of running flights.
    pub const fn max_flights(mut self, n: usize) -> Self {
        self.max_flights = n;
        self
    }

    /// Sets the maximum number of callers on one flight, leader included.
    pub const fn max_waiters(mut self, n: usize) -> Self {
        self.max_waiters = n;
        self
    }
}

impl FlightPolicy {
    /// Warns of each setting under which the layer does nothing useful,
    /// with what it does instead: legal (each has a meaning, and a test
    /// may want it), but a `0` read as "no limit" is an easy mistake, so
    /// building a layer with one is never silent. Out of line and cold: it
    /// runs once per layer, and inline it moved the request path's codegen.
    #[cold]
    #[inline(never)]
    pub(crate) fn warn_if_degenerate(&self) {
        let degenerate = [
            (
                self.flight_ttl.is_zero(),
                "flight_ttl",
                "is 0: no caller ever joins a running flight, every caller runs its own \
                 work (for no limit, give Duration::MAX)",
            ),
            (
                self.wait_timeout.is_some_and(|t| t.is_zero()),
                "wait_timeout",
                "is Some(0): every caller that joins a flight fails at once with \
                 WaitTimeout (for no limit, give None)",
            ),
            (
                self.max_flights == 0,
                "max_flights",
                "is 0: every call is rejected with TooManyFlights",
            ),
            (
                self.max_waiters == 0,
                "max_waiters",
                "is 0: every call is rejected with TooManyWaiters",
            ),
        ];
        for (_, setting, what) in degenerate.into_iter().filter(|(on, ..)| *on) {
            tracing::warn!(setting, "the local flight policy's {setting} {what}");
        }
    }
}

impl Default for FlightPolicy {
    fn default() -> Self {
        Self::new()
    }
}
