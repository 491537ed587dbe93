//! The L2 layer's logic against the in-memory backend, with paused time.
//! (The same paths against real Redis are in flightdeck-redis's tests.)

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{
    find, BoxError, BulkheadFull, CoordinationUnavailable, ErrorClass, LeaseLost, OwnerGone,
    TooManyFlights,
};
use flightdeck_core::{metric, CloneShare, FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendFuture, CommitArgs, Committed, LeaseTerms,
    Released, Renewal, Subscription,
};
use flightdeck_distributed::error::RemoteFailure;
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedPolicy, FencingToken, FlightId, OwnerToken, PostcardCodec,
};
use flightdeck_test::recorded::{self, counter};
use flightdeck_test::{Hooked, MemoryBackend};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(3 * SEC)
        .heartbeat(SEC)
        .poll_interval(SEC / 2)
        .wait_timeout(30 * SEC)
        .replay_ttl(60 * SEC)
}

type Svc = BoxCloneService<String, String, BoxError>;

fn key_of(stage: &str, req: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new(stage).unwrap(), req)
}

/// A node: the L2 layer over `backend` around `inner`.
fn node<B: Backend + Clone>(
    backend: &B,
    stage: &'static str,
    policy: DistributedPolicy,
    inner: Svc,
) -> Svc {
    recorded::install();
    let layer = DistributedFlightLayer::new(
        backend.clone(),
        policy,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        move |req: &String| Some(key_of(stage, req)),
    )
    .unwrap();
    BoxCloneService::new(layer.layer(inner))
}

/// Counts executions, answers `"{tag}:{req}"` after `delay`.
fn work(calls: &Arc<AtomicUsize>, tag: &'static str, delay: Duration) -> Svc {
    let calls = calls.clone();
    BoxCloneService::new(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(format!("{tag}:{req}"))
        }
    }))
}

fn failing(calls: &Arc<AtomicUsize>) -> Svc {
    let calls = calls.clone();
    BoxCloneService::new(service_fn(move |_req: String| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(SEC).await;
            Err::<String, BoxError>("database on fire".into())
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn owner_then_hit_without_execution() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = node(&b, "hit", policy(), work(&calls, "v", SEC));
    assert_eq!(svc.clone().oneshot("x".into()).await.unwrap(), "v:x");
    // The commit goes on after the owner's callers got the value.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let before = b.calls();
    assert_eq!((before.acquire, before.commit), (1, 1), "owner: 2 calls");
    assert_eq!(svc.oneshot("x".into()).await.unwrap(), "v:x");
    assert_eq!(b.calls().acquire, before.acquire + 1, "hit: 1 call");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(counter(metric::OWNER_TOTAL, "hit"), 1);
    assert_eq!(counter(metric::HIT_TOTAL, "hit"), 1);
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_key_bypass() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DistributedFlightLayer::new(
        b.clone(),
        policy(),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |_: &String| None,
    )
    .unwrap();
    let svc = layer.layer(work(&calls, "v", SEC));
    assert_eq!(svc.clone().oneshot("x".into()).await.unwrap(), "v:x");
    assert_eq!(svc.oneshot("x".into()).await.unwrap(), "v:x");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(b.calls().acquire, 0);
}

/// The owner's fencing token reaches the handler.
#[tokio::test(start_paused = true)]
async fn fencing_token_reaches_the_handler() {
    let b = MemoryBackend::new();
    let layer = DistributedFlightLayer::new(
        b.clone(),
        policy(),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &(String, Option<FencingToken>)| Some(key_of("fence", &req.0)),
    )
    .unwrap()
    .fence(|req: &mut (String, Option<FencingToken>), t| req.1 = Some(t));
    let svc = layer.layer(service_fn(
        |req: (String, Option<FencingToken>)| async move {
            let t = req.1.expect("fencing token set for the owner");
            Ok::<_, Infallible>(format!("{}@{}", req.0, t.generation))
        },
    ));
    assert_eq!(svc.oneshot(("x".into(), None)).await.unwrap(), "x@1");
}

/// Followers on other nodes get the owner's result inline; the owner's
/// heartbeats keep them from taking over a long execution (invariants 6, 9).
#[tokio::test(start_paused = true)]
async fn followers_wait_through_a_long_heartbeating_execution() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(&b, "long", policy(), work(&calls, "v", 10 * SEC));
    let f = node(&b, "long", policy(), work(&calls, "v", 10 * SEC));
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    let started = Instant::now();
    let mut followers = Vec::new();
    for _ in 0..10 {
        followers.push(tokio::spawn(f.clone().oneshot("x".into())));
    }
    for t in followers {
        assert_eq!(t.await.unwrap().unwrap(), "v:x");
    }
    assert_eq!(owner.await.unwrap().unwrap(), "v:x");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(b.calls().heartbeat >= 9, "{:?}", b.calls());
    // Woken by the inline notice, not by a poll.
    assert!(started.elapsed() <= 10 * SEC, "{:?}", started.elapsed());
    assert_eq!(counter(metric::FOLLOWER_TOTAL, "long"), 10);
    assert_eq!(counter(metric::TAKEOVER_TOTAL, "long"), 0);
}

/// Pub/sub fully broken: followers finish by polling, within the poll bound
/// (invariant 5).
#[tokio::test(start_paused = true)]
async fn followers_poll_when_notices_are_lost() {
    let b = MemoryBackend::new();
    b.set_drop_notices(true);
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(&b, "poll", policy(), work(&calls, "v", 2 * SEC));
    let f = node(&b, "poll", policy(), work(&calls, "v", 2 * SEC));
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    let started = Instant::now();
    assert_eq!(f.oneshot("x".into()).await.unwrap(), "v:x");
    owner.await.unwrap().unwrap();
    assert!(
        started.elapsed() <= 2 * SEC + SEC / 2,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

fn long_lease() -> LeaseTerms {
    LeaseTerms {
        lease: 3 * SEC,
        state_ttl: 120 * SEC,
        allow_takeover: true,
    }
}

/// Commits `value` as generation 1's owner `tok` (another node's),
/// inline for its followers.
async fn commit_as(mem: &MemoryBackend, flight: &FlightId, tok: &OwnerToken, value: &str) {
    let payload = flightdeck_distributed::Envelope::new(1 << 20, 1 << 20)
        .seal(&PostcardCodec::<String>::new(), &value.to_owned())
        .unwrap();
    let args = CommitArgs {
        payload,
        ttl: 60 * SEC,
        retain: 60 * SEC,
        inline_below: 1 << 20,
        state_ttl: 120 * SEC,
        stale_for: Duration::ZERO,
        work_time: Duration::ZERO,
        sent: None,
    };
    let done = mem.commit(flight, tok, 1, &args).await.unwrap();
    assert_eq!(done, Committed::Committed);
}

/// While the node's subscription is in force before a flight's first call
/// (the Redis backend's inbox; the memory backend's is, unless
/// `set_inbox_down`), every follower sends one ACQUIRE and waits: no
/// SUBSCRIBE, no re-check; a commit that lands right after a follower's
/// ACQUIRE (before it starts to wait) still wakes it at once. Without it,
/// the first follower subscribes and re-checks.
#[tokio::test(start_paused = true)]
async fn followers_with_a_subscription_in_force_send_one_acquire() {
    let mem = MemoryBackend::new();
    let flight = FlightId::of(&key_of("share", "x"));
    let owner = OwnerToken::random();
    let first = mem.acquire(&flight, &owner, &long_lease()).await.unwrap();
    assert!(matches!(first, Acquired::Owner { generation: 1, .. }));
    // The owner (another node) commits right after the 11th follower's
    // ACQUIRE through this node.
    let acquires = Arc::new(AtomicUsize::new(0));
    let (inner, n) = (mem.clone(), acquires.clone());
    let b = Hooked::new(mem.clone()).after_acquire(move |flight| {
        let (inner, owner, n) = (inner.clone(), owner.clone(), n.clone());
        async move {
            if n.fetch_add(1, Ordering::SeqCst) + 1 == 11 {
                commit_as(&inner, &flight, &owner, "shared").await;
            }
        }
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let f = node(&b, "share", policy(), work(&calls, "v", SEC));
    let started = Instant::now();
    let before = mem.calls();
    let followers: Vec<_> = (0..21)
        .map(|_| tokio::spawn(f.clone().oneshot("x".to_owned())))
        .collect();
    for (i, h) in followers.into_iter().enumerate() {
        assert_eq!(h.await.unwrap().unwrap(), "shared", "follower {i}");
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait for a poll");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let after = mem.calls();
    // One ACQUIRE per follower: the 11 before the commit follow, the 10
    // after it hit.
    assert_eq!(after.acquire - before.acquire, 21, "{before:?} {after:?}");
    assert_eq!(after.subscribe, 0, "nobody subscribed");
    assert_eq!(mem.subscribers(&flight), 0, "every subscription released");

    // The inbox out of force: the follower subscribes, then re-checks.
    mem.set_inbox_down(true);
    let flight = FlightId::of(&key_of("share", "y"));
    let owner = OwnerToken::random();
    let g = mem.acquire(&flight, &owner, &long_lease()).await.unwrap();
    assert!(matches!(g, Acquired::Owner { generation: 1, .. }));
    let before = mem.calls();
    let follower = tokio::spawn(f.clone().oneshot("y".to_owned()));
    while mem.subscribers(&flight) == 0 {
        tokio::task::yield_now().await;
    }
    commit_as(&mem, &flight, &owner, "late").await;
    assert_eq!(follower.await.unwrap().unwrap(), "late");
    let after = mem.calls();
    assert_eq!(after.subscribe - before.subscribe, 1);
    assert_eq!(after.acquire - before.acquire, 2, "ACQUIRE and re-check");
}

/// Publish-before-subscribe: the re-check after subscribing sees the
/// result at once; no lost wakeup (invariant 5).
#[tokio::test(start_paused = true)]
async fn publish_before_subscribe_is_not_a_lost_wakeup() {
    let mem = MemoryBackend::new();
    let flight = FlightId::of(&key_of("race", "x"));
    let tok = OwnerToken::random();
    mem.acquire(&flight, &tok, &long_lease()).await.unwrap();
    // The owner commits after the follower's acquire, before its subscribe.
    let owner = Arc::new(Mutex::new(Some(tok)));
    let inner = mem.clone();
    let b = Hooked::new(mem.clone()).before_subscribe(move |flight| {
        let (owner, inner) = (owner.clone(), inner.clone());
        async move {
            let Some(tok) = owner.lock().unwrap().take() else {
                return;
            };
            commit_as(&inner, &flight, &tok, "early").await;
        }
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let f = node(&b, "race", policy(), work(&calls, "v", SEC));
    let started = Instant::now();
    assert_eq!(f.oneshot("x".into()).await.unwrap(), "early");
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait for a poll");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// An ambiguous acquire (it happened, the reply was lost) is retried with
/// the same token and answers OWNER with the same generation: one
/// execution, generation 1 (invariant 8).
#[tokio::test(start_paused = true)]
async fn ambiguous_acquire_is_retried_with_the_same_token() {
    let mem = MemoryBackend::new();
    let b = Hooked::new(mem.clone()).lose_acquire_replies(1);
    let layer = DistributedFlightLayer::new(
        b,
        policy(),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &(String, Option<FencingToken>)| Some(key_of("ambig", &req.0)),
    )
    .unwrap()
    .fence(|req: &mut (String, Option<FencingToken>), t| req.1 = Some(t));
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let svc = layer.layer(service_fn(move |req: (String, Option<FencingToken>)| {
        c.fetch_add(1, Ordering::SeqCst);
        let gen = req.1.map(|t| t.generation);
        async move { Ok::<_, Infallible>(format!("{}@{gen:?}", req.0)) }
    }));
    assert_eq!(svc.oneshot(("x".into(), None)).await.unwrap(), "x@Some(1)");
    assert_eq!(mem.calls().acquire, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The owner is cut off (heartbeats fail) past its lease; a follower takes
/// over and commits; the old owner's heartbeat then finds LOST (counted),
/// its commit is FENCED, and it serves its own value locally (invariants 1,
/// 2, 3).
#[tokio::test(start_paused = true)]
async fn lost_lease_is_counted_and_the_late_commit_fenced() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(&b, "lost", policy(), work(&calls, "old", 10 * SEC));
    let f = node(&b, "lost", policy(), work(&calls, "new", SEC / 10));
    b.set_fail_heartbeats(true);
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    assert_eq!(f.clone().oneshot("x".into()).await.unwrap(), "new:x");
    assert_eq!(counter(metric::TAKEOVER_TOTAL, "lost"), 1);
    b.set_fail_heartbeats(false);
    assert_eq!(owner.await.unwrap().unwrap(), "old:x", "served locally");
    assert_eq!(counter(metric::HEARTBEAT_LOST_TOTAL, "lost"), 1);
    assert_eq!(counter(metric::FENCED_TOTAL, "lost"), 1);
    assert_eq!(
        f.oneshot("x".into()).await.unwrap(),
        "new:x",
        "the new result stands"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// INVALIDATE while the owner runs: its commit is fenced (it still serves
/// its caller), and the next request runs the work again (invariant 11).
#[tokio::test(start_paused = true)]
async fn invalidate_fences_the_running_owner() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DistributedFlightLayer::new(
        b.clone(),
        policy(),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &String| Some(key_of("inval", req)),
    )
    .unwrap();
    recorded::install();
    let svc = layer.clone().layer(work(&calls, "v", 2 * SEC));
    let owner = tokio::spawn(svc.clone().oneshot("x".into()));
    tokio::time::sleep(SEC).await;
    assert_eq!(layer.invalidate(&key_of("inval", "x")).await.unwrap(), 2);
    assert_eq!(owner.await.unwrap().unwrap(), "v:x");
    assert_eq!(counter(metric::FENCED_TOTAL, "inval"), 1);
    assert_eq!(svc.oneshot("x".into()).await.unwrap(), "v:x");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the invalidated result was not replayed"
    );
}

/// With `cancel_on_lease_loss`, the work stops when the lease is lost.
#[tokio::test(start_paused = true)]
async fn lost_lease_can_cancel_the_work() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(
        &b,
        "cancel",
        policy().cancel_on_lease_loss(true),
        work(&calls, "old", 60 * SEC),
    );
    let f = node(&b, "cancel", policy(), work(&calls, "new", SEC / 10));
    b.set_fail_heartbeats(true);
    let started = Instant::now();
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    assert_eq!(f.oneshot("x".into()).await.unwrap(), "new:x");
    b.set_fail_heartbeats(false);
    let err = owner.await.unwrap().unwrap_err();
    let lost = find::<LeaseLost>(&*err).expect("LeaseLost");
    assert_eq!(lost.generation(), 1);
    assert!(started.elapsed() < 10 * SEC);
}

/// A failed commit still returns the value, never re-executes, retries with
/// the same token, and is counted (invariant 7).
#[tokio::test(start_paused = true)]
async fn commit_failure_returns_the_value() {
    let b = MemoryBackend::new();
    b.set_fail_commits(true);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = node(&b, "cfail", policy(), work(&calls, "v", SEC));
    assert_eq!(svc.oneshot("x".into()).await.unwrap(), "v:x");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The attempts run after the value went out (20 ms, then 100 ms apart).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.calls().commit, 3, "default commit attempts");
    assert_eq!(counter(metric::RESULT_WRITE_FAILURE_TOTAL, "cfail"), 1);
}

/// A commit that failed for want of Redis goes on in the background: when
/// the store is back before the lease ends, a follower on another node gets
/// the owner's value (no second execution), before the lease would have
/// let it take over.
#[tokio::test(start_paused = true)]
async fn a_failed_commit_is_stored_later_and_followers_get_it() {
    let b = MemoryBackend::new();
    b.set_fail_commits(true);
    let calls = Arc::new(AtomicUsize::new(0));
    let owner = node(&b, "clater", policy(), work(&calls, "v", SEC));
    let follower = node(&b, "clater", policy(), work(&calls, "other", SEC));
    let started = Instant::now();
    let o = tokio::spawn(owner.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    let f = tokio::spawn(follower.oneshot("x".into()));
    // The owner answers with its value although every commit attempt failed.
    assert_eq!(o.await.unwrap().unwrap(), "v:x");
    // The attempts run after the value went out (20 ms, then 100 ms apart).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.calls().commit, 3, "the owner's own attempts");
    // The store comes back within the lease (3 s).
    b.set_fail_commits(false);
    assert_eq!(f.await.unwrap().unwrap(), "v:x", "the owner's value");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second execution");
    assert!(
        started.elapsed() < 3 * SEC,
        "answered before the lease ended: {:?}",
        started.elapsed()
    );
}

/// The owner's business error: by default followers race again (one of
/// them runs); with a failure TTL they get the owner's error.
#[tokio::test(start_paused = true)]
async fn owner_errors_release_or_are_cached() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(&b, "err", policy(), failing(&calls));
    let f = node(&b, "err", policy(), work(&calls, "v", SEC));
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    let started = Instant::now();
    assert_eq!(f.oneshot("x".into()).await.unwrap(), "v:x");
    assert!(
        started.elapsed() < 2 * SEC + SEC / 10,
        "woken by ABANDON, not by expiry"
    );
    let err = owner.await.unwrap().unwrap_err();
    assert_eq!(err.to_string(), "database on fire");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let cached = policy().failure_ttl(10 * SEC);
    let a = node(&b, "errc", cached.clone(), failing(&calls));
    let f = node(&b, "errc", cached, work(&calls, "v", SEC));
    let owner = tokio::spawn(a.oneshot("y".into()));
    tokio::time::sleep(SEC / 10).await;
    let err = f.oneshot("y".into()).await.unwrap_err();
    let remote = find::<RemoteFailure>(&*err).expect("RemoteFailure");
    assert_eq!(remote.message(), "database on fire");
    owner.await.unwrap().unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A failure cached by one node keeps its class on the others: a node
/// that replays it (a follower, then a hit on a third node) answers with
/// the owner's status, as the owner did, not with a 500.
#[tokio::test(start_paused = true)]
async fn a_cached_failure_keeps_the_owners_class_on_other_nodes() {
    fn stage() -> Option<StageName> {
        Some(StageName::new("errclass").unwrap())
    }
    /// A request, the owner's error, its class, HTTP status and gRPC code.
    type Case = (&'static str, fn() -> BoxError, ErrorClass, u16, u8);
    let cases: [Case; 2] = [
        (
            "busy",
            || Box::new(BulkheadFull::new(stage())),
            ErrorClass::TooManyRequests,
            429,
            8,
        ),
        (
            "full",
            || Box::new(TooManyFlights::new(stage(), 4)),
            ErrorClass::Overloaded,
            503,
            8,
        ),
    ];
    let b = MemoryBackend::new();
    let cached = policy().failure_ttl(10 * SEC);
    for (req, error, class, http, grpc) in cases {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let owner_work = BoxCloneService::new(service_fn(move |_req: String| {
            let calls = counted.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(SEC).await;
                Err::<String, BoxError>(error())
            }
        }));
        let a = node(&b, "errclass", cached.clone(), owner_work);
        let f = node(&b, "errclass", cached.clone(), work(&calls, "v", SEC));
        let owner = tokio::spawn(a.oneshot(req.into()));
        tokio::time::sleep(SEC / 10).await;
        let followed = f.oneshot(req.into()).await.unwrap_err();
        let remote = find::<RemoteFailure>(&*followed).expect("RemoteFailure");
        assert_eq!(remote.class(), class, "{req}");
        assert_eq!(remote.message(), error().to_string(), "{req}");
        let owned = owner.await.unwrap().unwrap_err();
        assert_eq!(
            ErrorClass::of(&*owned),
            class,
            "{req}: the owner's own answer"
        );
        for err in [followed, {
            let c = node(&b, "errclass", cached.clone(), work(&calls, "v", SEC));
            c.oneshot(req.into()).await.unwrap_err()
        }] {
            assert_eq!(ErrorClass::of(&*err).http_status(), http, "{req}");
            assert_eq!(ErrorClass::of(&*err).grpc_code(), grpc, "{req}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{req}: only the owner ran");
    }
}

/// A dropped owner (its caller went away) releases the lease at once, so
/// followers do not wait for the lease to expire.
#[tokio::test(start_paused = true)]
async fn dropped_owner_releases_the_lease() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = node(&b, "drop", policy(), work(&calls, "old", 60 * SEC));
    let f = node(&b, "drop", policy(), work(&calls, "new", SEC / 10));
    let owner = tokio::spawn(a.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    let follower = tokio::spawn(f.oneshot("x".into()));
    tokio::time::sleep(SEC / 10).await;
    owner.abort();
    let started = Instant::now();
    assert_eq!(follower.await.unwrap().unwrap(), "new:x");
    assert!(started.elapsed() < SEC, "{:?}", started.elapsed());
    assert_eq!(b.calls().abandon, 1);
    assert_eq!(counter(metric::TAKEOVER_TOTAL, "drop"), 0);
}

/// Without takeover, a dead owner's flight ends its followers' wait as
/// soon as its lease has expired (typed `OwnerGone`, never a hang until
/// the wait timeout), and never runs the work.
#[tokio::test(start_paused = true)]
async fn expired_flight_without_takeover_times_out() {
    let b = MemoryBackend::new();
    let flight = FlightId::of(&key_of("notake", "x"));
    let terms = LeaseTerms {
        lease: 3 * SEC,
        state_ttl: 120 * SEC,
        allow_takeover: true,
    };
    b.acquire(&flight, &OwnerToken::random(), &terms)
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let p = policy().allow_takeover(false).wait_timeout(10 * SEC);
    let f = node(&b, "notake", p, work(&calls, "v", SEC));
    let started = Instant::now();
    let err = f.oneshot("x".into()).await.unwrap_err();
    assert!(err.is::<OwnerGone>(), "{err}");
    let waited = started.elapsed();
    assert!(waited >= 3 * SEC && waited < 4 * SEC, "{waited:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// An unreachable backend before acquiring is a typed, retryable error;
/// the work does not run.
#[tokio::test(start_paused = true)]
async fn unavailable_backend_is_a_typed_error() {
    let b = MemoryBackend::new();
    b.set_unavailable(true);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = node(&b, "down", policy(), work(&calls, "v", SEC));
    let err = svc.oneshot("x".into()).await.unwrap_err();
    assert!(err.is::<CoordinationUnavailable>(), "{err}");
    assert_eq!(ErrorClass::of(&*err).http_status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A backend call that never answers is cut by the call timeout, retried
/// once (same token), then reported.
#[tokio::test(start_paused = true)]
async fn hanging_backend_is_cut_by_the_call_timeout() {
    #[derive(Clone)]
    struct Hang;
    impl Backend for Hang {
        fn acquire_with<'a>(
            &'a self,
            _: &'a FlightId,
            _: &'a OwnerToken,
            _: Ask,
            _: &'a LeaseTerms,
        ) -> BackendFuture<'a, Acquired> {
            Box::pin(std::future::pending())
        }
        fn heartbeat<'a>(
            &'a self,
            _: &'a FlightId,
            _: &'a OwnerToken,
            _: u64,
            _: &'a LeaseTerms,
        ) -> BackendFuture<'a, Renewal> {
            Box::pin(std::future::pending())
        }
        fn commit<'a>(
            &'a self,
            _: &'a FlightId,
            _: &'a OwnerToken,
            _: u64,
            _: &'a CommitArgs,
        ) -> BackendFuture<'a, Committed> {
            Box::pin(std::future::pending())
        }
        fn abandon<'a>(
            &'a self,
            _: &'a FlightId,
            _: &'a OwnerToken,
            _: u64,
            _: &'a AbandonArgs,
        ) -> BackendFuture<'a, Released> {
            Box::pin(std::future::pending())
        }
        fn release<'a>(
            &'a self,
            _: &'a FlightId,
            _: &'a OwnerToken,
            _: Duration,
        ) -> BackendFuture<'a, Released> {
            Box::pin(std::future::pending())
        }
        fn invalidate<'a>(&'a self, _: &'a FlightId, _: Duration) -> BackendFuture<'a, u64> {
            Box::pin(std::future::pending())
        }
        fn subscribe<'a>(&'a self, _: &'a FlightId) -> BackendFuture<'a, Subscription> {
            Box::pin(std::future::pending())
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = node(&Hang, "hang", policy(), work(&calls, "v", SEC));
    let started = Instant::now();
    let err = svc.oneshot("x".into()).await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        2 * SEC,
        "two attempts of the 1 s call timeout"
    );
    assert_eq!(ErrorClass::of(&*err), ErrorClass::Unavailable, "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A corrupt stored value is a protocol error, never a panic (invariant 14).
#[tokio::test(start_paused = true)]
async fn corrupt_stored_value_is_a_protocol_error() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = node(&b, "corrupt", policy(), work(&calls, "v", SEC));
    let flight = FlightId::of(&key_of("corrupt", "x"));
    b.put_raw_result(
        &flight,
        bytes::Bytes::from_static(b"\x01\x01\x00\xff\xff\xff"),
        60 * SEC,
    );
    let err = svc.oneshot("x".into()).await.unwrap_err();
    assert!(err.is::<flightdeck_core::error::ProtocolError>(), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[cfg(feature = "http")]
mod http_responses {
    use super::*;
    use bytes::Bytes;
    use flightdeck_core::http::{FlightBody, HttpShare};
    use flightdeck_core::FromExtension;
    use flightdeck_distributed::{ExtensionFence, HttpCodec};
    use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};

    /// HTTP responses (status, non-UTF-8 headers, body, trailers) travel
    /// between nodes; the key comes from the request extension and the
    /// fencing token is inserted for the owner.
    #[tokio::test(start_paused = true)]
    async fn http_response_replays_on_another_node() {
        let b = MemoryBackend::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let make = |calls: Arc<AtomicUsize>| {
            let layer = DistributedFlightLayer::new(
                b.clone(),
                policy(),
                HttpShare::new().buffer_unknown_length(true),
                HttpCodec::new(),
                FromExtension,
            )
            .unwrap()
            .fence(ExtensionFence);
            layer.layer(service_fn(move |req: Request<()>| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let gen = req.extensions().get::<FencingToken>().map(|t| t.generation);
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("0"));
                    let body = Full::new(Bytes::from_static(b"\x00body\xff"))
                        .with_trailers(async move { Some(Ok(trailers)) })
                        .boxed_unsync();
                    let mut resp = Response::new(body);
                    *resp.status_mut() = StatusCode::ACCEPTED;
                    resp.headers_mut()
                        .insert("x-bin", HeaderValue::from_bytes(b"\xfe\x80ok").unwrap());
                    resp.headers_mut()
                        .insert("x-gen", HeaderValue::from(gen.unwrap_or(0)));
                    Ok::<_, Infallible>(resp)
                }
            }))
        };
        let req = || {
            let mut r = Request::new(());
            r.extensions_mut().insert(key_of("http", "GET /x"));
            r
        };
        let check = |resp: Response<FlightBody<_>>| async move {
            assert_eq!(resp.status(), StatusCode::ACCEPTED);
            assert_eq!(resp.headers()["x-bin"].as_bytes(), b"\xfe\x80ok");
            assert_eq!(resp.headers()["x-gen"], "1");
            let collected = resp.into_body().collect().await.unwrap();
            assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
            assert_eq!(collected.to_bytes(), Bytes::from_static(b"\x00body\xff"));
        };
        let first = make(calls.clone()).oneshot(req()).await.unwrap();
        check(first).await;
        let second = make(calls.clone()).oneshot(req()).await.unwrap();
        check(second).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Without the extension the request bypasses the layer.
        make(calls.clone()).oneshot(Request::new(())).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

/// A result committed by this node (as owner, or seen committed as
/// follower) and gone before its TTL, without an invalidation, is counted
/// lost; an invalidation by another node, or an expiry, is not.
#[tokio::test(start_paused = true)]
async fn lost_results_are_counted_and_told_from_invalidations_and_expiry() {
    let b = MemoryBackend::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let stage = "gone";
    let a = node(&b, stage, policy(), work(&calls, "v", SEC));
    let other = node(&b, stage, policy(), work(&calls, "v", SEC));
    let flight = |req| FlightId::of(&key_of(stage, req));
    let settle = || tokio::time::sleep(Duration::from_millis(10));

    // Owner: committed, then lost.
    assert_eq!(a.clone().oneshot("x".into()).await.unwrap(), "v:x");
    settle().await;
    b.remove_result(&flight("x"));
    assert_eq!(a.clone().oneshot("x".into()).await.unwrap(), "v:x");
    settle().await;
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 1);

    // Follower: saw the commit inline, then lost.
    let owner = tokio::spawn(a.clone().oneshot("y".into()));
    tokio::time::sleep(SEC / 4).await;
    assert_eq!(other.clone().oneshot("y".into()).await.unwrap(), "v:y");
    owner.await.unwrap().unwrap();
    settle().await;
    b.remove_result(&flight("y"));
    assert_eq!(other.clone().oneshot("y".into()).await.unwrap(), "v:y");
    settle().await;
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 2);

    // Invalidated by another node: not lost.
    let layer = DistributedFlightLayer::new(
        b.clone(),
        policy(),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        move |req: &String| Some(key_of(stage, req)),
    )
    .unwrap();
    assert_eq!(a.clone().oneshot("z".into()).await.unwrap(), "v:z");
    settle().await;
    layer.invalidate(&key_of(stage, "z")).await.unwrap();
    assert_eq!(a.clone().oneshot("z".into()).await.unwrap(), "v:z");
    settle().await;

    // Expired by its TTL: not lost.
    assert_eq!(a.clone().oneshot("w".into()).await.unwrap(), "v:w");
    settle().await;
    tokio::time::sleep(61 * SEC).await;
    assert_eq!(a.clone().oneshot("w".into()).await.unwrap(), "v:w");
    settle().await;
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 2);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        8,
        "each missing result ran again"
    );
}

/// Answers `wait_replicas` with a set number of acknowledgements.
struct Replicas {
    inner: MemoryBackend,
    acked: Arc<AtomicUsize>,
}

impl Backend for Replicas {
    fn wait_replicas<'a>(
        &'a self,
        _: &'a FlightId,
        _: u32,
        _: Duration,
    ) -> BackendFuture<'a, Option<u32>> {
        let acked = u32::try_from(self.acked.load(Ordering::SeqCst)).unwrap();
        Box::pin(std::future::ready(Ok(Some(acked))))
    }

    flightdeck_distributed::forward_backend!(inner => acquire_with, heartbeat, commit, abandon, subscribe, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since);
}

/// With `commit_replicas`, a result counts as lost when it goes missing
/// only if enough replicas acknowledged its commit: a short commit was
/// counted at the commit, and a failover may drop it without a second
/// count. A follower, which cannot tell, never counts.
#[tokio::test(start_paused = true)]
async fn with_commit_replicas_only_acknowledged_results_count_as_lost() {
    let mem = MemoryBackend::new();
    let acked = Arc::new(AtomicUsize::new(0));
    let b = Arc::new(Replicas {
        inner: mem.clone(),
        acked: acked.clone(),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let stage = "replicated-lost";
    let wait = policy()
        .call_timeout(SEC)
        .commit_replicas(1)
        .commit_replicas_timeout(SEC / 10);
    let a = node(&b, stage, wait.clone(), work(&calls, "v", SEC));
    let other = node(&b, stage, wait, work(&calls, "v", SEC));
    let flight = |req| FlightId::of(&key_of(stage, req));
    let settle = || tokio::time::sleep(Duration::from_millis(10));

    // Short: committed, gone, run again; not counted lost.
    assert_eq!(a.clone().oneshot("short".into()).await.unwrap(), "v:short");
    settle().await;
    mem.remove_result(&flight("short"));
    assert_eq!(a.clone().oneshot("short".into()).await.unwrap(), "v:short");
    settle().await;
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 0);

    // Acknowledged: gone before its TTL, counted lost on the owner's node;
    // the follower on the other node saw it committed, and does not count.
    acked.store(1, Ordering::SeqCst);
    let owner = tokio::spawn(a.clone().oneshot("acked".into()));
    tokio::time::sleep(SEC / 4).await;
    assert_eq!(
        other.clone().oneshot("acked".into()).await.unwrap(),
        "v:acked"
    );
    owner.await.unwrap().unwrap();
    settle().await;
    mem.remove_result(&flight("acked"));
    assert_eq!(
        other.clone().oneshot("acked".into()).await.unwrap(),
        "v:acked"
    );
    settle().await;
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 0, "the follower");
    // The follower's node ran it again and committed (acknowledged) it.
    mem.remove_result(&flight("acked"));
    assert_eq!(a.clone().oneshot("acked".into()).await.unwrap(), "v:acked");
    settle().await;
    // `a` was the first owner: its memory of the first commit counts.
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, stage), 1, "the owner");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// Remembers the call timeouts it is told.
struct Told {
    inner: MemoryBackend,
    told: Mutex<Vec<Duration>>,
}

impl Backend for Told {
    fn call_timeout_hint(&self, timeout: Duration) {
        self.told.lock().unwrap().push(timeout);
    }

    flightdeck_distributed::forward_backend!(inner => acquire_with, heartbeat, commit, abandon, subscribe, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas);
}

/// Every layer tells its backend (through `Arc` and the breaker's
/// `GuardedBackend`) the call timeout it cuts calls off at, so that a
/// backend waiting before it sends gives up first, answering unavailable.
#[tokio::test]
async fn layers_tell_the_backend_their_call_timeout() {
    let b = Arc::new(Told {
        inner: MemoryBackend::new(),
        told: Mutex::default(),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    node(
        &b,
        "told-a",
        policy().call_timeout(SEC / 4),
        work(&calls, "v", SEC),
    );
    let breaker =
        flightdeck_breaker::Breaker::new("told", flightdeck_breaker::BreakerConfig::default())
            .unwrap();
    let guarded = flightdeck_distributed::GuardedBackend::new(b.clone(), breaker);
    node(
        &Arc::new(guarded),
        "told-b",
        policy().call_timeout(SEC / 2),
        work(&calls, "v", SEC),
    );
    assert_eq!(*b.told.lock().unwrap(), [SEC / 4, SEC / 2]);
}
