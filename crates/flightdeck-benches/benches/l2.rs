//! L2 over a real Redis (a `redis-server` the harness starts on a free
//! loopback port), each row next to its floor, raw fred running a trivial
//! script (`return 1`, one key) by `EVALSHA` on a client set up as the
//! backend's (`l2::floor_client`), to the same server, in the
//! same run, interleaved round by round:
//!
//! - **owner, pending work**: the same with work that yields once before
//!   it completes (the realistic case: the owner's heartbeat timer is
//!   armed), vs two EVALSHA round trips and a yield;
//! - **owner**: a flight on a fresh key, ACQUIRE + trivial work + COMMIT
//!   (the layer sends the COMMIT as it hands the value back and waits for
//!   its answer in the background: the row waits for that too), vs two
//!   EVALSHA round trips;
//! - **hit**: a flight whose result is stored (one ACQUIRE), vs one;
//! - **follower**: a second node joins a flight whose owner is working;
//!   the row is the time from the owner's work ending to the follower
//!   holding the value (the owner's COMMIT, its notice, the decode), vs
//!   one EVALSHA round trip;
//! - **flights/s**: one node, 64 tasks, owner flights on fresh keys
//!   (commits included), vs 64 tasks running EVALSHA pairs (pairs/s).
//!
//! Each latency row is the median over rounds of a batch's mean, and the
//! ratio is the median of the per-round ratios (ours / floor), so a
//! shared machine's drifting load cannot bias it.
//!
//! `cargo bench -p flightdeck-benches --bench l2` (`FLIGHTDECK_L2_ROUNDS`,
//! default 15; `FLIGHTDECK_L2_SECS`, default 2, per throughput window).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flightdeck_benches::l2::{
    connect, evalsha, flight, floor_client, fresh_key, load_floor, node, owner, owner_pending,
    Work, FLOOR_SCRIPT,
};
use flightdeck_core::{FlightKey, Shareable};
use flightdeck_distributed::Propagate;
use flightdeck_harness::RedisServer;
use tokio::sync::Notify;

const BATCH: u32 = 100;
const TASKS: usize = 64;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: Vec<f64>) -> f64 {
    quartiles(v).1
}

/// (first quartile, median, third quartile).
fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: usize| v[(v.len() - 1) * q / 4];
    (at(1), at(2), at(3))
}

/// One latency row: `ours` and `floor` each run `BATCH` times per round,
/// alternating which goes first; per round the mean of each and their
/// ratio.
struct Row {
    ours: Vec<f64>,
    floor: Vec<f64>,
    ratio: Vec<f64>,
}

impl Row {
    fn new() -> Self {
        Self {
            ours: Vec::new(),
            floor: Vec::new(),
            ratio: Vec::new(),
        }
    }

    fn push(&mut self, ours: Duration, floor: Duration) {
        let (o, f) = (ours.as_secs_f64() * 1e6, floor.as_secs_f64() * 1e6);
        self.ours.push(o);
        self.floor.push(f);
        self.ratio.push(o / f);
    }

    fn print(self, name: &str, floor: &str, goal: &str) {
        let (q1, m, q3) = quartiles(self.ratio);
        println!(
            "| {name} | {:.1} µs | {floor} {:.1} µs | {m:.2}x ({q1:.2}–{q3:.2}) | {goal} |",
            median(self.ours),
            median(self.floor),
        );
    }
}

/// How many times `one` completes in `secs` across [`TASKS`] tasks, then
/// `settle`, per second of the whole.
async fn throughput<F, Fut>(secs: f64, one: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (stop, done, one) = (stop.clone(), done.clone(), one.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    one().await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = env("FLIGHTDECK_L2_ROUNDS", 15).max(1);
    let secs = env("FLIGHTDECK_L2_SECS", 2).max(1) as f64;
    let redis = RedisServer::start().expect("redis-server starts");
    let (a, b) = (connect(&redis.url()).await, connect(&redis.url()).await);
    let client = floor_client(&redis.url()).await;
    let sha = load_floor(&client).await;
    let (node_a, node_b) = (node(a), node(b));
    // Warm up: scripts loaded, connections and subscriptions open.
    for _ in 0..200 {
        owner(&node_a).await;
        evalsha(&client, &sha).await;
    }

    let (mut own, mut hit, mut follow) = (Row::new(), Row::new(), Row::new());
    let mut own_pending = Row::new();
    for round in 0..rounds {
        let ours_first = round % 2 == 0;
        // Owner vs two EVALSHAs.
        let mut t = [Duration::ZERO; 2];
        for side in [ours_first, !ours_first] {
            let started = Instant::now();
            for _ in 0..BATCH {
                if side {
                    owner(&node_a).await;
                } else {
                    evalsha(&client, &sha).await;
                    evalsha(&client, &sha).await;
                }
            }
            t[usize::from(!side)] = started.elapsed() / BATCH;
        }
        own.push(t[0], t[1]);
        // The same with work that yields once, vs two EVALSHAs and a yield.
        for side in [ours_first, !ours_first] {
            let started = Instant::now();
            for _ in 0..BATCH {
                if side {
                    owner_pending(&node_a).await;
                } else {
                    evalsha(&client, &sha).await;
                    tokio::task::yield_now().await;
                    evalsha(&client, &sha).await;
                }
            }
            t[usize::from(!side)] = started.elapsed() / BATCH;
        }
        own_pending.push(t[0], t[1]);

        // Hit vs one EVALSHA, on keys committed just now.
        let keys: Vec<FlightKey> = (0..BATCH).map(|_| fresh_key()).collect();
        for k in &keys {
            flight(&node_a, k).await;
        }
        node_a.idle().await;
        for side in [ours_first, !ours_first] {
            let started = Instant::now();
            for k in &keys {
                if side {
                    flight(&node_b, k).await;
                } else {
                    evalsha(&client, &sha).await;
                }
            }
            t[usize::from(!side)] = started.elapsed() / BATCH;
        }
        hit.push(t[0], t[1]);

        // Follower: from the owner's work ending to the follower's value.
        let mut waited = Duration::ZERO;
        for _ in 0..BATCH / 4 {
            let key = fresh_key();
            let gate = Arc::new((Notify::new(), Notify::new()));
            let work = Work {
                gate: Some(gate.clone()),
                ..Work::default()
            };
            let owner_task = {
                let (node, key) = (node_a.clone(), key.clone());
                tokio::spawn(async move { node.run(&key, (), work, &Propagate).await })
            };
            gate.0.notified().await;
            let follower_task = {
                let (node, key) = (node_b.clone(), key.clone());
                tokio::spawn(async move {
                    let out = node.run(&key, (), Work::default(), &Propagate).await;
                    (out, Instant::now())
                })
            };
            // Let the follower acquire, subscribe and start waiting.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let released = Instant::now();
            gate.1.notify_one();
            let (out, got) = follower_task.await.unwrap();
            assert!(matches!(out, Ok(Shareable::Shared(_))), "{out:?}");
            waited += got - released;
            owner_task.await.unwrap().unwrap();
            node_a.idle().await;
        }
        let started = Instant::now();
        for _ in 0..BATCH / 4 {
            evalsha(&client, &sha).await;
        }
        follow.push(waited / (BATCH / 4), started.elapsed() / (BATCH / 4));
    }

    // One node's owner flights/s vs EVALSHA pairs/s, alternating.
    let (mut ours_rate, mut floor_rate, mut rate_ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let node = node_a.clone();
        let o = throughput(secs, move || {
            let node = node.clone();
            async move { flight(&node, &fresh_key()).await }
        })
        .await;
        let started = Instant::now();
        node_a.idle().await;
        let settle = started.elapsed().as_secs_f64();
        let o = o * secs / (secs + settle);
        let (c, s) = (client.clone(), sha.clone());
        let f = throughput(secs, move || {
            let (c, s) = (c.clone(), s.clone());
            async move {
                evalsha(&c, &s).await;
                evalsha(&c, &s).await;
            }
        })
        .await;
        ours_rate.push(o);
        floor_rate.push(f);
        rate_ratio.push(o / f);
    }

    println!(
        "\nL2 over one loopback redis-server, {rounds} rounds of {BATCH} (follower: {}), release build; floor = raw fred EVALSHA of `{FLOOR_SCRIPT}` on a client set up as the backend's\n",
        BATCH / 4
    );
    println!("| row | ours (median) | floor (median) | ours / floor: median of rounds (quartiles) | goal |");
    println!("|---|---|---|---|---|");
    own.print("owner: ACQUIRE + work + COMMIT", "2 EVALSHA", "≤ 1.3x");
    own_pending.print(
        "owner, work pending at its first poll",
        "2 EVALSHA + a yield",
        "≤ 1.3x",
    );
    hit.print("hit: one ACQUIRE", "1 EVALSHA", "≤ 1.3x");
    follow.print(
        "follower: owner's work ended → follower has the value",
        "1 EVALSHA",
        "—",
    );
    let (q1, m, q3) = quartiles(rate_ratio);
    println!(
        "| one node's owner flights/s, {TASKS} tasks, {secs} s windows x3 | {:.0}/s | EVALSHA pairs {:.0}/s | {m:.2}x ({q1:.2}–{q3:.2}) | ≥ 0.6x |",
        median(ours_rate),
        median(floor_rate),
    );
}
