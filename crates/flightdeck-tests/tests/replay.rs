//! One meaning of replay in every mode: `replay-ttl` alone decides whether
//! a finished result answers a new request, in LOCAL_ONLY as in HYBRID,
//! and a mode switch at run time changes at most where a replay comes
//! from (the process, or the store), never how old it may be. The
//! followers already waiting when a result is committed get it whatever
//! `replay-ttl` says, also when it is too big to travel in the notice.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{burst, fast, stage_node, StageNode, Svc, Work};
use flightdeck::core::BoxError;
use flightdeck::distributed::backend::{
    Acquired, Ask, Backend, BackendFuture, FlightId, LeaseTerms, OwnerToken,
};
use flightdeck::{Mode, StageConfig, StageHandle};
use flightdeck_harness::RedisServer;
use flightdeck_test::MemoryBackend;
use tokio::time::{sleep, Instant};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// The executions after each step of one sequence of calls on one node:
/// two calls one after the other, a burst, a call inside `replay`, and
/// one after it ran out. Work takes 300 ms.
async fn executions(node: &StageNode, work: &Work, replay: Duration) -> Vec<usize> {
    let mut seen = Vec::new();
    let call = |req: &'static str| node.svc.clone().oneshot(req.to_owned());
    assert_eq!(call("a").await.unwrap(), "done:a");
    seen.push(work.calls());
    assert_eq!(call("a").await.unwrap(), "done:a");
    seen.push(work.calls());
    for r in burst(node.svc.clone(), "b", 8).await {
        assert_eq!(r.unwrap(), "done:b");
    }
    seen.push(work.calls());
    sleep(Duration::from_millis(100)).await;
    assert_eq!(call("b").await.unwrap(), "done:b");
    seen.push(work.calls());
    sleep(replay + Duration::from_secs(1)).await;
    assert_eq!(call("b").await.unwrap(), "done:b");
    seen.push(work.calls());
    seen
}

fn config(mode: Mode, replay: Duration) -> StageConfig {
    let mut cfg = fast(mode);
    cfg.replay_ttl = replay;
    cfg
}

/// The same calls get the same answers, with the same executions, in
/// LOCAL_ONLY and HYBRID: without replay (the default) and with it.
#[tokio::test(start_paused = true)]
async fn local_only_and_hybrid_replay_alike() {
    for replay in [Duration::ZERO, Duration::from_secs(2)] {
        let mut runs = Vec::new();
        for mode in [Mode::LocalOnly, Mode::Hybrid] {
            let work = Work::default();
            let node = stage_node("replay", config(mode, replay), MemoryBackend::new(), &work);
            runs.push(executions(&node, &work, replay).await);
        }
        assert_eq!(runs[0], runs[1], "LOCAL_ONLY vs HYBRID, replay {replay:?}");
        let want = if replay.is_zero() {
            [1, 2, 3, 4, 5]
        } else {
            [1, 1, 2, 2, 3]
        };
        assert_eq!(runs[0], want, "replay {replay:?}");
    }
}

/// The default replays nothing, in every mode.
#[tokio::test(start_paused = true)]
async fn the_default_replays_nothing() {
    assert_eq!(StageConfig::new().replay_ttl, Duration::ZERO);
    for mode in [Mode::LocalOnly, Mode::Hybrid, Mode::DistributedOnly] {
        let work = Work::default();
        let mut cfg = StageConfig::new().mode(mode);
        if mode.is_distributed() {
            cfg = cfg.backend("redis");
        }
        let node = stage_node("default", cfg, MemoryBackend::new(), &work);
        for _ in 0..3 {
            node.svc.clone().oneshot("x".to_owned()).await.unwrap();
        }
        assert_eq!(work.calls(), 3, "{}", mode.as_str());
    }
}

/// Switching the mode between calls changes nothing callers get: without
/// replay (the default) each call runs; with it, the first runs in HYBRID
/// (replayed from the store), the second in LOCAL_ONLY (which does not ask
/// the store), and the process replays that one in either mode.
#[tokio::test(start_paused = true)]
async fn a_mode_switch_changes_no_answer() {
    for (replay, want) in [(Duration::ZERO, 4), (Duration::from_secs(2), 2)] {
        let work = Work::default();
        let node = stage_node(
            "switch",
            config(Mode::Hybrid, replay),
            MemoryBackend::new(),
            &work,
        );
        for mode in [Mode::Hybrid, Mode::LocalOnly, Mode::Hybrid, Mode::LocalOnly] {
            node.handle.set_mode(mode).unwrap();
            assert_eq!(
                node.svc.clone().oneshot("k".to_owned()).await.unwrap(),
                "done:k"
            );
        }
        assert_eq!(work.calls(), want, "replay {replay:?}");
    }
}

/// Two nodes, no replay, results too big for the notice: the callers
/// waiting on the other node when the owner commits get its result (one
/// execution), and a caller that comes after it runs the work again.
async fn waiting_followers_get_the_result<B: Backend + Clone>(backend: B) {
    let work = Work::default();
    let mut cfg = config(Mode::Hybrid, Duration::ZERO);
    cfg.inline_publish_below = 0;
    let a = stage_node("waiters", cfg.clone(), backend.clone(), &work);
    let b = stage_node("waiters", cfg, backend, &work);
    let first = tokio::spawn(burst(a.slow.clone(), "big", 3));
    // Node b's callers arrive while a's owner runs (work takes a second).
    sleep(Duration::from_millis(300)).await;
    let second = burst(b.svc.clone(), "big", 3).await;
    for r in first.await.unwrap().into_iter().chain(second) {
        assert_eq!(r.unwrap(), "done:big");
    }
    assert_eq!(work.calls(), 1, "the waiting followers got the result");
    b.svc.clone().oneshot("big".to_owned()).await.unwrap();
    assert_eq!(work.calls(), 2, "a new request is not replayed");
}

#[tokio::test(start_paused = true)]
async fn waiting_followers_get_a_result_kept_for_them() {
    let backend = MemoryBackend::new();
    // The notices are lost too: the followers find it by re-checking.
    backend.set_drop_notices(true);
    waiting_followers_get_the_result(backend).await;
}

/// A backend whose re-checks reach the store `delay` late (a follower
/// that missed the notice, or a slow network).
#[derive(Clone)]
struct LateRechecks<B> {
    inner: B,
    delay: Duration,
}

impl<B: Backend> Backend for LateRechecks<B> {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            if ask.recheck {
                sleep(self.delay).await;
            }
            self.inner.acquire_with(flight, token, ask, terms).await
        })
    }

    flightdeck::distributed::forward_backend!(inner => heartbeat, commit, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_followers_get_a_result_kept_for_them_on_redis() {
    let redis = RedisServer::start().unwrap();
    let backend = LateRechecks {
        inner: Arc::new(common::redis_backend(redis.url()).await),
        delay: Duration::from_millis(150),
    };
    waiting_followers_get_the_result(backend).await;
}

/// The replay TTL of the switching tests.
const REPLAY: Duration = Duration::from_secs(2);

/// A node of stage "switch" whose work takes 300 ms and answers
/// `{req}@{ms}`, `ms` when it ended (from `t0`): a caller can tell how old
/// its answer is.
struct Stamped {
    svc: Svc,
    handle: StageHandle,
    runs: Arc<AtomicUsize>,
    t0: Instant,
}

impl Stamped {
    /// A node built in `mode`, with a backend in every mode.
    fn new(mode: Mode, backend: MemoryBackend, t0: Instant) -> Self {
        let cfg = config(mode, REPLAY).backend("redis");
        let layer = common::builder("switch")
            .stage("switch", cfg)
            .backend("redis", backend)
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let work = service_fn(move |req: String| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                sleep(Duration::from_millis(300)).await;
                Ok::<_, BoxError>(format!("{req}@{}", t0.elapsed().as_millis()))
            }
        });
        Self {
            svc: BoxCloneService::new(layer.layer(work)),
            handle: layer.stage("switch").unwrap(),
            runs,
            t0,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Calls with "k"; returns how old the answer is.
    fn ask(&self) -> impl std::future::Future<Output = Duration> + Send + 'static {
        let (svc, t0) = (self.svc.clone(), self.t0);
        async move {
            let answer = svc.oneshot("k".to_owned()).await.unwrap();
            let ended = answer.strip_prefix("k@").expect("k's answer");
            let ended = t0 + Duration::from_millis(ended.parse().unwrap());
            Instant::now().saturating_duration_since(ended)
        }
    }

    /// Plays `steps` (after a pause in ms, switch to a mode and send that
    /// many calls at once, without waiting for their answers); returns
    /// the executions seen at each step's start, and at the end once every
    /// call was answered. Each answer is checked when it arrives: no older
    /// than `REPLAY`.
    async fn play(&self, steps: &[(u64, Mode, usize)]) -> Vec<usize> {
        let mut calls = tokio::task::JoinSet::new();
        let mut seen = Vec::new();
        for &(after, mode, n) in steps {
            sleep(Duration::from_millis(after)).await;
            seen.push(self.runs());
            self.handle.set_mode(mode).unwrap();
            for _ in 0..n {
                calls.spawn(self.ask());
            }
            // The calls arrive in this mode.
            sleep(Duration::from_millis(1)).await;
        }
        while let Some(age) = calls.join_next().await {
            let age = age.expect("no call panics");
            assert!(age <= REPLAY, "an answer {age:?} old");
        }
        seen.push(self.runs());
        seen
    }
}

/// Built distributed and switched to LOCAL_ONLY, the process replays, as
/// a stage built LOCAL_ONLY does.
#[tokio::test(start_paused = true)]
async fn built_distributed_and_switched_to_local_only_the_process_replays() {
    let steps = [
        (0, Mode::LocalOnly, 1),
        (500, Mode::LocalOnly, 3),
        (500, Mode::LocalOnly, 1),
        (2500, Mode::LocalOnly, 1),
    ];
    for built in [Mode::Hybrid, Mode::DistributedOnly, Mode::LocalOnly] {
        let node = Stamped::new(built, MemoryBackend::new(), Instant::now());
        assert_eq!(node.play(&steps).await, [0, 1, 1, 1, 2], "built {built}");
    }
}

/// Built LOCAL_ONLY (with a backend) and switched to HYBRID, the process
/// does not replay on top of the store: a result the store replayed is
/// not replayed again once the store's replay ended, as on a stage built
/// HYBRID.
#[tokio::test(start_paused = true)]
async fn built_local_only_and_switched_to_distributed_replays_from_the_store_alone() {
    for built in [Mode::LocalOnly, Mode::Hybrid] {
        let backend = MemoryBackend::new();
        let t0 = Instant::now();
        let a = Stamped::new(Mode::Hybrid, backend.clone(), t0);
        let b = Stamped::new(built, backend, t0);
        b.handle.set_mode(Mode::Hybrid).unwrap();
        // A runs and commits at 300 ms: fresh in the store until 2.3 s.
        assert_eq!(a.ask().await, Duration::ZERO);
        sleep(Duration::from_millis(1200)).await;
        let age = b.ask().await;
        assert_eq!(
            age,
            Duration::from_millis(1200),
            "built {built}: the store's replay"
        );
        sleep(Duration::from_millis(1500)).await;
        let age = b.ask().await;
        assert_eq!(
            age,
            Duration::ZERO,
            "built {built}: run again, not {age:?} old"
        );
        assert_eq!((a.runs(), b.runs()), (1, 1), "built {built}");
    }
}

/// Switching back and forth while bursts are under way: every answer is
/// within `REPLAY`, a flight led in LOCAL_ONLY is replayed by the process
/// in either mode, one led in HYBRID by the store, and the stage answers
/// alike whichever mode it was built in.
#[tokio::test(start_paused = true)]
async fn switching_back_and_forth_mid_burst() {
    use Mode::{Hybrid, LocalOnly};
    let steps = [
        // HYBRID leads (ends at 300 ms; the store replays it until 2.3 s),
        // LOCAL_ONLY callers join it mid-flight.
        (0, Hybrid, 4),
        (100, LocalOnly, 4),
        // Not replayed by the process: LOCAL_ONLY runs (until 0.8 s; the
        // process replays it until 2.8 s), HYBRID callers join it.
        (400, LocalOnly, 2),
        (100, Hybrid, 2),
        // The process replays it, in either mode.
        (400, Hybrid, 2),
        (100, LocalOnly, 2),
        // Both replays ended: HYBRID runs (until 3.3 s), LOCAL_ONLY joins.
        (1900, Hybrid, 2),
        (100, LocalOnly, 2),
        // The store replays it to HYBRID; LOCAL_ONLY runs (until 3.9 s).
        (400, Hybrid, 2),
        (100, LocalOnly, 2),
        // The process replays that in HYBRID until its replay ends.
        (400, Hybrid, 2),
        (2000, Hybrid, 2),
    ];
    for built in [Hybrid, LocalOnly] {
        let node = Stamped::new(built, MemoryBackend::new(), Instant::now());
        assert_eq!(
            node.play(&steps).await,
            [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 5],
            "built {built}"
        );
    }
}
