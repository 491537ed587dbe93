//! Pub/sub notices against a real `redis-server`: a follower must get
//! every notice about its flight published after its ACQUIRE answered
//! FOLLOWER (which added its node's inbox to the flight), or a resync.
//!
//! Two races are closed here. fred 10.1 answers a (non-sharded)
//! `SUBSCRIBE` as soon as it is written to the socket, not when Redis has
//! applied it (`Connection::push_command`, `Command::has_no_responses`), so
//! "subscribed" could be false for a while after `subscribe` returned: the
//! backend puts a `PING` on the subscriber connection behind every
//! `SUBSCRIBE` of an inbox (Redis answers it only after the `SUBSCRIBE`
//! before it). And a notice travels on the subscriber connection while the
//! ACQUIRE's answer travels on the command connection: the notice may
//! arrive first, before the follower read its subscription (which opens,
//! and registers, at its first read); the inbox keeps the last messages
//! for it.

use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{
    Acquired, Backend, FlightId, LeaseTerms, Notice, OwnerToken, Subscription,
};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::conformance::fresh_flight;

fn terms() -> LeaseTerms {
    LeaseTerms {
        lease: Duration::from_secs(30),
        state_ttl: Duration::from_secs(120),
        allow_takeover: true,
    }
}

/// Makes `backend`'s node a follower of `f` as the scripts know it:
/// another token holds the lease, and an ACQUIRE of `backend` answered
/// FOLLOWER (adding the node's inbox to the flight).
async fn follow(backend: &RedisBackend, f: &FlightId) {
    let owner = backend.acquire(f, &OwnerToken::random(), &terms()).await;
    assert!(matches!(owner, Ok(Acquired::Owner { .. })), "{owner:?}");
    let follower = backend.acquire(f, &OwnerToken::random(), &terms()).await;
    assert!(
        matches!(follower, Ok(Acquired::Follower { .. })),
        "{follower:?}"
    );
}

/// A follower's subscription (taken before its ACQUIRE, opened at its
/// first read; or, every other round, subscribed before it), then at once
/// a notice (INVALIDATE) from the command connection, many times over on
/// parallel tasks: every notice arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_published_right_after_follow_is_never_lost() {
    const TASKS: usize = 8;
    const ROUNDS: usize = 150;
    let redis = RedisServer::start().expect("redis-server");
    let backend = Arc::new(
        RedisBackend::connect(RedisConfig::new(redis.url()))
            .await
            .expect("connect"),
    );
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let b = Arc::clone(&backend);
        tasks.push(tokio::spawn(async move {
            let mut lost = 0;
            for round in 0..ROUNDS {
                let f = fresh_flight();
                let mut sub = if round % 2 == 0 {
                    let sub = b.join_subscription(&f).expect("the inbox is in force");
                    follow(&b, &f).await;
                    sub
                } else {
                    let sub = b.subscribe(&f).await.expect("subscribe");
                    follow(&b, &f).await;
                    sub
                };
                let generation = b
                    .invalidate(&f, Duration::from_secs(30))
                    .await
                    .expect("invalidate");
                match tokio::time::timeout(Duration::from_secs(2), sub.recv()).await {
                    Ok(Some(Notice::Abandoned { generation: g })) => assert_eq!(g, generation),
                    Ok(other) => panic!("unexpected notice {other:?}"),
                    Err(_) => lost += 1,
                }
            }
            lost
        }));
    }
    let mut lost = 0;
    for t in tasks {
        lost += t.await.expect("task");
    }
    assert_eq!(
        lost,
        0,
        "{lost} of {} notices published right after a follower's ACQUIRE were lost",
        TASKS * ROUNDS
    );
}

/// What a follower's subscription says within `within`: a notice, or
/// `None` for silence.
async fn next(sub: &mut Subscription, within: Duration) -> Option<Notice> {
    tokio::time::timeout(within, sub.recv())
        .await
        .ok()
        .flatten()
}

/// The subscriber connections of `servers` are cut. Each follower's
/// subscription then sees a resync; a notice published right after it
/// (while the inbox's resubscription may still be under way) is either
/// delivered or followed by another resync (once the inbox is subscribed
/// again: followers re-check then); and a notice published after that
/// (to a follower that followed again, as its re-check does) arrives.
async fn a_reconnect_loses_no_notice_unannounced(
    backend: &RedisBackend,
    servers: &[&RedisServer],
    flights: &[FlightId],
) {
    const QUIET: Duration = Duration::from_secs(5);
    let mut subs = Vec::new();
    for f in flights {
        subs.push(backend.subscribe(f).await.expect("subscribe"));
        follow(backend, f).await;
    }
    for s in servers {
        s.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    }
    let mut first = Vec::new();
    for (i, (f, sub)) in flights.iter().zip(&mut subs).enumerate() {
        assert_eq!(
            next(sub, QUIET).await,
            Some(Notice::Resync),
            "flight {i}: the reconnect"
        );
        first.push(
            backend
                .invalidate(f, Duration::from_secs(30))
                .await
                .unwrap(),
        );
    }
    for (i, sub) in subs.iter_mut().enumerate() {
        loop {
            match next(sub, QUIET).await {
                Some(Notice::Resync) => break,
                Some(Notice::Abandoned { generation }) if generation == first[i] => {}
                other => panic!("flight {i}: a notice lost unannounced ({other:?})"),
            }
        }
    }
    for (i, (f, sub)) in flights.iter().zip(&mut subs).enumerate() {
        follow(backend, f).await;
        let generation = backend
            .invalidate(f, Duration::from_secs(30))
            .await
            .unwrap();
        loop {
            match next(sub, QUIET).await {
                Some(Notice::Abandoned { generation: g }) if g == generation => break,
                Some(Notice::Resync) => {}
                Some(Notice::Abandoned { generation: g }) if g == first[i] => {}
                other => panic!("flight {i}: not subscribed again after the reconnect ({other:?})"),
            }
        }
    }
}

/// One server: fred reports the reconnect before its resubscription is in
/// force; the backend resubscribes the inbox itself and says so with a
/// second resync.
#[tokio::test]
async fn after_a_subscriber_reconnect_no_notice_is_lost_unannounced() {
    let redis = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(RedisConfig::new(redis.url()))
        .await
        .expect("connect");
    let flights: Vec<FlightId> = (0..4).map(|_| fresh_flight()).collect();
    a_reconnect_loses_no_notice_unannounced(&backend, &[&redis], &flights).await;
}
