//! Answering anyway across nodes: two nodes (two `DistributedFlights`) on
//! one in-memory store, paused time. A result past its freshness answers
//! at once while exactly one refresh runs for the whole deployment, stands
//! by for a failing or slow work, is throttled after a failure on every
//! node, is refreshed early once, and never answers once purged or older
//! than its freshness plus its window.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{BoxError, DeadlineExceeded};
use flightdeck_core::stale::{StaleReason, StaleWindows};
use flightdeck_core::{metric, ErrorClass, FlightKey, Shareable, StageName};
use flightdeck_distributed::backend::{Backend, BackendFuture, CommitArgs, Committed};
use flightdeck_distributed::{
    forward_backend, Answered, DistributedFlights, DistributedPolicy, Execute, FlightId, KeptEnd,
    KeptHere, OwnerToken, PostcardCodec, Propagate, ResultCodec, Role,
};
use flightdeck_test::recorded::{self, counter_where};
use flightdeck_test::MemoryBackend;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const SEC: Duration = Duration::from_secs(1);

/// How long a result is fresh.
const FRESH: Duration = Duration::from_secs(10);

type Node = DistributedFlights<MemoryBackend, PostcardCodec<String>>;

/// The policy of a node of these tests, with `windows`.
fn policy(windows: StaleWindows) -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .replay_ttl(FRESH)
        .stale_windows(windows)
}

/// A grace window of a minute.
fn grace() -> StaleWindows {
    StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    }
}

/// Two nodes of one deployment on one store, with `windows`.
fn nodes(windows: StaleWindows) -> (Node, Node) {
    let store = MemoryBackend::new();
    let policy = policy(windows);
    let node =
        || DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    (node(), node())
}

fn key(stage: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new(stage).unwrap(), "k")
}

/// The work of every node: answers `v<n>` (its `n`th run) after `delay`,
/// or, while `failing`, fails as an execution timeout does.
/// With `panicking`, it panics instead; `kept` is the node's own copy
/// ([`Execute::kept_here`]) and when its work ended.
#[derive(Clone)]
struct Work {
    runs: Arc<AtomicUsize>,
    delay: Duration,
    failing: Arc<AtomicBool>,
    panicking: Arc<AtomicBool>,
    unshared: Arc<AtomicBool>,
    kept: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Work {
    fn new(delay: Duration) -> Self {
        Self {
            runs: Arc::default(),
            delay,
            failing: Arc::default(),
            panicking: Arc::default(),
            unshared: Arc::default(),
            kept: Arc::default(),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Execute<()> for Work {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), _role: Role) -> Result<Shareable<String, String>, BoxError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        sleep(self.delay).await;
        if self.panicking.load(Ordering::SeqCst) {
            panic!("the work panics");
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(Box::new(DeadlineExceeded::new("execution")));
        }
        if self.unshared.load(Ordering::SeqCst) {
            return Ok(Shareable::Unshared(
                format!("v{n}, this caller's alone"),
                flightdeck_core::Unshareable::Other("test"),
            ));
        }
        Ok(Shareable::Shared(format!("v{n}")))
    }

    fn kept_here(&self) -> Option<KeptHere<String>> {
        let kept = self.kept.lock().unwrap().clone();
        kept.map(|(v, ended)| KeptHere::copy(v, ended.elapsed(), Duration::ZERO))
    }

    fn kept_end(&self) -> Option<KeptEnd> {
        let kept = Arc::clone(&self.kept);
        Some(KeptEnd::new(move || {
            kept.lock().unwrap().as_ref().map(|(_, ended)| *ended)
        }))
    }
}

/// One call on `node`: its value, how it was answered, how long it took.
async fn call<B: Backend>(
    node: &DistributedFlights<B, PostcardCodec<String>>,
    k: &FlightKey,
    work: &Work,
) -> (String, Answered, Duration) {
    let started = Instant::now();
    let (out, how) = node
        .run_answered(k, (), work.clone(), &Propagate, None)
        .await
        .unwrap();
    let Shareable::Shared(v) = out else {
        panic!("every answer is shared");
    };
    (v, how, started.elapsed())
}

/// [`call`] on a task of its own.
fn spawn_call(node: &Node, k: &FlightKey, work: &Work) -> JoinHandle<(String, Answered, Duration)> {
    let (node, k, work) = (node.clone(), k.clone(), work.clone());
    tokio::spawn(async move { call(&node, &k, &work).await })
}

/// `node` runs the work once and its result is stored: `v1`.
async fn prime(node: &Node, k: &FlightKey, work: &Work) {
    let (v, how, _) = call(node, k, work).await;
    assert_eq!((v.as_str(), how), ("v1", Answered::Ran));
    node.idle().await;
}

fn reason(how: Answered) -> Option<StaleReason> {
    how.stale().map(|s| s.reason)
}

/// Primes `k` on `node`, lets it go stale, turns `on` (how the next run of
/// the work ends), and calls once: the stale result answers at once while
/// the refresh runs in the background, which has ended on return.
async fn refresh_in_the_background(node: &Node, k: &FlightKey, work: &Work, on: &AtomicBool) {
    prime(node, k, work).await;
    sleep(FRESH + SEC).await;
    on.store(true, Ordering::SeqCst);
    let (v, how, _) = call(node, k, work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    node.idle().await;
    assert_eq!(work.runs(), 2, "the refresh ran");
}

/// Grace: past freshness, 50 callers on two nodes are all answered at
/// once with the stale value, while one refresh runs for both nodes;
/// its result answers next.
#[tokio::test(start_paused = true)]
async fn grace_answers_every_node_at_once_while_one_refresh_runs() {
    recorded::install();
    let (a, b) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("grace");
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    let calls = (0..50).map(|i| spawn_call(if i % 2 == 0 { &a } else { &b }, &k, &work));
    for answer in futures_join(calls).await {
        let (v, how, took) = answer;
        assert_eq!(v, "v1");
        assert_eq!(reason(how), Some(StaleReason::Revalidate), "{how:?}");
        assert_eq!(took, Duration::ZERO, "answered at once");
        assert_eq!(how.stale().unwrap().age, FRESH + SEC, "the store's age");
    }
    a.idle().await;
    b.idle().await;
    assert_eq!(work.runs(), 2, "one refresh for both nodes");
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v2");
    assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
    assert_eq!(
        counter_where(
            metric::STALE_SERVED_TOTAL,
            "grace",
            Some(("reason", "revalidate"))
        ),
        50
    );
    assert_eq!(
        counter_where(
            metric::REFRESH_TOTAL,
            "grace",
            Some(("outcome", "committed"))
        ),
        1
    );
}

/// Waits for every spawned call, in order.
async fn futures_join<T: Send + 'static>(
    handles: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
}

/// Stale-if-error across nodes: while the work fails, every caller on
/// both nodes gets the stale value, and the work runs at most once per
/// `stale-retry-after` for the whole deployment.
#[tokio::test(start_paused = true)]
async fn a_failing_refresh_is_throttled_across_nodes() {
    let retry_after = 5 * SEC;
    let (a, b) = nodes(StaleWindows {
        if_error: 120 * SEC,
        retry_after,
        ..StaleWindows::OFF
    });
    let k = key("if-error");
    let work = Work::new(SEC / 10);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    work.failing.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < 30 * SEC {
        for node in [&a, &b] {
            let (v, how, _) = call(node, &k, &work).await;
            assert_eq!(v, "v1");
            assert_eq!(reason(how), Some(StaleReason::Error), "{how:?}");
            answered += 1;
        }
        sleep(SEC / 4).await;
    }
    let retries = work.runs() - 1;
    assert!(answered > 200, "{answered}");
    assert!(
        (2..=7).contains(&retries),
        "{retries} executions in 30 s: at most one per 5 s across both nodes"
    );
}

/// Soft timeout across nodes: the owner's caller and another node's
/// follower both get the stale value once the soft timeout passes; the
/// work goes on and its result answers next.
#[tokio::test(start_paused = true)]
async fn the_soft_timeout_answers_both_nodes_and_the_work_goes_on() {
    let soft = SEC;
    let (a, b) = nodes(StaleWindows {
        if_error: 60 * SEC,
        soft_timeout: soft,
        ..StaleWindows::OFF
    });
    let k = key("soft");
    let work = Work::new(5 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    let owner = spawn_call(&a, &k, &work);
    sleep(SEC / 10).await;
    let follower = call(&b, &k, &work).await;
    let owner = owner.await.unwrap();
    for (v, how, took) in [owner.clone(), follower.clone()] {
        assert_eq!(v, "v1");
        assert_eq!(reason(how), Some(StaleReason::SoftTimeout), "{how:?}");
        assert_eq!(took, soft);
    }
    a.idle().await;
    assert_eq!(work.runs(), 2, "one execution: the owner's, finished");
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!((v.as_str(), how.stale()), ("v2", None));
}

/// Early refresh: callers on both nodes near the end of freshness all get
/// their hit at once; one of them refreshes it, once for both nodes.
#[tokio::test(start_paused = true)]
async fn an_early_refresh_runs_once_across_nodes() {
    flightdeck_core::random::seed_this_thread(Some(7));
    let (a, b) = nodes(StaleWindows {
        early_refresh: FRESH,
        ..StaleWindows::OFF
    });
    let k = key("early");
    let work = Work::new(SEC);
    prime(&a, &k, &work).await;
    let mut seen = Vec::new();
    loop {
        for node in [&a, &b] {
            let (v, how, took) = call(node, &k, &work).await;
            assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
            assert_eq!(took, Duration::ZERO, "a hit answers at once");
            seen.push(v);
        }
        if seen.last().is_some_and(|v| v == "v2") {
            break;
        }
        assert!(seen.len() < 200, "never refreshed early: {seen:?}");
        sleep(SEC / 10).await;
    }
    flightdeck_core::random::seed_this_thread(None);
    assert_eq!(work.runs(), 2, "one early refresh across nodes");
    let first_new = seen.iter().position(|v| v == "v2").unwrap();
    assert!(seen[..first_new].iter().all(|v| v == "v1"));
    assert!(
        first_new < 2 * 10 * 10,
        "refreshed before freshness ended: {first_new} calls"
    );
}

/// An early refresh asked for by a node's own copy (the facade's): the
/// store grants one across the nodes; a node whose copy is older than the
/// store's result (another node refreshed it already) gives the grant
/// back and runs nothing; asked for by a copy of that newer result, it is
/// granted again.
#[tokio::test(start_paused = true)]
async fn an_early_refresh_asked_by_a_stale_copy_runs_nothing() {
    let (a, b) = nodes(StaleWindows {
        early_refresh: FRESH,
        ..StaleWindows::OFF
    });
    let k = key("early-copy");
    let work = Work::new(SEC);
    prime(&a, &k, &work).await;
    sleep(8 * SEC).await;
    // v1 ended 8 s ago on a, whose copy chose to refresh it.
    assert!(a.refresh_early(&k, (), work.clone(), 8 * SEC).await);
    assert!(
        !b.refresh_early(&k, (), work.clone(), 8 * SEC).await,
        "a lease runs: not granted"
    );
    sleep(2 * SEC).await;
    assert_eq!(work.runs(), 2, "v2, committed");
    // b's copy is v1, now 10 s old; the store's is v2, 1 s old.
    assert!(
        !b.refresh_early(&k, (), work.clone(), 10 * SEC).await,
        "given back: v2 is newer than b's copy"
    );
    sleep(2 * SEC).await;
    assert_eq!(work.runs(), 2, "nothing ran");
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v2");
    assert!(
        matches!(how, Answered::Hit { .. }),
        "no lease left behind: {how:?}"
    );
    assert!(
        a.refresh_early(&k, (), work.clone(), 3 * SEC).await,
        "a copy of v2"
    );
    sleep(2 * SEC).await;
    assert_eq!(work.runs(), 3);
}

/// A purge during a refresh, from the other node: the refresh's result
/// never answers, nor does the purged one. Its commit, fenced, counts the
/// refresh `outcome="fenced"`, not `committed`: it replaced nothing.
#[tokio::test(start_paused = true)]
async fn a_purge_during_a_refresh_fences_it_on_every_node() {
    recorded::install();
    let (a, b) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("purge");
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    sleep(SEC).await;
    b.invalidate(&k).await.unwrap();
    // The refresh (v2) is still running; nothing stale answers on b.
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!((v.as_str(), how), ("v3", Answered::Ran));
    a.idle().await;
    b.idle().await;
    for node in [&a, &b] {
        let (v, how, _) = call(node, &k, &work).await;
        assert_eq!(v, "v3", "the fenced refresh's v2 never answers");
        assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
    }
    let outcome = |o| counter_where(metric::REFRESH_TOTAL, "purge", Some(("outcome", o)));
    assert_eq!((outcome("fenced"), outcome("committed")), (1, 0));
    assert_eq!(counter_where(metric::FENCED_TOTAL, "purge", None), 1);
}

/// A stale answer is never older than freshness plus its window: within
/// it, its age is the store's; past it, the work runs.
#[tokio::test(start_paused = true)]
async fn stale_answers_never_outlive_freshness_plus_the_window() {
    let window = 5 * SEC;
    let (a, b) = nodes(StaleWindows {
        revalidate: window,
        ..StaleWindows::OFF
    });
    let k = key("bound");
    let work = Work::new(Duration::ZERO);
    prime(&a, &k, &work).await;
    sleep(FRESH + window - SEC).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v1");
    let age = how.stale().expect("within the window").age;
    assert_eq!(age, FRESH + window - SEC);
    b.idle().await;
    // The refresh committed v2; let it, too, age past freshness + window.
    sleep(FRESH + window + SEC).await;
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!((v.as_str(), how), ("v3", Answered::Ran));
}

/// A hit says how old the stored result is by the store's clock, whichever
/// node stored it.
#[tokio::test(start_paused = true)]
async fn hits_carry_the_stores_age() {
    let (a, b) = nodes(StaleWindows::OFF);
    let k = key("age");
    let work = Work::new(Duration::ZERO);
    prime(&a, &k, &work).await;
    sleep(3 * SEC).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v1");
    assert!(
        matches!(how, Answered::Hit { age, fresh_for, .. } if age == 3 * SEC && fresh_for == FRESH - 3 * SEC),
        "{how:?}"
    );
}

/// The windows count from the end of the work, not from a commit that
/// retries delayed: a result whose commit landed 1.5 s late answers stale
/// no longer than freshness + window after its work ended.
#[tokio::test(start_paused = true)]
async fn a_late_commit_does_not_stretch_the_window() {
    let window = 5 * SEC;
    let store = MemoryBackend::new();
    let policy = DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .replay_ttl(FRESH)
        .stale_windows(StaleWindows {
            revalidate: window,
            ..StaleWindows::OFF
        });
    let node =
        || DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    let (a, b) = (node(), node());
    let k = key("late-commit");
    let work = Work::new(Duration::ZERO);
    store.set_fail_commits(true);
    let heal = {
        let store = store.clone();
        tokio::spawn(async move {
            sleep(SEC).await;
            store.set_fail_commits(false);
        })
    };
    let ended = Instant::now();
    let (v, _, _) = call(&a, &k, &work).await;
    assert_eq!(v, "v1");
    heal.await.unwrap();
    a.idle().await;
    assert!(ended.elapsed() >= SEC, "the commit landed late");
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v1");
    assert!(matches!(how, Answered::Hit { .. }), "stored: {how:?}");
    // Past freshness + window since the work ended (though not since the
    // commit): nothing stale answers, the work runs.
    tokio::time::sleep_until(ended + FRESH + window + SEC / 2).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!((v.as_str(), how), ("v2", Answered::Ran));
}

/// A refresh whose work panics is counted (`outcome="failed"`), like any
/// other refresh.
#[tokio::test(start_paused = true)]
async fn a_panicking_refresh_is_counted() {
    recorded::install();
    let (a, _b) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("panicking-refresh");
    let work = Work::new(SEC);
    refresh_in_the_background(&a, &k, &work, &work.panicking).await;
    assert_eq!(
        counter_where(
            metric::REFRESH_TOTAL,
            "panicking-refresh",
            Some(("outcome", "failed"))
        ),
        1
    );
}

/// Two nodes with `stale-if-error` and a `soft` timeout; `a` primed `k`
/// (`v1`, with work that takes 3 s) and, past its freshness, owns its
/// refresh (`owner`, running); 0.1 s later.
async fn owner_past_freshness(
    name: &str,
    soft: Duration,
) -> (
    Node,
    Node,
    FlightKey,
    Work,
    JoinHandle<(String, Answered, Duration)>,
) {
    let (a, b) = nodes(StaleWindows {
        if_error: 60 * SEC,
        soft_timeout: soft,
        ..StaleWindows::OFF
    });
    let k = key(name);
    let work = Work::new(3 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    let owner = spawn_call(&a, &k, &work);
    sleep(SEC / 10).await;
    (a, b, k, work, owner)
}

/// The follower waited past its soft timeout for the work (not `v1`,
/// `unless` says why, nor a stale answer); the owner's caller was answered
/// `v1` at its soft timeout.
async fn follower_waited_owner_did_not(
    follower: JoinHandle<(String, Answered, Duration)>,
    owner: JoinHandle<(String, Answered, Duration)>,
    soft: Duration,
    unless: &str,
) {
    let (v, how, took) = follower.await.unwrap();
    assert_ne!(v, "v1", "{unless}");
    assert!(how.stale().is_none(), "{how:?}");
    assert!(took > soft);
    let (v, how, _) = owner.await.unwrap();
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::SoftTimeout))
    );
}

/// A follower on the node that purges: the stale result it fetched before
/// the purge never answers after it began (not at the soft timeout); it
/// waits for the work instead.
#[tokio::test(start_paused = true)]
async fn a_purge_keeps_a_waiting_follower_from_answering_what_it_fetched_before() {
    let soft = SEC;
    let (_a, b, k, work, owner) = owner_past_freshness("purge-soft", soft).await;
    let follower = spawn_call(&b, &k, &work);
    sleep(SEC / 2).await;
    b.invalidate(&k).await.unwrap();
    // The owner's node did not purge: its caller was answered at its soft
    // timeout.
    follower_waited_owner_did_not(
        follower,
        owner,
        soft,
        "the purged result answered at the soft timeout",
    )
    .await;
}

/// A follower's kept result standing by does not answer at the soft
/// timeout once its node has a copy of newer work (its own refresh
/// committed meanwhile, say, and the commit's notice is slow): the node
/// gave that copy, or may have; the caller waits on for the work instead.
#[tokio::test(start_paused = true)]
async fn a_kept_result_standing_by_yields_to_a_newer_copy_on_its_node() {
    let soft = SEC;
    let (_a, b, k, work, owner) = owner_past_freshness("superseded-soft", soft).await;
    let on_b = Work {
        kept: Arc::default(),
        ..work.clone()
    };
    let follower = spawn_call(&b, &k, &on_b);
    sleep(SEC / 2).await;
    // b gets a copy of newer work while its follower waits.
    *on_b.kept.lock().unwrap() = Some(("v7".to_owned(), Instant::now()));
    follower_waited_owner_did_not(
        follower,
        owner,
        soft,
        "an older result than b's copy answered at the soft timeout",
    )
    .await;
}

/// A node whose own copy is of work that started later than the store's
/// kept result answers its copy, never the older result.
#[tokio::test(start_paused = true)]
async fn a_copy_of_later_work_on_the_node_answers_instead_of_the_stores() {
    let (a, b) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("younger");
    let work = Work::new(Duration::ZERO);
    prime(&a, &k, &work).await;
    sleep(SEC + SEC / 2).await;
    // b ran it on its own meanwhile (say, the store was unreachable).
    let on_b = Work {
        kept: Arc::new(Mutex::new(Some(("v9".to_owned(), Instant::now())))),
        ..work.clone()
    };
    sleep(FRESH + SEC / 2).await;
    let (v, how, _) = call(&b, &k, &on_b).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v9", Some(StaleReason::Revalidate))
    );
    assert_eq!(how.stale().unwrap().age, FRESH + SEC / 2, "the copy's age");
    // Without a younger copy, the store's answers.
    b.idle().await;
    let (a2, b2) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    });
    let work = Work::new(Duration::ZERO);
    prime(&a2, &k, &work).await;
    sleep(FRESH + SEC).await;
    let older = Work {
        kept: Arc::new(Mutex::new(Some((
            "v0".to_owned(),
            Instant::now() - FRESH - 2 * SEC,
        )))),
        ..work.clone()
    };
    let (v, how, _) = call(&b2, &k, &older).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
}

/// A store whose commits take `transit` to arrive (a slow or stalled
/// server): applied late, though sent as the work ended.
#[derive(Clone)]
struct Transit {
    inner: MemoryBackend,
    transit: Duration,
}

impl Backend for Transit {
    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        Box::pin(async move {
            sleep(self.transit).await;
            self.inner.commit(flight, token, generation, args).await
        })
    }

    forward_backend!(inner => acquire_with, heartbeat, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// A node on `store` under `policy` whose commits take 0.5 s to arrive
/// ([`Transit`]), which ran `k` (`v1`, stored), and when that work ended.
async fn slow_node_ran(
    store: &MemoryBackend,
    policy: DistributedPolicy,
    k: &FlightKey,
    work: &Work,
) -> (DistributedFlights<Transit, PostcardCodec<String>>, Instant) {
    let slow = Transit {
        inner: store.clone(),
        transit: SEC / 2,
    };
    let node = DistributedFlights::new(slow, policy, PostcardCodec::new()).unwrap();
    let ended = Instant::now();
    let (v, _, _) = call(&node, k, work).await;
    assert_eq!(v, "v1");
    node.idle().await;
    (node, ended)
}

/// A commit 0.5 s on its way: the node that ran the work counts its stale
/// answers from the work's end, so past freshness + window by its clock it
/// runs the work instead; so does another node, by the store's date of
/// the result, its commit's sending (not its arrival, 0.5 s later).
#[tokio::test(start_paused = true)]
async fn the_node_that_ran_the_work_counts_from_its_end_despite_a_slow_commit() {
    let window = 5 * SEC;
    let store = MemoryBackend::new();
    let policy = DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .call_timeout(SEC)
        .replay_ttl(FRESH)
        .stale_windows(StaleWindows {
            revalidate: window,
            ..StaleWindows::OFF
        });
    let k = key("transit");
    let work = Work::new(Duration::ZERO);
    let (a, ended) = slow_node_ran(&store, policy.clone(), &k, &work).await;
    let b = DistributedFlights::new(store, policy, PostcardCodec::new()).unwrap();
    tokio::time::sleep_until(ended + FRESH + window + SEC / 4).await;
    // The node that ran v1 knows it ended 15.25 s ago (and the store dates
    // it from its commit's sending): nothing stale answers, the work runs.
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!((v.as_str(), how), ("v2", Answered::Ran));
    // Another node counts from the commit's sending: the store's age.
    let k = key("transit-other");
    let sent = Instant::now();
    let (v, _, _) = call(&a, &k, &work).await;
    assert_eq!(v, "v3");
    a.idle().await;
    assert_eq!(
        Instant::now(),
        sent + SEC / 2,
        "the commit landed 0.5 s late"
    );
    tokio::time::sleep_until(sent + FRESH + window - SEC / 4).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v3", Some(StaleReason::Revalidate))
    );
    // As old as since its sending (since its arrival: 0.5 s less).
    assert_eq!(how.stale().unwrap().age, FRESH + window - SEC / 4);
}

/// The store's throttle after a failed refresh answers the kept result
/// as `error` only within `stale-if-error`: with that window off, a
/// result inside `stale-while-revalidate` answers as `revalidate`, and is
/// counted so.
#[tokio::test(start_paused = true)]
async fn a_throttled_answer_names_the_window_it_is_in() {
    recorded::install();
    let (a, b) = nodes(StaleWindows {
        revalidate: 60 * SEC,
        retry_after: 30 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("throttled-revalidate");
    let work = Work::new(SEC / 10);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    work.failing.store(true, Ordering::SeqCst);
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    a.idle().await;
    assert_eq!(work.runs(), 2, "the refresh ran and failed");
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(work.runs(), 2, "throttled: nothing runs");
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate)),
        "stale-if-error is off: {how:?}"
    );
    assert_eq!(
        counter_where(
            metric::STALE_SERVED_TOTAL,
            "throttled-revalidate",
            Some(("reason", "error"))
        ),
        0
    );
}

/// A refresh that fails while another node follows it: the follower is
/// answered the kept result and runs nothing, so the failing work runs
/// once per `stale-retry-after` for the whole deployment (no failure is
/// cached: the follower's re-check must not be granted the flight the
/// throttle holds).
#[tokio::test(start_paused = true)]
async fn a_follower_of_a_failed_refresh_runs_nothing_while_throttled() {
    let (a, b) = nodes(StaleWindows {
        if_error: 120 * SEC,
        retry_after: 30 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("throttled-follower");
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    work.failing.store(true, Ordering::SeqCst);
    let owner = spawn_call(&a, &k, &work);
    sleep(SEC / 10).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Error)),
        "the follower: {how:?}"
    );
    let (v, how, _) = owner.await.unwrap();
    assert_eq!((v.as_str(), reason(how)), ("v1", Some(StaleReason::Error)));
    a.idle().await;
    b.idle().await;
    assert_eq!(
        work.runs(),
        2,
        "one refresh, failed; the follower ran nothing"
    );
    for node in [&a, &b] {
        let (v, how, _) = call(node, &k, &work).await;
        assert_eq!((v.as_str(), reason(how)), ("v1", Some(StaleReason::Error)));
    }
    assert_eq!(work.runs(), 2, "still throttled");
}

/// A follower standing by with the kept result that is granted the
/// flight after the throttle (it polls: notices are lost) runs a refresh:
/// its failure throttles the next one as the first owner's did.
#[tokio::test(start_paused = true)]
async fn a_follower_granted_after_the_throttle_throttles_on_failure() {
    let store = MemoryBackend::new();
    let policy = DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .poll_interval(2 * SEC)
        .replay_ttl(FRESH)
        .stale_windows(StaleWindows {
            if_error: 120 * SEC,
            retry_after: SEC / 5,
            ..StaleWindows::OFF
        });
    let node =
        || DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    let (a, b) = (node(), node());
    let k = key("follower-refresh");
    let work = Work::new(SEC / 2);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    work.failing.store(true, Ordering::SeqCst);
    store.set_drop_notices(true);
    let owner = spawn_call(&a, &k, &work);
    sleep(SEC / 10).await;
    // Polls at least a second later, past the owner's failure and its
    // throttle: granted, it refreshes and fails too.
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!((v.as_str(), reason(how)), ("v1", Some(StaleReason::Error)));
    assert_eq!(owner.await.unwrap().0, "v1");
    assert_eq!(work.runs(), 3, "the owner's refresh, then the follower's");
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!((v.as_str(), reason(how)), ("v1", Some(StaleReason::Error)));
    assert_eq!(work.runs(), 3, "the follower's failed refresh throttles");
}

/// A hit that starts an early refresh is answered after its own store
/// call only: the early refresh's grant is asked in the background, so
/// no hit waits a second round trip (nor a stalled store's call timeout).
#[tokio::test(start_paused = true)]
async fn a_hit_never_waits_for_its_early_refresh_grant() {
    flightdeck_core::random::seed_this_thread(Some(7));
    let trip = SEC / 10;
    let store = flightdeck_test::Hooked::new(MemoryBackend::new())
        .after_acquire(move |_| tokio::time::sleep(trip));
    let policy = DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .replay_ttl(FRESH)
        .stale_windows(StaleWindows {
            early_refresh: FRESH,
            ..StaleWindows::OFF
        });
    let node = DistributedFlights::new(store, policy, PostcardCodec::new()).unwrap();
    let k = key("early-latency");
    let work = Work::new(SEC);
    let started = Instant::now();
    let v = node
        .run_answered(&k, (), work.clone(), &Propagate, None)
        .await
        .unwrap();
    assert!(matches!(v.1, Answered::Ran));
    node.idle().await;
    assert!(started.elapsed() >= trip);
    loop {
        let started = Instant::now();
        let (out, how) = node
            .run_answered(&k, (), work.clone(), &Propagate, None)
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
        assert_eq!(took, trip, "one store call per hit");
        if work.runs() == 2 {
            break;
        }
        assert!(matches!(out, Shareable::Shared(ref v) if v == "v1"));
        sleep(SEC / 10).await;
    }
    flightdeck_core::random::seed_this_thread(None);
    node.idle().await;
}

/// A node whose windows are shorter than those the result was committed
/// with (a configuration rolling out) never answers the store's throttled
/// result past its own freshness plus window. Nor does it run the work
/// beside the throttle, which holds the failing work off every node: its
/// caller gets the failure the store throttles (a copy of its own would
/// answer it, within `stale-if-error`). Before, it ran the work, found by
/// the simulation (seeds 5416816, 5459434) as a run no mode or response
/// explained.
#[tokio::test(start_paused = true)]
async fn a_throttled_answer_stays_within_this_nodes_windows() {
    let store = MemoryBackend::new();
    let node = |windows| {
        let policy = DistributedPolicy::new()
            .lease(3 * SEC)
            .heartbeat(SEC)
            .replay_ttl(FRESH)
            .stale_windows(windows);
        DistributedFlights::new(store.clone(), policy, PostcardCodec::new()).unwrap()
    };
    let a = node(StaleWindows {
        if_error: 120 * SEC,
        retry_after: 60 * SEC,
        ..StaleWindows::OFF
    });
    let b = node(StaleWindows {
        revalidate: 2 * SEC,
        ..StaleWindows::OFF
    });
    let k = key("shorter-windows");
    let work = Work::new(SEC / 10);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    work.failing.store(true, Ordering::SeqCst);
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!((v.as_str(), reason(how)), ("v1", Some(StaleReason::Error)));
    work.failing.store(false, Ordering::SeqCst);
    sleep(10 * SEC).await;
    let runs = work.runs();
    let err = b
        .run_answered(&k, (), work.clone(), &Propagate, None)
        .await
        .expect_err("21 s past freshness, b's window is 2 s");
    assert_eq!(ErrorClass::of(&*err), ErrorClass::Unavailable, "{err}");
    assert_eq!(work.runs(), runs, "nothing runs beside the throttle");
    // Once the throttle ends, b is granted the next try.
    sleep(60 * SEC).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!((v.as_str(), how), ("v3", Answered::Ran));
}

/// A store that counts the acquires that reached it.
type Counted = flightdeck_test::Hooked<MemoryBackend>;

/// Node `a` on the store, node `b` on it through [`Counted`], within a
/// 60 s grace window; `v1` stored by `a` and past its freshness.
async fn grace_elsewhere(
    stage: &str,
) -> (
    Node,
    DistributedFlights<Counted, PostcardCodec<String>>,
    Arc<AtomicUsize>,
    FlightKey,
    Work,
) {
    let store = MemoryBackend::new();
    let policy = policy(grace());
    let a = DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    let acquires = Arc::new(AtomicUsize::new(0));
    let counted = Counted::new(store).after_acquire({
        let acquires = Arc::clone(&acquires);
        move |_| {
            acquires.fetch_add(1, Ordering::SeqCst);
            std::future::ready(())
        }
    });
    let b = DistributedFlights::new(counted, policy, PostcardCodec::new()).unwrap();
    let k = key(stage);
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    (a, b, acquires, k, work)
}

/// `a` refreshes `k`, past its freshness, and answers `v1`; `b` is told
/// so by the store (FOLLOWER, `v1` beside) and answers `v1` too.
async fn refreshing_on<B: Backend>(
    a: &Node,
    b: &DistributedFlights<B, PostcardCodec<String>>,
    k: &FlightKey,
    work: &Work,
) {
    let (v, _, _) = call(a, k, work).await;
    assert_eq!(v, "v1");
    let (v, how, _) = call(b, k, work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
}

/// Grace while another node refreshes: the store tells this node once
/// (FOLLOWER, the kept result beside) and its next callers are answered
/// the kept result at a hit's cost, without a store call each; the
/// refresh's commit reaches the node (a notice), and the next caller
/// asks the store again and gets the new result.
#[tokio::test(start_paused = true)]
async fn a_refresh_running_elsewhere_costs_each_node_one_store_call() {
    let (a, b, acquires, k, work) = grace_elsewhere("elsewhere").await;
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    for i in 0..5u32 {
        let (v, how, took) = call(&b, &k, &work).await;
        assert_eq!(
            (v.as_str(), reason(how)),
            ("v1", Some(StaleReason::Revalidate))
        );
        assert_eq!(took, Duration::ZERO);
        let aged = FRESH + SEC + Duration::from_millis(100) * i;
        assert_eq!(
            how.stale().unwrap().age,
            aged,
            "call {i}: the store's age, and since"
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        acquires.load(Ordering::SeqCst),
        1,
        "one store call for five callers"
    );
    a.idle().await;
    sleep(2 * SEC).await;
    let (v, how, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v2", "the refresh's commit ended what b knew of it");
    assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
    assert_eq!(acquires.load(Ordering::SeqCst), 2);
    assert_eq!(work.runs(), 2, "one refresh");
}

/// What a node knows of a refresh running elsewhere ends with a purge:
/// from another node (its notice), or from this one (at once).
#[tokio::test(start_paused = true)]
async fn a_purge_ends_what_a_node_knows_of_a_refresh_elsewhere() {
    for purge_here in [false, true] {
        let (a, b, _, k, work) = grace_elsewhere(if purge_here { "here" } else { "there" }).await;
        refreshing_on(&a, &b, &k, &work).await;
        if purge_here {
            b.invalidate(&k).await.unwrap();
        } else {
            a.invalidate(&k).await.unwrap();
        }
        tokio::task::yield_now().await;
        sleep(Duration::from_millis(1)).await;
        let (v, how, _) = call(&b, &k, &work).await;
        assert_eq!(
            (v.as_str(), how),
            ("v3", Answered::Ran),
            "purged {purge_here}"
        );
    }
}

/// The work of [`Work`] for a request that a stored `v1` does not serve
/// when it is fussy (HTTP's `Vary`): it follows the refresh instead.
#[derive(Clone)]
struct Fussy(Work);

impl Execute<bool> for Fussy {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: bool, role: Role) -> Result<Shareable<String, String>, BoxError> {
        self.0.execute((), role).await
    }

    fn serves(&self, shared: &String, fussy: &bool) -> bool {
        !*fussy || shared != "v1"
    }
}

/// A node that answered a refresh's result to a follower never answers
/// the older result it remembered the refresh by: the follower's answer
/// (here by polling, the notices lost) ends what the node knew of it, as
/// a hit does.
#[tokio::test(start_paused = true)]
async fn a_followers_newer_answer_ends_what_a_node_knows_of_a_refresh() {
    let store = MemoryBackend::new();
    let windows = StaleWindows {
        revalidate: 60 * SEC,
        ..StaleWindows::OFF
    };
    let policy = DistributedPolicy::new().lease(3 * SEC).heartbeat(SEC);
    let policy = policy.poll_interval(SEC / 10).replay_ttl(FRESH);
    let policy = policy.stale_windows(windows);
    let node =
        || DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    let (a, b) = (node(), node());
    let k = key("fussy");
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    store.set_drop_notices(true);
    // `a` refreshes (2 s); `b` is told so and remembers it.
    refreshing_on(&a, &b, &k, &work).await;
    let fussy = Fussy(work.clone());
    let (out, _) = b
        .run_answered(&k, true, fussy, &Propagate, None)
        .await
        .unwrap();
    let Shareable::Shared(v) = out else {
        panic!("every answer is shared");
    };
    assert_eq!(v, "v2", "the refresh's result, followed");
    let (v, _, _) = call(&b, &k, &work).await;
    assert_eq!(v, "v2", "b answered v2 already: never v1 again");
    a.idle().await;
}

/// A second past `k`'s freshness, `node` is granted its refresh and
/// answers `v1` (how, returned) while the refresh runs (`v2`) with
/// `store` refusing every commit: its commit never gets through.
async fn refresh_never_stored<B: Backend>(
    node: &DistributedFlights<B, PostcardCodec<String>>,
    store: &MemoryBackend,
    k: &FlightKey,
    work: &Work,
) -> Answered {
    sleep(FRESH + SEC).await;
    store.set_fail_commits(true);
    let runs = work.runs();
    let (v, how, _) = call(node, k, work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    node.idle().await;
    store.set_fail_commits(false);
    assert_eq!(work.runs(), runs + 1, "the refresh ran");
    how
}

/// A refresh whose commit never gets through (the store refuses commits
/// for longer than the retries last) replaced nothing: it counts as
/// `outcome="write_failed"`, beside the result write failure, never as
/// `committed`.
#[tokio::test(start_paused = true)]
async fn a_refresh_whose_commit_never_got_through_is_not_counted_committed() {
    recorded::install();
    let store = MemoryBackend::new();
    let a = DistributedFlights::new(store.clone(), policy(grace()), PostcardCodec::new()).unwrap();
    let stage = "unwritten-refresh";
    let k = key(stage);
    let work = Work::new(SEC);
    prime(&a, &k, &work).await;
    refresh_never_stored(&a, &store, &k, &work).await;
    let outcome = |o| counter_where(metric::REFRESH_TOTAL, stage, Some(("outcome", o)));
    assert_eq!((outcome("committed"), outcome("write_failed")), (0, 1));
    assert_eq!(
        counter_where(metric::RESULT_WRITE_FAILURE_TOTAL, stage, None),
        1
    );
}

/// A refresh whose response may not be shared replaced nothing: it counts
/// as `outcome="failed"`, as the local copy's refresh does, never as
/// `abandoned` (which says the execution timeout or the wait cut it).
#[tokio::test(start_paused = true)]
async fn a_refresh_whose_response_may_not_be_shared_counts_failed() {
    recorded::install();
    let store = MemoryBackend::new();
    let a = DistributedFlights::new(store, policy(grace()), PostcardCodec::new()).unwrap();
    let stage = "unshared-refresh";
    let k = key(stage);
    let work = Work::new(SEC);
    refresh_in_the_background(&a, &k, &work, &work.unshared).await;
    let outcome = |o| counter_where(metric::REFRESH_TOTAL, stage, Some(("outcome", o)));
    assert_eq!((outcome("failed"), outcome("abandoned")), (1, 0));
}

/// The node that ran a result's work keeps dating its stale answers from
/// that work's end after a later run of its own (a refresh) failed to
/// commit: the store still answers the earlier result, whose commit took
/// 0.5 s to arrive, and the node still knows when that work ended.
#[tokio::test(start_paused = true)]
async fn a_later_runs_failed_commit_leaves_the_earlier_results_age_right() {
    later_runs_fail_to_commit("ended-twice", 1).await;
}

/// `failed` later runs of the node that ran `stage`'s result (`v1`, its
/// commit 0.5 s on its way) fail to commit, one after the other: the
/// store still answers `v1`, and the node dates it from its work's end,
/// never from its commit's arrival (younger by the commit's trip).
async fn later_runs_fail_to_commit(stage: &str, failed: usize) {
    let store = MemoryBackend::new();
    let k = key(stage);
    let work = Work::new(Duration::ZERO);
    let policy = policy(grace()).call_timeout(SEC);
    let (a, ended) = slow_node_ran(&store, policy, &k, &work).await;
    for _ in 0..failed {
        // Answered a second past freshness, at once.
        let asked = Instant::now() + FRESH + SEC;
        let how = refresh_never_stored(&a, &store, &k, &work).await;
        assert_eq!(how.stale().unwrap().age, asked - ended, "since v1's end");
    }
    let (v, how, _) = call(&a, &k, &work).await;
    assert_eq!(
        (v.as_str(), reason(how)),
        ("v1", Some(StaleReason::Revalidate))
    );
    assert_eq!(
        how.stale().unwrap().age,
        ended.elapsed(),
        "still since v1's end, not since its commit's arrival"
    );
    a.idle().await;
}

/// Two later runs of the node failing to commit, one after the other,
/// leave the earlier result (the store still answers it) dated from its
/// work's end on the node that ran it, never from its commit's arrival,
/// which would make it look younger than it is by the commit's trip.
#[tokio::test(start_paused = true)]
async fn two_later_runs_failed_commits_leave_the_earlier_results_age_right() {
    later_runs_fail_to_commit("ended-thrice", 2).await;
}

/// A node whose own copy, of later work, is still fresh answers it while
/// it remembers a refresh running elsewhere: a hit, never counted as a
/// stale answer.
#[tokio::test(start_paused = true)]
async fn a_fresh_copy_standing_in_for_a_remembered_result_is_no_stale_answer() {
    recorded::install();
    let stage = "fresh-copy";
    let (a, b, _, k, work) = grace_elsewhere(stage).await;
    refreshing_on(&a, &b, &k, &work).await;
    let revalidated = || {
        counter_where(
            metric::STALE_SERVED_TOTAL,
            stage,
            Some(("reason", "revalidate")),
        )
    };
    let before = revalidated();
    // b ran the work on its own since (say, in the local fallback): v9,
    // a second old.
    let on_b = Work {
        kept: Arc::new(Mutex::new(Some(("v9".to_owned(), Instant::now() - SEC)))),
        ..work.clone()
    };
    let (v, how, _) = call(&b, &k, &on_b).await;
    assert_eq!(v, "v9");
    assert!(
        matches!(how, Answered::Hit { age, fresh_for, .. } if age == SEC && fresh_for == FRESH - SEC),
        "{how:?}"
    );
    assert_eq!(revalidated(), before, "a fresh answer is no stale one");
    a.idle().await;
}

/// [`PostcardCodec`], counting the results it decodes.
#[derive(Clone, Default)]
struct CountingCodec {
    decodes: Arc<AtomicUsize>,
}

impl CountingCodec {
    fn decodes(&self) -> usize {
        self.decodes.load(Ordering::SeqCst)
    }
}

impl ResultCodec<String> for CountingCodec {
    fn codec_id(&self) -> u8 {
        ResultCodec::<String>::codec_id(&PostcardCodec::<String>::new())
    }

    fn encode(&self, value: &String) -> Result<Vec<u8>, BoxError> {
        PostcardCodec::new().encode(value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<String, BoxError> {
        self.decodes.fetch_add(1, Ordering::SeqCst);
        PostcardCodec::new().decode(bytes)
    }
}

/// A refresh of `k` runs on `a` and node `b` (decoding with `codec`) was
/// told so by the store: it answered `v1` once, through a flight.
async fn watching(
    stage: &str,
    codec: &CountingCodec,
) -> (
    Node,
    DistributedFlights<MemoryBackend, CountingCodec>,
    FlightKey,
    Work,
) {
    let store = MemoryBackend::new();
    let policy = policy(grace());
    let a = DistributedFlights::new(store.clone(), policy.clone(), PostcardCodec::new()).unwrap();
    let b = DistributedFlights::new(store, policy, codec.clone()).unwrap();
    let k = key(stage);
    let work = Work::new(2 * SEC);
    prime(&a, &k, &work).await;
    sleep(FRESH + SEC).await;
    let (v, _, _) = call(&a, &k, &work).await;
    assert_eq!(v, "v1", "a refreshes");
    let (out, how) = b
        .run_answered(&k, (), work.clone(), &Propagate, None)
        .await
        .unwrap();
    assert!(matches!(out, Shareable::Shared(v) if v == "v1"));
    assert_eq!(reason(how), Some(StaleReason::Revalidate));
    (a, b, k, work)
}

/// While a node knows a refresh runs elsewhere, its callers share one
/// decode of the kept result, whether they come through a flight or
/// are answered without one (`answer_during_refresh`), and both are
/// answered and counted alike.
#[tokio::test(start_paused = true)]
async fn callers_during_a_refresh_elsewhere_share_one_decode() {
    recorded::install();
    let stage = "one-decode";
    let codec = CountingCodec::default();
    let (a, b, k, work) = watching(stage, &codec).await;
    let revalidated = || {
        counter_where(
            metric::STALE_SERVED_TOTAL,
            stage,
            Some(("reason", "revalidate")),
        )
    };
    let (decoded, counted) = (codec.decodes(), revalidated());
    let aged = |i: u32| FRESH + SEC + Duration::from_millis(100) * i;
    for i in 0..4u32 {
        let (out, how) = b
            .run_answered(&k, (), work.clone(), &Propagate, None)
            .await
            .unwrap();
        assert!(matches!(out, Shareable::Shared(v) if v == "v1"));
        assert_eq!(
            how.stale().map(|s| (s.reason, s.age)),
            Some((StaleReason::Revalidate, aged(2 * i)))
        );
        sleep(Duration::from_millis(100)).await;
        let here = work.kept_here();
        let (v, how) = b
            .answer_during_refresh(&k, here.as_ref().map(KeptHere::as_ref), |_| true)
            .expect("answered without a flight");
        assert_eq!(v, "v1");
        assert_eq!(
            how.stale().map(|s| (s.reason, s.age)),
            Some((StaleReason::Revalidate, aged(2 * i + 1)))
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(codec.decodes(), decoded + 1, "one decode for eight callers");
    assert_eq!(revalidated(), counted + 8, "every caller counted");
    // A request the kept result does not serve gets no answer here.
    assert!(b
        .answer_during_refresh(&k, None, |_: &String| false)
        .is_none());
    assert_eq!(work.runs(), 2, "one refresh");
    a.idle().await;
    sleep(2 * SEC).await;
    assert!(
        b.answer_during_refresh(&k, None, |_: &String| true)
            .is_none(),
        "the refresh's commit ended what b knew of it"
    );
}

/// A purge on the node while it knows of a refresh elsewhere: its next
/// caller is not answered the purged result without a flight, nor
/// through one.
#[tokio::test(start_paused = true)]
async fn a_purge_here_ends_answers_without_a_flight() {
    let codec = CountingCodec::default();
    let (_a, b, k, work) = watching("purged-fast", &codec).await;
    assert!(b
        .answer_during_refresh(&k, None, |_: &String| true)
        .is_some());
    b.invalidate(&k).await.unwrap();
    assert!(
        b.answer_during_refresh(&k, None, |_: &String| true)
            .is_none(),
        "purged here"
    );
    let (out, how) = b
        .run_answered(&k, (), work.clone(), &Propagate, None)
        .await
        .unwrap();
    let Shareable::Shared(v) = out else {
        panic!("every answer is shared");
    };
    assert_eq!(how, Answered::Ran, "runs anew");
    assert_ne!(v, "v1", "the purged result never answers");
}

/// An early grant given back beside a newer stored result (df732fc) is a
/// decision, not a token this node lost track of: it must not count in
/// `singleflight_orphan_release_total` (whose every `released` means an
/// acquire of unknown outcome or a flight cut mid-acquire), nor take a
/// place on the orphan list that real orphans are dropped from.
#[tokio::test(start_paused = true)]
async fn a_given_back_early_grant_is_no_orphan() {
    recorded::install();
    let (a, b) = nodes(StaleWindows {
        early_refresh: FRESH,
        ..StaleWindows::OFF
    });
    let k = key("early-give-back");
    let work = Work::new(SEC);
    prime(&a, &k, &work).await;
    sleep(8 * SEC).await;
    assert!(a.refresh_early(&k, (), work.clone(), 8 * SEC).await);
    sleep(2 * SEC).await;
    assert_eq!(work.runs(), 2, "v2, committed");
    assert!(
        !b.refresh_early(&k, (), work.clone(), 10 * SEC).await,
        "given back"
    );
    sleep(SEC).await;
    a.idle().await;
    b.idle().await;
    assert_eq!(work.runs(), 2);
    let orphans = |r| {
        counter_where(
            metric::ORPHAN_RELEASE_TOTAL,
            "early-give-back",
            Some(("result", r)),
        )
    };
    assert_eq!(
        (
            orphans("released"),
            orphans("not_owner"),
            orphans("dropped")
        ),
        (0, 0, 0),
        "a grant given back is counted as an orphan lease"
    );
}
