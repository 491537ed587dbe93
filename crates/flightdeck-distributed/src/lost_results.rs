//! Results this node saw committed, remembered until their TTL runs out,
//! so that a later answer that finds one missing tells a lost result
//! apart from one that merely expired.
//!
//! A node remembers the flights it committed as owner, and those whose
//! commit notice it received as follower (with `commit_replicas`, only
//! the commits it saw acknowledged by enough replicas), with the
//! generation and the
//! earliest moment the store may drop the result: the flight's start plus
//! the replay TTL (the commit happened after the flight started, so the
//! store keeps the result at least that long), less a small margin for
//! clocks. At most [`CAPACITY`] flights are remembered; the oldest go
//! first (an `ExpiringMap`, on tokio's clock). This node's own
//! invalidation forgets the flight; another node's is told apart by the
//! backend ([`Backend::invalidated_since`]).
//!
//! [`Backend::invalidated_since`]: crate::backend::Backend::invalidated_since

use std::time::Duration;

use flightdeck_core::expiring::ExpiringMap;
use tokio::time::Instant;

use crate::backend::FlightId;

/// How many flights a node remembers at most.
pub(crate) const CAPACITY: usize = 4096;

/// The generation seen committed per flight, until the store may drop
/// its result.
pub(crate) struct SeenCommits {
    flights: ExpiringMap<FlightId, u64>,
}

impl Default for SeenCommits {
    fn default() -> Self {
        Self {
            flights: ExpiringMap::new(CAPACITY),
        }
    }
}

/// How long before its TTL ran out a result is no longer expected: the
/// store's clock may run a little faster than this node's.
fn margin(ttl: Duration) -> Duration {
    (ttl / 50).min(Duration::from_secs(1))
}

impl SeenCommits {
    /// `generation` of `flight`, which started at `started`, committed a
    /// result kept for `ttl`.
    pub(crate) fn remember(
        &self,
        flight: FlightId,
        generation: u64,
        started: Instant,
        ttl: Duration,
    ) {
        let Some(until) = started.checked_add(ttl.saturating_sub(margin(ttl))) else {
            return;
        };
        if until <= Instant::now() {
            return;
        }
        self.flights.insert(flight, generation, until);
    }

    /// Forgets `flight` (this node invalidated it).
    pub(crate) fn forget(&self, flight: &FlightId) {
        self.flights.remove(flight);
    }

    /// The generation seen committed for `flight` whose result the store
    /// should still hold (one past that moment is forgotten).
    #[cfg(test)]
    pub(crate) fn expected(&self, flight: &FlightId) -> Option<u64> {
        self.flights.get(flight)
    }

    /// Forgets `flight` and returns the generation seen committed for it,
    /// if the store should still hold its result (one lock).
    pub(crate) fn take(&self, flight: &FlightId) -> Option<u64> {
        self.flights.remove(flight)
    }

    /// Forgets `flight` if the generation seen committed for it is not
    /// `generation` (the store holds another generation's result: the one
    /// seen was invalidated or is stale, not lost).
    pub(crate) fn forget_other(&self, flight: &FlightId, generation: u64) {
        self.flights.remove_if(flight, |seen| *seen != generation);
    }
}

#[cfg(test)]
mod tests {
    use flightdeck_core::{FlightKey, StageName};

    use super::*;

    fn flight(i: usize) -> FlightId {
        FlightId::of(&FlightKey::from_bytes(
            StageName::new("seen").unwrap(),
            format!("k{i}"),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn remembers_until_the_ttl_and_at_most_capacity() {
        let seen = SeenCommits::default();
        let ttl = Duration::from_secs(10);
        seen.remember(flight(0), 7, Instant::now(), ttl);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(seen.expected(&flight(0)), Some(7));
        seen.remember(flight(1), 8, Instant::now(), ttl);
        tokio::time::advance(ttl).await;
        assert_eq!(seen.expected(&flight(1)), None, "expired by its TTL");
        for i in 0..CAPACITY + 10 {
            seen.remember(flight(i), 1, Instant::now(), ttl);
        }
        let flights = &seen.flights;
        assert!(flights.len() <= CAPACITY);
        assert!(!flights.contains_key(&flight(0)), "the oldest went first");
        assert!(flights.contains_key(&flight(CAPACITY + 9)));
    }

    #[tokio::test(start_paused = true)]
    async fn forget_drops_the_flight() {
        let seen = SeenCommits::default();
        seen.remember(flight(0), 3, Instant::now(), Duration::from_secs(10));
        seen.forget(&flight(0));
        assert_eq!(seen.expected(&flight(0)), None);
    }
}
