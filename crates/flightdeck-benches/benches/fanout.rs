//! Fan-out: 10,000 waiters on one key whose work takes 200 ms.
//!
//! For flightdeck and each peer, in the same run: executions, CPU time the
//! process used while the waiters waited (getrusage, from 50 ms into the
//! work until the work returns), and the delay from the work's completion
//! until the last waiter woke up.
//!
//! Two floors run next to them: tokio's own `Notify` (the first caller runs
//! the work and then `notify_waiters`; the others wait on `notified()`, no
//! timers, no map) and tokio's `OnceCell::get_or_init` (a single-flight of
//! one value). They say how fast this runtime can wake 10,000 tasks at all;
//! the last lines print each implementation's last wake over theirs.
//!
//! `cargo bench -p flightdeck-benches --bench fanout` (add `-- 1000` for
//! another waiter count). `FANOUT_ROUNDS=n` sets the rounds (default 5;
//! each implementation's median is printed), `FANOUT_ONLY=<name>` runs one
//! implementation alone (for a profiler), `FANOUT_MEMORY=0` skips the
//! memory figures (their 20,000 callers only add to a profile).
//!
//! For callgrind, the work's completion and the end of each round's joins
//! call two marker functions, so that the counts from one to the other
//! (the wake of every waiter, and the joins of their tasks) come apart:
//!
//! ```sh
//! FANOUT_MEMORY=0 FANOUT_ROUNDS=1 FANOUT_ONLY=flightdeck_local valgrind \
//!   --tool=callgrind --dump-before='fanout::mark_done' \
//!   --dump-before='fanout::mark_joined' <fanout binary>
//! ```
//!
//! The dump that begins at `mark_done` holds the wake.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flightdeck_benches::cpu_time;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use tower::{service_fn, Layer, ServiceExt};

const WORK: Duration = Duration::from_millis(200);
const SETTLE: Duration = Duration::from_millis(50);

/// What the work records: its executions, the CPU time at SETTLE, and the
/// instant it finished.
#[derive(Default)]
struct Probe {
    /// The key of every caller of one run (a fresh one per run: moka keeps
    /// the value of the last).
    round: u64,
    executions: AtomicUsize,
    cpu_at_settle: Mutex<Option<Duration>>,
    cpu_at_done: Mutex<Option<Duration>>,
    done_at: Mutex<Option<Instant>>,
    last_wake_nanos: AtomicU64,
    /// The `Notify` floor: whether its work started, its value once done.
    started: AtomicBool,
    value: AtomicU64,
    done: AtomicBool,
    notify: tokio::sync::Notify,
    /// The `OnceCell` floor.
    once: tokio::sync::OnceCell<u64>,
}

impl Probe {
    async fn work(self: Arc<Self>) -> u64 {
        self.executions.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(SETTLE).await;
        *self.cpu_at_settle.lock().unwrap() = Some(cpu_time());
        tokio::time::sleep(WORK - SETTLE).await;
        *self.cpu_at_done.lock().unwrap() = Some(cpu_time());
        *self.done_at.lock().unwrap() = Some(Instant::now());
        mark_done();
        42
    }

    fn woke(&self, base: Instant) {
        let n = base.elapsed().as_nanos() as u64;
        self.last_wake_nanos.fetch_max(n, Ordering::SeqCst);
    }
}

/// The work is done (a mark for callgrind's `--dump-before`).
#[inline(never)]
fn mark_done() {
    std::hint::black_box(1u8);
}

/// Every task of the round has been joined (a mark, as `mark_done`).
#[inline(never)]
fn mark_joined() {
    // Not the same body as `mark_done`'s, which LLVM would merge.
    std::hint::black_box(2u8);
}

struct Row {
    name: &'static str,
    executions: usize,
    cpu_waiting: Duration,
    last_wake: Duration,
}

type Call = Arc<dyn Fn(Arc<Probe>) -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

async fn run(name: &'static str, round: u64, waiters: usize, call: Call) -> Row {
    let probe = Arc::new(Probe {
        round,
        ..Probe::default()
    });
    let base = Instant::now();
    let mut tasks = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        let (probe, call) = (probe.clone(), call.clone());
        tasks.push(tokio::spawn(async move {
            let v = call(probe.clone()).await;
            probe.woke(base);
            v
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 42);
    }
    mark_joined();
    let done_at = probe.done_at.lock().unwrap().expect("work ran");
    let last_wake = base + Duration::from_nanos(probe.last_wake_nanos.load(Ordering::SeqCst));
    let settle = probe.cpu_at_settle.lock().unwrap().unwrap();
    let done = probe.cpu_at_done.lock().unwrap().unwrap();
    Row {
        name,
        executions: probe.executions.load(Ordering::SeqCst),
        cpu_waiting: done.saturating_sub(settle),
        last_wake: last_wake.saturating_duration_since(done_at),
    }
}

#[derive(Debug, Clone)]
struct PeerError;

const NOTIFY: &str = "floor: tokio Notify";
const ONCE_CELL: &str = "floor: tokio OnceCell";

/// The `Notify` floor's caller: the first runs the work and wakes the
/// others with `notify_waiters`; the others register, check that the work
/// is not done already, and wait.
async fn notify_floor(p: Arc<Probe>) -> u64 {
    if !p.started.swap(true, Ordering::SeqCst) {
        let v = p.clone().work().await;
        p.value.store(v, Ordering::SeqCst);
        p.done.store(true, Ordering::SeqCst);
        p.notify.notify_waiters();
        return v;
    }
    let notified = p.notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if !p.done.load(Ordering::SeqCst) {
        notified.await;
    }
    p.value.load(Ordering::SeqCst)
}

/// Resident memory of this process, in bytes (Linux `/proc/self/statm`).
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Memory per idle flight (distinct keys, each with its leader waiting) and
/// per extra waiter on one key, from the RSS growth over 10,000 of each.
async fn memory() {
    const N: usize = 10_000;
    let stage = StageName::new("memory").unwrap();
    let layer = LocalFlightLayer::with_key(
        FlightPolicy::new().max_flights(N + 1).max_waiters(N + 1),
        move |k: &u64| Some(FlightKey::from_bytes(stage.clone(), k.to_le_bytes())),
    );
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let svc = layer.layer(service_fn(move |k: u64| {
        let r = r.clone();
        async move {
            r.notified().await;
            Ok::<_, Infallible>(k)
        }
    }));
    let measure = |label: &str, before: Option<u64>, after: Option<u64>| {
        if let (Some(b), Some(a)) = (before, after) {
            println!("{label:<44} {:>8} bytes", a.saturating_sub(b) / N as u64);
        }
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = rss();
    let flights: Vec<_> = (0..N as u64)
        .map(|k| tokio::spawn(svc.clone().oneshot(k)))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after_flights = rss();
    let waiters: Vec<_> = (0..N)
        .map(|_| tokio::spawn(svc.clone().oneshot(0)))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after_waiters = rss();
    println!("memory (RSS growth / item, {N} items, includes the caller's tokio task):");
    measure(
        "  idle flight (leader waiting, distinct keys)",
        before,
        after_flights,
    );
    measure("  extra waiter on one key", after_flights, after_waiters);
    release.notify_waiters();
    drop((flights, waiters));
}

fn main() {
    let waiters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // First, on a fresh heap: freed memory of the runs below would be
        // reused without growing the RSS.
        if std::env::var("FANOUT_MEMORY").as_deref() != Ok("0") {
            memory().await;
        }
        let stage = StageName::new("fanout").unwrap();
        let ours = LocalFlightLayer::with_key(
            FlightPolicy::new().max_waiters(waiters + 1),
            move |p: &Arc<Probe>| Some(FlightKey::from_bytes(stage.clone(), p.round.to_le_bytes())),
        )
        .layer(service_fn(|p: Arc<Probe>| async move {
            Ok::<_, Infallible>(p.work().await)
        }));
        let ours: Call = Arc::new(move |p| {
            let svc = ours.clone();
            Box::pin(async move { svc.oneshot(p).await.unwrap() })
        });

        let coalesce = tower_resilience_coalesce::CoalesceLayer::new(|p: &Arc<Probe>| p.round)
            .layer(service_fn(|p: Arc<Probe>| async move {
                Ok::<_, PeerError>(p.work().await)
            }));
        let coalesce: Call = Arc::new(move |p| {
            let svc = coalesce.clone();
            Box::pin(async move { svc.oneshot(p).await.unwrap() })
        });

        let group: Arc<async_singleflight::Group<u64, u64, PeerError>> =
            Arc::new(async_singleflight::Group::new());
        let sf: Call = Arc::new(move |p| {
            let (group, key) = (group.clone(), p.round);
            Box::pin(async move {
                group
                    .work(&key, async move { Ok(p.work().await) })
                    .await
                    .unwrap()
            })
        });

        let cache: moka::future::Cache<u64, u64> = moka::future::Cache::new(16);
        let moka_call: Call = Arc::new(move |p| {
            let cache = cache.clone();
            Box::pin(async move { cache.get_with(p.round, p.work()).await })
        });

        // The floors: tokio's primitives, with nothing of a layer around.
        let notify: Call = Arc::new(|p| Box::pin(notify_floor(p)));
        let once_cell: Call =
            Arc::new(|p| Box::pin(async move { *p.once.get_or_init(|| p.clone().work()).await }));

        // Several rounds, the implementations in a rotating order, and the
        // median of each: one run on a shared 2-core machine says little.
        let rounds: usize = std::env::var("FANOUT_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5)
            .max(1);
        let only = std::env::var("FANOUT_ONLY").ok();
        let impls: Vec<(&'static str, Call)> = [
            ("flightdeck_local", ours),
            ("async_singleflight", sf),
            ("moka_get_with", moka_call),
            ("tower_resilience_coalesce", coalesce),
            (NOTIFY, notify),
            (ONCE_CELL, once_cell),
        ]
        .into_iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .collect();
        let mut runs: Vec<Vec<Row>> = impls.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for i in 0..impls.len() {
                let i = (i + round) % impls.len();
                let (name, call) = &impls[i];
                let key = (round * impls.len() + i) as u64;
                runs[i].push(run(name, key, waiters, call.clone()).await);
            }
        }

        println!(
            "fan-out: {waiters} waiters on one key, work {WORK:?}, 2 worker threads, \
             {rounds} rounds (median, and min-max)"
        );
        println!(
            "{:<28} {:>10} {:>16} {:>28} {:>10}",
            "implementation", "executions", "cpu_while_wait", "last_wake_delay", "cpu_ratio"
        );
        let median = |mut v: Vec<Duration>| {
            v.sort();
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        let summary: Vec<_> = runs
            .iter()
            .map(|rows| {
                let cpu = median(rows.iter().map(|r| r.cpu_waiting).collect());
                let wake = median(rows.iter().map(|r| r.last_wake).collect());
                let execs = rows.iter().map(|r| r.executions).max().unwrap_or(0);
                (rows[0].name, execs, cpu, wake)
            })
            .collect();
        let ours_cpu = summary[0].2 .0.as_secs_f64().max(1e-9);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for (name, execs, cpu, wake) in &summary {
            println!(
                "{:<28} {:>10} {:>13.3} ms {:>9.3} ms ({:>6.3}-{:>6.3}) {:>9.1}x",
                name,
                execs,
                ms(cpu.0),
                ms(wake.0),
                ms(wake.1),
                ms(wake.2),
                cpu.0.as_secs_f64() / ours_cpu,
            );
        }
        println!("(cpu_ratio: the implementation's CPU while waiting / flightdeck's, same run)");
        // Each implementation's last wake over a floor's, round by round
        // (the rounds alternate the implementations), then the median.
        for floor in [NOTIFY, ONCE_CELL] {
            let Some(f) = impls.iter().position(|(name, _)| *name == floor) else {
                continue;
            };
            for (i, (name, _)) in impls.iter().enumerate() {
                if i == f {
                    continue;
                }
                let mut ratios: Vec<f64> = runs[i]
                    .iter()
                    .zip(&runs[f])
                    .map(|(a, b)| a.last_wake.as_secs_f64() / b.last_wake.as_secs_f64().max(1e-9))
                    .collect();
                ratios.sort_by(f64::total_cmp);
                println!(
                    "last wake, {name} / {floor}: {:.2}x (per-round median; {:.2}x-{:.2}x)",
                    ratios[ratios.len() / 2],
                    ratios[0],
                    ratios[ratios.len() - 1]
                );
            }
        }
    });
}
