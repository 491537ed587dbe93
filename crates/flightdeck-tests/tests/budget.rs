//! The facade honours each request's own deadline (the budget's
//! coordination and execution slices), without a `BudgetLayer` around it:
//! a caller never waits past its deadline, a leader never follows another
//! node's flight past it (and never falls back to running it here), the
//! work runs within what remains, and a request whose time is already up
//! reaches neither the work nor Redis. HTTP requests bring their deadline
//! in `grpc-timeout` / `x-request-timeout`.
//!
//! Paused time where the backend is not needed; real `redis-server`s from
//! the harness where it is.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use flightdeck::budget::{Deadline, Inbound, InvalidTimeout, Slices};
use flightdeck::core::error::{find, BoxError, DeadlineExceeded};
use flightdeck::core::{metric, CloneShare, FlightKey, StageName};
use flightdeck::distributed::backend::{Acquired, Backend, LeaseTerms};
use flightdeck::distributed::{FlightId, OwnerToken, PostcardCodec};
use flightdeck::readers::DynReaders;
use flightdeck::{GenericSingleFlightLayer, Mode, OnWaitFailure, StageConfig};
use flightdeck_breaker::CircuitState;
use flightdeck_harness::RedisServer;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// A request of a non-HTTP stack that carries its caller's timeout.
#[derive(Debug, Clone)]
struct Job {
    id: String,
    timeout: Option<Duration>,
    /// A deadline an outer layer attached (with its slices).
    outer: Option<Deadline>,
}

fn job(id: &str, timeout: Option<Duration>) -> Job {
    Job {
        id: id.to_owned(),
        timeout,
        outer: None,
    }
}

/// Tells the facade where a `Job`'s deadline is.
#[derive(Debug, Clone, Copy)]
struct JobDeadline;

impl Inbound<Job> for JobDeadline {
    fn inbound(&self, job: &Job) -> Result<Option<Duration>, InvalidTimeout> {
        Ok(job.timeout)
    }

    fn existing(&self, job: &Job) -> Option<Deadline> {
        job.outer
    }
}

type JobSvc = BoxCloneService<Job, String, BoxError>;

/// Counts executions; sleeps `delay`; answers "done:<id>".
fn work(calls: &Arc<AtomicUsize>, delay: Duration) -> BoxCloneService<Job, String, BoxError> {
    let calls = calls.clone();
    BoxCloneService::new(service_fn(move |job: Job| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(format!("done:{}", job.id))
        }
    }))
}

type JobLayer = flightdeck::GenericSingleFlightLayer<DynReaders<Job>, CloneShare<String>>;

fn layer(
    stage: &str,
    cfg: StageConfig,
    backend: Option<flightdeck_redis::RedisBackend>,
) -> JobLayer {
    metrics_on();
    let name = StageName::new(stage).unwrap();
    let mut b = GenericSingleFlightLayer::builder(
        move |job: &Job| Some(FlightKey::from_bytes(name.clone(), &job.id)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .deadlines(JobDeadline)
    .stage(stage, cfg);
    if let Some(backend) = backend {
        b = b.backend("redis", backend);
    }
    b.build().expect("valid stage")
}

fn deadline_exceeded(res: &Result<String, BoxError>) -> &DeadlineExceeded {
    match res {
        Err(e) => find::<DeadlineExceeded>(&**e)
            .unwrap_or_else(|| panic!("expected a deadline error, got {e}")),
        Ok(v) => panic!("expected a deadline error, got {v:?}"),
    }
}

/// Waits (at most `limit`) until the stage has no local flight left.
async fn until_no_flight<R, Sh: flightdeck::core::SharedForm>(
    layer: &flightdeck::GenericSingleFlightLayer<R, Sh>,
    stage: &str,
    limit: Duration,
) -> usize {
    let end = Instant::now() + limit;
    loop {
        let n = layer.running_flights(stage).unwrap();
        if n == 0 || Instant::now() >= end {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_request_deadline_bounds_the_execution() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cfg = fast(Mode::LocalOnly);
    // The execution slice is longer than the caller's deadline (and
    // shorter than the stage's 2 s local wait).
    cfg.execution_timeout = Some(Duration::from_secs(1));
    let l = layer("exec-deadline", cfg, None);
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::from_secs(10))));

    let start = Instant::now();
    let res = svc
        .clone()
        .oneshot(job("a", Some(Duration::from_millis(300))))
        .await;
    deadline_exceeded(&res);
    assert_eq!(start.elapsed(), Duration::from_millis(300), "paused clock");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Without a deadline of its own, the stage's execution slice applies.
    let res = svc.oneshot(job("b", None)).await;
    assert_eq!(deadline_exceeded(&res).phase(), "execution");
    assert_eq!(start.elapsed(), Duration::from_millis(1300));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_leaves_at_its_own_deadline_and_the_flight_goes_on() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer("waiter-deadline", fast(Mode::LocalOnly), None);
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::from_secs(1))));

    let leader = tokio::spawn(svc.clone().oneshot(job("k", None)));
    tokio::task::yield_now().await;
    assert_eq!(l.running_flights("waiter-deadline"), Some(1));
    let waiter = svc
        .clone()
        .oneshot(job("k", Some(Duration::from_millis(100))))
        .await;
    assert_eq!(deadline_exceeded(&waiter).phase(), "request");
    assert_eq!(
        l.running_flights("waiter-deadline"),
        Some(1),
        "the flight goes on"
    );
    assert_eq!(leader.await.unwrap().unwrap(), "done:k");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
}

/// The work is every caller's: the execution slice of one caller's
/// budget (its outer `Deadline`) bounds that caller's own wait, never the
/// work another caller, with a budget of its own or none, waits for.
#[tokio::test(start_paused = true)]
async fn one_callers_execution_slice_does_not_cut_the_work_of_another() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer("slice-of-one", fast(Mode::LocalOnly), None);
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::from_secs(1))));

    let slices = Slices {
        execution: Some(Duration::from_millis(100)),
        ..Slices::default()
    };
    let mut hurried = job("k", None);
    hurried.outer = Some(Deadline::after(Duration::from_secs(60), slices));
    let leader = tokio::spawn(svc.clone().oneshot(hurried));
    tokio::task::yield_now().await;
    assert_eq!(l.running_flights("slice-of-one"), Some(1));
    let patient = svc.clone().oneshot(job("k", None)).await;
    assert_eq!(patient.unwrap(), "done:k");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
    drop(leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_time_is_up_reaches_neither_the_work_nor_redis() {
    let st = "spent";
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(
        st,
        fast(Mode::Hybrid),
        Some(redis_backend(redis.url()).await),
    );
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::ZERO)));
    let before = redis.command_calls("eval").unwrap_or(0);
    let res = svc.oneshot(job("x", Some(Duration::ZERO))).await;
    assert_eq!(deadline_exceeded(&res).phase(), "request");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(redis.command_calls("eval").unwrap_or(0) - before, 0);
    assert_eq!(counter(metric::DISTRIBUTED_REQUEST_TOTAL, st), 0);
}

/// Another node's acquire of `id` in `stage` (a long lease, its own
/// token and connection).
async fn other_node_acquires(redis: &RedisServer, stage: &str, id: &str) -> Acquired {
    let other = redis_backend(redis.url()).await;
    let flight = FlightId::of(&FlightKey::from_bytes(StageName::new(stage).unwrap(), id));
    let terms = LeaseTerms {
        lease: Duration::from_secs(30),
        state_ttl: Duration::from_secs(60),
        allow_takeover: true,
    };
    other
        .acquire(&flight, &OwnerToken::random(), &terms)
        .await
        .unwrap()
}

/// Stage settings with a long wait: only the request's deadline can end a
/// follower's wait early.
fn patient(mode: Mode) -> StageConfig {
    let mut cfg = fast(mode);
    cfg.lease_timeout = Duration::from_secs(30);
    cfg.heartbeat_interval = Duration::from_secs(5);
    cfg.wait_timeout = Duration::from_secs(30);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_never_waits_past_the_request_deadline() {
    let st = "follow-deadline";
    let redis = RedisServer::start().unwrap();
    let got = other_node_acquires(&redis, st, "q").await;
    assert!(matches!(got, Acquired::Owner { .. }), "{got:?}");
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cfg = patient(Mode::Hybrid);
    // Even the opt-in to run locally after a failed wait must not apply:
    // the caller's time is up, the owner may still be running it.
    cfg.on_wait_failure = OnWaitFailure::Local;
    let l = layer(st, cfg, Some(redis_backend(redis.url()).await));
    let handle = l.stage(st).unwrap();
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::ZERO)));

    let res = svc
        .oneshot(job("q", Some(Duration::from_millis(400))))
        .await;
    deadline_exceeded(&res);
    // The leader's follow ends with the deadline, not with the 30 s wait.
    assert_eq!(until_no_flight(&l, st, Duration::from_secs(10)).await, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never run here");
    assert_eq!(counter(metric::FOLLOWER_TOTAL, st), 1);
    assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0);
    assert_eq!(counter(metric::WAIT_FAILURE_TOTAL, st), 0);
    // Not the backend's failure.
    assert_eq!(handle.breaker().state(), CircuitState::Closed);
    assert_eq!(handle.breaker().stats().failures, 0);
    // The other node still owns the flight: nothing took it over.
    let now = other_node_acquires(&redis, st, "q").await;
    assert!(matches!(now, Acquired::Follower { .. }), "{now:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_runs_within_the_deadline_and_releases_the_flight_at_once() {
    let st = "owner-deadline";
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(
        st,
        patient(Mode::DistributedOnly),
        Some(redis_backend(redis.url()).await),
    );
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::from_secs(20))));

    let res = svc
        .oneshot(job("w", Some(Duration::from_millis(400))))
        .await;
    deadline_exceeded(&res);
    assert_eq!(until_no_flight(&l, st, Duration::from_secs(10)).await, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The work was cut and the flight abandoned: another node owns it at
    // once (a fresh grant), without waiting for the 30 s lease.
    let mut got = None;
    for _ in 0..50 {
        let a = other_node_acquires(&redis, st, "w").await;
        if matches!(a, Acquired::Owner { .. }) {
            got = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        matches!(
            got,
            Some(Acquired::Owner {
                takeover: false,
                ..
            })
        ),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_cannot_hold_a_caller_past_its_deadline() {
    let st = "hung-deadline";
    let mut redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cfg = patient(Mode::Hybrid);
    // A coordination slice longer than the caller's deadline.
    cfg.coordination_timeout = Duration::from_secs(2);
    let l = layer(st, cfg, Some(redis_backend(redis.url()).await));
    let svc: JobSvc = BoxCloneService::new(l.layer(work(&calls, Duration::ZERO)));
    redis.pause().unwrap();
    let res = svc
        .oneshot(job("h", Some(Duration::from_millis(300))))
        .await;
    deadline_exceeded(&res);
    // The acquire ends with its slice, after the deadline: HYBRID's local
    // fallback then has no time left and does not start the work.
    assert_eq!(until_no_flight(&l, st, Duration::from_secs(15)).await, 0);
    redis.resume().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[cfg(feature = "http")]
mod http_deadlines {
    use super::*;
    use bytes::Bytes;
    use flightdeck::core::error::ErrorClass;
    use http::{Request, Response};
    use http_body_util::Full;

    fn request(stage: &str, path: &str, header: Option<(&str, &str)>) -> Request<Full<Bytes>> {
        let mut b = Request::builder().uri(path);
        if let Some((name, value)) = header {
            b = b.header(name, value);
        }
        let mut req = b.body(Full::new(Bytes::new())).unwrap();
        req.extensions_mut()
            .insert(FlightKey::from_bytes(StageName::new(stage).unwrap(), path));
        req
    }

    #[tokio::test(start_paused = true)]
    async fn http_requests_bring_their_deadline_in_their_headers() {
        metrics_on();
        let st = "http-deadline";
        let layer = GenericSingleFlightLayer::http()
            .stage(st, fast(Mode::LocalOnly))
            .build()
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = layer.layer(service_fn({
            let calls = calls.clone();
            move |_req: Request<Full<Bytes>>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                }
            }
        }));

        for (i, header) in [("grpc-timeout", "300m"), ("x-request-timeout", "300ms")]
            .into_iter()
            .enumerate()
        {
            let start = Instant::now();
            let Err(err) = svc
                .clone()
                .oneshot(request(st, &format!("/{i}"), Some(header)))
                .await
            else {
                panic!("{header:?}: no deadline error");
            };
            assert!(
                find::<DeadlineExceeded>(&*err).is_some(),
                "{header:?}: {err}"
            );
            assert_eq!(start.elapsed(), Duration::from_millis(300), "{header:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // A malformed timeout is the caller's error, never guessed at.
        let Err(err) = svc
            .clone()
            .oneshot(request(st, "/bad", Some(("grpc-timeout", "soon"))))
            .await
        else {
            panic!("a malformed timeout was accepted");
        };
        assert_eq!(ErrorClass::of(&*err), ErrorClass::InvalidRequest, "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "not run");
    }

    /// An outer `BudgetLayer`'s slices bound the flight as the stage's own
    /// settings do: each coordination call gets at most its coordination
    /// slice (a frozen Redis costs HYBRID two 50 ms acquires, not two
    /// 250 ms ones, before it runs locally).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outer_budgets_coordination_slice_bounds_each_call() {
        metrics_on();
        let st = "outer-slices";
        let mut redis = RedisServer::start().unwrap();
        let layer = GenericSingleFlightLayer::http()
            .backend("redis", redis_backend(redis.url()).await)
            .stage(st, fast(Mode::Hybrid))
            .build()
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = tower::ServiceBuilder::new()
            .layer(
                flightdeck::budget::BudgetLayer::new(Duration::from_secs(10))
                    .coordination(Duration::from_millis(50)),
            )
            .layer(layer)
            .service(service_fn({
                let calls = calls.clone();
                move |_req: Request<Full<Bytes>>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                }
            }));
        redis.pause().unwrap();
        let start = Instant::now();
        svc.oneshot(request(st, "/slow-redis", None)).await.unwrap();
        let took = start.elapsed();
        redis.resume().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "ran locally");
        assert_eq!(
            counter_with(
                metric::LOCAL_FALLBACK_TOTAL,
                st,
                "reason",
                "outcome_unknown"
            ),
            1
        );
        assert!(
            took < Duration::from_millis(250),
            "two acquires of at most 50 ms each, not of the stage's 250 ms: {took:?}"
        );
    }
}
