//! One shard's outage degrades only that shard's flights. Two nodes (two
//! layers) share one in-memory backend split into three shards, whose
//! shard `s0` fails on demand (every call of its flights unavailable):
//!
//! - HYBRID: while `s0` fails, a key on healthy `s1` still runs once for
//!   both nodes; `s0`'s keys run in each node (counted as fallbacks);
//!   `singleflight_degraded{shard="s0"}` is 1, `s1`'s and the whole
//!   store's 0; the bulkhead's degraded limit holds `s0`'s executions only.
//! - DISTRIBUTED_ONLY: `s0`'s keys fail fast (503), `s1`'s coalesce.
//! - Both: once `s0` answers again, its breaker's half-open probe closes
//!   it and its keys coalesce across the nodes again.
//! - The stage's own breaker still stands for the whole store: forced open,
//!   it degrades every shard.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use flightdeck::core::error::{find, BoxError, CircuitOpen, ErrorClass};
use flightdeck::core::{metric, FlightKey, StageName};
use flightdeck::distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendError, BackendFuture, CommitArgs, Committed,
    FlightId, LeaseTerms, OwnerToken, Released, Renewal, Shard, Subscription,
};
use flightdeck::Mode;
use flightdeck_test::MemoryBackend;
use tokio::time::{sleep, Instant};
use tower::ServiceExt;

const SHARDS: [&str; 3] = ["s0", "s1", "s2"];

fn shard_name(flight: &FlightId) -> &'static str {
    SHARDS[usize::from(flight.digest().as_bytes()[0]) % SHARDS.len()]
}

/// The memory backend as three shards (by the flight's digest); the
/// flights of a failing shard get "unavailable" for every call.
#[derive(Default)]
struct Sharded {
    inner: MemoryBackend,
    failing: Mutex<HashSet<&'static str>>,
    /// Shards no longer serving flights (a primary replaced in a failover).
    gone: Mutex<HashSet<&'static str>>,
}

impl Sharded {
    fn fail(&self, shard: &'static str, yes: bool) {
        let mut failing = self.failing.lock().unwrap();
        if yes {
            failing.insert(shard);
        } else {
            failing.remove(shard);
        }
    }

    fn down<T>(&self, flight: &FlightId) -> Option<BackendFuture<'static, T>> {
        let shard = shard_name(flight);
        if !self.failing.lock().unwrap().contains(shard) {
            return None;
        }
        let err = BackendError::unavailable(format!("shard {shard} is down"));
        Some(Box::pin(async move { Err(err) }))
    }
}

/// Backend methods that answer "unavailable" for a failing shard's
/// flights, and ask the memory backend otherwise.
macro_rules! gated {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)+) => {$(
        fn $name<'a>(&'a self, flight: &'a FlightId, $($arg: $ty),*) -> BackendFuture<'a, $out> {
            self.down(flight)
                .unwrap_or_else(|| self.inner.$name(flight, $($arg),*))
        }
    )+};
}

impl Backend for Sharded {
    gated! {
        acquire_with(token: &'a OwnerToken, ask: Ask, terms: &'a LeaseTerms) -> Acquired;
        heartbeat(token: &'a OwnerToken, generation: u64, terms: &'a LeaseTerms) -> Renewal;
        commit(token: &'a OwnerToken, generation: u64, args: &'a CommitArgs) -> Committed;
        abandon(token: &'a OwnerToken, generation: u64, args: &'a AbandonArgs) -> Released;
        release(token: &'a OwnerToken, state_ttl: Duration) -> Released;
        invalidate(state_ttl: Duration) -> u64;
        subscribe() -> Subscription;
    }

    fn sharded(&self) -> bool {
        true
    }

    fn shard(&self, flight: &FlightId) -> Shard {
        Shard::new(shard_name(flight))
    }

    fn shards(&self) -> Option<Vec<Shard>> {
        let gone = self.gone.lock().unwrap();
        Some(
            SHARDS
                .iter()
                .filter(|s| !gone.contains(*s))
                .map(|s| Shard::new(*s))
                .collect(),
        )
    }
}

/// A request (key) of `stage` served by `shard`.
fn key_on(stage: &str, shard: &str, tag: &str) -> String {
    let name = StageName::new(stage).unwrap();
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|req| shard_name(&FlightId::of(&FlightKey::from_bytes(name.clone(), req))) == shard)
        .expect("some key lands on every shard")
}

type Node = StageNode;

fn nodes(stage: &str, mode: Mode, backend: &Arc<Sharded>, work: &Work) -> Vec<Node> {
    (0..2)
        .map(|_| {
            let cfg = shard_outage_config(mode, Duration::from_secs(3));
            stage_node(stage, cfg, Arc::clone(backend), work)
        })
        .collect()
}

fn s(name: &str) -> Shard {
    Shard::new(name)
}

/// Sends fresh `s0` keys to each node until its `s0` breaker is open.
async fn open_s0(stage: &str, nodes: &[Node], tag: &str) -> Vec<Result<String, BoxError>> {
    let mut answers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for i in 0.. {
            if node.handle.is_shard_degraded(&s("s0")) {
                break;
            }
            assert!(i < 10, "s0's breaker never opened on node {n}");
            let key = key_on(stage, "s0", &format!("{tag}-{n}-{i}"));
            answers.push(node.svc.clone().oneshot(key).await);
        }
    }
    answers
}

/// Sends fresh `s0` keys to each node until `s0` is no longer degraded
/// (its half-open probe closed its breaker).
async fn recover_s0(stage: &str, nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    while nodes.iter().any(|n| n.handle.is_degraded()) {
        assert!(
            Instant::now() < deadline,
            "s0 still degraded after it came back"
        );
        for node in nodes {
            i += 1;
            let _ = node
                .svc
                .clone()
                .oneshot(key_on(stage, "s0", &format!("probe-{i}")))
                .await;
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// Both nodes at once, `n` callers each, for one key: every answer.
async fn both(nodes: &[Node], key: &str, n: usize) -> Vec<Result<String, BoxError>> {
    let (a, b) = tokio::join!(
        burst(nodes[0].svc.clone(), key, n),
        burst(nodes[1].svc.clone(), key, n)
    );
    a.into_iter().chain(b).collect()
}

/// Two nodes over a fresh sharded backend, with one key of `s0` and one
/// of `s1` served once for both (so both shards' breakers exist).
async fn healthy(stage: &str, mode: Mode) -> (Arc<Sharded>, Work, Vec<Node>) {
    let backend = Arc::new(Sharded::default());
    let work = Work::default();
    let nodes = nodes(stage, mode, &backend, &work);
    for shard in ["s0", "s1"] {
        let key = key_on(stage, shard, "warm");
        for r in both(&nodes, &key, 2).await {
            assert_eq!(r.unwrap(), format!("done:{key}"));
        }
    }
    (backend, work, nodes)
}

/// `s0` answers again: once its breaker's open wait has passed, a probe
/// closes it on each node, and its keys coalesce across the nodes again.
async fn back_again(stage: &str, nodes: &[Node], backend: &Sharded, work: &Work) {
    backend.fail("s0", false);
    sleep(Duration::from_millis(3100)).await;
    recover_s0(stage, nodes).await;
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s0")), Some(0.0));
    let before = work.calls();
    let x = key_on(stage, "s0", "back");
    for r in both(nodes, &x, 3).await {
        assert_eq!(r.unwrap(), format!("done:{x}"));
    }
    assert_eq!(
        work.calls() - before,
        1,
        "s0 coalesces across the nodes again"
    );
}

/// HYBRID leaders of `stage` that ran here because a breaker refused them.
fn circuit_open_fallbacks(stage: &str) -> u64 {
    counter_with(
        metric::LOCAL_FALLBACK_TOTAL,
        stage,
        "reason",
        "circuit_open",
    )
}

fn assert_only_s0_degraded(stage: &str, nodes: &[Node]) {
    for node in nodes {
        let degraded = degraded_names(&node.handle);
        assert_eq!(degraded, vec![s("s0")]);
        assert!(!node.handle.is_shard_degraded(&s("s1")));
        assert!(!node.handle.is_shard_degraded(&Shard::WHOLE));
        assert!(
            !node.handle.bulkhead().is_degraded(),
            "the stage-wide degraded limit stays off"
        );
        assert_eq!(
            node.handle.breakers().whole().state(),
            flightdeck::breaker::CircuitState::Closed
        );
    }
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s0")), Some(1.0));
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s1")), Some(0.0));
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_one_failing_shard_falls_back_alone_while_healthy_shards_coalesce_across_nodes() {
    metrics_on();
    let stage = "shard-hybrid";
    let (backend, work, nodes) = healthy(stage, Mode::Hybrid).await;
    assert_eq!(work.calls(), 2, "one execution per key for both nodes");
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s0")), Some(0.0));
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s1")), Some(0.0));

    backend.fail("s0", true);
    for r in open_s0(stage, &nodes, "open").await {
        assert!(
            r.unwrap().starts_with("done:"),
            "HYBRID runs s0's keys here"
        );
    }
    assert_only_s0_degraded(stage, &nodes);
    assert_eq!(
        nodes[0].handle.breakers().get(&s("s1")).unwrap().state(),
        flightdeck::breaker::CircuitState::Closed
    );

    // A key on s1 still runs once for both nodes.
    let before = work.calls();
    let y = key_on(stage, "s1", "healthy");
    for r in both(&nodes, &y, 3).await {
        assert_eq!(r.unwrap(), format!("done:{y}"));
    }
    assert_eq!(work.calls() - before, 1, "coalesced across the nodes");

    // A key on s0 runs in each node (once per node: L1 still coalesces).
    let fallbacks = circuit_open_fallbacks(stage);
    let before = work.calls();
    let x = key_on(stage, "s0", "degraded");
    for r in both(&nodes, &x, 3).await {
        assert_eq!(r.unwrap(), format!("done:{x}"));
    }
    assert_eq!(work.calls() - before, 2, "one local execution per node");
    assert_eq!(circuit_open_fallbacks(stage) - fallbacks, 2);

    // The degraded limit (1) holds s0's executions; s1's keep the normal
    // limit (4): three of them run next to one of s0's.
    let node = &nodes[0];
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..2 {
        let svc = node.slow.clone();
        let key = key_on(stage, "s0", &format!("lane-{i}"));
        calls.spawn(async move { ("s0", svc.oneshot(key).await) });
    }
    for i in 0..3 {
        let svc = node.slow.clone();
        let key = key_on(stage, "s1", &format!("normal-{i}"));
        calls.spawn(async move { ("s1", svc.oneshot(key).await) });
    }
    let mut answers = Vec::new();
    while let Some(done) = calls.join_next().await {
        let (shard, r) = done.unwrap();
        answers.push((shard == "s0", r));
    }
    assert_eq!(degraded_lane_tally(answers), (1, 1, 3));

    // s0 answers again: its breaker's probe closes it on each node, and
    // its keys coalesce across the nodes again.
    back_again(stage, &nodes, &backend, &work).await;
    assert!(samples_shard(metric::DEGRADED_DURATION, stage, Some("s0")) >= 2);
    assert_eq!(samples_shard(metric::DEGRADED_DURATION, stage, None), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_fails_fast_on_the_failing_shard_only() {
    metrics_on();
    let stage = "shard-dist-only";
    let (backend, work, nodes) = healthy(stage, Mode::DistributedOnly).await;

    backend.fail("s0", true);
    for r in open_s0(stage, &nodes, "open").await {
        let e = r.unwrap_err();
        assert_eq!(ErrorClass::of(&*e), ErrorClass::Unavailable, "{e}");
    }
    assert_only_s0_degraded(stage, &nodes);

    // s0's keys fail fast, refused by s0's breaker: nothing runs.
    let before = work.calls();
    let x = key_on(stage, "s0", "refused");
    for r in both(&nodes, &x, 2).await {
        let e = r.unwrap_err();
        assert_eq!(ErrorClass::of(&*e), ErrorClass::Unavailable, "{e}");
        let open = find::<CircuitOpen>(&*e).expect("refused by a breaker");
        assert!(open.to_string().contains(&format!("{stage}@s0")), "{open}");
    }
    assert_eq!(work.calls(), before);
    // s1's keys coalesce across the nodes.
    let y = key_on(stage, "s1", "healthy");
    for r in both(&nodes, &y, 3).await {
        assert_eq!(r.unwrap(), format!("done:{y}"));
    }
    assert_eq!(work.calls() - before, 1);

    back_again(stage, &nodes, &backend, &work).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forcing_the_stage_breaker_open_degrades_every_shard() {
    metrics_on();
    let stage = "shard-forced";
    let (_backend, work, nodes) = healthy(stage, Mode::Hybrid).await;
    let handle = &nodes[0].handle;
    handle.breaker().force_open();
    let degraded: Vec<Shard> = handle
        .degraded_shards()
        .into_iter()
        .map(|(shard, _)| shard)
        .collect();
    assert_eq!(
        degraded,
        vec![Shard::WHOLE],
        "the whole store, not one shard"
    );
    assert!(
        handle.bulkhead().is_degraded(),
        "the stage-wide degraded limit"
    );
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(1.0));
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s1")), Some(0.0));

    // A key on healthy s1: node 1 runs and stores it; node 0 would replay
    // it, but its breaker refuses every shard, so it runs it itself.
    let before = work.calls();
    let y = key_on(stage, "s1", "forced");
    assert_eq!(
        nodes[1].svc.clone().oneshot(y.clone()).await.unwrap(),
        format!("done:{y}")
    );
    nodes[1].handle.idle().await;
    let fallbacks = circuit_open_fallbacks(stage);
    assert_eq!(
        nodes[0].svc.clone().oneshot(y.clone()).await.unwrap(),
        format!("done:{y}")
    );
    assert_eq!(
        work.calls() - before,
        2,
        "node 0 did not replay node 1's result"
    );
    assert_eq!(circuit_open_fallbacks(stage) - fallbacks, 1);
    // Node 1, not forced, replays it.
    nodes[1].svc.clone().oneshot(y.clone()).await.unwrap();
    assert_eq!(work.calls() - before, 2);

    handle.breaker().reset();
    assert!(!handle.is_degraded());
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(0.0));
}

/// A degraded shard that stops serving flights (its primary was replaced:
/// nothing will ever probe its breaker again) stops being degraded within
/// the stage's shard check, on every node; its gauge goes back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_shard_that_went_away_is_forgotten() {
    metrics_on();
    let stage = "shard-gone";
    let (backend, _work, nodes) = healthy(stage, Mode::Hybrid).await;
    backend.fail("s0", true);
    open_s0(stage, &nodes, "open").await;
    assert_only_s0_degraded(stage, &nodes);

    backend.gone.lock().unwrap().insert("s0");
    let deadline = Instant::now() + Duration::from_secs(15);
    while nodes.iter().any(|n| n.handle.is_degraded()) {
        assert!(
            Instant::now() < deadline,
            "a shard that went away stays degraded"
        );
        sleep(Duration::from_millis(100)).await;
    }
    for node in &nodes {
        assert!(node.handle.degraded_shards().is_empty());
        assert!(
            node.handle.breakers().get(&s("s0")).is_none(),
            "its breaker is dropped"
        );
        assert!(node.handle.breakers().get(&s("s1")).is_some());
    }
    assert_eq!(gauge_shard(metric::DEGRADED, stage, Some("s0")), Some(0.0));
}
