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

use flightdeck_distributed::backend::{Acquired, Backend, BackendFuture, FlightId, LeaseTerms};
use flightdeck_distributed::OwnerToken;
use flightdeck_testkit::{conformance, MemoryBackend};

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
}

impl Stalling {
    fn new(stall: Stall) -> Self {
        Stalling {
            inner: MemoryBackend::new(),
            stall,
            acquires: AtomicUsize::new(0),
            per_flight: Mutex::new(HashMap::new()),
            demote_takeovers: false,
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
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            if self.stalls(flight) {
                tokio::time::sleep(STALL).await;
            }
            match self.inner.acquire(flight, token, terms).await? {
                Acquired::Owner { generation, .. } if self.demote_takeovers => {
                    Ok(Acquired::Owner {
                        generation,
                        takeover: false,
                    })
                }
                other => Ok(other),
            }
        })
    }

    flightdeck_distributed::forward_backend!(inner => commit, heartbeat, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
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
