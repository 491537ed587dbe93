//! A token whose attempt ended (it committed, abandoned or released) is
//! never granted the flight again, however late a duplicate of its
//! ACQUIRE arrives: on the Redis scripts (a real Redis) and on the memory
//! backend kept in step with them. Found by the protocol model
//! (`flightdeck-model`), whose run each test replays.

use std::time::Duration;

use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, CommitArgs, Committed, LeaseTerms, Released,
};
use flightdeck_distributed::{FlightId, OwnerToken};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::MemoryBackend;

const TERMS: LeaseTerms = LeaseTerms {
    lease: Duration::from_secs(30),
    state_ttl: Duration::from_secs(120),
    allow_takeover: true,
};

fn flight(name: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(
        StageName::new("ended").unwrap(),
        name,
    ))
}

fn no_failure() -> AbandonArgs {
    AbandonArgs {
        failure: None,
        failure_ttl: Duration::ZERO,
        state_ttl: TERMS.state_ttl,
        retry_after: Duration::ZERO,
    }
}

async fn owner(b: &dyn Backend, flight: &FlightId, tok: &OwnerToken) -> u64 {
    match b.acquire(flight, tok, &TERMS).await.unwrap() {
        Acquired::Owner { generation, .. } => generation,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The model's trace (2 nodes, 3 tokens): node 1's ACQUIRE of token 1 is
/// cut off and stays on its way; its retry with the same token is granted
/// and abandons; node 0's token 2 is granted and abandons; then the first
/// ACQUIRE of token 1 reaches the server. It was granted the flight: a
/// lease nobody works on, blocking the key for a lease (without takeover,
/// two). An attempt that ended is never granted again.
async fn late_acquire_of_an_abandoned_token(b: &dyn Backend) {
    let f = flight("abandoned");
    let (t1, t2) = (OwnerToken::random(), OwnerToken::random());
    let g1 = owner(b, &f, &t1).await;
    assert_eq!(
        b.abandon(&f, &t1, g1, &no_failure()).await.unwrap(),
        Released::Released
    );
    let g2 = owner(b, &f, &t2).await;
    assert_eq!(
        b.abandon(&f, &t2, g2, &no_failure()).await.unwrap(),
        Released::Released
    );
    let late = b.acquire(&f, &t1, &TERMS).await.unwrap();
    assert!(
        matches!(late, Acquired::Expired { .. }),
        "a late ACQUIRE of an abandoned token: {late:?}"
    );
}

/// The same after a commit and an invalidation: the committed token's
/// late ACQUIRE is not granted the invalidated flight.
async fn late_acquire_of_a_committed_token(b: &dyn Backend) {
    let f = flight("committed");
    let t1 = OwnerToken::random();
    let g1 = owner(b, &f, &t1).await;
    let args = CommitArgs {
        payload: "v".into(),
        ttl: Duration::from_secs(60),
        retain: Duration::from_secs(60),
        inline_below: 1024,
        state_ttl: TERMS.state_ttl,
        stale_for: Duration::ZERO,
        work_time: Duration::ZERO,
        sent: None,
    };
    assert_eq!(
        b.commit(&f, &t1, g1, &args).await.unwrap(),
        Committed::Committed
    );
    b.invalidate(&f, TERMS.state_ttl).await.unwrap();
    let late = b.acquire(&f, &t1, &TERMS).await.unwrap();
    assert!(
        matches!(late, Acquired::Expired { .. }),
        "a late ACQUIRE of a committed token after an invalidation: {late:?}"
    );
    // A fresh token is granted it.
    owner(b, &f, &OwnerToken::random()).await;
}

#[tokio::test]
async fn redis_never_grants_an_ended_attempt_again() {
    let server = RedisServer::start().expect("redis-server starts");
    let b = RedisBackend::connect(RedisConfig::new(server.url()))
        .await
        .expect("connects");
    late_acquire_of_an_abandoned_token(&b).await;
    late_acquire_of_a_committed_token(&b).await;
}

#[tokio::test]
async fn memory_never_grants_an_ended_attempt_again() {
    let b = MemoryBackend::new();
    late_acquire_of_an_abandoned_token(&b).await;
    late_acquire_of_a_committed_token(&b).await;
}
