//! The cost of the facade's modes, in one run, as ratios:
//!
//! - HYBRID with Redis down and the breaker open vs LOCAL_ONLY (goal: at
//!   most 1.1): while degraded, a leader pays one breaker check on top of
//!   the local path, and not a single Redis call.
//! - HYBRID with a healthy Redis vs LOCAL_ONLY (reported: two round trips
//!   per flight, acquire and commit).
//!
//! Each request has a fresh key (every call is an L1 leader: the worst
//! case for the facade's own work), the inner service answers at once.
//! Rounds alternate between the modes; the median round is reported.
//!
//! ```text
//! cargo run --release -p flightdeck --all-features --example mode_overhead
//! ```

use std::convert::Infallible;
use std::time::Duration;

use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{Mode, SingleFlightBuilder, StageConfig};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_testkit::RedisServer;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<(String, u64), u64, flightdeck::core::BoxError>;

async fn backend(url: String) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(url)
            .command_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(200))
            .reconnect_max_delay(Duration::from_millis(100)),
    )
    .await
    .expect("redis")
}

fn stage(mode: Mode, backend: Option<&str>) -> StageConfig {
    let mut cfg = StageConfig::new().mode(mode);
    cfg.backend = backend.map(str::to_owned);
    cfg.lease_timeout = Duration::from_secs(3);
    cfg.heartbeat_interval = Duration::from_secs(1);
    cfg.wait_timeout = Duration::from_secs(3);
    cfg.breaker.consecutive_failures = Some(2);
    cfg.breaker.wait_in_open = Duration::from_secs(3600);
    cfg
}

/// `n` sequential requests with fresh keys on each of `tasks` tasks;
/// nanoseconds per request.
async fn round(svc: &Svc, stage: &str, n: u64, tasks: u64, base: u64) -> f64 {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let svc = svc.clone();
        let stage = stage.to_owned();
        set.spawn(async move {
            for i in 0..n {
                let key = base + t * n + i;
                svc.clone().oneshot((stage.clone(), key)).await.expect("ok");
            }
        });
    }
    while set.join_next().await.is_some() {}
    start.elapsed().as_nanos() as f64 / (n * tasks) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut down = RedisServer::start().expect("redis-server");
    let healthy = RedisServer::start().expect("redis-server");
    let layer = SingleFlightBuilder::new(
        |(stage, id): &(String, u64)| {
            Some(FlightKey::from_bytes(
                StageName::new(stage).ok()?,
                id.to_le_bytes(),
            ))
        },
        CloneShare::<u64>::new(),
        PostcardCodec::<u64>::new(),
    )
    .backend("down", backend(down.url()).await)
    .backend("healthy", backend(healthy.url()).await)
    .stage("local", stage(Mode::LocalOnly, None))
    .stage("hybrid-open", stage(Mode::Hybrid, Some("down")))
    .stage("hybrid", stage(Mode::Hybrid, Some("healthy")))
    .build()
    .expect("config");
    let svc: Svc =
        BoxCloneService::new(layer.layer(service_fn(|(_, id): (String, u64)| async move {
            Ok::<_, Infallible>(id)
        })));

    // Redis down: two coordination failures open the breaker.
    down.kill();
    for i in 0..2 {
        svc.clone()
            .oneshot(("hybrid-open".to_owned(), u64::MAX - i))
            .await
            .expect("local fallback");
    }
    let open = layer.stage("hybrid-open").unwrap();
    assert!(open.is_degraded(), "breaker open");

    let rounds = 7;
    let mut base = 0;
    for (label, tasks, n_local, n_redis) in [
        ("1 caller", 1, 20_000, 1_000),
        ("16 callers", 16, 2_000, 200),
    ] {
        let (mut local, mut hyb_open, mut hyb) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            local.push(round(&svc, "local", n_local, tasks, base).await);
            base += n_local * tasks;
            hyb_open.push(round(&svc, "hybrid-open", n_local, tasks, base).await);
            base += n_local * tasks;
            hyb.push(round(&svc, "hybrid", n_redis, tasks, base).await);
            base += n_redis * tasks;
        }
        let (l, o, h) = (median(local), median(hyb_open), median(hyb));
        println!("{label}: LOCAL_ONLY {l:.0} ns/req, HYBRID breaker open {o:.0} ns/req, HYBRID healthy Redis {h:.0} ns/req");
        println!(
            "{label}: HYBRID(open)/LOCAL_ONLY = {:.3}   HYBRID(healthy)/LOCAL_ONLY = {:.1}",
            o / l,
            h / l
        );
    }
    assert!(open.is_degraded(), "still degraded: no Redis call was made");
    println!(
        "eval calls on the down server: none possible (killed); on the healthy one: {}",
        healthy.command_calls("eval").unwrap_or(0)
    );
}
