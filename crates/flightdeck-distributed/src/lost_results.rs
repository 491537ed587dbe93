//! Results this node saw committed, remembered until their TTL runs out,
//! so that a later answer that finds one missing tells a lost result
//! apart from one that merely expired.
//!
//! A node remembers the flights it committed as owner, and those whose
//! commit notice it received as follower (with `commit_replicas`, only
//! the commits it saw acknowledged by enough replicas), with the
//! generation and the
//! earliest moment the store may drop the result: the flight's start plus
//! the result TTL (the commit happened after the flight started, so the
//! store keeps the result at least that long), less a small margin for
//! clocks. At most [`CAPACITY`] flights are remembered; the oldest go
//! first. This node's own invalidation forgets the flight; another node's
//! is told apart by the backend ([`Backend::invalidated_since`]).
//!
//! [`Backend::invalidated_since`]: crate::backend::Backend::invalidated_since

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::FlightId;

/// How many flights a node remembers at most.
pub(crate) const CAPACITY: usize = 4096;

#[derive(Default)]
pub(crate) struct SeenCommits {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    flights: HashMap<FlightId, Committed>,
    /// Remembered flights, oldest first (with the generation, so that an
    /// entry replaced since is not taken for the current one).
    order: VecDeque<(FlightId, u64)>,
}

#[derive(Clone, Copy)]
struct Committed {
    generation: u64,
    until: Instant,
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
        let now = Instant::now();
        if until <= now {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&(front, generation)) = inner.order.front() {
            let stale = inner
                .flights
                .get(&front)
                .is_none_or(|c| c.generation != generation || c.until <= now);
            if !stale && inner.order.len() < CAPACITY {
                break;
            }
            inner.order.pop_front();
            if inner
                .flights
                .get(&front)
                .is_some_and(|c| c.generation == generation)
            {
                inner.flights.remove(&front);
            }
        }
        inner
            .flights
            .insert(flight, Committed { generation, until });
        inner.order.push_back((flight, generation));
    }

    /// Forgets `flight` (this node invalidated it).
    pub(crate) fn forget(&self, flight: &FlightId) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flights
            .remove(flight);
    }

    /// The generation seen committed for `flight` whose result the store
    /// should still hold (one past that moment is forgotten).
    #[cfg(test)]
    pub(crate) fn expected(&self, flight: &FlightId) -> Option<u64> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let c = *inner.flights.get(flight)?;
        if c.until > Instant::now() {
            return Some(c.generation);
        }
        inner.flights.remove(flight);
        None
    }

    /// Forgets `flight` and returns the generation seen committed for it,
    /// if the store should still hold its result (one lock).
    pub(crate) fn take(&self, flight: &FlightId) -> Option<u64> {
        let c = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flights
            .remove(flight)?;
        (c.until > Instant::now()).then_some(c.generation)
    }

    /// Forgets `flight` if the generation seen committed for it is not
    /// `generation` (the store holds another generation's result: the one
    /// seen was invalidated or is stale, not lost).
    pub(crate) fn forget_other(&self, flight: &FlightId, generation: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner
            .flights
            .get(flight)
            .is_some_and(|c| c.generation != generation)
        {
            inner.flights.remove(flight);
        }
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
        let inner = seen.inner.lock().unwrap();
        assert!(inner.order.len() <= CAPACITY && inner.flights.len() <= CAPACITY);
        assert!(
            !inner.flights.contains_key(&flight(0)),
            "the oldest went first"
        );
        assert!(inner.flights.contains_key(&flight(CAPACITY + 9)));
    }

    #[tokio::test(start_paused = true)]
    async fn forget_drops_the_flight() {
        let seen = SeenCommits::default();
        seen.remember(flight(0), 3, Instant::now(), Duration::from_secs(10));
        seen.forget(&flight(0));
        assert_eq!(seen.expected(&flight(0)), None);
    }
}
