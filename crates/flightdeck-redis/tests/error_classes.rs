//! Each row of `docs/redis-errors.md` that needs a real server: the
//! failure is produced against the testkit's Redis (or cluster) and the
//! backend's error class is checked.

mod short;

use std::future::Future;
use std::time::Duration;

use flightdeck_distributed::backend::Backend;
use flightdeck_distributed::{BackendError, BackendErrorKind, OwnerToken};
use flightdeck_redis::RedisBackend;
use flightdeck_testkit::{RedisCluster, RedisServer};
use fred::interfaces::ClientLike;
use short::{config, flight, keys_by_node, terms};

async fn acquire_kind(b: &RedisBackend, key: &str) -> Option<BackendErrorKind> {
    acquire_error(b, key).await.map(|e| e.kind())
}

/// The error of an ACQUIRE by a fresh token (`None`: it succeeded).
async fn acquire_error(b: &RedisBackend, key: &str) -> Option<BackendError> {
    let (f, token, terms) = (flight(key), OwnerToken::random(), terms());
    error_of(&format!("acquire {key}"), b.acquire(&f, &token, &terms)).await
}

/// One call's error (`None`: it succeeded), within 5 s.
async fn error_of<T>(
    what: &str,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Option<BackendError> {
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => panic!("{what}: no answer within 5 s"),
    }
}

/// Asserts that `e` is unavailable and names `word` (Redis's reply, say).
fn assert_unavailable(e: Option<BackendError>, word: &str) {
    let e = e.expect("the call failed");
    assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains(word), "{word}: {e}");
}

/// Rows "reconnecting after a loss" and "connection refused": the server
/// killed, fred's reconnection attempts are refused (`IO` "Connection
/// refused"). Every call is refused before it is sent, naming that
/// error: unavailable, not outcome unknown — the script was never sent.
/// The layer's own check before a flight (`reject_early`) says the same.
#[tokio::test]
async fn killed_server_is_unavailable_not_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    assert_eq!(acquire_kind(&b, "up").await, None);
    redis.kill();
    // Let fred see the dropped connection and fail to reconnect.
    let _ = b.ready(Duration::from_millis(0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = b.reject_early(&b.shard(&flight("down"))).expect("refused");
    assert_unavailable(Some(early), "Connection refused");
    for i in 0..3 {
        let e = acquire_error(&b, &format!("down-{i}")).await;
        assert_unavailable(e, "Connection refused");
    }
}

/// Row "reconnecting after a loss": a call made after fred saw the
/// connection close and before its first reconnection attempt (50 ms or
/// more later) was written nowhere. fred still says "connected" then, so
/// its `fail_fast` lets the call in, and its router holds it behind the
/// reconnection until the call's timeout (outcome unknown, for a script
/// that was never sent). The backend refuses it: unavailable, at once
/// when the reconnection fails (Redis is down).
#[tokio::test]
async fn call_just_after_a_loss_is_unavailable_not_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    // The window is short: try until a call lands in it.
    for _ in 0..10 {
        assert_eq!(acquire_kind(&b, "before").await, None);
        redis.kill();
        // fred reads the close (and says why on its error channel).
        tokio::time::sleep(Duration::from_millis(10)).await;
        if b.client().is_connected() {
            let e = acquire_error(&b, "just-after").await;
            assert_unavailable(e, "Connection refused");
            return;
        }
        redis.restart().unwrap();
        b.ready(Duration::from_secs(5)).await.unwrap();
    }
    panic!("no call made while fred still said connected after the loss");
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
