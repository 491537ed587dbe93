//! The facade's invariants that the failure matrix must not break, each
//! against real `redis-server`s of the harness (two layers over one server
//! are two nodes):
//!
//! - a cached owner failure is an answer, never a follower's wait failure;
//! - no caller's deadline decides another caller's outcome;
//! - the abandon rule of a flight comes from the mode its leader found on
//!   arrival, not the configured one;
//! - one `singleflight_execution_duration` sample per real execution.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use flightdeck::core::error::{find, BoxError, DeadlineExceeded, InProgress};
use flightdeck::core::metric;
use flightdeck::distributed::error::RemoteFailure;
use flightdeck::{Mode, OnWaitFailure, StageConfig};
use flightdeck_harness::RedisServer;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// A node: the layer of `stage` over its own connection to `redis`.
async fn node(redis: &RedisServer, stage: &str, cfg: StageConfig, inner: Svc) -> Svc {
    metrics_on();
    let layer = builder(stage)
        .backend("redis", redis_backend(redis.url()).await)
        .stage(stage, cfg)
        .build()
        .expect("valid stage");
    BoxCloneService::new(layer.layer(inner))
}

/// Another node's owner fails, and the stage caches failures: a follower
/// here gets the owner's error as its answer. It never runs the failing
/// work itself (not even with `on-wait-failure = local`), never answers
/// "in progress" for a flight that is over, and counts no wait failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_owner_failure_is_an_answer_never_a_wait_failure() {
    let redis = RedisServer::start().unwrap();
    for (st, policy) in [
        ("cached-fail-local", OnWaitFailure::Local),
        ("cached-fail-202", OnWaitFailure::InProgress),
        ("cached-fail-wait", OnWaitFailure::Wait),
    ] {
        let mut cfg = fast(Mode::Hybrid);
        cfg.failure_ttl = Duration::from_secs(10);
        cfg.on_wait_failure = policy;
        let owner_work = Work::default();
        let follower_work = Work::default();
        let a = node(
            &redis,
            st,
            cfg.clone(),
            owner_work.service(Duration::from_millis(400)),
        )
        .await;
        let b = node(
            &redis,
            st,
            cfg,
            follower_work.service(Duration::from_millis(10)),
        )
        .await;

        let owner = tokio::spawn(a.oneshot("fail-q".to_owned()));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let followed = b.oneshot("fail-q".to_owned()).await;

        let err = followed.expect_err("the owner's failure");
        let remote = find::<RemoteFailure>(&*err).unwrap_or_else(|| panic!("{policy}: {err}"));
        assert_eq!(remote.message(), "boom", "{policy}");
        assert!(find::<InProgress>(&*err).is_none(), "{policy}: {err}");
        assert_eq!(follower_work.calls(), 0, "{policy}: never run again here");
        assert!(owner.await.unwrap().is_err());
        assert_eq!(owner_work.calls(), 1, "{policy}");
        assert_eq!(counter(metric::WAIT_FAILURE_TOTAL, st), 0, "{policy}");
        assert_eq!(counter(metric::LOCAL_FALLBACK_TOTAL, st), 0, "{policy}");
        assert_eq!(counter(metric::FOLLOWER_TOTAL, st), 1, "{policy}");
    }
}

/// A request with its own deadline (`x-request-timeout`) and its key in the
/// extensions, answering the path.
mod http_callers {
    use super::*;
    use bytes::Bytes;
    use flightdeck::core::{FlightKey, StageName};
    use flightdeck::GenericSingleFlightLayer;
    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};

    pub(super) fn request(stage: &str, timeout: Option<&str>) -> Request<Full<Bytes>> {
        let mut b = Request::builder().uri("/model");
        if let Some(t) = timeout {
            b = b.header("x-request-timeout", t);
        }
        let mut req = b.body(Full::new(Bytes::new())).unwrap();
        req.extensions_mut().insert(FlightKey::from_bytes(
            StageName::new(stage).unwrap(),
            "model",
        ));
        req
    }

    /// The first caller is impatient (500 ms), nine more without a
    /// deadline join 100 ms later: the first gets 504 at its deadline, the
    /// nine get the model's answer, and the model ran once.
    pub(super) async fn impatient_first_caller(
        st: &str,
        cfg: StageConfig,
        redis: Option<&RedisServer>,
    ) {
        metrics_on();
        let mut b = GenericSingleFlightLayer::http().stage(st, cfg);
        if let Some(redis) = redis {
            b = b.backend("redis", redis_backend(redis.url()).await);
        }
        let layer = b.build().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = layer.layer(service_fn({
            let runs = runs.clone();
            move |_req: Request<Full<Bytes>>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"answer"))))
                }
            }
        }));
        let impatient = tokio::spawn(svc.clone().oneshot(request(st, Some("500ms"))));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let patient: Vec<_> = (0..9)
            .map(|_| tokio::spawn(svc.clone().oneshot(request(st, None))))
            .collect();
        let err = impatient
            .await
            .unwrap()
            .expect_err("the impatient caller's own deadline");
        assert!(find::<DeadlineExceeded>(&*err).is_some(), "{err}");
        for p in patient {
            let resp = p
                .await
                .unwrap()
                .expect("the patient callers get the answer");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"answer");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the model ran once, for the nine"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_impatient_caller_never_fails_the_flight_local_only() {
    http_callers::impatient_first_caller("impatient-local", fast(Mode::LocalOnly), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_impatient_caller_never_fails_the_flight_hybrid() {
    let redis = RedisServer::start().unwrap();
    let mut cfg = fast(Mode::Hybrid);
    cfg.lease_timeout = Duration::from_secs(3);
    cfg.heartbeat_interval = Duration::from_secs(1);
    cfg.wait_timeout = Duration::from_secs(3);
    http_callers::impatient_first_caller("impatient-hybrid", cfg, Some(&redis)).await;
}

/// Work that counts the runs that started and the runs that finished.
#[derive(Clone, Default)]
struct Tracked {
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Tracked {
    fn service(&self, delay: Duration) -> Svc {
        let t = self.clone();
        BoxCloneService::new(service_fn(move |req: String| {
            let t = t.clone();
            async move {
                t.started.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                t.finished.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(format!("done:{req}"))
            }
        }))
    }
}

/// A stage configured LOCAL_ONLY and switched to HYBRID at run time: when
/// the owner's caller disconnects, the work is not cancelled and the lease
/// not abandoned (another node waits on it), so another node gets its
/// result and runs nothing. The reverse switch: a flight of a stage
/// configured HYBRID, now LOCAL_ONLY, is cancelled when nobody wants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_abandon_rule_follows_the_mode_in_force() {
    let redis = RedisServer::start().unwrap();
    let st = "abandon-switched";
    let mut cfg = fast(Mode::LocalOnly);
    cfg.backend = Some("redis".into());
    let here = Tracked::default();
    let there = Tracked::default();
    metrics_on();
    let layer = builder(st)
        .backend("redis", redis_backend(redis.url()).await)
        .stage(st, cfg.clone())
        .build()
        .unwrap();
    layer.stage(st).unwrap().set_mode(Mode::Hybrid).unwrap();
    let a = BoxCloneService::new(layer.layer(here.service(Duration::from_millis(800))));
    cfg.mode = Mode::Hybrid;
    let b = node(&redis, st, cfg, there.service(Duration::from_millis(10))).await;

    let owner = tokio::spawn(a.oneshot("q".to_owned()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    owner.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        b.oneshot("q".to_owned()).await.unwrap(),
        "done:q",
        "the other node got the owner's result"
    );
    assert_eq!(here.finished.load(Ordering::SeqCst), 1, "the work finished");
    assert_eq!(there.started.load(Ordering::SeqCst), 0, "nothing ran twice");

    // The reverse switch.
    let st = "abandon-switched-back";
    let work = Tracked::default();
    let layer = builder(st)
        .backend("redis", redis_backend(redis.url()).await)
        .stage(st, fast(Mode::Hybrid))
        .build()
        .unwrap();
    layer.stage(st).unwrap().set_mode(Mode::LocalOnly).unwrap();
    let svc = BoxCloneService::new(layer.layer(work.service(Duration::from_millis(600))));
    let caller = tokio::spawn(svc.oneshot("q".to_owned()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    caller.abort();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(work.started.load(Ordering::SeqCst), 1);
    assert_eq!(
        work.finished.load(Ordering::SeqCst),
        0,
        "cancelled: nobody wanted it"
    );
    assert_eq!(layer.running_flights(st), Some(0));
}

/// One `singleflight_execution_duration` sample per real execution: an
/// owner records one, a node that only waited on it records none, and a
/// replay none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_execution_sample_per_real_execution() {
    let redis = RedisServer::start().unwrap();
    let st = "exec-samples";
    let work = Work::default();
    let a = node(
        &redis,
        st,
        fast(Mode::Hybrid),
        work.service(Duration::from_millis(400)),
    )
    .await;
    let b = node(
        &redis,
        st,
        fast(Mode::Hybrid),
        work.service(Duration::from_millis(400)),
    )
    .await;

    let owner = tokio::spawn(a.clone().oneshot("q".to_owned()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let follower = tokio::spawn(b.clone().oneshot("q".to_owned()));
    assert_eq!(owner.await.unwrap().unwrap(), "done:q");
    assert_eq!(follower.await.unwrap().unwrap(), "done:q");
    // Replays, on both nodes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.oneshot("q".to_owned()).await.unwrap(), "done:q");
    assert_eq!(b.oneshot("q".to_owned()).await.unwrap(), "done:q");

    assert_eq!(work.calls(), 1);
    assert_eq!(
        samples(metric::EXECUTION_DURATION, st),
        1,
        "one sample, the owner's"
    );
}
