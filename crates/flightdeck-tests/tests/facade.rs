//! The facade against REAL `redis-server` processes started by the harness
//! (each test its own server on a free port): the failure matrix
//! {HYBRID, DISTRIBUTED_ONLY} × {before acquire, protocol, follower wait,
//! business error, after execution}, LOCAL_ONLY and BYPASS, the breaker
//! (zero commands while open, exactly the configured probes, distributed
//! mode back), the kill switch under load, and per-stage backends.
//!
//! Each cell asserts how many times the work ran, what every caller got
//! (by type) and which counters moved.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use flightdeck::core::error::{
    find, BoxError, CircuitOpen, CoordinationUnavailable, ErrorClass, InProgress, OutcomeUnknown,
    ProtocolError, WaitTimeout,
};
use flightdeck::core::{metric, FlightKey, StageName};
use flightdeck::distributed::backend::{Acquired, Backend, LeaseTerms};
use flightdeck::distributed::{FlightId, OwnerToken};
use flightdeck::{Mode, OnWaitFailure, StageConfig, StageHandle};
use flightdeck_breaker::CircuitState;
use flightdeck_harness::RedisServer;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

const N: usize = 5;

/// Builds one stage over `backend` (registered as "redis") and the work.
fn setup(stage: &str, cfg: StageConfig, backend: impl Backend, inner: Svc) -> (Svc, StageHandle) {
    metrics_on();
    let layer = builder(stage)
        .backend("redis", backend)
        .stage(stage, cfg)
        .build()
        .expect("valid stage");
    let handle = layer.stage(stage).unwrap();
    (BoxCloneService::new(layer.layer(inner)), handle)
}

fn class(err: &BoxError) -> ErrorClass {
    ErrorClass::of(&**err)
}

/// A coordination error of any class. With the server killed, fred
/// answers "connection refused" or "Failed to route command." (both
/// unavailable) or a timeout (outcome unknown); the class of a reply that
/// arrives mangled by the kill is protocol. The cell is about what the
/// facade does with any of them.
fn is_coordination(err: &BoxError) -> bool {
    find::<CoordinationUnavailable>(&**err).is_some()
        || find::<OutcomeUnknown>(&**err).is_some()
        || find::<ProtocolError>(&**err).is_some()
}

fn all_ok(results: &[Result<String, BoxError>], want: &str) {
    for r in results {
        match r {
            Ok(v) => assert_eq!(v, want),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

fn coordination_fallbacks(stage: &str) -> u64 {
    ["unavailable", "outcome_unknown", "protocol"]
        .iter()
        .map(|r| counter_with(metric::LOCAL_FALLBACK_TOTAL, stage, "reason", r))
        .sum()
}

// ---------------------------------------------------------------------------
// Before acquire: Redis is down (killed) when the leader asks for the flight.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_before_acquire_runs_once_locally() {
    let st = "hy-before";
    let mut redis = RedisServer::start().unwrap();
    let backend = redis_backend(redis.url()).await;
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::Hybrid),
        backend,
        work.service(Duration::from_millis(200)),
    );
    redis.kill();

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 1, "one local execution for the whole burst");
    all_ok(&results, "done:q");
    assert_eq!(
        counter(metric::DISTRIBUTED_REQUEST_TOTAL, st),
        1,
        "only the L1 leader asked"
    );
    assert_eq!(counter(metric::DISTRIBUTED_FAILURE_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 1);
    assert_eq!(coordination_fallbacks(st), 1, "not a circuit-open fallback");
    assert_eq!(counter(metric::FALLBACK_EXECUTION_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_OWNER_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_WAITER_TOTAL, st), (N - 1) as u64);
    assert_eq!(counter(metric::OWNER_TOTAL, st), 0);
    assert_eq!(
        handle.breaker().stats().failures,
        1,
        "a coordination failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_before_acquire_fails_fast() {
    let st = "do-before";
    let mut redis = RedisServer::start().unwrap();
    let backend = redis_backend(redis.url()).await;
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::DistributedOnly),
        backend,
        work.service(Duration::from_millis(200)),
    );
    redis.kill();

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 0, "never executed without coordination");
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(is_coordination(err), "typed coordination error, got {err}");
        assert_eq!(class(err), ErrorClass::Unavailable, "503 / UNAVAILABLE");
    }
    // A flight that fails at once may end before every caller joined it:
    // each leader asked once and failed fast.
    let leaders = counter(metric::LOCAL_OWNER_TOTAL, st);
    assert!(leaders >= 1);
    assert_eq!(counter(metric::DISTRIBUTED_REQUEST_TOTAL, st), leaders);
    assert_eq!(counter(metric::FAIL_FAST_TOTAL, st), leaders);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::FALLBACK_EXECUTION_TOTAL, st), 0);
    assert_eq!(u64::from(handle.breaker().stats().failures), leaders);
}

// ---------------------------------------------------------------------------
// Protocol: the real Redis answers, but the reply is garbage.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_protocol_error_runs_once_locally_and_alerts() {
    let st = "hy-protocol";
    let redis = RedisServer::start().unwrap();
    let backend = Faulty::garbage(redis_backend(redis.url()).await);
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::Hybrid),
        backend,
        work.service(Duration::from_millis(200)),
    );

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 1);
    all_ok(&results, "done:q");
    assert!(
        redis.command_calls("evalsha").unwrap() >= 1,
        "Redis was asked"
    );
    assert_eq!(
        counter_with(metric::LOCAL_FALLBACK_TOTAL, st, "reason", "protocol"),
        1
    );
    assert_eq!(counter(metric::UNKNOWN_ACTION_TOTAL, st), 1, "alert metric");
    assert_eq!(
        counter_with(metric::DISTRIBUTED_FAILURE_TOTAL, st, "kind", "protocol"),
        1
    );
    assert_eq!(counter(metric::FALLBACK_EXECUTION_TOTAL, st), 1);
    assert_eq!(handle.breaker().stats().failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_protocol_error_fails_fast() {
    let st = "do-protocol";
    let redis = RedisServer::start().unwrap();
    let backend = Faulty::garbage(redis_backend(redis.url()).await);
    let work = Work::default();
    let (svc, _handle) = setup(
        st,
        fast(Mode::DistributedOnly),
        backend,
        work.service(Duration::from_millis(200)),
    );

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 0);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(find::<ProtocolError>(&**err).is_some(), "got {err}");
        assert_eq!(class(err), ErrorClass::Unavailable);
    }
    // A flight that fails at once may end before every caller joined it:
    // each leader asked once and failed fast.
    let leaders = counter(metric::LOCAL_OWNER_TOTAL, st);
    assert!(leaders >= 1);
    assert_eq!(counter(metric::DISTRIBUTED_REQUEST_TOTAL, st), leaders);
    assert_eq!(
        counter_with(metric::FAIL_FAST_TOTAL, st, "reason", "protocol"),
        leaders
    );
    assert_eq!(counter(metric::UNKNOWN_ACTION_TOTAL, st), leaders);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
}

// ---------------------------------------------------------------------------
// Follower wait: another node owns the flight (a 10 s lease), then Redis
// stops answering (SIGSTOP) while we follow.

/// Makes "another node" own the flight of `req` in `stage`.
async fn other_node_owns(redis: &RedisServer, stage: &str, req: &str) {
    let other = redis_backend(redis.url()).await;
    let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(stage).unwrap(), req));
    let terms = LeaseTerms {
        lease: Duration::from_secs(10),
        state_ttl: Duration::from_secs(30),
        allow_takeover: true,
    };
    let got = other
        .acquire(&flight, &OwnerToken::random(), &terms)
        .await
        .unwrap();
    assert!(matches!(got, Acquired::Owner { .. }), "{got:?}");
}

/// Another node owns the flight of "q"; a burst of callers follows it;
/// then Redis stops answering (SIGSTOP) until the wait ends.
async fn follow_and_lose_redis(
    st: &str,
    mode: Mode,
    policy: OnWaitFailure,
) -> (Work, StageHandle, Vec<Result<String, BoxError>>) {
    let mut cfg = fast(mode);
    cfg.on_wait_failure = policy;
    follow_and_lose_redis_with(st, cfg).await
}

async fn follow_and_lose_redis_with(
    st: &str,
    cfg: StageConfig,
) -> (Work, StageHandle, Vec<Result<String, BoxError>>) {
    let mut redis = RedisServer::start().unwrap();
    other_node_owns(&redis, st, "q").await;
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(50)),
    );
    let task = tokio::spawn(async move { burst(svc, "q", N).await });
    // Long enough for the leader to have become a follower, well within
    // the 1.5 s wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.pause().unwrap();
    let results = task.await.unwrap();
    redis.resume().unwrap();
    (work, handle, results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_follower_wait_failure_never_executes() {
    let st = "hy-follow";
    let (work, handle, results) =
        follow_and_lose_redis(st, Mode::Hybrid, OnWaitFailure::Wait).await;

    assert_eq!(
        work.calls(),
        0,
        "another node may own the lease: never run at once"
    );
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(find::<WaitTimeout>(&**err).is_some(), "got {err}");
        assert_eq!(class(err), ErrorClass::DeadlineExceeded);
    }
    assert_eq!(counter(metric::FOLLOWER_TOTAL, st), 1);
    assert_eq!(
        counter_with(metric::WAIT_FAILURE_TOTAL, st, "action", "wait"),
        1
    );
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::FALLBACK_EXECUTION_TOTAL, st), 0);
    assert_eq!(
        handle.breaker().stats().failures,
        0,
        "not a coordination failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_follower_wait_failure_runs_locally_when_opted_in() {
    let st = "hy-follow-local";
    let (work, _handle, results) =
        follow_and_lose_redis(st, Mode::Hybrid, OnWaitFailure::Local).await;

    assert_eq!(
        work.calls(),
        1,
        "explicit opt-in: one local execution after the wait"
    );
    all_ok(&results, "done:q");
    assert_eq!(
        counter_with(metric::LOCAL_FALLBACK_TOTAL, st, "reason", "wait_failure"),
        1
    );
    assert_eq!(
        counter_with(metric::WAIT_FAILURE_TOTAL, st, "action", "local"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_follower_wait_failure_answers_in_progress() {
    let st = "do-follow";
    // A wait timeout far longer than the test's bound: the answer must come
    // from the failed re-check, not from the end of the wait.
    let mut cfg = fast(Mode::DistributedOnly);
    cfg.on_wait_failure = OnWaitFailure::InProgress;
    cfg.wait_timeout = Duration::from_secs(60);
    let (work, _handle, results) =
        tokio::time::timeout(Duration::from_secs(20), follow_and_lose_redis_with(st, cfg))
            .await
            .expect("answered at the first failed re-check, not after the 60 s wait");

    assert_eq!(work.calls(), 0);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(find::<InProgress>(&**err).is_some(), "got {err}");
        assert_eq!(class(err), ErrorClass::InProgress, "202 / retry later");
    }
    assert_eq!(
        counter_with(metric::WAIT_FAILURE_TOTAL, st, "action", "in_progress"),
        1
    );
    assert_eq!(counter(metric::FAIL_FAST_TOTAL, st), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_follower_wait_failure_can_fail_as_unavailable() {
    let st = "do-follow-fail";
    let mut cfg = fast(Mode::DistributedOnly);
    cfg.on_wait_failure = OnWaitFailure::Fail;
    cfg.wait_timeout = Duration::from_secs(60);
    let (work, _handle, results) =
        tokio::time::timeout(Duration::from_secs(20), follow_and_lose_redis_with(st, cfg))
            .await
            .expect("answered at the first failed re-check, not after the 60 s wait");

    assert_eq!(work.calls(), 0);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(
            find::<CoordinationUnavailable>(&**err).is_some(),
            "got {err}"
        );
        assert_eq!(class(err), ErrorClass::Unavailable, "503");
    }
    assert_eq!(
        counter_with(metric::WAIT_FAILURE_TOTAL, st, "action", "fail"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_over_when_the_other_owner_dies() {
    let st = "hy-takeover";
    let redis = RedisServer::start().unwrap();
    // The other node's owner got a 600 ms lease and died (no heartbeat).
    let other = redis_backend(redis.url()).await;
    let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(st).unwrap(), "q"));
    let terms = LeaseTerms {
        lease: Duration::from_millis(600),
        state_ttl: Duration::from_secs(30),
        allow_takeover: true,
    };
    let got = other
        .acquire(&flight, &OwnerToken::random(), &terms)
        .await
        .unwrap();
    assert!(matches!(got, Acquired::Owner { .. }));
    let work = Work::default();
    let (svc, _handle) = setup(
        st,
        fast(Mode::Hybrid),
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(50)),
    );

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 1, "exactly one takeover execution");
    all_ok(&results, "done:q");
    assert_eq!(counter(metric::FOLLOWER_TOTAL, st), 1);
    assert_eq!(counter(metric::TAKEOVER_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::WAIT_FAILURE_TOTAL, st), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_protocol_error_while_following_is_a_wait_failure_not_a_fallback() {
    let st = "hy-follow-garbage";
    let redis = RedisServer::start().unwrap();
    other_node_owns(&redis, st, "q").await;
    let backend = Faulty::garbage_on_recheck(redis_backend(redis.url()).await);
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::Hybrid),
        backend.clone(),
        work.service(Duration::from_millis(50)),
    );

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(
        work.calls(),
        0,
        "following another node's flight: never run at once"
    );
    assert!(
        backend.acquires.load(Ordering::SeqCst) >= 2,
        "followed, then garbage"
    );
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(find::<ProtocolError>(&**err).is_some(), "got {err}");
    }
    // A flight that fails at once may end before every caller joined it:
    // every leader followed, then got garbage.
    let leaders = counter(metric::LOCAL_OWNER_TOTAL, st);
    assert!(leaders >= 1);
    assert_eq!(counter(metric::FOLLOWER_TOTAL, st), leaders);
    assert_eq!(
        counter_with(metric::WAIT_FAILURE_TOTAL, st, "action", "wait"),
        leaders
    );
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(
        u64::from(handle.breaker().stats().failures),
        leaders,
        "still a coordination failure for the breaker"
    );
}

// ---------------------------------------------------------------------------
// The owner's business error: shared, never retried, never a Redis failure.

async fn business_error(st: &str, mode: Mode) {
    let redis = RedisServer::start().unwrap();
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(mode),
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(200)),
    );

    let results = burst(svc.clone(), "fail-q", N).await;

    assert_eq!(work.calls(), 1, "run once, not retried locally");
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(
            find::<Boom>(&**err).is_some(),
            "the business error, got {err}"
        );
    }
    assert_eq!(counter(metric::OWNER_TOTAL, st), 1);
    assert_eq!(counter(metric::OWNER_FAILURE_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::DISTRIBUTED_FAILURE_TOTAL, st), 0);
    assert_eq!(counter(metric::FAIL_FAST_TOTAL, st), 0);
    let stats = handle.breaker().stats();
    assert_eq!(
        (stats.calls, stats.failures),
        (1, 0),
        "a success for the breaker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_business_error_is_shared_not_retried() {
    business_error("hy-business", Mode::Hybrid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_business_error_is_shared_not_retried() {
    business_error("do-business", Mode::DistributedOnly).await;
}

// ---------------------------------------------------------------------------
// After execution: the work succeeded, then Redis stopped answering
// (SIGSTOP from inside the work) so the commit fails.

async fn commit_failure(st: &str, mode: Mode) {
    let redis = Arc::new(Mutex::new(RedisServer::start().unwrap()));
    let url = redis.lock().unwrap().url();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        let redis = redis.clone();
        BoxCloneService::new(service_fn(move |req: String| {
            let calls = calls.clone();
            let redis = redis.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                redis.lock().unwrap().pause().unwrap();
                Ok::<_, BoxError>(format!("done:{req}"))
            }
        }))
    };
    let (svc, handle) = setup(st, fast(mode), redis_backend(url).await, inner);

    let results = burst(svc.clone(), "q", N).await;
    // The callers got the value at once; the commit's attempts go on in
    // the background (with Redis still stopped) until they give up.
    handle.idle().await;
    redis.lock().unwrap().resume().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert_eq!(calls.load(Ordering::SeqCst), 1, "never re-executed");
    all_ok(&results, "done:q");
    assert_eq!(counter(metric::OWNER_TOTAL, st), 1);
    assert_eq!(counter(metric::RESULT_WRITE_FAILURE_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::FAIL_FAST_TOTAL, st), 0);
    assert_eq!(handle.breaker().stats().failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_commit_failure_returns_the_value_once() {
    commit_failure("hy-commit", Mode::Hybrid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_commit_failure_returns_the_value_once() {
    commit_failure("do-commit", Mode::DistributedOnly).await;
}

// ---------------------------------------------------------------------------
// LOCAL_ONLY and BYPASS.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_only_coalesces_in_process_and_never_calls_redis() {
    let st = "local-only";
    let redis = RedisServer::start().unwrap();
    let work = Work::default();
    let mut cfg = fast(Mode::LocalOnly);
    cfg.backend = Some("redis".into());
    let (svc, _handle) = setup(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(200)),
    );

    let results = burst(svc.clone(), "q", 10).await;
    all_ok(&results, "done:q");
    assert_eq!(work.calls(), 1);
    let errors = burst(svc.clone(), "fail-q", 10).await;
    assert_eq!(work.calls(), 2, "a failure is shared too");
    assert!(errors
        .iter()
        .all(|r| find::<Boom>(&**r.as_ref().unwrap_err()).is_some()));

    assert_eq!(redis.command_calls("eval").unwrap(), 0, "no script ran");
    assert_eq!(counter(metric::DISTRIBUTED_REQUEST_TOTAL, st), 0);
    assert_eq!(counter(metric::LOCAL_OWNER_TOTAL, st), 2);
    assert_eq!(counter(metric::LOCAL_WAITER_TOTAL, st), 18);
    // Every request counts, whatever the mode: the merge ratio's
    // denominator.
    assert_eq!(counter(metric::REQUEST_TOTAL, st), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_runs_every_request() {
    let st = "bypass";
    let redis = RedisServer::start().unwrap();
    let work = Work::default();
    let mut cfg = fast(Mode::Bypass);
    cfg.backend = Some("redis".into());
    let (svc, _handle) = setup(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(100)),
    );

    let results = burst(svc.clone(), "q", 10).await;

    all_ok(&results, "done:q");
    assert_eq!(work.calls(), 10);
    assert_eq!(counter(metric::BYPASS_TOTAL, st), 10);
    assert_eq!(counter(metric::LOCAL_OWNER_TOTAL, st), 0);
    assert_eq!(redis.command_calls("eval").unwrap(), 0);
}

// ---------------------------------------------------------------------------
// The breaker.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_open_sends_nothing_half_open_sends_the_probes_then_distributed_returns() {
    let st = "breaker";
    let mut redis = RedisServer::start().unwrap();
    let backend = redis_backend(redis.url()).await;
    let mut cfg = fast(Mode::Hybrid);
    cfg.breaker.consecutive_failures = Some(2);
    // Long enough for Redis to come back and drain while still open, on a
    // loaded machine too; the test waits for its end, not for 4 s.
    cfg.breaker.wait_in_open = Duration::from_secs(4);
    cfg.breaker.half_open_probes = 2;
    // No heartbeat within the 300 ms probes: each probe flight is exactly
    // acquire + commit on the server.
    cfg.lease_timeout = Duration::from_secs(3);
    cfg.heartbeat_interval = Duration::from_secs(1);
    cfg.wait_timeout = Duration::from_secs(3);
    cfg.bulkhead.limit = 64;
    cfg.bulkhead.degraded_limit = Some(16);
    metrics_on();
    // Acquires take 200 ms more (a slow network), so the half-open window
    // stays open while the ten leaders ask for it.
    let slow_net = Faulty::new(backend.clone(), |_| Fault::Slow(Duration::from_millis(200)));
    let layer = builder(st)
        .backend("redis", slow_net)
        .stage(st, cfg)
        .build()
        .unwrap();
    let handle = layer.stage(st).unwrap();
    let fast_work = Work::default();
    let slow_work = Work::default();
    let svc = BoxCloneService::new(layer.layer(fast_work.service(Duration::from_millis(10))));
    let slow = BoxCloneService::new(layer.layer(slow_work.service(Duration::from_millis(300))));

    // Two coordination failures in a row (Redis stopped) open it.
    redis.pause().unwrap();
    for i in 0..2 {
        let v = svc.clone().oneshot(format!("open-{i}")).await.unwrap();
        assert_eq!(v, format!("done:open-{i}"), "HYBRID still answers");
    }
    assert_eq!(handle.breaker().state(), CircuitState::Open);
    assert!(handle.is_degraded());
    assert_eq!(gauge(metric::DEGRADED, st), Some(1.0));
    assert!(handle.bulkhead().is_degraded());
    assert_eq!(handle.bulkhead().limit(), 16, "the degraded limit applies");
    redis.resume().unwrap();

    // Let the backend reconnect and the stopped commands drain, outside
    // the layer.
    let probe_flight = FlightId::of(&FlightKey::from_bytes(
        StageName::new("warmup").unwrap(),
        "w",
    ));
    let terms = LeaseTerms {
        lease: Duration::from_secs(1),
        state_ttl: Duration::from_secs(2),
        allow_takeover: true,
    };
    let mut warmed = false;
    for _ in 0..30 {
        if backend
            .acquire(&probe_flight, &OwnerToken::random(), &terms)
            .await
            .is_ok()
        {
            warmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(warmed, "redis answers again");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        handle.breaker().state(),
        CircuitState::Open,
        "still open after the reconnect (the open period is long enough for a loaded machine)"
    );

    // The open phase's background work is over first: the release of the
    // leases its timed-out acquires may hold (sent whatever the breaker
    // says, and possibly retried after the reconnect).
    tokio::time::timeout(Duration::from_secs(10), handle.idle())
        .await
        .expect("background coordination ends");
    assert_eq!(handle.breaker().state(), CircuitState::Open, "still open");

    // Open: twelve concurrent requests (under the degraded limit), zero
    // commands reach Redis.
    let base = redis.command_calls("eval").unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..12 {
        let svc = svc.clone();
        set.spawn(async move { svc.oneshot(format!("closed-door-{i}")).await });
    }
    while let Some(r) = set.join_next().await {
        if let Err(e) = r.unwrap() {
            panic!("unexpected error: {e}");
        }
    }
    assert_eq!(
        redis.command_calls("eval").unwrap() - base,
        0,
        "zero commands while open"
    );
    assert_eq!(
        counter_with(metric::LOCAL_FALLBACK_TOTAL, st, "reason", "circuit_open"),
        12
    );
    assert_eq!(fast_work.calls(), 14);
    assert!(
        counter_with(
            flightdeck_breaker::metric::CIRCUIT_REJECTED_TOTAL,
            "",
            "breaker",
            st
        ) >= 12,
        "the breaker counted its rejections"
    );

    // Half-open: of ten concurrent leaders, exactly the two probes reach
    // Redis (acquire + commit each); the others run locally.
    let until = handle.breaker().open_until().expect("open");
    tokio::time::sleep_until(until + Duration::from_millis(50)).await;
    let base = redis.command_calls("eval").unwrap();
    let requests_before = counter(metric::DISTRIBUTED_REQUEST_TOTAL, st);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..10 {
        let slow = slow.clone();
        set.spawn(async move { slow.oneshot(format!("probe-{i}")).await });
    }
    while let Some(r) = set.join_next().await {
        if let Err(e) = r.unwrap() {
            panic!("unexpected error: {e}");
        }
    }
    assert_eq!(slow_work.calls(), 10);
    // The probes' commits went on after their callers got the value.
    handle.idle().await;
    assert_eq!(
        counter(metric::DISTRIBUTED_REQUEST_TOTAL, st) - requests_before,
        2,
        "exactly the configured probes"
    );
    assert_eq!(
        redis.command_calls("eval").unwrap() - base,
        4,
        "two probe flights: acquire + commit each"
    );
    assert_eq!(
        counter_with(metric::LOCAL_FALLBACK_TOTAL, st, "reason", "circuit_open"),
        20
    );

    // The probes succeeded: closed, distributed mode is back.
    assert_eq!(handle.breaker().state(), CircuitState::Closed);
    assert!(!handle.is_degraded());
    assert_eq!(gauge(metric::DEGRADED, st), Some(0.0));
    assert_eq!(samples(metric::DEGRADED_DURATION, st), 1);
    assert!(!handle.bulkhead().is_degraded());
    let base = redis.command_calls("eval").unwrap();
    for i in 0..3 {
        svc.clone().oneshot(format!("back-{i}")).await.unwrap();
    }
    handle.idle().await;
    assert_eq!(redis.command_calls("eval").unwrap() - base, 6);
    assert_eq!(
        counter(metric::DISTRIBUTED_REQUEST_TOTAL, st) - requests_before,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_degraded_the_bulkhead_admits_only_its_degraded_limit() {
    let st = "degraded-bulkhead";
    let redis = RedisServer::start().unwrap();
    let mut cfg = fast(Mode::Hybrid);
    cfg.bulkhead.limit = 8;
    cfg.bulkhead.degraded_limit = Some(2);
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(600)),
    );
    handle.breaker().force_open();
    // No request and no handle read: the stage follows the breaker's
    // transitions on its own.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(handle.bulkhead().is_degraded());
    assert_eq!(gauge(metric::DEGRADED, st), Some(1.0));
    assert!(handle.is_degraded());

    let mut set = tokio::task::JoinSet::new();
    for i in 0..5 {
        let svc = svc.clone();
        set.spawn(async move { svc.oneshot(format!("k{i}")).await });
    }
    let (mut ok, mut full) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(
                    find::<flightdeck::core::error::BulkheadFull>(&*e).is_some(),
                    "got {e}"
                );
                assert_eq!(class(&e), ErrorClass::TooManyRequests, "429");
                full += 1;
            }
        }
    }
    assert_eq!((ok, full), (2, 3), "two local executions at a time");
    assert_eq!(redis.command_calls("eval").unwrap(), 0);
    // The rejected calls are not executions: two counted, two timed.
    assert_eq!(work.calls(), 2);
    assert_eq!(
        counter_with(metric::EXECUTION_TOTAL, st, "path", "fallback"),
        2
    );
    assert_eq!(counter(metric::EXECUTION_TOTAL, st), 2);
    assert_eq!(counter(metric::FALLBACK_EXECUTION_TOTAL, st), 2);
    assert_eq!(samples(metric::EXECUTION_DURATION, st), 2);

    handle.breaker().reset();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!handle.bulkhead().is_degraded());
    assert_eq!(gauge(metric::DEGRADED, st), Some(0.0));
    assert_eq!(samples(metric::DEGRADED_DURATION, st), 1);
    assert!(!handle.is_degraded());
    assert_eq!(handle.bulkhead().limit(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_with_open_breaker_fails_fast_with_circuit_open() {
    let st = "do-open";
    let redis = RedisServer::start().unwrap();
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::DistributedOnly),
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(10)),
    );
    handle.breaker().force_open();

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 0);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(find::<CircuitOpen>(&**err).is_some(), "got {err}");
        assert_eq!(class(err), ErrorClass::Unavailable);
    }
    assert_eq!(redis.command_calls("eval").unwrap(), 0);
    // A failing flight ends at once, so the burst may make several leaders:
    // each fails fast, none reaches Redis.
    let leaders = counter(metric::LOCAL_OWNER_TOTAL, st);
    assert!(leaders >= 1);
    assert_eq!(
        counter_with(metric::FAIL_FAST_TOTAL, st, "reason", "circuit_open"),
        leaders
    );
    assert!(handle.is_degraded());
    handle.breaker().reset();
    assert!(!handle.is_degraded());
}

// ---------------------------------------------------------------------------
// The kill switch.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_switch_under_load_keeps_in_flight_requests_and_moves_new_ones() {
    let st = "kill-switch";
    let redis = RedisServer::start().unwrap();
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        fast(Mode::Hybrid),
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(800)),
    );

    // Twenty callers on one key, in flight through L1 and L2.
    let in_flight = {
        let svc = svc.clone();
        tokio::spawn(async move { burst(svc.clone(), "k", 20).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(handle.set_mode(Mode::Bypass).unwrap(), Mode::Hybrid);

    // New requests for the same key follow the new mode: each runs.
    let bypassed = burst(svc.clone(), "k", 5).await;
    all_ok(&bypassed, "done:k");
    let results = in_flight.await.unwrap();
    all_ok(&results, "done:k");
    assert_eq!(
        work.calls(),
        1 + 5,
        "one flight for the twenty, five bypasses"
    );
    assert_eq!(counter(metric::BYPASS_TOTAL, st), 5);

    // Local only: no more Redis calls.
    handle.set_mode(Mode::LocalOnly).unwrap();
    let base = redis.command_calls("eval").unwrap();
    all_ok(&burst(svc.clone(), "k2", 5).await, "done:k2");
    assert_eq!(redis.command_calls("eval").unwrap(), base);

    // Flipping modes under continuous load never drops a request.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for t in 0..8 {
        let svc = svc.clone();
        let stop = stop.clone();
        load.spawn(async move {
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let req = format!("load-{}", (t + n) % 3);
                let v = svc.clone().oneshot(req.clone()).await;
                assert_eq!(v.unwrap(), format!("done:{req}"));
                n += 1;
            }
            n
        });
    }
    for mode in [Mode::Hybrid, Mode::Bypass, Mode::LocalOnly, Mode::Hybrid] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        handle.set_mode(mode).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    while let Some(n) = load.join_next().await {
        total += n.expect("every request under load succeeded");
    }
    assert!(total > 0);

    // Back in HYBRID, flights go through Redis again.
    let base = redis.command_calls("eval").unwrap();
    all_ok(&burst(svc.clone(), "k3", 5).await, "done:k3");
    assert!(redis.command_calls("eval").unwrap() >= base + 2);
    assert_eq!(gauge(metric::MODE, st), Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_without_backend_cannot_be_switched_to_a_distributed_mode() {
    metrics_on();
    let layer = builder("no-backend")
        .stage("no-backend", fast(Mode::LocalOnly))
        .build()
        .unwrap();
    let handle = layer.stage("no-backend").unwrap();
    let err = handle.set_mode(Mode::Hybrid).unwrap_err();
    assert_eq!(err.mode(), Mode::Hybrid);
    assert!(err.to_string().contains("no-backend"));
    assert_eq!(handle.mode(), Mode::LocalOnly);
    handle.set_mode(Mode::Bypass).unwrap();
}

// ---------------------------------------------------------------------------
// Per-stage backends: two Redis deployments and a local-only stage.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stage_uses_its_own_backend() {
    metrics_on();
    let a = RedisServer::start().unwrap();
    let b = RedisServer::start().unwrap();
    let mut cfg_a = fast(Mode::Hybrid);
    cfg_a.backend = Some("a".into());
    let mut cfg_b = fast(Mode::DistributedOnly);
    cfg_b.backend = Some("b".into());
    let layer = flightdeck::GenericSingleFlightLayer::builder(
        |req: &String| {
            let (stage, rest) = req.split_once('|')?;
            Some(FlightKey::from_bytes(StageName::new(stage).ok()?, rest))
        },
        flightdeck::core::CloneShare::<String>::new(),
        flightdeck::distributed::PostcardCodec::<String>::new(),
    )
    .backend("a", redis_backend(a.url()).await)
    .backend("b", redis_backend(b.url()).await)
    .stage("sel-a", cfg_a)
    .stage("sel-b", cfg_b)
    .stage("sel-c", fast(Mode::LocalOnly))
    .build()
    .unwrap();
    let work = Work::default();
    let svc = BoxCloneService::new(layer.layer(work.service(Duration::from_millis(10))));

    svc.clone().oneshot("sel-a|x".to_owned()).await.unwrap();
    layer.idle().await;
    assert_eq!(
        (
            a.command_calls("eval").unwrap(),
            b.command_calls("eval").unwrap()
        ),
        (2, 0)
    );
    svc.clone().oneshot("sel-b|x".to_owned()).await.unwrap();
    layer.idle().await;
    assert_eq!(
        (
            a.command_calls("eval").unwrap(),
            b.command_calls("eval").unwrap()
        ),
        (2, 2)
    );
    svc.clone().oneshot("sel-c|x".to_owned()).await.unwrap();
    assert_eq!(
        (
            a.command_calls("eval").unwrap(),
            b.command_calls("eval").unwrap()
        ),
        (2, 2)
    );
    assert_eq!(work.calls(), 3);

    // A request without a key passes through; an unknown stage is an error.
    assert_eq!(
        svc.clone().oneshot("no key".to_owned()).await.unwrap(),
        "done:no key"
    );
    let err = svc.oneshot("sel-z|x".to_owned()).await.unwrap_err();
    assert!(err.is::<flightdeck::error::UnknownStage>());
    assert_eq!(class(&err), ErrorClass::Misconfigured);
}

// ---------------------------------------------------------------------------
// The ramp: after closing, traffic returns to distributed mode gradually.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_closing_the_ramp_returns_leaders_to_redis_gradually() {
    let st = "ramp";
    let redis = RedisServer::start().unwrap();
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let backend = Faulty::switch(redis_backend(redis.url()).await, down.clone());
    let mut cfg = fast(Mode::Hybrid);
    cfg.breaker.consecutive_failures = Some(2);
    cfg.breaker.wait_in_open = Duration::from_millis(300);
    cfg.breaker.half_open_probes = 1;
    cfg.breaker.ramp = vec![0.5];
    cfg.breaker.ramp_step = Duration::from_secs(2);
    let work = Work::default();
    let (svc, handle) = setup(st, cfg, backend, work.service(Duration::from_millis(5)));

    for i in 0..2 {
        svc.clone().oneshot(format!("down-{i}")).await.unwrap();
    }
    assert_eq!(handle.breaker().state(), CircuitState::Open);
    down.store(false, Ordering::SeqCst);
    let until = handle.breaker().open_until().unwrap();
    tokio::time::sleep_until(until + Duration::from_millis(20)).await;
    svc.clone().oneshot("probe".to_owned()).await.unwrap();
    assert_eq!(handle.breaker().state(), CircuitState::Closed);
    assert_eq!(handle.breaker().ramp_share(), Some(0.5));
    assert!(!handle.is_degraded());

    let before = counter(metric::DISTRIBUTED_REQUEST_TOTAL, st);
    for i in 0..10 {
        svc.clone().oneshot(format!("ramp-{i}")).await.unwrap();
    }
    let sent = counter(metric::DISTRIBUTED_REQUEST_TOTAL, st) - before;
    assert!((4..=6).contains(&sent), "about half went to Redis: {sent}");
    assert_eq!(work.calls(), 13, "every request answered");
}

// ---------------------------------------------------------------------------
// The budget: the execution slice bounds the real work.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_execution_budget_ends_slow_work_for_every_caller() {
    let st = "budget";
    let redis = RedisServer::start().unwrap();
    let mut cfg = fast(Mode::Hybrid);
    cfg.execution_timeout = Some(Duration::from_millis(100));
    let work = Work::default();
    let (svc, handle) = setup(
        st,
        cfg,
        redis_backend(redis.url()).await,
        work.service(Duration::from_millis(400)),
    );

    let results = burst(svc.clone(), "q", N).await;

    assert_eq!(work.calls(), 1);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        let dl = find::<flightdeck::core::error::DeadlineExceeded>(&**err).expect("deadline");
        assert_eq!(dl.phase(), "execution");
        assert_eq!(class(err), ErrorClass::DeadlineExceeded, "504");
    }
    assert_eq!(
        counter(metric::OWNER_FAILURE_TOTAL, st),
        1,
        "the owner's failure"
    );
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0, "not retried");
    assert_eq!(handle.breaker().stats().failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_probe_is_judged_by_its_acquire_not_by_slow_work() {
    let st = "slow-probe";
    let redis = RedisServer::start().unwrap();
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let backend = Faulty::switch(redis_backend(redis.url()).await, down.clone());
    let mut cfg = fast(Mode::Hybrid);
    cfg.lease_timeout = Duration::from_secs(6);
    cfg.heartbeat_interval = Duration::from_secs(2);
    cfg.wait_timeout = Duration::from_secs(6);
    cfg.breaker.consecutive_failures = Some(2);
    cfg.breaker.wait_in_open = Duration::from_millis(200);
    cfg.breaker.half_open_probes = 1;
    cfg.breaker.probe_timeout = Duration::from_millis(300);
    metrics_on();
    let layer = builder(st)
        .backend("redis", backend)
        .stage(st, cfg)
        .build()
        .unwrap();
    let handle = layer.stage(st).unwrap();
    let quick = BoxCloneService::new(layer.layer(Work::default().service(Duration::ZERO)));
    let svc =
        BoxCloneService::new(layer.layer(Work::default().service(Duration::from_millis(1500))));

    for i in 0..2 {
        quick.clone().oneshot(format!("open-{i}")).await.unwrap();
    }
    assert_eq!(handle.breaker().state(), CircuitState::Open);
    down.store(false, Ordering::SeqCst);
    let until = handle.breaker().open_until().unwrap();
    tokio::time::sleep_until(until + Duration::from_millis(20)).await;

    // The probe's work takes 1.5 s, five times the probe timeout; its
    // acquire answered at once, and that closes the breaker.
    let probe = tokio::spawn({
        let svc = svc.clone();
        async move { svc.oneshot("long-probe".to_owned()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handle.breaker().state(), CircuitState::Closed);
    assert!(!handle.is_degraded());
    assert_eq!(probe.await.unwrap().unwrap(), "done:long-probe");
}
