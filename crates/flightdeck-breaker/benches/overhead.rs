//! Per-call overhead of a breaker in the closed state and a bulkhead below
//! its limit, against tower-resilience's breaker and bulkhead and tower's
//! `ConcurrencyLimit`, all in one criterion group around the same trivial
//! inner service (so the layer is all that differs).
//!
//! Run: `cargo bench -p flightdeck-breaker --bench overhead`
//!
//! After the group, the bench prints each of our rows divided by each peer
//! row (criterion's own slope estimates from this run, so the ratios need
//! no arithmetic by the reader), and the load average before and after.
//! Then, because criterion's rows run one after another and a shared
//! machine's load drifts between them, it times each pair again in
//! alternating short batches (~5 ms each) and prints the median and
//! quartiles of the per-round ratios.
//!
//! For an instruction count that a loaded machine cannot disturb, run one
//! row alone, outside criterion, under callgrind, at two iteration counts;
//! the difference of the totals divided by the difference of the counts is
//! the per-call cost (start-up cancels out):
//!
//! ```text
//! OVERHEAD_ROW="bulkhead below limit / flightdeck" OVERHEAD_ITERS=200000 \
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/deps/overhead-<hash>
//! ```

#![allow(missing_docs)] // a bench, not an API

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::Criterion;
use tower::{Layer, Service, ServiceExt};

/// The cheapest possible inner service: answers at once.
#[derive(Clone, Copy)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

/// Times `iters` sequential ready+call round trips on one service.
async fn drive<S>(mut svc: S, iters: u64) -> Duration
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        let out = svc.ready().await.unwrap().call(i).await.unwrap();
        std::hint::black_box(out);
    }
    start.elapsed()
}

type Routine = Box<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Duration>>>>;

/// One row of the group: a name and `drive` over a fresh clone of one
/// service (clones share the layer's state, as under axum).
struct Row {
    name: &'static str,
    routine: Routine,
}

fn row<S>(name: &'static str, svc: S) -> Row
where
    S: Service<u64, Response = u64> + Clone + 'static,
    S::Error: std::fmt::Debug,
    S::Future: 'static,
{
    Row {
        name,
        routine: Box::new(move |iters| Box::pin(drive(svc.clone(), iters))),
    }
}

const BASELINE: &str = "baseline (no layer)";
const BREAKER_OURS: &str = "breaker closed / flightdeck";
const BREAKER_TR: &str = "breaker closed / tower-resilience";
const BULKHEAD_OURS: &str = "bulkhead below limit / flightdeck";
const BULKHEAD_QUEUE_OURS: &str = "bulkhead below limit, queue configured / flightdeck";
const BULKHEAD_TR: &str = "bulkhead below limit / tower-resilience";
const CONCURRENCY_LIMIT: &str = "bulkhead below limit / tower ConcurrencyLimit";
const CONCURRENCY_LIMIT_BOXED: &str = "bulkhead below limit / tower ConcurrencyLimit, errors boxed";

/// Ours / peer, printed after the group.
const RATIOS: &[(&str, &str)] = &[
    (BULKHEAD_OURS, CONCURRENCY_LIMIT),
    (BULKHEAD_OURS, CONCURRENCY_LIMIT_BOXED),
    (BULKHEAD_OURS, BULKHEAD_TR),
    (BULKHEAD_QUEUE_OURS, CONCURRENCY_LIMIT),
    (BULKHEAD_QUEUE_OURS, BULKHEAD_TR),
    (BREAKER_OURS, BREAKER_TR),
];

/// Every row; built inside the runtime, as some layers read tokio's clock
/// on creation.
fn rows() -> Vec<Row> {
    let breaker =
        flightdeck_breaker::Breaker::new("bench", flightdeck_breaker::BreakerConfig::default())
            .unwrap();
    let tr_breaker = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .name("bench")
        .build()
        .unwrap();
    let tr_bulkhead = tower_resilience_bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(1024)
        .name("bench")
        .build()
        .unwrap();
    let queued = flightdeck_bulkhead::BulkheadConfig::new(1024).queue(64, Duration::from_secs(1));
    vec![
        row(BASELINE, Echo),
        row(BREAKER_OURS, breaker.layer().layer(Echo)),
        row(BREAKER_TR, tr_breaker.layer(Echo)),
        row(
            BULKHEAD_OURS,
            flightdeck_bulkhead::BulkheadLayer::new(1024).layer(Echo),
        ),
        row(
            BULKHEAD_QUEUE_OURS,
            flightdeck_bulkhead::BulkheadLayer::from_config(queued).layer(Echo),
        ),
        row(BULKHEAD_TR, tr_bulkhead.layer(Echo)),
        row(
            CONCURRENCY_LIMIT,
            tower::limit::ConcurrencyLimitLayer::new(1024).layer(Echo),
        ),
        // The same limit with errors boxed, as a layer that returns
        // `BoxError` would: isolates the cost of a boxed error type from the
        // cost of the limit itself.
        row(
            CONCURRENCY_LIMIT_BOXED,
            tower::ServiceBuilder::new()
                .map_err(Into::<flightdeck_core::BoxError>::into)
                .concurrency_limit(1024)
                .service(Echo),
        ),
    ]
}

/// Criterion's point estimate in linear sampling mode: the least-squares
/// slope through the origin of the measured samples, in ns per call. The
/// measured samples are the last ones, whose iteration counts grow by a
/// constant step (warm-up doubles them instead).
fn slope_ns(samples: &[(u64, Duration)]) -> Option<f64> {
    let mut start = samples.len().checked_sub(1)?;
    if start >= 2 {
        let step = samples[start].0 as i128 - samples[start - 1].0 as i128;
        while start > 0 && samples[start].0 as i128 - samples[start - 1].0 as i128 == step {
            start -= 1;
        }
    }
    let (xy, xx) = samples[start..]
        .iter()
        .fold((0.0, 0.0), |(xy, xx), &(n, d)| {
            let n = n as f64;
            (xy + n * d.as_nanos() as f64, xx + n * n)
        });
    (xx > 0.0).then(|| xy / xx)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let rows = rows();

    // One row alone, outside criterion (for callgrind).
    if let Ok(name) = std::env::var("OVERHEAD_ROW") {
        let iters = std::env::var("OVERHEAD_ITERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        let Some(row) = rows.iter().find(|r| r.name == name) else {
            let names: Vec<_> = rows.iter().map(|r| r.name).collect();
            panic!("no row {name:?}; rows: {names:?}");
        };
        let took = rt.block_on((row.routine)(iters));
        println!("{name}: {iters} calls in {took:?}");
        return;
    }

    let load_before = load_average();
    let mut c = Criterion::default().configure_from_args();
    let samples: Vec<RefCell<Vec<(u64, Duration)>>> =
        rows.iter().map(|_| RefCell::default()).collect();
    let mut g = c.benchmark_group("overhead");
    for (row, samples) in rows.iter().zip(&samples) {
        g.bench_function(row.name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let run = (row.routine)(iters);
                async move {
                    let took = run.await;
                    samples.borrow_mut().push((iters, took));
                    took
                }
            })
        });
    }
    g.finish();
    let load_after = load_average();

    let estimate = |name: &str| {
        let i = rows.iter().position(|r| r.name == name)?;
        slope_ns(&samples[i].borrow())
    };
    println!();
    println!("ratios, ours / peer (criterion's slope estimates from this run)");
    println!("load average (1 5 15 min): before {load_before}, after {load_after}");
    let base = estimate(BASELINE);
    if let Some(base) = base {
        println!("  baseline (no layer): {base:.1} ns");
    }
    for &(ours, peer) in RATIOS {
        let (Some(o), Some(p)) = (estimate(ours), estimate(peer)) else {
            continue;
        };
        let net = base
            .filter(|b| p - b > 0.0)
            .map(|b| format!(", over baseline {:.2}x", (o - b) / (p - b)))
            .unwrap_or_default();
        println!(
            "  {ours}  /  {peer}:  {o:.1} ns / {p:.1} ns = {:.2}x{net}",
            o / p
        );
    }

    // Criterion times rows one after the other, so a change in the
    // machine's load between two rows moves their ratio. Here each pair
    // alternates in short batches (~5 ms) and the ratio is taken per round,
    // so slow load changes cancel out.
    let real_run = samples.iter().all(|s| s.borrow().len() >= 10);
    if real_run {
        println!("paired, interleaved (median and quartiles of {ROUNDS} per-round ratios, ~5 ms batches)");
        for &(ours, peer) in RATIOS {
            let (Some(o), Some(p)) = (estimate(ours), estimate(peer)) else {
                continue;
            };
            let find = |name| rows.iter().find(|r| r.name == name).unwrap();
            let (ro, rp) = (find(ours), find(peer));
            let iters = |ns: f64| ((5e6 / ns) as u64).max(1_000);
            let (io, ip) = (iters(o), iters(p));
            let mut ratios: Vec<f64> = (0..ROUNDS)
                .map(|_| {
                    let to = rt.block_on((ro.routine)(io)).as_nanos() as f64 / io as f64;
                    let tp = rt.block_on((rp.routine)(ip)).as_nanos() as f64 / ip as f64;
                    to / tp
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
            println!(
                "  {ours}  /  {peer}:  {:.2}x  ({:.2}x - {:.2}x)",
                q(0.5),
                q(0.25),
                q(0.75)
            );
        }
        println!("load average after: {}", load_average());
    }
    c.final_summary();
}

/// Rounds of the paired comparison.
const ROUNDS: usize = 101;
