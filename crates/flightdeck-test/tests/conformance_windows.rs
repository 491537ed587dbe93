//! The conformance checks run in real time, so a loaded machine can stall
//! between two calls for longer than a lease or a flight's record lives.
//! A stall past the window a verdict needs makes the check run again on a
//! fresh flight; a stall every time fails it by name; a rule broken while
//! the window held still fails it. Stalls are injected in front of the
//! memory backend, under paused time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_distributed::backend::{
    Acquired, Ask, Backend, BackendError, BackendFuture, FlightId, LeaseTerms, Renewal,
};
use flightdeck_distributed::OwnerToken;
use flightdeck_test::{conformance, MemoryBackend};

/// Which acquires stall for [`STALL`] before they reach the backend.
enum Stall {
    /// The `n`th acquire of the whole run (counted from 0).
    Nth(usize),
    /// Every acquire of a flight but its first.
    AllButFirstPerFlight,
    /// None.
    Never,
}

/// Longer than a flight's record lives with the checks' terms.
const STALL: Duration = Duration::from_secs(1);

/// The memory backend behind stalls (and, if asked, a broken rule).
struct Stalling {
    inner: MemoryBackend,
    stall: Stall,
    acquires: AtomicUsize,
    per_flight: Mutex<HashMap<FlightId, usize>>,
    /// Answer a takeover as a fresh grant (a broken backend).
    demote_takeovers: bool,
    /// How many of the first heartbeats stall for [`STALL`].
    stalled_heartbeats: AtomicUsize,
    /// Heartbeats renew nothing and answer at once (a broken backend).
    refuse_heartbeats: bool,
}

impl Stalling {
    fn new(stall: Stall) -> Self {
        Stalling {
            inner: MemoryBackend::new(),
            stall,
            acquires: AtomicUsize::new(0),
            per_flight: Mutex::new(HashMap::new()),
            demote_takeovers: false,
            stalled_heartbeats: AtomicUsize::new(0),
            refuse_heartbeats: false,
        }
    }

    fn stalls(&self, flight: &FlightId) -> bool {
        let n = self.acquires.fetch_add(1, Ordering::SeqCst);
        let mut seen = self.per_flight.lock().unwrap();
        let of_flight = seen.entry(*flight).or_insert(0);
        *of_flight += 1;
        match self.stall {
            Stall::Nth(i) => n == i,
            Stall::AllButFirstPerFlight => *of_flight > 1,
            Stall::Never => false,
        }
    }
}

impl Backend for Stalling {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            if self.stalls(flight) {
                tokio::time::sleep(STALL).await;
            }
            match self.inner.acquire_with(flight, token, ask, terms).await? {
                Acquired::Owner {
                    generation, stale, ..
                } if self.demote_takeovers => Ok(Acquired::Owner {
                    generation,
                    takeover: false,
                    stale,
                }),
                other => Ok(other),
            }
        })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        Box::pin(async move {
            let stalls = self
                .stalled_heartbeats
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if stalls {
                tokio::time::sleep(STALL).await;
            }
            if self.refuse_heartbeats {
                return Err(BackendError::unavailable("heartbeats refused"));
            }
            self.inner.heartbeat(flight, token, generation, terms).await
        })
    }

    flightdeck_distributed::forward_backend!(inner => commit, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// The first takeover acquire lands after the dead owner's record expired
/// (a fresh grant, not a takeover): the attempt says nothing, the next
/// one draws the verdict.
#[tokio::test(start_paused = true)]
async fn a_stall_past_the_record_makes_the_check_run_again() {
    // Acquire 0 is the dead owner's grant; 1 is the first of the 20.
    let b = Arc::new(Stalling::new(Stall::Nth(1)));
    conformance::exactly_one_takeover(b.clone(), 20).await;
    assert_eq!(
        b.per_flight.lock().unwrap().len(),
        2,
        "the stalled attempt ran again on a fresh flight"
    );
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "no verdict in 5 attempts")]
async fn a_stall_every_time_fails_the_check_by_name() {
    let b = Arc::new(Stalling::new(Stall::AllButFirstPerFlight));
    conformance::exactly_one_takeover(b, 4).await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "no verdict in 5 attempts")]
async fn a_stall_every_time_fails_the_dead_owner_check_too() {
    let b = Stalling::new(Stall::AllButFirstPerFlight);
    conformance::dead_owner_without_takeover_blocks_until_its_record_expires(&b).await;
}

/// A backend that hands out a takeover as a fresh grant, with no stall:
/// the retries must not hide it.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "unexpected Owner")]
async fn a_rule_broken_inside_the_window_still_fails_the_check() {
    let b = Stalling {
        demote_takeovers: true,
        ..Stalling::new(Stall::Never)
    };
    conformance::exactly_one_takeover(Arc::new(b), 4).await;
}

/// The owner's first heartbeat stalls past its lease (the backend froze):
/// the layer check's verdict on the heartbeats means nothing that time,
/// and the next attempt draws it.
#[tokio::test(start_paused = true)]
async fn a_stalled_heartbeat_makes_the_layer_check_run_again() {
    let b = Stalling::new(Stall::Never);
    b.stalled_heartbeats.store(1, Ordering::SeqCst);
    let b = Arc::new(b);
    conformance::the_owner_heartbeats_until_its_commit_has_returned(b.clone()).await;
    assert_eq!(b.stalled_heartbeats.load(Ordering::SeqCst), 0);
}

/// Heartbeats that renew nothing, answered at once, are no stall: the
/// lapsed lease is a verdict.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "the owner's lease lapsed")]
async fn a_lease_lapsed_without_a_stall_still_fails_the_layer_check() {
    let b = Stalling {
        refuse_heartbeats: true,
        ..Stalling::new(Stall::Never)
    };
    conformance::the_owner_heartbeats_until_its_commit_has_returned(Arc::new(b)).await;
}
