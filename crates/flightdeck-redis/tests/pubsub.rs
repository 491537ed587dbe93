//! Pub/sub notices against a real `redis-server`: a follower that has
//! subscribed must get every notice published after that.
//!
//! fred 10.1 answers a (non-sharded) `SUBSCRIBE` as soon as it is written to
//! the socket, not when Redis has applied it (`Connection::push_command`,
//! `Command::has_no_responses`), so "subscribed" could be false for a while
//! after `subscribe` returned: a notice published by another connection in
//! that window was lost (about 1 in 10 conformance runs under load). The
//! backend now puts a `PING` on the subscriber connection behind every
//! `SUBSCRIBE`: Redis answers it only after the `SUBSCRIBE` before it.

use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{Backend, FlightId, Notice, Subscription};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_testkit::conformance::fresh_flight;
use flightdeck_testkit::RedisServer;

/// Subscribe, then at once publish (INVALIDATE) from the command
/// connection, many times over on parallel tasks: every notice arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_published_right_after_subscribe_is_never_lost() {
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
            for _ in 0..ROUNDS {
                let f = fresh_flight();
                let mut sub = b.subscribe(&f).await.expect("subscribe");
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
        "{lost} of {} notices published right after SUBSCRIBE were lost",
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

/// The subscriber connections of `servers` are cut. Each subscription
/// then sees a resync; a notice published right after it (while the
/// resubscription may still be under way) is either delivered or
/// followed by another resync (once the channel is subscribed again:
/// followers re-check then); and a notice published after that arrives.
async fn a_reconnect_loses_no_notice_unannounced(
    backend: &RedisBackend,
    servers: &[&RedisServer],
    flights: &[FlightId],
) {
    const QUIET: Duration = Duration::from_secs(5);
    let mut subs = Vec::new();
    for f in flights {
        subs.push(backend.subscribe(f).await.expect("subscribe"));
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
/// force; the backend resubscribes itself and says so with a second
/// resync.
#[tokio::test]
async fn after_a_subscriber_reconnect_no_notice_is_lost_unannounced() {
    let redis = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(RedisConfig::new(redis.url()))
        .await
        .expect("connect");
    let flights: Vec<FlightId> = (0..4).map(|_| fresh_flight()).collect();
    a_reconnect_loses_no_notice_unannounced(&backend, &[&redis], &flights).await;
}
