//! A per-call overhead bench in three views of the same rows, for a shared
//! 2-core machine where one view alone misleads:
//!
//! 1. **criterion**, one group, one row after another (its report, plus
//!    each listed ratio of its slope estimates);
//! 2. **paired**: each listed pair timed again in alternating short batches
//!    (~5 ms each), and the median and quartiles of the per-round ratios.
//!    Criterion's rows run minutes apart, and the machine's load drifts in
//!    between (one unchanged binary gave 1.32× and 0.78× for one pair in
//!    two runs); alternating batches cancel slow drift;
//! 3. **one row alone**: with `OVERHEAD_ROW=<name>` (and `OVERHEAD_ITERS`)
//!    the bench runs that row only, outside criterion, for
//!    `valgrind --tool=callgrind`: instruction counts do not depend on the
//!    machine's load. Run it at two iteration counts and divide the
//!    difference of the totals by the difference of the counts (start-up
//!    cancels out); `scripts/instructions` does that.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tower::{Service, ServiceExt};

/// Runs a row's calls: given a count, makes that many calls and returns
/// how long they took.
pub type Routine = Box<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Duration>>>>;

/// One row of a group.
pub struct Row {
    /// Its name in criterion's report and in the ratios.
    pub name: &'static str,
    routine: Routine,
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row").field("name", &self.name).finish()
    }
}

impl Row {
    /// A row that makes its calls itself: `calls(n)` makes `n` calls (its
    /// time is measured around it).
    pub fn new<F, Fut>(name: &'static str, calls: F) -> Self
    where
        F: Fn(u64) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        Self {
            name,
            routine: Box::new(move |iters| {
                let run = calls(iters);
                Box::pin(async move {
                    let start = Instant::now();
                    run.await;
                    start.elapsed()
                })
            }),
        }
    }

    /// Makes `iters` calls and returns how long they took (for a row that
    /// wraps another one).
    pub fn run(&self, iters: u64) -> Pin<Box<dyn Future<Output = Duration>>> {
        (self.routine)(iters)
    }

    /// A row of sequential `ready` + `call` round trips on one clone of
    /// `svc` per batch; `req(i)` is the `i`-th request.
    pub fn service<S, Req, F>(name: &'static str, svc: S, req: F) -> Self
    where
        S: Service<Req> + Clone + 'static,
        S::Error: std::fmt::Debug,
        F: Fn(u64) -> Req + Clone + 'static,
        Req: 'static,
    {
        Self::round_trips(name, svc, req, false)
    }

    /// Like [`Row::service`], but on a fresh clone of `svc` per call, as
    /// axum does (clones share the layer's state).
    pub fn service_cloned<S, Req, F>(name: &'static str, svc: S, req: F) -> Self
    where
        S: Service<Req> + Clone + 'static,
        S::Error: std::fmt::Debug,
        F: Fn(u64) -> Req + Clone + 'static,
        Req: 'static,
    {
        Self::round_trips(name, svc, req, true)
    }

    fn round_trips<S, Req, F>(name: &'static str, svc: S, req: F, clone_per_call: bool) -> Self
    where
        S: Service<Req> + Clone + 'static,
        S::Error: std::fmt::Debug,
        F: Fn(u64) -> Req + Clone + 'static,
        Req: 'static,
    {
        Self::new(name, move |iters| {
            let (mut svc, req) = (svc.clone(), req.clone());
            async move {
                for i in 0..iters {
                    let mut fresh;
                    let svc = if clone_per_call {
                        fresh = svc.clone();
                        &mut fresh
                    } else {
                        &mut svc
                    };
                    let out = svc.ready().await.unwrap().call(req(i)).await.unwrap();
                    std::hint::black_box(out);
                }
            }
        })
    }
}

/// What to print after the group.
#[derive(Debug, Default)]
pub struct Report<'a> {
    /// The row of no layer at all, subtracted for the "over baseline"
    /// ratios.
    pub baseline: Option<&'static str>,
    /// `(ours, peer)` pairs: ours / peer is printed for each.
    pub ratios: &'a [(&'static str, &'static str)],
}

/// Rounds of the paired comparison.
const ROUNDS: usize = 101;

/// Runs the bench: one row alone if `OVERHEAD_ROW` names one, otherwise
/// the criterion group `group` over every row, then the ratios of
/// `report`, from criterion's estimates and paired.
pub fn run(group: &str, rt: &tokio::runtime::Runtime, rows: Vec<Row>, report: Report<'_>) {
    if let Ok(name) = std::env::var("OVERHEAD_ROW") {
        let iters = std::env::var("OVERHEAD_ITERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        let Some(row) = rows.iter().find(|r| r.name == name) else {
            let names: Vec<_> = rows.iter().map(|r| r.name).collect();
            eprintln!("no row {name:?}; rows: {names:?}");
            std::process::exit(2);
        };
        let took = rt.block_on((row.routine)(iters));
        println!(
            "{name}: {iters} calls in {took:?}, {:.1} ns/call",
            took.as_nanos() as f64 / iters as f64
        );
        return;
    }

    let load_before = load_average();
    let mut c = Criterion::default().configure_from_args();
    let samples: Vec<RefCell<Vec<(u64, Duration)>>> =
        rows.iter().map(|_| RefCell::default()).collect();
    let mut g = c.benchmark_group(group);
    for (row, samples) in rows.iter().zip(&samples) {
        g.bench_function(row.name, |b| {
            b.to_async(rt).iter_custom(|iters| {
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
    let base = report.baseline.and_then(estimate);
    if let Some(base) = base {
        println!("  baseline (no layer): {base:.1} ns");
    }
    for &(ours, peer) in report.ratios {
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

    // Only after a real run (not `cargo test`'s single pass over the rows).
    if samples.iter().all(|s| s.borrow().len() >= 10) {
        println!(
            "paired, interleaved (median and quartiles of {ROUNDS} per-round ratios, ~5 ms batches)"
        );
        for &(ours, peer) in report.ratios {
            let (Some(o), Some(p)) = (estimate(ours), estimate(peer)) else {
                continue;
            };
            let find = |name| rows.iter().find(|r| r.name == name).expect("a row");
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

/// The 1, 5 and 15 minute load averages (Linux), as text.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
