//! The cost of the facade's modes, in one run, as ratios against
//! LOCAL_ONLY measured in the same run:
//!
//! - HYBRID with Redis down and the breaker open (goal: at most 1.1):
//!   while degraded, a leader runs exactly LOCAL_ONLY's path plus the
//!   breaker's check (one load, and which runtime the caller is on: on
//!   another than the one whose task ends the open wait, a clock read)
//!   and the fallback counters, and not a single Redis call;
//! - HYBRID with a healthy Redis (reported: two round trips per flight,
//!   acquire and commit).
//!
//! Each request has a fresh key (every call is an L1 leader: the worst
//! case for the facade's own work); the inner service answers at once.
//! Wall time: `ROUNDS` short rounds (default 61; 5,000 requests per mode
//! and round for 1 caller, 16 × 500 for 16 callers); in each round the
//! modes run back to back, in alternating order (ABBA, so drift cancels),
//! and the round's ratio is taken between neighbours, which share the
//! machine's load of the moment. The median ratio and the spread (min,
//! quartiles, max) over the rounds are printed, for 1 caller and for 16
//! concurrent callers.
//!
//! ```text
//! cargo run --release -p flightdeck-examples --example mode_overhead
//! ```
//!
//! With `--callgrind`, it then counts instructions per request under
//! valgrind (robust on a loaded machine): it runs itself four times under
//! `valgrind --tool=callgrind` (LOCAL_ONLY and HYBRID with an open breaker,
//! each with two request counts, on one thread, with an in-memory backend
//! whose breaker was opened by recorded failures) and prints the
//! difference quotient per request and the ratio.
//!
//! ```text
//! cargo run --release -p flightdeck-examples --example mode_overhead -- --callgrind
//! cargo run --release -p flightdeck-examples --example mode_overhead -- --callgrind-only
//! ```

use std::convert::Infallible;
use std::time::Duration;

use flightdeck::breaker::Outcome;
use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::readers::DynReaders;
use flightdeck::{GenericSingleFlightLayer, GenericSingleFlightLayerBuilder, Mode, StageConfig};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::MemoryBackend;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// A request: its stage (built once, cloned: an `Arc`) and an id.
type Req = (StageName, u64);
type Svc = BoxCloneService<Req, u64, flightdeck::core::BoxError>;

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

type KeyFn = fn(&Req) -> Option<FlightKey>;
type Work = fn(Req) -> std::future::Ready<Result<u64, Infallible>>;

fn key((stage, id): &Req) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(stage.clone(), id.to_le_bytes()))
}

// Stage names of one length: the stage map and the metric registries hash
// them, so names of different lengths would differ in cost by themselves.
const LOCAL: &str = "local-only";
const OPEN: &str = "hybrid-opn";
const HEALTHY: &str = "hybrid-red";

fn builder() -> GenericSingleFlightLayerBuilder<DynReaders<Req>, CloneShare<u64>> {
    GenericSingleFlightLayer::builder(
        key as KeyFn,
        CloneShare::<u64>::new(),
        PostcardCodec::<u64>::new(),
    )
}

fn service(layer: &GenericSingleFlightLayer<DynReaders<Req>, CloneShare<u64>>) -> Svc {
    let work: Work = |(_, id)| std::future::ready(Ok(id));
    BoxCloneService::new(layer.layer(service_fn(work)))
}

/// `n` sequential requests with fresh keys on each of `tasks` tasks;
/// nanoseconds per request.
async fn round(svc: &Svc, stage: &str, n: u64, tasks: u64, base: &mut u64) -> f64 {
    let stage = StageName::new(stage).expect("stage name");
    let first = *base;
    *base += n * tasks;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let svc = svc.clone();
        let stage = stage.clone();
        set.spawn(async move {
            for i in 0..n {
                let key = first + t * n + i;
                svc.clone().oneshot((stage.clone(), key)).await.expect("ok");
            }
        });
    }
    while set.join_next().await.is_some() {}
    start.elapsed().as_nanos() as f64 / (n * tasks) as f64
}

/// Min, lower quartile, median, upper quartile, max.
fn spread(mut v: Vec<f64>) -> [f64; 5] {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.0), at(0.25), at(0.5), at(0.75), at(1.0)]
}

fn show(label: &str, what: &str, v: Vec<f64>, digits: usize) {
    let [min, q1, med, q3, max] = spread(v);
    println!(
        "{label}: {what} median {med:.digits$}  (min {min:.digits$}, quartiles {q1:.digits$}–{q3:.digits$}, max {max:.digits$})"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        // One thread, one mode, `n` requests: what `--callgrind` measures.
        Some("--callgrind-child") => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let stage = args.get(1).expect("stage").clone();
            let n: u64 = args.get(2).and_then(|s| s.parse().ok()).expect("count");
            rt.block_on(callgrind_child(stage, n));
        }
        other => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            if other != Some("--callgrind-only") {
                rt.block_on(wall_time());
            }
            drop(rt);
            if matches!(other, Some("--callgrind" | "--callgrind-only")) {
                callgrind();
            }
        }
    }
}

async fn wall_time() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(61);
    let mut down = RedisServer::start().expect("redis-server");
    let healthy = RedisServer::start().expect("redis-server");
    let layer = builder()
        .backend("down", backend(down.url()).await)
        .backend("healthy", backend(healthy.url()).await)
        .stage(LOCAL, stage(Mode::LocalOnly, None))
        .stage(OPEN, stage(Mode::Hybrid, Some("down")))
        .stage(HEALTHY, stage(Mode::Hybrid, Some("healthy")))
        .build()
        .expect("config");
    let svc = service(&layer);

    // Redis down: two coordination failures open the breaker.
    down.kill();
    for i in 0..2 {
        svc.clone()
            .oneshot((StageName::new(OPEN).unwrap(), u64::MAX - i))
            .await
            .expect("local fallback");
    }
    let open = layer.stage(OPEN).unwrap();
    assert!(open.is_degraded(), "breaker open");

    let mut base = 0;
    // Warm-up (allocator, caches, the runtime's threads).
    for st in [LOCAL, OPEN] {
        round(&svc, st, 20_000, 1, &mut base).await;
    }
    println!("{rounds} rounds; fresh key per request; inner service answers at once");
    for (label, tasks, n_local, n_redis) in
        [("1 caller", 1, 5_000, 200), ("16 callers", 16, 500, 20)]
    {
        let (mut local, mut hyb_open, mut ratio, mut healthy_ratio) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (l, o) = if r % 2 == 0 {
                let l = round(&svc, LOCAL, n_local, tasks, &mut base).await;
                (l, round(&svc, OPEN, n_local, tasks, &mut base).await)
            } else {
                let o = round(&svc, OPEN, n_local, tasks, &mut base).await;
                (round(&svc, LOCAL, n_local, tasks, &mut base).await, o)
            };
            let h = round(&svc, HEALTHY, n_redis, tasks, &mut base).await;
            local.push(l);
            hyb_open.push(o);
            ratio.push(o / l);
            healthy_ratio.push(h / l);
        }
        show(label, "LOCAL_ONLY ns/req", local, 0);
        show(
            label,
            "HYBRID (Redis down, breaker open) ns/req",
            hyb_open,
            0,
        );
        show(
            label,
            "HYBRID (Redis down, breaker open) / LOCAL_ONLY",
            ratio,
            3,
        );
        show(
            label,
            "HYBRID (healthy Redis) / LOCAL_ONLY",
            healthy_ratio,
            1,
        );
    }
    assert!(open.is_degraded(), "still degraded: no Redis call was made");
    println!(
        "eval calls on the down server: none possible (killed); on the healthy one: {}",
        healthy.command_calls("eval").unwrap_or(0)
    );
}

/// The `--callgrind-child` run: `n` sequential requests of one stage on a
/// current-thread runtime. The backend is in memory and its breaker is
/// opened by two recorded failures (a timed open, as with Redis down), so
/// nothing runs in the background.
async fn callgrind_child(stage_name: String, n: u64) {
    let layer = builder()
        .backend("mem", MemoryBackend::new())
        .stage(LOCAL, stage(Mode::LocalOnly, None))
        .stage(OPEN, stage(Mode::Hybrid, Some("mem")))
        .build()
        .expect("config");
    let open = layer.stage(OPEN).unwrap();
    for _ in 0..2 {
        open.breaker()
            .try_acquire()
            .expect("closed")
            .record(Outcome::Failure);
    }
    assert!(open.breaker().try_reject(), "open, timed");
    let svc = service(&layer);
    let stage_name = StageName::new(&stage_name).expect("stage name");
    for i in 0..n {
        svc.clone()
            .oneshot((stage_name.clone(), i))
            .await
            .expect("ok");
    }
    assert!(open.is_degraded());
}

/// Runs `--callgrind-child` under valgrind for both modes and two request
/// counts; the difference quotient removes the fixed start-up cost.
fn callgrind() {
    let exe = std::env::current_exe().expect("own path");
    let (n1, n2) = (2_000u64, 12_000u64);
    let count = |stage: &str, n: u64| -> f64 {
        let out = std::process::Command::new("valgrind")
            .args([
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                exe.to_str().expect("utf-8 path"),
                "--callgrind-child",
                stage,
                &n.to_string(),
            ])
            .output()
            .expect("valgrind (apt-get install valgrind)");
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.contains("Collected :"))
            .unwrap_or_else(|| panic!("no callgrind summary in:\n{err}"));
        line.rsplit(':')
            .next()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .expect("instruction count")
    };
    let per_request = |stage: &str| (count(stage, n2) - count(stage, n1)) / (n2 - n1) as f64;
    let local = per_request(LOCAL);
    let open = per_request(OPEN);
    println!(
        "callgrind, 1 caller: LOCAL_ONLY {local:.0} instructions/req, HYBRID (breaker open) {open:.0} instructions/req, ratio {:.3} (+{:.0} instructions)",
        open / local,
        open - local
    );
}
