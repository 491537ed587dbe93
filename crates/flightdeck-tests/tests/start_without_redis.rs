//! A node whose Redis is down when it starts: the backend is created
//! anyway, a HYBRID stage starts degraded (breaker open, gauge set) and
//! serves every request in its own process; once Redis answers, the
//! breaker's half-open probe closes it and two nodes coalesce again. A
//! DISTRIBUTED_ONLY stage fails fast meanwhile.

mod common;

use std::time::Duration;

use common::*;
use flightdeck::core::error::{find, CircuitOpen, CoordinationUnavailable};
use flightdeck::core::metric;
use flightdeck::Mode;
use flightdeck_breaker::CircuitState;
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::time::{timeout, Instant};
use tower::ServiceExt;

fn config(url: String) -> RedisConfig {
    RedisConfig::new(url)
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .reconnect_max_delay(Duration::from_millis(100))
}

fn probing(mode: Mode) -> flightdeck::StageConfig {
    let mut cfg = fast(mode);
    cfg.breaker.wait_in_open = Duration::from_millis(200);
    cfg.breaker.half_open_probes = 1;
    cfg
}

/// Down at start: `new` works, and the first connection attempt has
/// failed by the time the layer is built (`ready` says so).
async fn down_backend(url: &str) -> RedisBackend {
    let b = RedisBackend::new(config(url.to_owned())).expect("created while Redis is down");
    let err = b.ready(Duration::from_millis(300)).await.unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_starts_degraded_then_coalesces_across_nodes_when_redis_starts() {
    metrics_on();
    let mut redis = RedisServer::start().unwrap();
    redis.kill();
    let url = redis.url();
    let stage = "start-hybrid";
    let work = Work::default();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let layer = builder(stage)
            .stage(stage, probing(Mode::Hybrid))
            .backend("redis", down_backend(&url).await)
            .build()
            .expect("builds with Redis down");
        let handle = layer.stage(stage).unwrap();
        assert!(handle.is_degraded(), "starts degraded");
        assert_eq!(handle.breaker().state(), CircuitState::Open);
        nodes.push((
            stack(&layer, &work, Duration::from_millis(50)),
            handle,
            layer,
        ));
    }
    assert_eq!(gauge(metric::DEGRADED, stage), Some(1.0));

    // Each node serves in its own process.
    for (svc, _, _) in &nodes {
        let out = timeout(Duration::from_secs(5), svc.clone().oneshot("q".into()))
            .await
            .expect("served while Redis is down");
        assert_eq!(out.unwrap(), "done:q");
    }
    assert_eq!(work.calls(), 2, "one local execution per node");

    redis.restart().unwrap();
    // Requests keep flowing; a half-open probe finds Redis and closes the
    // breaker on each node.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut i = 0;
    while nodes.iter().any(|(_, h, _)| h.is_degraded()) {
        assert!(
            Instant::now() < deadline,
            "still degraded after Redis started"
        );
        for (svc, _, _) in &nodes {
            i += 1;
            svc.clone().oneshot(format!("probe-{i}")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gauge(metric::DEGRADED, stage), Some(0.0));

    let before = work.calls();
    let (a, b) = tokio::join!(
        burst(nodes[0].0.clone(), "together", 5),
        burst(nodes[1].0.clone(), "together", 5)
    );
    for r in a.into_iter().chain(b) {
        assert_eq!(r.unwrap(), "done:together");
    }
    assert_eq!(work.calls() - before, 1, "two nodes, one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_only_fails_fast_while_redis_is_down() {
    metrics_on();
    let mut redis = RedisServer::start().unwrap();
    redis.kill();
    let stage = "start-dist-only";
    let work = Work::default();
    let layer = builder(stage)
        .stage(stage, probing(Mode::DistributedOnly))
        .backend("redis", down_backend(&redis.url()).await)
        .build()
        .unwrap();
    assert!(layer.stage(stage).unwrap().is_degraded());
    let svc = stack(&layer, &work, Duration::from_millis(50));
    let err = timeout(Duration::from_secs(5), svc.clone().oneshot("q".into()))
        .await
        .expect("fails fast")
        .unwrap_err();
    assert!(
        find::<CircuitOpen>(&*err).is_some() || find::<CoordinationUnavailable>(&*err).is_some(),
        "{err}"
    );
    assert_eq!(work.calls(), 0);
}

/// Built at once on a backend whose Redis is down (no `ready` wait): the
/// stage is degraded before any request, with its gauge and a log line,
/// and goes distributed by itself when Redis starts, while idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_started_without_redis_is_degraded_until_redis_starts() {
    metrics_on();
    let mut redis = RedisServer::start().unwrap();
    redis.kill();
    let stage = "start-idle";
    let backend = RedisBackend::new(config(redis.url())).expect("created while Redis is down");
    let layer = builder(stage)
        .stage(stage, probing(Mode::Hybrid))
        .backend("redis", backend)
        .build()
        .expect("builds with Redis down");
    let handle = layer.stage(stage).unwrap();
    assert!(handle.is_degraded(), "degraded from the first moment");
    assert_eq!(gauge(metric::DEGRADED, stage), Some(1.0));

    redis.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while handle.is_degraded() {
        assert!(
            Instant::now() < deadline,
            "still degraded after Redis started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gauge(metric::DEGRADED, stage), Some(0.0));
    assert_eq!(handle.breaker().state(), CircuitState::Closed);

    // The first request coordinates through Redis.
    let work = Work::default();
    let svc = stack(&layer, &work, Duration::from_millis(5));
    assert_eq!(svc.oneshot("q".into()).await.unwrap(), "done:q");
    assert_eq!(counter(metric::DISTRIBUTED_REQUEST_TOTAL, stage), 1);
}
