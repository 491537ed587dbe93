//! Each row of `docs/redis-errors.md` that needs a real server: the
//! failure is produced against the testkit's Redis (or cluster) and the
//! backend's error class is checked.

mod short;

use std::time::Duration;

use flightdeck_distributed::backend::Backend;
use flightdeck_distributed::{BackendErrorKind, OwnerToken};
use flightdeck_redis::RedisBackend;
use flightdeck_testkit::{RedisCluster, RedisServer};
use short::{config, flight, keys_by_node, terms};

async fn acquire_kind(b: &RedisBackend, key: &str) -> Option<BackendErrorKind> {
    let (f, token, terms) = (flight(key), OwnerToken::random(), terms());
    let call = b.acquire(&f, &token, &terms);
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.kind()),
        Err(_) => panic!("acquire {key}: no answer within 5 s"),
    }
}

/// Row "server killed (connection refused, reconnecting)": unavailable,
/// not outcome unknown — the script was never sent.
#[tokio::test]
async fn killed_server_is_unavailable_not_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    assert_eq!(acquire_kind(&b, "up").await, None);
    redis.kill();
    // Let fred see the dropped connection and fail to reconnect.
    let _ = b.ready(Duration::from_millis(0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        assert_eq!(
            acquire_kind(&b, &format!("down-{i}")).await,
            Some(BackendErrorKind::Unavailable)
        );
    }
}

/// Row "a cluster primary down": the flights of its slots are refused as
/// unavailable at once (before anything is sent: `reject_early`, and the
/// call itself fails fast), the other primaries' flights are served.
#[tokio::test]
async fn dead_cluster_primary_is_unavailable_for_its_slots_only() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &b, 3);
    let dead = format!("127.0.0.1:{}", cluster.nodes()[1].port());
    assert_eq!(acquire_kind(&b, &keys[1][0]).await, None);
    cluster.node_mut(1).unwrap().kill();
    // The backend sees the loss (its connection to that primary fails).
    let seen = tokio::time::Instant::now();
    while b.reject_early(&b.shard(&flight(&keys[1][1]))).is_none() {
        assert!(seen.elapsed() < Duration::from_secs(5), "loss not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for key in &keys[1][1..] {
        let refused = b
            .reject_early(&b.shard(&flight(key)))
            .expect("refused early");
        assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
        assert!(refused.to_string().contains(&dead), "{refused}");
        let started = tokio::time::Instant::now();
        assert_eq!(
            acquire_kind(&b, key).await,
            Some(BackendErrorKind::Unavailable)
        );
        let took = started.elapsed();
        assert!(took < Duration::from_millis(200), "{key}: {took:?}");
    }
    for key in keys[0].iter().chain(&keys[2]) {
        assert!(b.reject_early(&b.shard(&flight(key))).is_none(), "{key}");
        assert_eq!(acquire_kind(&b, key).await, None, "{key}");
    }
    assert!(b.unreachable().is_none(), "two primaries are connected");
}

/// Row "TRYAGAIN / ASK while a slot migrates, beyond the deadline":
/// unavailable, never protocol.
#[tokio::test]
async fn slot_in_migration_is_unavailable() {
    let cluster = RedisCluster::start(2).unwrap();
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let f = flight("moving");
    let record = b.keys(&f)[0].clone();
    // A stored record, so the old owner answers TRYAGAIN or ASK.
    assert_eq!(acquire_kind(&b, "moving").await, None);
    let slot = cluster.keyslot(&record).unwrap();
    let from = cluster.slot_owner(slot).unwrap();
    let migration = cluster
        .begin_migration(slot, 1 - from)
        .unwrap()
        .expect("the slot moves to the other node");
    let kind = acquire_kind(&b, "moving").await;
    assert_eq!(kind, Some(BackendErrorKind::Unavailable));
    // Subscribing while the slot moves works (the old owner serves it).
    let sub = tokio::time::timeout(Duration::from_secs(5), b.subscribe(&f))
        .await
        .expect("subscribe answers")
        .expect("subscribes during the migration");
    cluster.migrate_all_keys(&migration).unwrap();
    cluster.finish_migration(&migration).unwrap();
    assert_eq!(
        acquire_kind(&b, "moving").await,
        None,
        "served again after the move"
    );
    // Subscribing after the move: fred's subscriber may give up (its
    // attempts used up by the redirect); that is unavailable, never a
    // protocol error.
    drop(sub);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = tokio::time::timeout(Duration::from_secs(5), b.subscribe(&f))
        .await
        .expect("subscribe answers");
    if let Err(e) = after {
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
    }
}
