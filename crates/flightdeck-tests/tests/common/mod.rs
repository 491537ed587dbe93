//! Shared helpers of the facade tests: the metrics recorder's readers
//! (flightdeck-test's), a counting inner service, stage settings for fast
//! tests, backends on the harness's real Redis servers, and a
//! protocol-garbage backend wrapper.

#![allow(dead_code, unreachable_pub)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck::core::error::{find, BoxError, BulkheadFull, ErrorClass};
use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::backend::{
    Acquired, Ask, Backend, BackendError, BackendFuture, FlightId, LeaseTerms, OwnerToken,
};
use flightdeck::distributed::PostcardCodec;
use flightdeck::readers::DynReaders;
use flightdeck::{
    GenericSingleFlightLayer, GenericSingleFlightLayerBuilder, Mode, StageConfig, StageHandle,
};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

pub type Svc = BoxCloneService<String, String, BoxError>;

// The one metrics recorder of the tests (each test binary uses some).
#[allow(unused_imports)]
pub use flightdeck_test::recorded::install as metrics_on;
#[allow(unused_imports)]
pub use flightdeck_test::recorded::{
    counter, gauge, gauge_by, gauge_shard, registered, samples, samples_shard,
};

/// A counter of one stage with one more label.
pub fn counter_with(name: &str, stage: &str, label: &str, value: &str) -> u64 {
    flightdeck_test::recorded::counter_where(name, stage, Some((label, value)))
}

/// The business error of the tests' inner service.
#[derive(Debug)]
pub struct Boom;

impl fmt::Display for Boom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("boom")
    }
}

impl std::error::Error for Boom {}

/// What [`Faulty`] does with one acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass it to the real backend.
    Pass,
    /// Ask the real backend, then answer garbage (a protocol error).
    Garbage,
    /// Fail as unavailable without reaching the backend.
    Unavailable,
    /// Wait, then pass it to the real backend (a slow network).
    Slow(Duration),
}

type Decide = Arc<dyn Fn(&OwnerToken) -> Fault + Send + Sync>;

/// A backend wrapper that injects faults into acquires (the other calls go
/// to the real backend): protocol garbage after a real round trip, or an
/// outage.
#[derive(Clone)]
pub struct Faulty<B> {
    pub inner: B,
    pub acquires: Arc<AtomicUsize>,
    decide: Decide,
}

impl<B> Faulty<B> {
    /// `decide` picks the fault of each acquire, by the caller's token.
    pub fn new(inner: B, decide: impl Fn(&OwnerToken) -> Fault + Send + Sync + 'static) -> Self {
        Self {
            inner,
            acquires: Arc::new(AtomicUsize::new(0)),
            decide: Arc::new(decide),
        }
    }

    /// Every acquire answers garbage.
    pub fn garbage(inner: B) -> Self {
        Self::new(inner, |_| Fault::Garbage)
    }

    /// The first acquire of each token is real; its re-checks (a
    /// follower's) answer garbage.
    pub fn garbage_on_recheck(inner: B) -> Self {
        let seen = Mutex::new(std::collections::HashSet::new());
        Self::new(inner, move |token| {
            if seen.lock().unwrap().insert(token.as_str().to_owned()) {
                Fault::Pass
            } else {
                Fault::Garbage
            }
        })
    }

    /// Acquires fail as unavailable while `down` is set.
    pub fn switch(inner: B, down: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Self::new(inner, move |_| {
            if down.load(Ordering::SeqCst) {
                Fault::Unavailable
            } else {
                Fault::Pass
            }
        })
    }
}

impl<B: Backend> Backend for Faulty<B> {
    /// Faulted as acquires are (both count in `acquires`).
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        match (self.decide)(token) {
            Fault::Pass => self.inner.acquire_with(flight, token, ask, terms),
            Fault::Unavailable => {
                Box::pin(async { Err(BackendError::unavailable("switched down")) })
            }
            Fault::Slow(d) => Box::pin(async move {
                tokio::time::sleep(d).await;
                self.inner.acquire_with(flight, token, ask, terms).await
            }),
            Fault::Garbage => Box::pin(async move {
                let _real = self.inner.acquire_with(flight, token, ask, terms).await;
                Err(BackendError::protocol(
                    "unknown action \"MAYBE\" in ACQUIRE reply",
                ))
            }),
        }
    }

    flightdeck::distributed::forward_backend!(inner => heartbeat, commit, abandon, subscribe, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// A Redis backend for a harness server, with short deadlines.
pub async fn redis_backend(url: String) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(url)
            .command_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .reconnect_max_delay(Duration::from_millis(100)),
    )
    .await
    .expect("connects to the test redis")
}

/// Stage settings scaled down for tests: lease 600 ms, heartbeat 150 ms,
/// wait 1.5 s, polls every 100 ms, 250 ms per coordination call; a breaker
/// that only opens when a test asks for it.
pub fn fast(mode: Mode) -> StageConfig {
    let mut cfg = StageConfig::new().mode(mode);
    if mode.is_distributed() {
        cfg = cfg.backend("redis");
    }
    cfg.lease_timeout = Duration::from_millis(600);
    cfg.heartbeat_interval = Duration::from_millis(150);
    cfg.wait_timeout = Duration::from_millis(1500);
    cfg.poll_interval = Duration::from_millis(100);
    cfg.replay_ttl = Duration::from_secs(10);
    cfg.coordination_timeout = Duration::from_millis(250);
    cfg.commit_attempts = 2;
    cfg.breaker.consecutive_failures = Some(1000);
    cfg.breaker.min_calls = 1000;
    cfg.breaker.window = 1000;
    cfg.breaker.jitter = 0.0;
    cfg
}

/// [`fast`] settings for shard outages: two consecutive failures open a
/// shard's breaker, which lets one probe through after `wait_in_open`; the
/// bulkhead holds 4 executions, 1 of them of a degraded shard.
pub fn shard_outage_config(mode: Mode, wait_in_open: Duration) -> StageConfig {
    let mut cfg = fast(mode);
    cfg.breaker.consecutive_failures = Some(2);
    cfg.breaker.wait_in_open = wait_in_open;
    cfg.breaker.half_open_probes = 1;
    cfg.bulkhead.limit = 4;
    cfg.bulkhead.degraded_limit = Some(1);
    cfg
}

/// The tests' inner service: counts executions, sleeps `delay`, fails for
/// requests starting with "fail", answers "done:<req>".
#[derive(Clone, Default)]
pub struct Work {
    pub calls: Arc<AtomicUsize>,
}

impl Work {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn service(&self, delay: Duration) -> Svc {
        let calls = self.calls.clone();
        BoxCloneService::new(service_fn(move |req: String| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                if req.starts_with("fail") {
                    Err::<String, BoxError>(Box::new(Boom))
                } else {
                    Ok(format!("done:{req}"))
                }
            }
        }))
    }
}

/// A builder keyed by the request text in `stage`, sharing `String`s.
pub fn builder(
    stage: &str,
) -> GenericSingleFlightLayerBuilder<DynReaders<String>, CloneShare<String>> {
    let name = StageName::new(stage).unwrap();
    GenericSingleFlightLayer::builder(
        move |req: &String| Some(FlightKey::from_bytes(name.clone(), req)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
}

/// Builds the service: the layer over the work.
pub fn stack<L>(layer: &L, work: &Work, delay: Duration) -> Svc
where
    L: Layer<BoxCloneService<String, String, BoxError>>,
    L::Service:
        tower::Service<String, Response = String, Error = BoxError> + Clone + Send + 'static,
    <L::Service as tower::Service<String>>::Future: Send + 'static,
{
    BoxCloneService::new(layer.layer(work.service(delay)))
}

/// One node of a stage: its layer over a backend (registered as "redis")
/// and the work.
pub struct StageNode {
    pub svc: Svc,
    /// The same node, with work that takes a second (for overlaps that
    /// must hold on a loaded machine).
    pub slow: Svc,
    pub handle: StageHandle,
}

/// A node of `stage` with `cfg` over `backend`; the work takes 300 ms.
pub fn stage_node(stage: &str, cfg: StageConfig, backend: impl Backend, work: &Work) -> StageNode {
    let layer = builder(stage)
        .stage(stage, cfg)
        .backend("redis", backend)
        .build()
        .unwrap();
    StageNode {
        svc: stack(&layer, work, Duration::from_millis(300)),
        slow: stack(&layer, work, Duration::from_secs(1)),
        handle: layer.stage(stage).unwrap(),
    }
}

/// Sends `n` identical requests at once; returns every result.
pub async fn burst(svc: Svc, req: &str, n: usize) -> Vec<Result<String, BoxError>> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let svc = svc.clone();
        let req = req.to_owned();
        set.spawn(async move { svc.oneshot(req).await });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.expect("no task panics"));
    }
    out
}

/// Tallies the answers of flights sent next to each other, each marked
/// whether its shard is degraded: (degraded ones served, degraded ones
/// refused by the bulkhead as full (429), others served). Panics on any
/// other answer: the others are never held to the degraded limit.
pub fn degraded_lane_tally(
    answers: impl IntoIterator<Item = (bool, Result<String, BoxError>)>,
) -> (usize, usize, usize) {
    let (mut degraded_ok, mut degraded_full, mut others_ok) = (0, 0, 0);
    for answer in answers {
        match answer {
            (true, Ok(_)) => degraded_ok += 1,
            (true, Err(e)) => {
                assert!(find::<BulkheadFull>(&*e).is_some(), "{e}");
                assert_eq!(ErrorClass::of(&*e), ErrorClass::TooManyRequests);
                degraded_full += 1;
            }
            (false, r) => {
                r.expect("the healthy shards' flights are not held to the degraded limit");
                others_ok += 1;
            }
        }
    }
    (degraded_ok, degraded_full, others_ok)
}

/// The shards degraded now on `handle`, without their durations.
pub fn degraded_names(handle: &StageHandle) -> Vec<flightdeck::distributed::backend::Shard> {
    handle
        .degraded_shards()
        .into_iter()
        .map(|(shard, _)| shard)
        .collect()
}

/// Captures this thread's `warn` lines (and worse) while the guard lives:
/// for a current-thread runtime, whose tasks log on the test's thread.
pub fn capture_warnings() -> (
    flightdeck_harness::recorder::SharedBuffer,
    tracing::subscriber::DefaultGuard,
) {
    let logs = flightdeck_harness::recorder::SharedBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}
