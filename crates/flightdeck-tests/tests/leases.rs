//! Leases that hold under timeouts, freezes and slow owners, against real
//! `redis-server`s of the harness (two layers over one server are two
//! nodes):
//!
//! - a lease granted to a token that will not run the work (an acquire
//!   that timed out and ran later, answers that were lost, a follower that
//!   gave up after its re-check was granted) is released as soon as Redis
//!   answers: nobody waits for it to expire;
//! - the owner heartbeats until its commit has returned (a slow commit, a
//!   slow body never let a follower take over);
//! - the owner's callers get its value before any commit is tried;
//! - without takeover, a dead owner's followers get the stage's answer when
//!   the lease expires, never a hang.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use flightdeck::core::error::{find, BoxError, InProgress, OwnerGone};
use flightdeck::core::{metric, FlightKey, StageName};
use flightdeck::distributed::backend::{
    Acquired, Ask, Backend, BackendFuture, CommitArgs, Committed, FlightId, LeaseTerms, OwnerToken,
};
use flightdeck::{Mode, OnWaitFailure, StageConfig, StageHandle};
use flightdeck_harness::RedisServer;
use flightdeck_test::Hooked;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

/// A 3 s lease (a lease left behind would block the key that long).
fn leased(mode: Mode) -> StageConfig {
    let mut cfg = fast(mode);
    cfg.lease_timeout = Duration::from_secs(3);
    cfg.heartbeat_interval = Duration::from_millis(300);
    cfg.wait_timeout = Duration::from_secs(4);
    cfg
}

/// A node: the layer of `stage` over `backend`, around `inner`.
fn node(stage: &str, cfg: StageConfig, backend: impl Backend, inner: Svc) -> (Svc, StageHandle) {
    metrics_on();
    let layer = builder(stage)
        .backend("redis", backend)
        .stage(stage, cfg)
        .build()
        .expect("valid stage");
    let handle = layer.stage(stage).unwrap();
    (BoxCloneService::new(layer.layer(inner)), handle)
}

/// How long another node takes to own the flight of `req` (polling every
/// 20 ms, at most `limit`).
async fn time_to_own(
    redis: &RedisServer,
    stage: &str,
    req: &str,
    limit: Duration,
) -> Option<Duration> {
    let other = redis_backend(redis.url()).await;
    let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(stage).unwrap(), req));
    let terms = LeaseTerms {
        lease: Duration::from_secs(3),
        state_ttl: Duration::from_secs(10),
        allow_takeover: true,
    };
    let token = OwnerToken::random();
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Acquired::Owner { .. }) = other.acquire(&flight, &token, &terms).await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Node P's acquires are sent into a frozen Redis, time out, and P runs
/// the work itself (HYBRID). They run when Redis thaws, granting P a 3 s
/// lease that P will never use: it is released as soon as Redis answers,
/// and another node owns the flight at once (not after 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_after_a_freeze_leaves_no_lease_behind() {
    let st = "orphan-freeze";
    let mut redis = RedisServer::start().unwrap();
    let work = Work::default();
    // The client keeps its connection through a freeze of a few seconds
    // (fred drops one unresponsive for twice the command timeout): the
    // acquires wait in Redis's socket and run at the thaw.
    let backend = flightdeck_redis::RedisBackend::connect(
        flightdeck_redis::RedisConfig::new(redis.url()).command_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let (svc, handle) = node(
        st,
        leased(Mode::Hybrid),
        backend,
        work.service(Duration::ZERO),
    );
    redis.pause().unwrap();
    assert_eq!(
        svc.oneshot("q".to_owned()).await.unwrap(),
        "done:q",
        "ran locally"
    );
    redis.resume().unwrap();
    let owned = time_to_own(&redis, st, "q", Duration::from_secs(5)).await;
    let owned = owned.expect("another node owns the flight");
    assert!(
        owned < Duration::from_secs(1),
        "released, not expired: {owned:?}"
    );
    handle.idle().await;
    assert_eq!(
        counter_with(metric::ORPHAN_RELEASE_TOTAL, st, "result", "released"),
        1
    );
    assert_eq!(work.calls(), 1);
}

/// Both answers of an acquire are lost (it took effect: Redis granted the
/// lease), so the node runs the work itself (HYBRID): the lease is released
/// at once, not left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_answers_were_lost_is_released() {
    let st = "orphan-lost";
    let redis = RedisServer::start().unwrap();
    let backend = Hooked::new(redis_backend(redis.url()).await).lose_acquire_replies(2);
    let work = Work::default();
    let (svc, handle) = node(
        st,
        leased(Mode::Hybrid),
        backend,
        work.service(Duration::ZERO),
    );
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "done:q");
    handle.idle().await;
    let owned = time_to_own(&redis, st, "q", Duration::from_secs(5)).await;
    assert!(
        owned.expect("owned") < Duration::from_millis(500),
        "{owned:?}"
    );
    assert_eq!(
        counter_with(metric::ORPHAN_RELEASE_TOTAL, st, "result", "released"),
        1
    );
    assert_eq!(
        counter_with(
            metric::LOCAL_FALLBACK_TOTAL,
            st,
            "reason",
            "outcome_unknown"
        ),
        1
    );
}

/// A backend whose re-checks take effect at once but answer `delay` later.
struct SlowRechecks<B> {
    inner: B,
    delay: Duration,
}

impl<B: Backend> Backend for SlowRechecks<B> {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            let answer = self.inner.acquire_with(flight, token, ask, terms).await;
            if ask.recheck {
                tokio::time::sleep(self.delay).await;
            }
            answer
        })
    }

    flightdeck::distributed::forward_backend!(inner => heartbeat, commit, abandon, subscribe, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// A follower whose only caller gives up (its deadline) while a re-check
/// is on its way, the re-check granting it the flight (the owner's lease
/// just expired): the lease it will never use is released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_gave_up_after_a_granting_recheck_releases_the_lease() {
    let st = "orphan-recheck";
    let redis = RedisServer::start().unwrap();
    // Another node owned the flight with a 600 ms lease, and died.
    let other = redis_backend(redis.url()).await;
    let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(st).unwrap(), "q"));
    let short = LeaseTerms {
        lease: Duration::from_millis(600),
        state_ttl: Duration::from_secs(10),
        allow_takeover: true,
    };
    assert!(matches!(
        other
            .acquire(&flight, &OwnerToken::random(), &short)
            .await
            .unwrap(),
        Acquired::Owner { .. }
    ));
    let backend = SlowRechecks {
        inner: redis_backend(redis.url()).await,
        delay: Duration::from_secs(2),
    };
    let work = Work::default();
    let layer = flightdeck::GenericSingleFlightLayer::http()
        .backend("redis", backend)
        .stage(st, leased(Mode::Hybrid))
        .build()
        .unwrap();
    let handle = layer.stage(st).unwrap();
    metrics_on();
    let svc = layer.layer(tower::service_fn({
        let work = work.clone();
        move |_req: http::Request<()>| {
            work.calls.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, BoxError>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::new(),
                )))
            }
        }
    }));
    let mut req = http::Request::builder()
        .header("x-request-timeout", "1500ms")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(FlightKey::from_bytes(StageName::new(st).unwrap(), "q"));
    let err = svc
        .oneshot(req)
        .await
        .expect_err("out of time while following");
    assert!(
        find::<flightdeck::core::error::DeadlineExceeded>(&*err).is_some(),
        "{err}"
    );
    handle.idle().await;
    assert_eq!(work.calls(), 0, "never ran here");
    let owned = time_to_own(&redis, st, "q", Duration::from_secs(5)).await;
    assert!(
        owned.expect("owned") < Duration::from_millis(500),
        "{owned:?}"
    );
    assert_eq!(
        counter_with(metric::ORPHAN_RELEASE_TOTAL, st, "result", "released"),
        1
    );
}

/// A backend whose first commit waits `fail_after`, then fails (Redis
/// unreachable), and whose next ones wait `delay` before they are sent.
struct SlowCommits<B> {
    inner: B,
    fail_after: Duration,
    delay: Duration,
    commits: Arc<AtomicUsize>,
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
            if self.commits.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(self.fail_after).await;
                return Err(flightdeck::distributed::BackendError::unavailable(
                    "injected",
                ));
            }
            tokio::time::sleep(self.delay).await;
            self.inner.commit(flight, token, generation, args).await
        })
    }

    flightdeck::distributed::forward_backend!(inner => acquire_with, heartbeat, abandon, subscribe, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// The owner's commit lands only after its lease would have run out (the
/// first attempt fails after 1.8 s, the second lands at ~2.5 s, the lease
/// is 2 s): its heartbeats run on until the commit has returned, so the
/// follower on another node, arriving at 2.25 s, never takes over; it gets
/// the owner's value, and the work ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_heartbeats_until_its_commit_has_returned() {
    let st = "heartbeat-commit";
    let redis = RedisServer::start().unwrap();
    let mut cfg = fast(Mode::Hybrid);
    cfg.coordination_timeout = Duration::from_millis(1900);
    cfg.lease_timeout = Duration::from_secs(2);
    cfg.heartbeat_interval = Duration::from_millis(200);
    cfg.wait_timeout = Duration::from_secs(6);
    let commits = Arc::new(AtomicUsize::new(0));
    let slow = SlowCommits {
        inner: redis_backend(redis.url()).await,
        fail_after: Duration::from_millis(1800),
        delay: Duration::from_millis(600),
        commits: commits.clone(),
    };
    let work = Work::default();
    let (owner, _) = node(
        st,
        cfg.clone(),
        slow,
        work.service(Duration::from_millis(100)),
    );
    let (follower, _) = node(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::ZERO),
    );
    assert_eq!(owner.oneshot("q".to_owned()).await.unwrap(), "done:q");
    tokio::time::sleep(Duration::from_millis(2150)).await;
    assert_eq!(follower.oneshot("q".to_owned()).await.unwrap(), "done:q");
    assert_eq!(work.calls(), 1, "no takeover, no second execution");
    assert_eq!(counter(metric::TAKEOVER_TOTAL, st), 0);
    assert_eq!(commits.load(Ordering::SeqCst), 2);
}

/// The owner's callers get its value as soon as the work ended: the commit
/// (into a Redis frozen by the work itself) is tried afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_callers_never_wait_for_its_commit() {
    let st = "commit-after";
    let redis = Arc::new(std::sync::Mutex::new(RedisServer::start().unwrap()));
    let url = redis.lock().unwrap().url();
    let inner = {
        let redis = redis.clone();
        BoxCloneService::new(tower::service_fn(move |req: String| {
            let redis = redis.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                redis.lock().unwrap().pause().unwrap();
                Ok::<_, BoxError>(format!("done:{req}"))
            }
        }))
    };
    let (svc, handle) = node(st, fast(Mode::Hybrid), redis_backend(url).await, inner);
    let start = Instant::now();
    let results = burst(svc, "q", 5).await;
    let took = start.elapsed();
    for r in &results {
        assert_eq!(r.as_deref().unwrap(), "done:q");
    }
    assert!(
        took < Duration::from_millis(250),
        "answered before one commit attempt (250 ms) could have timed out: {took:?}"
    );
    handle.idle().await;
    redis.lock().unwrap().resume().unwrap();
    assert_eq!(counter(metric::RESULT_WRITE_FAILURE_TOTAL, st), 1);
}

/// Without takeover, a dead owner's followers get the stage's answer for a
/// failed wait as soon as the lease has expired (never a hang until the
/// wait timeout): the typed error, "in progress", or a local run where
/// HYBRID opted in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_takeover_a_dead_owner_ends_the_wait_at_its_lease() {
    let redis = RedisServer::start().unwrap();
    for (st, policy) in [
        ("no-takeover-wait", OnWaitFailure::Wait),
        ("no-takeover-202", OnWaitFailure::InProgress),
        ("no-takeover-local", OnWaitFailure::Local),
    ] {
        let other = redis_backend(redis.url()).await;
        let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(st).unwrap(), "q"));
        let terms = LeaseTerms {
            lease: Duration::from_millis(800),
            state_ttl: Duration::from_secs(10),
            allow_takeover: false,
        };
        assert!(matches!(
            other
                .acquire(&flight, &OwnerToken::random(), &terms)
                .await
                .unwrap(),
            Acquired::Owner { .. }
        ));
        let mut cfg = fast(Mode::Hybrid);
        cfg.allow_takeover = false;
        cfg.wait_timeout = Duration::from_secs(30);
        cfg.on_wait_failure = policy;
        let work = Work::default();
        let (svc, _) = node(
            st,
            cfg,
            redis_backend(redis.url()).await,
            work.service(Duration::ZERO),
        );
        let start = Instant::now();
        let res = svc.oneshot("q".to_owned()).await;
        let waited = start.elapsed();
        assert!(
            waited < Duration::from_secs(2),
            "{policy}: ended at the lease, {waited:?}"
        );
        match policy {
            OnWaitFailure::Wait => {
                let err = res.unwrap_err();
                assert!(find::<OwnerGone>(&*err).is_some(), "{err}");
                assert_eq!(work.calls(), 0);
            }
            OnWaitFailure::InProgress => {
                let err = res.unwrap_err();
                assert!(find::<InProgress>(&*err).is_some(), "{err}");
                assert_eq!(work.calls(), 0);
            }
            _ => {
                assert_eq!(res.unwrap(), "done:q");
                assert_eq!(work.calls(), 1, "the explicit opt-in");
            }
        }
    }
}
