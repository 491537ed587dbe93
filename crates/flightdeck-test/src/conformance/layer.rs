//! The rules the L2 layer keeps over a backend, checked by running
//! [`DistributedFlights`] over the backend under test (wrapped to lose
//! answers or slow its commits): a lease granted to a token whose answers
//! were lost is released once the backend answers, so nobody waits for it
//! to expire; and the owner heartbeats until its commit has returned, so a
//! slow commit never lets its lease lapse.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, Shareable, StageName};
use flightdeck_distributed::backend::{
    Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, FlightId, LeaseTerms,
    OwnerToken, Renewal,
};
use flightdeck_distributed::{
    DistributedFlights, DistributedPolicy, Execute, PostcardCodec, Propagate, Role,
};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use super::{conclusive, terms, Stalled, LEASE};
use crate::Hooked;

/// The work of a layer check: answers `value`, counting its runs.
struct Work {
    value: &'static str,
    runs: Arc<AtomicUsize>,
}

impl Execute<()> for Work {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), _role: Role) -> Result<Shareable<String, String>, BoxError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Shareable::Shared(self.value.to_owned()))
    }
}

/// The deadline of each backend call in the layer checks.
const CALL: Duration = Duration::from_millis(300);

/// A layer policy: `lease` with heartbeats at a quarter of it, calls
/// bounded by [`CALL`], three commit attempts.
fn policy(lease: Duration) -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(lease)
        .heartbeat(lease / 4)
        .call_timeout(CALL)
        .poll_interval(Duration::from_millis(50))
        .wait_timeout(lease * 2)
        .replay_ttl(Duration::from_secs(30))
        .commit_attempts(3)
}

/// A fresh key of the checks' stage.
fn fresh_key() -> FlightKey {
    let n: u128 = rand::random();
    FlightKey::from_bytes(
        StageName::new("conformance").expect("valid stage name"),
        n.to_le_bytes(),
    )
}

/// The longest a stall may hold up the owner's heartbeats before the
/// verdict on them means nothing: half of what a heartbeat every quarter
/// lease leaves before the lease lapses.
const HELD_UP: Duration = Duration::from_millis(150);

/// The longest of the durations noted so far (to the microsecond),
/// shared by clones.
#[derive(Clone, Default)]
struct Worst(Arc<AtomicU64>);

impl Worst {
    fn note(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_max(us, Ordering::Relaxed);
    }

    fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }
}

/// How late the runtime ran a task that sleeps [`WATCHDOG_TICK`] at a
/// time, at worst, from its start until it is dropped: a stall of this
/// process (the runtime starved of CPU) shows here.
struct Watchdog {
    late: Worst,
    task: JoinHandle<()>,
}

const WATCHDOG_TICK: Duration = Duration::from_millis(10);

impl Watchdog {
    fn start() -> Self {
        let late = Worst::default();
        let noted = late.clone();
        let task = tokio::spawn(async move {
            loop {
                let asleep = Instant::now();
                tokio::time::sleep(WATCHDOG_TICK).await;
                noted.note(asleep.elapsed().saturating_sub(WATCHDOG_TICK));
            }
        });
        Watchdog { late, task }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits for the layer's background work, at most 10 s.
async fn idle<B: Backend, C: Send + Sync + 'static>(
    flights: &DistributedFlights<B, C>,
    what: &str,
) {
    timeout(Duration::from_secs(10), flights.idle())
        .await
        .unwrap_or_else(|_| panic!("{what}: the layer's background work did not end in 10 s"));
}

/// Both answers of a flight's acquire are lost (the first try and its
/// retry with the same token took effect: the backend granted the lease),
/// so the flight fails over to its fallback without running. The lease
/// (20 s) is released as soon as the backend answers again: once the
/// layer is idle, another token is granted the flight at once, without a
/// takeover, instead of following a lease nobody will use.
pub async fn an_unknown_outcome_leaves_no_lease<B: Backend>(b: Arc<B>) {
    let lost = Hooked::new(b.clone()).lose_acquire_replies(2);
    let flights = DistributedFlights::new(
        lost,
        policy(Duration::from_secs(20)),
        PostcardCodec::<String>::new(),
    )
    .expect("a valid policy");
    let key = fresh_key();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = Work {
        value: "v",
        runs: runs.clone(),
    };
    let answer = flights.run(&key, (), work, &Propagate).await;
    assert!(
        answer.is_err(),
        "both acquire answers were lost: the fallback answers"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    idle(&flights, "releasing a lease whose answers were lost").await;
    assert_eq!(flights.releasing(), 0);
    let flight = FlightId::of(&key);
    match b.acquire(&flight, &OwnerToken::random(), &terms(true)).await {
        Ok(Acquired::Owner {
            takeover: false, ..
        }) => {}
        other => panic!(
            "a lease whose acquire answers were lost must be released, not left to expire: got {other:?}"
        ),
    }
}

/// A backend whose commits each wait `each` first; the first `failing`
/// then fail (the backend unreachable), the next one first asks for the
/// flight with another token (`probe`: what a node arriving then would
/// get), then commits.
struct SlowCommits<B> {
    inner: B,
    failing: usize,
    each: Duration,
    commits: Arc<AtomicUsize>,
    probe: Arc<Mutex<Option<Acquired>>>,
    /// The slowest heartbeat or probe round trip: a stalled backend shows
    /// here.
    slowest: Worst,
}

impl<B> SlowCommits<B> {
    /// Times a call from now until the guard drops (answered, or given up
    /// by its caller).
    fn timed(&self) -> RoundTrip<'_> {
        RoundTrip {
            sent: Instant::now(),
            slowest: &self.slowest,
        }
    }
}

struct RoundTrip<'a> {
    sent: Instant,
    slowest: &'a Worst,
}

impl Drop for RoundTrip<'_> {
    fn drop(&mut self) {
        self.slowest.note(self.sent.elapsed());
    }
}

impl<B: Backend> Backend for SlowCommits<B> {
    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        Box::pin(async move {
            let n = self.commits.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.each).await;
            if n < self.failing {
                return Err(BackendError::unavailable("conformance: commit refused"));
            }
            if n == self.failing {
                let timed = self.timed();
                let seen = self
                    .inner
                    .acquire(flight, &OwnerToken::random(), &terms(true))
                    .await?;
                drop(timed);
                *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen);
            }
            self.inner.commit(flight, token, generation, args).await
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
            let _timed = self.timed();
            self.inner.heartbeat(flight, token, generation, terms).await
        })
    }

    flightdeck_distributed::forward_backend!(inner => acquire_with, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// The owner's first commit attempt fails after 280 ms and its second
/// waits 280 ms more before it is sent: the commit returns well past the
/// owner's lease ([`LEASE`]) from its grant. Its heartbeats run on until
/// the commit has returned, so a node asking for the flight just before
/// the second attempt lands (past the lease) follows the owner instead of
/// taking the flight over, and the result lands under the owner's
/// generation. The verdict on the heartbeats is drawn only when neither
/// this process nor the backend stalled for 150 ms meanwhile;
/// otherwise the check runs again.
pub async fn the_owner_heartbeats_until_its_commit_has_returned<B: Backend>(b: Arc<B>) {
    conclusive("the_owner_heartbeats_until_its_commit_has_returned", || {
        the_owner_heartbeats_once(b.clone())
    })
    .await
}

async fn the_owner_heartbeats_once<B: Backend>(b: Arc<B>) -> Result<(), Stalled> {
    let commits = Arc::new(AtomicUsize::new(0));
    let probe = Arc::new(Mutex::new(None));
    let slowest = Worst::default();
    let slow = SlowCommits {
        inner: b.clone(),
        failing: 1,
        each: Duration::from_millis(280),
        commits: commits.clone(),
        probe: probe.clone(),
        slowest: slowest.clone(),
    };
    let watchdog = Watchdog::start();
    let flights = DistributedFlights::new(slow, policy(LEASE), PostcardCodec::<String>::new())
        .expect("a valid policy");
    let key = fresh_key();
    let flight = FlightId::of(&key);
    let runs = Arc::new(AtomicUsize::new(0));
    let work = Work {
        value: "slow-commit",
        runs: runs.clone(),
    };
    let answer = flights.run(&key, (), work, &Propagate).await;
    assert!(
        matches!(&answer, Ok(Shareable::Shared(v)) if v == "slow-commit"),
        "the owner's callers get its value before its commit: {answer:?}"
    );
    idle(&flights, "the slow commit").await;
    assert_eq!(
        commits.load(Ordering::SeqCst),
        2,
        "one failed attempt, one landed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let seen = probe.lock().unwrap_or_else(|e| e.into_inner()).take();
    if watchdog.late.get() >= HELD_UP || slowest.get() >= HELD_UP {
        return Err(Stalled("the owner's heartbeats"));
    }
    let generation = match seen {
        Some(Acquired::Follower { generation, .. }) => generation,
        other => panic!(
            "the owner's lease lapsed while its commit was being tried (no heartbeat): a node arriving then got {other:?}"
        ),
    };
    match b
        .acquire(&flight, &OwnerToken::random(), &terms(true))
        .await
        .unwrap()
    {
        Acquired::Hit(stored) => assert_eq!(stored.generation, generation),
        other => panic!("the owner's commit did not land: {other:?}"),
    }
    Ok(())
}
