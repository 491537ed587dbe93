//! A backend created while Redis is down: it is usable at once (every call
//! fails fast as unavailable, nothing sent), reconnects in the background,
//! and coordinates across instances once Redis (a standalone server, a
//! sentinel's primary, a cluster's primaries) is back. A cluster with some
//! primaries down serves the others' flights from the start.

mod short;

use std::future::Future;
use std::time::Duration;

use flightdeck_distributed::backend::{Acquired, Backend};
use flightdeck_distributed::{BackendErrorKind, OwnerToken};
use flightdeck_harness::{RedisCluster, RedisSentinel, RedisServer};
use flightdeck_redis::RedisBackend;
use short::{config, flight, keys_by_node, terms};
use tokio::time::timeout;

async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {secs} s"))
}

/// While down: `new` succeeds, `ready` names the refusal, a call is
/// refused as unavailable before it is sent (and so is a subscription).
async fn assert_down(b: &RedisBackend) {
    let err = b.ready(Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("not connected"), "{err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");
    let refused = b.unreachable().expect("refused before the call is built");
    assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
    let err = within(
        5,
        "acquire while down",
        b.acquire(&flight("x"), &OwnerToken::random(), &terms()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    let err = within(5, "subscribe while down", b.subscribe(&flight("x")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
}

/// Two instances agree on one owner for a flight.
async fn assert_coordinates(a: &RedisBackend, b: &RedisBackend, key: &str) {
    within(20, "a ready", a.ready(Duration::from_secs(20)))
        .await
        .unwrap();
    within(20, "b ready", b.ready(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(a.unreachable().is_none() && b.unreachable().is_none());
    let f = flight(key);
    // A cluster is ready with some primaries still reconnecting, and a
    // restarted primary answers CLUSTERDOWN until it has rejoined: wait
    // for this flight's primary to serve.
    within(20, "the flight's primary serves", async {
        while a.reject_early(&a.shard(&f)).is_some()
            || b.reject_early(&b.shard(&f)).is_some()
            || a.invalidate(&f, Duration::from_secs(20)).await.is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let first = a.acquire(&f, &OwnerToken::random(), &terms()).await;
    assert!(matches!(first, Ok(Acquired::Owner { .. })), "{first:?}");
    let second = b.acquire(&f, &OwnerToken::random(), &terms()).await;
    assert!(
        matches!(second, Ok(Acquired::Follower { .. })),
        "{second:?}"
    );
    let _sub = b.subscribe(&f).await.expect("subscribes once connected");
}

#[tokio::test]
async fn standalone_redis_down_at_start() {
    let mut redis = RedisServer::start().unwrap();
    redis.kill();
    let a = RedisBackend::new(config(redis.url())).expect("created while Redis is down");
    let b = RedisBackend::new(config(redis.url())).unwrap();
    assert_down(&a).await;
    assert!(!a.is_connected());
    // The strict form still fails, and says why.
    let err = within(5, "connect", RedisBackend::connect(config(redis.url())))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");

    redis.restart().unwrap();
    assert_coordinates(&a, &b, "standalone").await;
}

/// A backend created with one primary down is ready and serves the other
/// primaries' flights at once; the down primary's flights are refused as
/// unavailable until it is back, then served too.
#[tokio::test]
async fn cluster_with_one_primary_down_at_start() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let probe = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &probe, 4);
    probe.quit().await;
    cluster.node_mut(1).unwrap().kill();
    let a = RedisBackend::new(config(cluster.url())).expect("created with a primary down");
    let b = RedisBackend::new(config(cluster.url())).unwrap();
    within(10, "a ready", a.ready(Duration::from_secs(5)))
        .await
        .expect("ready with two primaries of three");
    within(10, "b ready", b.ready(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(!a.is_connected(), "one primary is down");
    assert!(a.unreachable().is_none());
    for key in keys[0].iter().chain(&keys[2]) {
        assert_coordinates(&a, &b, key).await;
    }
    for key in &keys[1] {
        let refused = a
            .reject_early(&a.shard(&flight(key)))
            .expect("its primary is down");
        assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
        let err = within(
            5,
            "acquire",
            a.acquire(&flight(key), &OwnerToken::random(), &terms()),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    }

    cluster.node_mut(1).unwrap().restart().unwrap();
    for key in &keys[1] {
        assert_coordinates(&a, &b, key).await;
    }
    assert!(a.is_connected());
}

/// A backend created with every primary down is refused like one server
/// down, and converges (slot map, every primary) once they are back.
#[tokio::test]
async fn cluster_with_every_primary_down_at_start() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let probe = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &probe, 1);
    probe.quit().await;
    for i in 0..3 {
        cluster.node_mut(i).unwrap().kill();
    }
    let a = RedisBackend::new(config(cluster.url())).expect("created with every primary down");
    let b = RedisBackend::new(config(cluster.url())).unwrap();
    assert_down(&a).await;
    assert!(
        a.reject_early(&a.shard(&flight("x"))).is_some(),
        "no slot map yet"
    );

    for i in 0..3 {
        cluster.node_mut(i).unwrap().restart().unwrap();
    }
    for key in keys.iter().flatten() {
        assert_coordinates(&a, &b, key).await;
    }
}

#[tokio::test]
async fn sentinel_primary_unreachable_at_start() {
    let mut sentinel = RedisSentinel::start().unwrap();
    // Both data nodes down: the sentinels still name the primary, which
    // refuses connections, and no failover can happen meanwhile.
    for node in sentinel.data_nodes_mut().iter_mut() {
        node.kill();
    }
    let a = RedisBackend::new(config(sentinel.url())).expect("created with the primary down");
    let b = RedisBackend::new(config(sentinel.url())).unwrap();
    assert_down(&a).await;

    for node in sentinel.data_nodes_mut().iter_mut() {
        node.restart().unwrap();
    }
    assert_coordinates(&a, &b, "sentinel").await;
}

#[test]
fn new_outside_a_runtime_is_an_error_not_a_panic() {
    let err = RedisBackend::new(config("redis://127.0.0.1:1".into())).unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}

/// A timeout too long to add to the clock (or none at all) is refused by
/// name when the backend is made, before anything connects: not a panic
/// (`connect` added two of them at once), nor a deadline that every call
/// misses.
#[tokio::test]
async fn a_timeout_out_of_range_is_an_error_not_a_panic() {
    let url = || "redis://127.0.0.1:1".to_owned();
    let err = RedisBackend::connect(config(url()).connect_timeout(Duration::MAX))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("connect timeout"), "{err}");
    for (name, cfg) in [
        (
            "command timeout",
            config(url()).command_timeout(Duration::MAX),
        ),
        (
            "command timeout",
            config(url()).command_timeout(Duration::ZERO),
        ),
        (
            "connect timeout",
            config(url()).connect_timeout(Duration::ZERO),
        ),
        (
            "migration retry",
            config(url()).migration_retry(Duration::MAX),
        ),
        (
            "reconnect max delay",
            config(url()).reconnect_max_delay(Duration::MAX),
        ),
        (
            "subscriber ping",
            config(url()).subscriber_ping(Duration::MAX),
        ),
    ] {
        let err = RedisBackend::new(cfg).unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Protocol, "{err}");
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
}

/// `ready` given no deadline to speak of (`Duration::MAX`) waits as long
/// as it takes: it answered a panic, adding the wait to the clock.
#[tokio::test]
async fn ready_without_a_deadline_waits_and_does_not_panic() {
    let redis = RedisServer::start().unwrap();
    let b = RedisBackend::new(config(redis.url())).unwrap();
    within(10, "ready", b.ready(Duration::MAX)).await.unwrap();
}
