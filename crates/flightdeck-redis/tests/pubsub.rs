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

use flightdeck_distributed::backend::{Backend, Notice};
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
