//! One meaning of replay in every mode: `replay-ttl` alone decides whether
//! a finished result answers a new request, in LOCAL_ONLY as in HYBRID,
//! and a mode switch at run time changes nothing callers see. The
//! followers already waiting when a result is committed get it whatever
//! `replay-ttl` says, also when it is too big to travel in the notice.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{burst, fast, stage_node, StageNode, Work};
use flightdeck::distributed::backend::{
    Acquired, Backend, BackendFuture, FlightId, LeaseTerms, OwnerToken,
};
use flightdeck::{Mode, StageConfig};
use flightdeck_harness::RedisServer;
use flightdeck_test::MemoryBackend;
use tokio::time::sleep;
use tower::ServiceExt;

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

/// Switching the mode between calls changes nothing callers get without
/// replay (the default): each call runs. (With replay, who replays is
/// settled at build: a stage built distributed replays from its store
/// only, and switched to LOCAL_ONLY it does not replay in the process.)
#[tokio::test(start_paused = true)]
async fn a_mode_switch_changes_no_answer() {
    for (replay, want) in [(Duration::ZERO, 4)] {
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
    fn recheck<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        follows: Option<u64>,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            sleep(self.delay).await;
            self.inner.recheck(flight, token, follows, terms).await
        })
    }

    flightdeck::distributed::forward_backend!(inner => acquire, heartbeat, commit, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
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
