//! Where and when the owner's coordination runs, against the in-memory
//! backend with paused time: its COMMIT leaves from the owner's own task in
//! the poll in which its work returned (no task is spawned at the grant,
//! nor handed the value), and its heartbeats keep the lease, on the
//! grant's schedule, until the commit has returned.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, Shareable, StageName};
use flightdeck_distributed::backend::{
    Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, LeaseTerms,
};
use flightdeck_distributed::{
    DistributedFlights, DistributedPolicy, Execute, FlightId, OwnerToken, PostcardCodec, Propagate,
    Role,
};
use flightdeck_test::MemoryBackend;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::Id;
use tokio::time::{sleep_until, Instant};

const SEC: Duration = Duration::from_secs(1);

/// A lease of 3 s, heartbeats every second (calls cut at 1 s, the default).
fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .replay_ttl(60 * SEC)
}

fn key(name: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new("owner").unwrap(), name)
}

/// Answers `"v"`, after `delay` (at once, without a single `Pending`,
/// when it is `None`), counting its runs.
#[derive(Clone, Default)]
struct Work {
    delay: Option<Duration>,
    runs: Arc<AtomicUsize>,
}

impl Execute<()> for Work {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), _role: Role) -> Result<Shareable<String, String>, BoxError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        Ok(Shareable::Shared("v".to_owned()))
    }
}

/// Where a commit was sent from: the task (`None`: the test's own
/// future, no task), and how many tasks were alive then.
type Sent = (Option<Id>, usize);

/// The memory backend, noting where each commit is sent from. Each commit
/// waits `slow` first and then, for the first `failing` ones, fails (the
/// store unreachable); with a `gate`, it waits for one of its permits
/// before it reaches the store.
#[derive(Clone, Default)]
struct Watched {
    inner: MemoryBackend,
    sent: Arc<Mutex<Vec<Sent>>>,
    slow: Duration,
    failing: usize,
    gate: Option<Arc<Semaphore>>,
}

impl Watched {
    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// What another node asking for `name`'s flight now is answered (by
    /// the store itself, past the watch).
    async fn asked(&self, name: &str) -> Acquired {
        let flight = FlightId::of(&key(name));
        self.inner
            .acquire(&flight, &OwnerToken::random(), &probe_terms())
            .await
            .unwrap()
    }
}

impl Backend for Watched {
    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        let n = {
            let mut sent = self.sent.lock().unwrap();
            sent.push((
                tokio::task::try_id(),
                Handle::current().metrics().num_alive_tasks(),
            ));
            sent.len()
        };
        Box::pin(async move {
            tokio::time::sleep(self.slow).await;
            if n <= self.failing {
                return Err(BackendError::unavailable("test: commit refused"));
            }
            if let Some(gate) = &self.gate {
                let _permit = gate.acquire().await.unwrap();
            }
            self.inner.commit(flight, token, generation, args).await
        })
    }

    flightdeck_distributed::forward_backend!(inner => acquire_with, heartbeat, abandon, invalidate, subscribe, join_subscription, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

fn flights(
    b: &Watched,
    policy: DistributedPolicy,
) -> DistributedFlights<Watched, PostcardCodec<String>> {
    DistributedFlights::new(b.clone(), policy, PostcardCodec::<String>::new()).unwrap()
}

fn probe_terms() -> LeaseTerms {
    LeaseTerms {
        lease: 3 * SEC,
        state_ttl: 120 * SEC,
        allow_takeover: true,
    }
}

/// The commit is sent by the owner's own task, in the poll in which its
/// work returned: it is on its way when the owner's caller gets the value.
#[tokio::test(start_paused = true)]
async fn the_commit_leaves_from_the_owners_task_in_the_poll_its_work_returned() {
    let b = Watched::default();
    let flights = flights(&b, policy());
    let runs = Arc::new(AtomicUsize::new(0));
    let work = Work {
        delay: Some(SEC / 2),
        runs: runs.clone(),
    };
    let owner = tokio::spawn({
        let (flights, b) = (flights.clone(), b.clone());
        async move {
            let out = flights.run(&key("x"), (), work, &Propagate).await;
            // Nothing else ran since the work returned.
            (out, b.inner.calls().commit)
        }
    });
    let owner_task = owner.id();
    let (out, commits) = owner.await.unwrap();
    assert!(matches!(out, Ok(Shareable::Shared(v)) if v == "v"));
    assert_eq!(
        commits, 1,
        "the commit was sent before the owner's caller got the value"
    );
    assert_eq!(
        b.sent().first().map(|s| s.0),
        Some(Some(owner_task)),
        "the commit left from the owner's task: {:?}",
        b.sent()
    );
    flights.idle().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Work that is ready at once: nothing is spawned before the commit is
/// sent (no task at the grant); the task that waits for the commit's
/// answer comes after, and `idle` waits for it.
#[tokio::test(start_paused = true)]
async fn an_owner_whose_work_is_ready_at_once_spawns_no_task_before_its_commit() {
    let gate = Arc::new(Semaphore::new(0));
    let b = Watched {
        gate: Some(gate.clone()),
        ..Watched::default()
    };
    let flights = flights(&b, policy());
    let runs = Arc::new(AtomicUsize::new(0));
    let work = Work {
        delay: None,
        runs: runs.clone(),
    };
    let out = flights.run(&key("y"), (), work.clone(), &Propagate).await;
    assert!(matches!(out, Ok(Shareable::Shared(v)) if v == "v"));
    assert_eq!(
        b.sent(),
        vec![(None, 0)],
        "the commit was sent from the owner's future (here, no task), no task alive"
    );
    assert_eq!(
        Handle::current().metrics().num_alive_tasks(),
        1,
        "one task waits for the commit's answer"
    );
    gate.add_permits(1);
    flights.idle().await;
    let again = flights.run(&key("y"), (), work, &Propagate).await;
    assert!(matches!(again, Ok(Shareable::Shared(v)) if v == "v"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second run was a hit");
}

/// The work takes 1.5 s, then three commit attempts fail 800 ms each and
/// the fourth lands at 5.02 s, past the lease (3 s) from the grant and
/// from the last heartbeat during the work. Heartbeats go on every second
/// from the grant (not from the work's end) until the commit returned: a
/// node asking at 4.6 s follows the owner, and the result is stored
/// under the owner's generation.
#[tokio::test(start_paused = true)]
async fn heartbeats_keep_the_lease_on_the_grants_schedule_until_a_retried_commit_returned() {
    let b = Watched {
        slow: SEC * 8 / 10,
        failing: 3,
        ..Watched::default()
    };
    let flights = flights(&b, policy());
    let started = Instant::now();
    let owner = tokio::spawn({
        let flights = flights.clone();
        async move {
            let work = Work {
                delay: Some(SEC * 3 / 2),
                ..Work::default()
            };
            flights.run(&key("z"), (), work, &Propagate).await
        }
    });
    sleep_until(started + SEC * 21 / 10).await;
    assert!(owner.is_finished(), "the value went out at 1.5 s");
    assert_eq!(b.sent().len(), 1, "the first attempt is under way");
    assert_eq!(
        b.inner.calls().heartbeat,
        2,
        "at 1 s and 2 s: the schedule of the grant goes on"
    );
    sleep_until(started + SEC * 46 / 10).await;
    assert_eq!(b.sent().len(), 4, "the fourth attempt is under way");
    let seen = b.asked("z").await;
    assert!(
        matches!(seen, Acquired::Follower { generation: 1, .. }),
        "the owner's lease lapsed while its commit was being tried: {seen:?}"
    );
    flights.idle().await;
    assert_eq!(b.inner.calls().heartbeat, 5, "1, 2, 3, 4 and 5 s");
    match b.asked("z").await {
        Acquired::Hit(stored) => assert_eq!(stored.generation, 1),
        other => panic!("the owner's commit did not land: {other:?}"),
    }
    assert!(owner.await.unwrap().is_ok());
}

/// A result whose first commit failed is dated from its work's end, not
/// from the retry that landed: its age, and so the start of its work that
/// every node orders results by (its age plus its work time), are as on
/// the owner's node (seed 8178885 of the simulation: a result dated from
/// a retry looked as if its work had started after another's that began
/// before it).
#[tokio::test(start_paused = true)]
async fn a_retried_commit_is_dated_from_the_works_end() {
    let b = Watched {
        slow: SEC / 5,
        failing: 1,
        ..Watched::default()
    };
    let windows = flightdeck_core::StaleWindows {
        revalidate: 10 * SEC,
        ..flightdeck_core::StaleWindows::OFF
    };
    let flights = flights(&b, policy().stale_windows(windows));
    let work = Work {
        delay: Some(SEC / 2),
        ..Work::default()
    };
    let out = flights.run(&key("d"), (), work, &Propagate).await;
    assert!(matches!(out, Ok(Shareable::Shared(v)) if v == "v"));
    let ended = Instant::now();
    flights.idle().await;
    assert_eq!(b.sent().len(), 2, "the second attempt landed");
    match b.asked("d").await {
        Acquired::Hit(stored) => assert_eq!(
            stored.age,
            ended.elapsed(),
            "dated from the work's end, {:?} ago",
            ended.elapsed()
        ),
        other => panic!("the owner's commit did not land: {other:?}"),
    }
}

/// Every commit attempt fails (the store refuses writes of results, not
/// heartbeats): the settling gives up after a lease (3 s) of tries, while
/// its heartbeats, every second, kept the lease. Once the node is idle the
/// lease is over: another node asking is granted the flight, not told to
/// follow an owner that works on nothing. The settling waits for the
/// last renewal to run out; before, the node was idle at 2.7 s with the
/// lease live 2.3 s more (found by the simulation, seeds 7112008 and
/// 7116734).
#[tokio::test(start_paused = true)]
async fn a_settling_that_gives_up_is_idle_only_once_its_lease_is_over() {
    let b = Watched {
        slow: SEC / 5,
        failing: usize::MAX,
        ..Watched::default()
    };
    let flights = flights(&b, policy());
    let started = Instant::now();
    let out = flights
        .run(&key("u"), (), Work::default(), &Propagate)
        .await;
    assert!(matches!(out, Ok(Shareable::Shared(v)) if v == "v"));
    flights.idle().await;
    let renewals = b.inner.calls().heartbeat;
    assert!(
        renewals >= 2,
        "the lease was kept while commits were tried: {renewals}"
    );
    let seen = b.asked("u").await;
    assert!(
        matches!(seen, Acquired::Owner { generation: 2, .. }),
        "the node is idle, yet its lease still blocks the key: {seen:?} at {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= 3 * SEC,
        "the settling tried for a lease: {:?}",
        started.elapsed()
    );
    assert_eq!(
        b.inner.calls().heartbeat,
        renewals,
        "none after the settling"
    );
}

/// One commit attempt that takes longer than a heartbeat interval (its
/// deadline, 2.5 s, allows it): the heartbeats due meanwhile are sent.
#[tokio::test(start_paused = true)]
async fn a_commit_slower_than_a_heartbeat_interval_is_heartbeated_through() {
    let gate = Arc::new(Semaphore::new(0));
    let b = Watched {
        gate: Some(gate.clone()),
        ..Watched::default()
    };
    let flights = flights(&b, policy().call_timeout(SEC * 5 / 2));
    let started = Instant::now();
    let out = flights
        .run(&key("w"), (), Work::default(), &Propagate)
        .await;
    assert!(out.is_ok());
    sleep_until(started + SEC * 21 / 10).await;
    assert_eq!(b.inner.calls().heartbeat, 2, "at 1 s and 2 s");
    gate.add_permits(1);
    flights.idle().await;
    assert_eq!(b.inner.calls().commit, 1, "answered within its deadline");
    assert_eq!(b.inner.calls().heartbeat, 2, "none after the commit");
}

fn review_key(name: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new("review-owner").unwrap(), name)
}

/// Cooperative CPU-bound work, written the way tokio asks for it: a unit
/// of computation, then `consume_budget().await`, which yields to the
/// runtime whenever the task's budget (128 units per poll) is used up. It
/// never blocks its thread for more than a fraction of a millisecond.
struct Busy {
    for_: Duration,
    runs: Arc<AtomicUsize>,
    name: &'static str,
}

impl Execute<()> for Busy {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), role: Role) -> Result<Shareable<String, String>, BoxError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let end = Instant::now() + self.for_;
        let mut x = 0u64;
        while Instant::now() < end {
            for i in 0..200u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            tokio::task::consume_budget().await;
        }
        Ok(Shareable::Shared(format!("{}:{role:?}", self.name)))
    }
}

/// The heartbeats are polled with the task's coop budget lifted.
/// `Working::poll` polls the work first and the heartbeat timer after it,
/// in the same poll of the owner's task. Work that yields
/// because its coop budget is used up (tokio's `consume_budget`, or any
/// tokio resource that is always ready: an mpsc fed faster than it is
/// read, a socket with data waiting, `tokio::io::copy` of a large body)
/// returns `Pending` with the budget at zero; a heartbeat `Sleep` polled
/// on that budget answers `Pending` (tokio's `poll_proceed`), every time,
/// however long past its deadline. Without the lifted budget no heartbeat
/// was ever sent while such work ran: the lease lapsed while its owner
/// worked, and a second node took the flight over and ran the work again
/// (found in review; it failed so before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_go_on_while_the_work_yields_on_its_coop_budget() {
    let backend = MemoryBackend::new();
    let policy = DistributedPolicy::new()
        .lease(Duration::from_millis(600))
        .heartbeat(Duration::from_millis(200))
        .call_timeout(Duration::from_millis(150))
        .poll_interval(Duration::from_millis(50))
        .wait_timeout(Duration::from_secs(10));
    let node = |b: &MemoryBackend| {
        DistributedFlights::new(b.clone(), policy.clone(), PostcardCodec::<String>::new()).unwrap()
    };
    let (a, b) = (node(&backend), node(&backend));
    let runs = Arc::new(AtomicUsize::new(0));
    let k = review_key("busy");

    // Node a owns the flight; its work runs for 2.4 s (four leases).
    let owner = tokio::spawn({
        let (a, k, runs) = (a.clone(), k.clone(), runs.clone());
        async move {
            let work = Busy {
                for_: Duration::from_millis(2400),
                runs,
                name: "a",
            };
            a.run(&k, (), work, &Propagate).await
        }
    });
    // Past two leases of the owner's work, node b asks for the same flight:
    // it must follow (the lease is kept by heartbeats), never run it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let heartbeats = backend.calls().heartbeat;
    let follower = {
        let work = Busy {
            for_: Duration::ZERO,
            runs: runs.clone(),
            name: "b",
        };
        b.run(&k, (), work, &Propagate).await
    };
    let owned = owner.await.unwrap();
    eprintln!(
        "heartbeats sent in the owner's first 1.3 s: {heartbeats}; a: {:?}; b: {:?}",
        owned
            .as_ref()
            .map(|v| matches!(v, Shareable::Shared(s) if s.starts_with("a:"))),
        follower.as_ref().map(|v| match v {
            Shareable::Shared(s) => s.clone(),
            Shareable::Unshared(..) => "unshared".to_owned(),
        }),
    );
    assert!(
        heartbeats >= 3,
        "the owner's work yielded every few microseconds for 1.3 s, yet only {heartbeats} heartbeats (one due every 200 ms) were sent"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the lease lapsed while its owner worked: a second node ran the work again"
    );
}

/// The owner's work waits for the test's signal.
struct Gated(tokio::sync::oneshot::Receiver<()>);

impl Execute<()> for Gated {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), _role: Role) -> Result<Shareable<String, String>, BoxError> {
        let _ = self.0.await;
        Ok(Shareable::Shared("v".to_owned()))
    }
}

/// `idle()` (here, on `SingleFlightLayer::idle` and `StageHandle::idle`:
/// "for graceful shutdown") waits for an owner still at work: its lease is
/// counted from the grant, though it lives in its caller's future until
/// its work returns. Without that (found in review; it failed so before the
/// fix) `idle()` resolved while a lease was held and its commit was still
/// to come. A shutdown that awaits `idle()` and then drops the
/// runtime (as the docs suggest) drops the working owner: its abandon is
/// spawned on a runtime that is going away, and the key stays blocked for
/// the rest of the lease on every other node.
#[tokio::test(start_paused = true)]
async fn idle_waits_for_an_owner_still_at_work() {
    let backend = MemoryBackend::new();
    let policy = DistributedPolicy::new()
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1));
    let flights =
        DistributedFlights::new(backend.clone(), policy, PostcardCodec::<String>::new()).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let owner = tokio::spawn({
        let flights = flights.clone();
        async move {
            flights
                .run(&review_key("idle"), (), Gated(rx), &Propagate)
                .await
        }
    });
    while backend.calls().acquire == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let idle = tokio::time::timeout(Duration::from_secs(2), flights.idle()).await;
    let commits_then = backend.calls().commit;
    tx.send(()).unwrap();
    owner.await.unwrap().unwrap();
    flights.idle().await;
    assert!(
        idle.is_err(),
        "idle() resolved while an owner held its lease ({commits_then} commits sent then, {} after)",
        backend.calls().commit
    );
}
