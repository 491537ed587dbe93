//! A backend created while Redis is down: it is usable at once (every call
//! fails fast as unavailable, nothing sent), reconnects in the background,
//! and coordinates across instances once Redis (a standalone server, or a
//! cluster primary that was down at start) is back.

mod short;

use std::future::Future;
use std::time::Duration;

use flightdeck_distributed::backend::{Acquired, Backend};
use flightdeck_distributed::{BackendErrorKind, OwnerToken};
use flightdeck_redis::RedisBackend;
use flightdeck_testkit::{RedisCluster, RedisSentinel, RedisServer};
use short::{config, flight, terms};
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

#[tokio::test]
async fn cluster_with_one_primary_down_at_start() {
    let mut cluster = RedisCluster::start(3).unwrap();
    cluster.node_mut(1).unwrap().kill();
    let a = RedisBackend::new(config(cluster.url())).expect("created with a primary down");
    let b = RedisBackend::new(config(cluster.url())).unwrap();
    assert_down(&a).await;

    cluster.node_mut(1).unwrap().restart().unwrap();
    // A key on every primary: each shard coordinates once its node is back.
    for i in 0..12 {
        assert_coordinates(&a, &b, &format!("cluster-{i}")).await;
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
