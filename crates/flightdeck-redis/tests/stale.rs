//! Stale results in the Redis record, against a real `redis-server`
//! started by the harness: each answer the scripts give a stage with
//! stale windows (a kept result beside OWNER and FOLLOWER, STALE while a
//! failed refresh is throttled, the early refresh's grant, a refresh an
//! invalidation fenced), and how long the record keeps the result.
//!
//! Every verdict here needs a window to have passed (the tests sleep past
//! it), or a lease or throttle of 30 s still running: a stalled machine
//! cannot turn one into the other.

use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, CommitArgs, Committed, LeaseTerms, Released, ResultStatus,
    StoredResult,
};
use flightdeck_distributed::{FlightId, OwnerToken};
use flightdeck_harness::{RedisServer, Resp};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::conformance::fresh_flight;

/// Long enough that no lease runs out during a test.
const TERMS: LeaseTerms = LeaseTerms {
    lease: Duration::from_secs(30),
    state_ttl: Duration::from_secs(60),
    allow_takeover: true,
};

/// A result's freshness in the tests that let it go stale.
const TTL: Duration = Duration::from_millis(100);

/// What the stale tests sleep for a result to be past [`TTL`].
const PAST_TTL: Duration = Duration::from_millis(250);

/// The owner's work time every commit here carries.
const WORK: Duration = Duration::from_millis(170);

const STALE: Ask = Ask::STALE;
const EARLY: Ask = Ask::EARLY;

async fn backend(redis: &RedisServer) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(redis.url())
            .command_timeout(Duration::from_secs(2))
            .subscriber_ping(Duration::from_secs(3600)),
    )
    .await
    .expect("connects to the test redis")
}

/// An ACQUIRE of `f` asking `what`, with a fresh token.
async fn ask(b: &RedisBackend, f: &FlightId, what: Ask) -> Acquired {
    b.acquire_with(f, &OwnerToken::random(), what, &TERMS)
        .await
        .unwrap()
}

/// A commit of `payload`, fresh for `ttl` and answered stale for
/// `stale_for` more, kept for waiters 50 ms.
fn commit(payload: &'static [u8], ttl: Duration, stale_for: Duration) -> CommitArgs {
    CommitArgs {
        payload: Bytes::from_static(payload),
        ttl,
        retain: Duration::from_millis(50),
        stale_for,
        work_time: WORK,
        inline_below: 1024,
        state_ttl: Duration::from_secs(60),
        sent: None,
    }
}

/// An abandon without a cached failure, throttling for `retry_after`.
fn abandon(retry_after: Duration) -> AbandonArgs {
    AbandonArgs {
        failure: None,
        failure_ttl: Duration::ZERO,
        retry_after,
        state_ttl: Duration::from_secs(60),
    }
}

/// The generation of a grant and the result beside it; panics on any
/// other answer.
fn owner(answer: Acquired) -> (u64, Option<StoredResult>) {
    match answer {
        Acquired::Owner {
            generation, stale, ..
        } => (generation, stale),
        other => panic!("expected OWNER, got {other:?}"),
    }
}

/// The followed generation and the result beside it; panics on any
/// other answer.
fn follower(answer: Acquired) -> (u64, Option<StoredResult>) {
    match answer {
        Acquired::Follower {
            generation, stale, ..
        } => (generation, stale),
        other => panic!("expected FOLLOWER, got {other:?}"),
    }
}

/// Panics unless `r` is the success `payload` of `generation`, with the
/// commit's TTL and work time, at least `min_age` old.
fn is_result(r: &StoredResult, generation: u64, payload: &[u8], ttl: Duration, min_age: Duration) {
    assert_eq!(r.generation, generation);
    assert_eq!(r.status, ResultStatus::Ok);
    assert_eq!(&r.payload[..], payload);
    assert_eq!(r.ttl, ttl, "the commit's TTL");
    assert_eq!(r.work_time, WORK, "the commit's work time");
    assert!(r.age >= min_age, "age {:?} below {min_age:?}", r.age);
    assert!(r.age < Duration::from_secs(20), "age {:?}", r.age);
}

/// A flight whose result (generation returned) was committed `stale_for`
/// to answer stale and is past its freshness now.
async fn gone_stale(b: &RedisBackend, f: &FlightId, stale_for: Duration) -> u64 {
    let tok = OwnerToken::random();
    let (g, _) = owner(b.acquire(f, &tok, &TERMS).await.unwrap());
    assert_eq!(
        b.commit(f, &tok, g, &commit(b"old", TTL, stale_for))
            .await
            .unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(PAST_TTL).await;
    g
}

/// Past its freshness, the kept result goes beside the grant of its
/// refresh and beside every FOLLOWER while the refresh runs, with its
/// generation, age, TTL and work time; an ACQUIRE that does not ask for
/// stale results gets today's answers; the refresh's commit replaces it.
#[tokio::test]
async fn a_stale_result_goes_beside_the_refresh_and_its_followers() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let g1 = gone_stale(&b, &f, Duration::from_secs(30)).await;

    let refresher = OwnerToken::random();
    let (g2, beside) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert!(g2 > g1);
    is_result(
        &beside.expect("the kept result beside the grant"),
        g1,
        b"old",
        TTL,
        TTL,
    );
    // The owner's retry gets it again.
    let (again, beside) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert_eq!(again, g2);
    is_result(&beside.expect("beside the retry"), g1, b"old", TTL, TTL);

    let (followed, beside) = follower(ask(&b, &f, STALE).await);
    assert_eq!(followed, g2);
    is_result(&beside.expect("beside the follower"), g1, b"old", TTL, TTL);
    let (_, beside) = follower(ask(&b, &f, Ask::default()).await);
    assert_eq!(beside, None, "not asked for");

    assert_eq!(
        b.commit(
            &f,
            &refresher,
            g2,
            &commit(b"new", Duration::from_secs(30), Duration::ZERO),
        )
        .await
        .unwrap(),
        Committed::Committed
    );
    match ask(&b, &f, STALE).await {
        Acquired::Hit(r) => is_result(&r, g2, b"new", Duration::from_secs(30), Duration::ZERO),
        other => panic!("expected the refresh's HIT, got {other:?}"),
    }
}

/// Past its freshness and its stale window, a result is answered to
/// nobody, although the record keeps it longer for the followers that
/// were waiting for it: the grant comes alone.
#[tokio::test]
async fn a_result_past_its_stale_window_goes_nowhere() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let tok = OwnerToken::random();
    let (g, _) = owner(b.acquire(&f, &tok, &TERMS).await.unwrap());
    let args = CommitArgs {
        retain: Duration::from_secs(30),
        ..commit(b"old", TTL, Duration::from_millis(100))
    };
    assert_eq!(
        b.commit(&f, &tok, g, &args).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(PAST_TTL + Duration::from_millis(100)).await;
    // Kept for a follower of its generation, not answered stale.
    let waiter = Ask::rechecking(Some(g));
    match ask(&b, &f, waiter).await {
        Acquired::Hit(r) => is_result(&r, g, b"old", TTL, PAST_TTL),
        other => panic!("expected the waiter's HIT, got {other:?}"),
    }
    let (_, beside) = owner(ask(&b, &f, STALE).await);
    assert_eq!(beside, None);
    let (_, beside) = follower(ask(&b, &f, STALE).await);
    assert_eq!(beside, None);
}

/// The record lives as long as its result may be answered: its freshness
/// and its stale window, not the retention for waiters alone.
#[tokio::test]
async fn the_record_lives_through_the_stale_window() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let tok = OwnerToken::random();
    let (g, _) = owner(b.acquire(&f, &tok, &TERMS).await.unwrap());
    let args = commit(b"v", Duration::from_secs(2), Duration::from_secs(40));
    assert_eq!(
        b.commit(&f, &tok, g, &args).await.unwrap(),
        Committed::Committed
    );
    let Resp::Int(ms) = redis.cmd(&["PTTL", &b.record_key(&f)]).unwrap() else {
        panic!("PTTL answers an integer");
    };
    assert!(ms > 40_000 && ms <= 42_000, "the record's TTL: {ms} ms");
}

/// A failed refresh that names a retry time throttles the flight: until
/// it ends every ACQUIRE that asks for stale results answers STALE with
/// the kept result and grants nothing; after it one caller is granted
/// the refresh, beside the kept result, and the others follow it. An
/// ACQUIRE that does not ask gets today's answers (a grant), and that
/// grant ends the throttle.
#[tokio::test]
async fn a_failed_refresh_is_throttled_with_the_kept_result() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let g1 = gone_stale(&b, &f, Duration::from_secs(30)).await;
    let refresher = OwnerToken::random();
    let (g2, _) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert_eq!(
        b.abandon(&f, &refresher, g2, &abandon(Duration::from_secs(30)))
            .await
            .unwrap(),
        Released::Released
    );
    for _ in 0..3 {
        match ask(&b, &f, STALE).await {
            Acquired::Stale(r) => is_result(&r, g1, b"old", TTL, PAST_TTL),
            other => panic!("expected STALE in the throttle, got {other:?}"),
        }
    }
    // Today's answer to a stage without windows: the flight is granted,
    // and the grant ends the throttle: the others follow it.
    let plain = OwnerToken::random();
    let (g3, beside) = owner(b.acquire(&f, &plain, &TERMS).await.unwrap());
    assert_eq!(beside, None);
    assert!(g3 > g2);
    let (followed, beside) = follower(ask(&b, &f, STALE).await);
    assert_eq!(followed, g3);
    is_result(
        &beside.expect("beside the follower"),
        g1,
        b"old",
        TTL,
        PAST_TTL,
    );
    assert_eq!(
        b.commit(
            &f,
            &plain,
            g3,
            &commit(b"newer", TTL, Duration::from_secs(30)),
        )
        .await
        .unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(PAST_TTL).await;
    let (_, beside) = owner(ask(&b, &f, STALE).await);
    is_result(
        &beside.expect("the newer result beside the grant"),
        g3,
        b"newer",
        TTL,
        TTL,
    );

    // A short throttle: once it ended, one grant and its followers.
    let f = fresh_flight();
    let g1 = gone_stale(&b, &f, Duration::from_secs(30)).await;
    let refresher = OwnerToken::random();
    let (g2, _) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert_eq!(
        b.abandon(&f, &refresher, g2, &abandon(Duration::from_millis(150)))
            .await
            .unwrap(),
        Released::Released
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (g3, beside) = owner(ask(&b, &f, STALE).await);
    assert!(g3 > g2);
    is_result(
        &beside.expect("beside the retry's grant"),
        g1,
        b"old",
        TTL,
        PAST_TTL,
    );
    let (followed, beside) = follower(ask(&b, &f, STALE).await);
    assert_eq!(followed, g3);
    is_result(
        &beside.expect("beside the follower"),
        g1,
        b"old",
        TTL,
        PAST_TTL,
    );
}

/// Without a kept result, a retry time changes nothing: the next ACQUIRE
/// is granted.
#[tokio::test]
async fn a_retry_time_without_a_kept_result_throttles_nothing() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let tok = OwnerToken::random();
    let (g, _) = owner(b.acquire_with(&f, &tok, STALE, &TERMS).await.unwrap());
    assert_eq!(
        b.abandon(&f, &tok, g, &abandon(Duration::from_secs(30)))
            .await
            .unwrap(),
        Released::Released
    );
    let (next, beside) = owner(ask(&b, &f, STALE).await);
    assert!(next > g);
    assert_eq!(beside, None);
}

/// An early refresh of a fresh result is granted, the fresh result
/// beside; while it runs, another early refresh is a HIT (someone
/// refreshes already), and so is every ACQUIRE that does not ask for one.
#[tokio::test]
async fn an_early_refresh_is_granted_beside_the_fresh_result() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let ttl = Duration::from_secs(30);
    let tok = OwnerToken::random();
    let (g1, _) = owner(b.acquire(&f, &tok, &TERMS).await.unwrap());
    assert_eq!(
        b.commit(&f, &tok, g1, &commit(b"fresh", ttl, Duration::ZERO))
            .await
            .unwrap(),
        Committed::Committed
    );
    match ask(&b, &f, Ask::default()).await {
        Acquired::Hit(r) => is_result(&r, g1, b"fresh", ttl, Duration::ZERO),
        other => panic!("expected HIT, got {other:?}"),
    }

    let early = OwnerToken::random();
    let (g2, beside) = owner(b.acquire_with(&f, &early, EARLY, &TERMS).await.unwrap());
    assert!(g2 > g1);
    is_result(
        &beside.expect("the fresh result beside"),
        g1,
        b"fresh",
        ttl,
        Duration::ZERO,
    );
    for what in [EARLY, STALE, Ask::default()] {
        match ask(&b, &f, what).await {
            Acquired::Hit(r) => is_result(&r, g1, b"fresh", ttl, Duration::ZERO),
            other => panic!("{what:?} while the early refresh runs: expected HIT, got {other:?}"),
        }
    }
    assert_eq!(
        b.commit(&f, &early, g2, &commit(b"refreshed", ttl, Duration::ZERO))
            .await
            .unwrap(),
        Committed::Committed
    );
    match ask(&b, &f, Ask::default()).await {
        Acquired::Hit(r) => is_result(&r, g2, b"refreshed", ttl, Duration::ZERO),
        other => panic!("expected the refresh's HIT, got {other:?}"),
    }
}

/// An invalidation while a refresh runs drops the kept result and fences
/// the refresh: its commit brings nothing back, and no stale answer
/// follows.
#[tokio::test]
async fn an_invalidation_fences_the_running_refresh() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    gone_stale(&b, &f, Duration::from_secs(30)).await;
    let refresher = OwnerToken::random();
    let (g2, beside) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert!(beside.is_some());
    let purge = b.invalidate(&f, Duration::from_secs(60)).await.unwrap();
    assert!(purge > g2);
    assert_eq!(
        b.commit(
            &f,
            &refresher,
            g2,
            &commit(b"from before the purge", TTL, Duration::from_secs(30)),
        )
        .await
        .unwrap(),
        Committed::Fenced
    );
    let (g3, beside) = owner(ask(&b, &f, STALE).await);
    assert!(g3 > purge);
    assert_eq!(beside, None, "a purged result is never answered");
    let (_, beside) = follower(ask(&b, &f, STALE).await);
    assert_eq!(beside, None, "a purged result is never answered");
}

/// An invalidation during a throttle ends it with the kept result.
#[tokio::test]
async fn an_invalidation_ends_a_throttle() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    gone_stale(&b, &f, Duration::from_secs(30)).await;
    let refresher = OwnerToken::random();
    let (g2, _) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    assert_eq!(
        b.abandon(&f, &refresher, g2, &abandon(Duration::from_secs(30)))
            .await
            .unwrap(),
        Released::Released
    );
    assert!(matches!(ask(&b, &f, STALE).await, Acquired::Stale(_)));
    b.invalidate(&f, Duration::from_secs(60)).await.unwrap();
    let (_, beside) = owner(ask(&b, &f, STALE).await);
    assert_eq!(beside, None);
}

/// A failure an abandon caches goes beside the kept result, never in its
/// place: an ACQUIRE that asks for nothing stale replays the failure,
/// one that asks is granted the next refresh with the kept result
/// beside; no early refresh is granted while the failure lasts; and the
/// next commit ends the failure with the result it replaces.
#[tokio::test]
async fn a_cached_failure_goes_beside_the_kept_result() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let g1 = gone_stale(&b, &f, Duration::from_secs(30)).await;
    let refresher = OwnerToken::random();
    let (g2, _) = owner(b.acquire_with(&f, &refresher, STALE, &TERMS).await.unwrap());
    let failed = AbandonArgs {
        failure: Some(Bytes::from_static(b"boom")),
        failure_ttl: Duration::from_secs(30),
        ..abandon(Duration::ZERO)
    };
    assert_eq!(
        b.abandon(&f, &refresher, g2, &failed).await.unwrap(),
        Released::Released
    );
    match ask(&b, &f, Ask::default()).await {
        Acquired::Hit(r) => {
            assert_eq!((r.generation, r.status), (g2, ResultStatus::Failed));
            assert_eq!(&r.payload[..], b"boom");
            assert_eq!(r.ttl, Duration::from_secs(30));
            assert_eq!(r.work_time, Duration::ZERO);
        }
        other => panic!("without ask.stale: expected the cached failure, got {other:?}"),
    }
    let next = OwnerToken::random();
    let (g3, beside) = owner(b.acquire_with(&f, &next, STALE, &TERMS).await.unwrap());
    is_result(
        &beside.expect("the kept result beside"),
        g1,
        b"old",
        TTL,
        PAST_TTL,
    );
    let done = commit(b"new", TTL, Duration::from_secs(30));
    assert_eq!(
        b.commit(&f, &next, g3, &done).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(PAST_TTL).await;
    // The failure ended with the commit: past the new result's freshness
    // a plain ACQUIRE is granted, not told the failure.
    let (_, beside) = owner(ask(&b, &f, Ask::default()).await);
    assert_eq!(beside, None);

    // No early refresh while a failure lasts.
    let f = fresh_flight();
    let tok = OwnerToken::random();
    let (g1, _) = owner(b.acquire(&f, &tok, &TERMS).await.unwrap());
    let fresh = commit(b"fresh", Duration::from_secs(30), Duration::ZERO);
    assert_eq!(
        b.commit(&f, &tok, g1, &fresh).await.unwrap(),
        Committed::Committed
    );
    let early = OwnerToken::random();
    let (g2, _) = owner(b.acquire_with(&f, &early, EARLY, &TERMS).await.unwrap());
    assert_eq!(
        b.abandon(&f, &early, g2, &failed).await.unwrap(),
        Released::Released
    );
    for what in [EARLY, Ask::default()] {
        match ask(&b, &f, what).await {
            Acquired::Hit(r) => {
                is_result(&r, g1, b"fresh", Duration::from_secs(30), Duration::ZERO)
            }
            other => panic!("{what:?} after a failed early refresh: expected HIT, got {other:?}"),
        }
    }
}

/// The L2 flow over these scripts, two nodes on one Redis: past its
/// freshness, every caller on both nodes is answered with the kept
/// result (reason `revalidate`, its age by the server's clock) while one
/// refresh runs for the whole deployment; the refresh's result answers
/// next, on the other node too.
#[tokio::test]
async fn grace_over_redis_runs_one_refresh_for_both_nodes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use flightdeck_core::error::BoxError;
    use flightdeck_core::stale::{StaleReason, StaleWindows};
    use flightdeck_core::{FlightKey, Shareable, StageName};
    use flightdeck_distributed::{
        Answered, DistributedFlights, DistributedPolicy, Execute, PostcardCodec, Propagate, Role,
    };

    /// Answers `v<n>` (its `n`th run, on any node) after 1.5 s: longer
    /// than a loaded machine takes to send the 20 calls below.
    #[derive(Clone, Default)]
    struct Work(Arc<AtomicUsize>);

    impl Execute<()> for Work {
        type Shared = String;
        type Output = String;

        async fn execute(self, _: (), _: Role) -> Result<Shareable<String, String>, BoxError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok(Shareable::Shared(format!("v{n}")))
        }
    }

    type Node = DistributedFlights<RedisBackend, PostcardCodec<String>>;
    async fn call(node: &Node, k: &FlightKey, work: &Work) -> (String, Answered) {
        let (out, how) = node
            .run_answered(k, (), work.clone(), &Propagate, None)
            .await
            .unwrap();
        let Shareable::Shared(v) = out else {
            panic!("every answer is shared");
        };
        (v, how)
    }

    let redis = RedisServer::start().unwrap();
    let fresh = Duration::from_millis(300);
    let policy = DistributedPolicy::new()
        .lease(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(2))
        .replay_ttl(fresh)
        .stale_windows(StaleWindows {
            revalidate: Duration::from_secs(60),
            ..StaleWindows::OFF
        });
    let a = Node::new(backend(&redis).await, policy.clone(), PostcardCodec::new()).unwrap();
    let b = Node::new(backend(&redis).await, policy, PostcardCodec::new()).unwrap();
    let k = FlightKey::from_bytes(StageName::new("grace").unwrap(), "k");
    let work = Work::default();
    assert_eq!(call(&a, &k, &work).await, ("v1".to_owned(), Answered::Ran));
    a.idle().await;
    tokio::time::sleep(fresh + Duration::from_millis(200)).await;

    let calls: Vec<_> = (0..20)
        .map(|i| {
            let node = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (k, work) = (k.clone(), work.clone());
            tokio::spawn(async move { call(&node, &k, &work).await })
        })
        .collect();
    for c in calls {
        let (v, how) = c.await.unwrap();
        assert_eq!(v, "v1");
        let stale = how
            .stale()
            .unwrap_or_else(|| panic!("a stale answer: {how:?}"));
        assert_eq!(stale.reason, StaleReason::Revalidate);
        assert!(stale.age > fresh, "the store's age: {stale:?}");
    }
    a.idle().await;
    b.idle().await;
    assert_eq!(
        work.0.load(Ordering::SeqCst),
        2,
        "one refresh for both nodes"
    );
    // b learns that the refresh ended from the commit's notice, in its
    // inbox: until it arrives b answers the kept v1, stale, as it did
    // while the refresh ran.
    let heard_by = tokio::time::Instant::now() + Duration::from_secs(5);
    let (v, how) = loop {
        let (v, how) = call(&b, &k, &work).await;
        if v != "v1" || tokio::time::Instant::now() >= heard_by {
            break (v, how);
        }
        assert_eq!(
            how.stale().map(|s| s.reason),
            Some(StaleReason::Revalidate),
            "{how:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(v, "v2");
    assert!(matches!(how, Answered::Hit { .. }), "{how:?}");
    assert_eq!(work.0.load(Ordering::SeqCst), 2, "no other refresh");
}

/// A server that refuses writes (`min-replicas-to-write` without a
/// replica: every ACQUIRE is refused `NOREPLICAS`) still answers a stage
/// with stale windows: the result kept past its freshness, read without
/// writing, comes as STALE (no refresh can be granted, so nothing runs).
/// An ACQUIRE that does not ask for stale results keeps the refusal, and
/// past the stale window nothing is answered.
#[tokio::test]
async fn refused_writes_answer_the_kept_result_stale() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let f = fresh_flight();
    let g = gone_stale(&b, &f, Duration::from_millis(700)).await;
    redis
        .cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"])
        .unwrap();

    match ask(&b, &f, STALE).await {
        Acquired::Stale(r) => is_result(&r, g, b"old", TTL, TTL),
        other => panic!("expected the kept result as STALE, got {other:?}"),
    }
    let refused = b
        .acquire_with(&f, &OwnerToken::random(), Ask::default(), &TERMS)
        .await
        .unwrap_err();
    assert!(format!("{refused:?}").contains("NOREPLICAS"), "{refused:?}");

    // Past freshness + the stale window: the refusal stands for both.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let refused = b
        .acquire_with(&f, &OwnerToken::random(), STALE, &TERMS)
        .await
        .unwrap_err();
    assert!(format!("{refused:?}").contains("NOREPLICAS"), "{refused:?}");
}
