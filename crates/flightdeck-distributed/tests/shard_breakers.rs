//! The breaker decorator keeps one breaker per shard: a shard's failures
//! open only its own, and the whole store's breaker judges every flight
//! while it is not closed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_breaker::{Breaker, BreakerConfig, CircuitState};
use flightdeck_core::{FlightKey, StageName};

use flightdeck_distributed::backend::{
    Acquired, Ask, Backend, BackendError, BackendFuture, FlightId, LeaseTerms, OwnerToken, Shard,
};
use flightdeck_distributed::GuardedBackend;
use flightdeck_test::MemoryBackend;

/// The memory backend on two shards ("a" for keys starting with `a`,
/// "b" otherwise); the first acquires of a failing shard's flights
/// are unavailable.
#[derive(Default)]
struct TwoShards {
    inner: MemoryBackend,
    failing: Mutex<HashSet<Shard>>,
    names: Mutex<Vec<(FlightId, Shard)>>,
}

impl TwoShards {
    fn flight(&self, key: &str) -> FlightId {
        let flight = FlightId::of(&FlightKey::from_bytes(StageName::new("s").unwrap(), key));
        let shard = Shard::new(if key.starts_with('a') { "a" } else { "b" });
        self.names.lock().unwrap().push((flight, shard));
        flight
    }

    fn fail(&self, shard: &str, yes: bool) {
        let mut failing = self.failing.lock().unwrap();
        if yes {
            failing.insert(Shard::new(shard));
        } else {
            failing.remove(&Shard::new(shard));
        }
    }
}

impl Backend for TwoShards {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        if self.failing.lock().unwrap().contains(&self.shard(flight)) {
            return Box::pin(async { Err(BackendError::unavailable("shard down")) });
        }
        self.inner.acquire_with(flight, token, ask, terms)
    }

    fn sharded(&self) -> bool {
        true
    }

    fn shard(&self, flight: &FlightId) -> Shard {
        let names = self.names.lock().unwrap();
        names
            .iter()
            .find(|(f, _)| f == flight)
            .map_or(Shard::WHOLE, |(_, s)| s.clone())
    }

    flightdeck_distributed::forward_backend!(inner => heartbeat, commit, abandon, invalidate, subscribe, release, unreachable, invalidated_since, wait_replicas, call_timeout_hint);
}

fn terms() -> LeaseTerms {
    LeaseTerms {
        lease: Duration::from_secs(5),
        state_ttl: Duration::from_secs(20),
        allow_takeover: true,
    }
}

#[tokio::test(start_paused = true)]
async fn one_shards_failures_open_only_its_own_breaker_until_its_probe_succeeds() {
    let whole = Breaker::new(
        "stage",
        BreakerConfig::default()
            .consecutive_failures(2)
            .wait_in_open(Duration::from_secs(1))
            .jitter(0.0, 0.0)
            .half_open_probes(1)
            .success_threshold(1),
    )
    .unwrap();
    let backend = Arc::new(TwoShards::default());
    let guarded = GuardedBackend::new(Arc::clone(&backend), whole.clone());
    let mut published = guarded.breakers().watch();
    let token = OwnerToken::random();
    backend.fail("a", true);

    for i in 0..2 {
        let f = backend.flight(&format!("a{i}"));
        assert!(
            guarded.reject_early(&guarded.shard(&f)).is_none(),
            "closed: not refused yet"
        );
        let err = guarded.acquire(&f, &token, &terms()).await.unwrap_err();
        assert!(!err.is_rejected(), "the backend's own failure");
    }
    let a = guarded
        .breakers()
        .get(&Shard::new("a"))
        .expect("created on first use");
    assert_eq!(a.name(), "stage@a");
    assert_eq!(a.state(), CircuitState::Open);
    assert!(guarded.breakers().is_degraded(&Shard::new("a")));
    assert!(!guarded.breakers().is_degraded(&Shard::WHOLE));
    assert_eq!(
        whole.state(),
        CircuitState::Closed,
        "the whole store is not judged"
    );

    // Shard a's flights are refused before any call; shard b's go on.
    let fa = backend.flight("a-next");
    let refused = guarded
        .reject_early(&guarded.shard(&fa))
        .expect("a's breaker is open");
    assert!(refused.is_rejected());
    assert!(refused.to_string().contains("stage@a"), "{refused}");
    let fb = backend.flight("b1");
    assert!(guarded.reject_early(&guarded.shard(&fb)).is_none());
    assert!(matches!(
        guarded.acquire(&fb, &token, &terms()).await.unwrap(),
        Acquired::Owner { .. }
    ));
    let b = guarded.breaker_for(&fb);
    assert_eq!(b.name(), "stage@b");
    assert_eq!(b.state(), CircuitState::Closed);
    assert!(published.has_changed().unwrap());
    let seen: Vec<(Shard, bool)> = published
        .borrow_and_update()
        .iter()
        .map(|(shard, since)| (shard.clone(), since.is_some()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (Shard::WHOLE, false),
            (Shard::new("a"), true),
            (Shard::new("b"), false)
        ],
        "each shard's breaker published, and which is degraded"
    );

    // Shard a recovers: after the open wait its probe succeeds and
    // closes its breaker.
    backend.fail("a", false);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(guarded.reject_early(&guarded.shard(&fa)).is_none());
    assert_eq!(a.state(), CircuitState::HalfOpen);
    guarded.acquire(&fa, &token, &terms()).await.unwrap();
    assert_eq!(a.state(), CircuitState::Closed);
    assert!(published.has_changed().unwrap(), "a's recovery published");
    assert!(!guarded.breakers().any_degraded());
}

#[tokio::test(start_paused = true)]
async fn the_whole_store_breaker_judges_every_flight_while_it_is_not_closed() {
    let whole = Breaker::new("stage", BreakerConfig::default()).unwrap();
    let backend = Arc::new(TwoShards::default());
    let guarded = GuardedBackend::new(Arc::clone(&backend), whole.clone());
    let fa = backend.flight("a1");
    assert_eq!(guarded.breaker_for(&fa).name(), "stage@a");
    whole.force_open();
    assert_eq!(guarded.breaker_for(&fa).name(), "stage");
    let refused = guarded
        .reject_early(&guarded.shard(&fa))
        .expect("forced open for every shard");
    assert!(refused.is_rejected());
    let err = guarded
        .acquire(&fa, &OwnerToken::random(), &terms())
        .await
        .unwrap_err();
    assert!(err.is_rejected());
    whole.reset();
    assert!(guarded.reject_early(&guarded.shard(&fa)).is_none());
    // A flight on no named shard is the whole store's.
    let other = FlightId::of(&FlightKey::from_bytes(StageName::new("s").unwrap(), "x"));
    assert_eq!(guarded.breaker_for(&other).name(), "stage");
}
