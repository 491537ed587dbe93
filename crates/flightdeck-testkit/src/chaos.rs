//! The parts of a chaos run that do not depend on how the nodes run: a
//! seeded fault schedule and its application to Redis and to the nodes'
//! [`FaultProxy`]s, a keyed load with its outcomes, the executions and
//! their duplicates by cause, and the printed and checked summary (the
//! invariants of `docs/guarantees.md`).
//!
//! Two suites use it: `flightdeck-redis/tests/chaos.rs` (N L1 + L2 stacks
//! in one test process) and `flightdeck-testkit/tests/chaos_nodes.rs` (N
//! `flightdeck-node` processes driven over HTTP, which adds killing and
//! restarting a node process, [`Chaos::KillNode`]). The in-process suite
//! also runs over a Redis Cluster with live slot migrations
//! ([`Chaos::MigrateSlot`]).
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_testkit::chaos::{schedule, Chaos};
//!
//! // Faults for 3 nodes over 60 s: the same for the same seed, none in
//! // the calm last 5 s.
//! let total = Duration::from_secs(60);
//! let plan = schedule(7, total, |rng| Chaos::standalone(rng, 3));
//! let again = schedule(7, total, |rng| Chaos::standalone(rng, 3));
//! assert_eq!(format!("{plan:?}"), format!("{again:?}"));
//! assert!(plan.iter().all(|(at, _)| *at < Duration::from_secs(55)));
//! ```

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flightdeck_distributed::{DistributedPolicy, FlightId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::{timeout, Instant};

use crate::recorder::{wall_us, EventLog, WallClock};
use crate::{Fault, FaultProxy, Journal, RedisCluster, RedisSentinel, RedisServer, Resp};

/// Every request must end (value or typed error) within this bound: L1
/// wait, two acquire attempts, a follower's wait and takeover, the work,
/// commit attempts.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(12);

/// The lease of a chaos run's flights.
pub const LEASE: Duration = Duration::from_millis(1500);

/// The L2 policy of every chaos node: a short lease with heartbeats well
/// inside it, polls as the fallback of lost notices, a bounded wait, results
/// kept longer than the run's windows, three commit attempts.
pub fn distributed_policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(LEASE)
        .heartbeat(Duration::from_millis(400))
        .poll_interval(Duration::from_millis(200))
        .wait_timeout(Duration::from_secs(5))
        .result_ttl(Duration::from_secs(120))
        .call_timeout(Duration::from_millis(300))
        .commit_attempts(3)
}

/// The L1 wait timeout of every chaos node.
pub const LOCAL_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `name` from the environment as a number, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The shape of a run, from the environment: `FLIGHTDECK_CHAOS_SEED`
/// (default 20261129), `FLIGHTDECK_CHAOS_SECS`, `FLIGHTDECK_CHAOS_NODES`
/// (3), `FLIGHTDECK_CHAOS_KEYS` (8 per window); 6 workers per node, 2.5 s
/// windows.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Seeds the schedule and the workers.
    pub seed: u64,
    /// The run's length.
    pub secs: u64,
    /// Nodes.
    pub nodes: usize,
    /// Keys per window.
    pub keys: usize,
    /// Workers per node.
    pub workers: usize,
    /// How long a window's keys are requested.
    pub window: Duration,
}

impl Settings {
    /// From the environment, `default_secs` long unless
    /// `FLIGHTDECK_CHAOS_SECS` says otherwise.
    pub fn from_env(default_secs: u64) -> Self {
        let size = |name, default| usize::try_from(env_u64(name, default)).unwrap_or(1).max(1);
        Self {
            seed: env_u64("FLIGHTDECK_CHAOS_SEED", 20261129),
            secs: env_u64("FLIGHTDECK_CHAOS_SECS", default_secs),
            nodes: size("FLIGHTDECK_CHAOS_NODES", 3),
            keys: size("FLIGHTDECK_CHAOS_KEYS", 8),
            workers: 6,
            window: Duration::from_millis(2500),
        }
    }

    /// The run's length.
    pub fn total(&self) -> Duration {
        Duration::from_secs(self.secs)
    }

    /// The seed of a node's worker.
    pub fn worker_seed(&self, node: usize, worker: usize) -> u64 {
        self.seed ^ ((node as u64) << 16 | worker as u64)
    }

    /// A load of these keys and windows, starting now.
    pub fn load(&self) -> Arc<Load> {
        Load::new(self.seed, self.keys, self.window)
    }

    /// Says what is about to run (stderr).
    pub fn announce(&self, name: &str, faults: usize) {
        eprintln!(
            "chaos {name}: seed {}, {} s, {} nodes x {} workers, {} keys per {:?} window, {faults} faults scheduled",
            self.seed, self.secs, self.nodes, self.workers, self.keys, self.window
        );
    }
}

/// Awaits `fut`, panicking with `what` after `secs`.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {secs} s"))
}

/// Runs `f` on a blocking thread, panicking with `what` after 60 s.
pub async fn blocking<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    within(60, what, async {
        tokio::task::spawn_blocking(f).await.expect("fault thread")
    })
    .await
}

/// Locks, ignoring poison (a panicking worker must not hide the summary).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long the chaos work runs for `key`: fixed per key, 30 ms to 1.23 s
/// (some longer than a heartbeat, a few close to the lease).
pub fn work_duration(key: &str) -> Duration {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    Duration::from_millis(30 + h.finish() % 1200)
}

// ------------------------------------------------------------- executions

/// One run of the work.
#[derive(Clone, Debug)]
pub struct Exec {
    /// The request key.
    pub key: String,
    /// The owner's generation (its fencing token).
    pub generation: u64,
    /// The node that ran it.
    pub node: usize,
    /// When it started.
    pub start: Instant,
    /// When it ended (`None`: still running).
    pub end: Option<Instant>,
    /// Its process was killed before it ended (`end` is the kill).
    pub killed: bool,
}

/// Executions shared by the nodes of one test process.
pub type Executions = Arc<Mutex<Vec<Exec>>>;

/// Logs the start of an execution (a node process's half of [`Exec`]).
pub fn log_exec_start(log: &EventLog, key: &str, generation: u64) {
    log.write(&json!({"event": "exec", "key": key, "generation": generation, "at_us": wall_us()}));
}

/// Logs the end of an execution started with [`log_exec_start`].
pub fn log_exec_end(log: &EventLog, key: &str, generation: u64) {
    log.write(
        &json!({"event": "exec_end", "key": key, "generation": generation, "at_us": wall_us()}),
    );
}

/// What one node process logged (its journal and executions).
#[derive(Debug, Default)]
pub struct NodeLog {
    /// Its grants, commits and heartbeats.
    pub journal: Journal,
    /// Its executions.
    pub executions: Vec<Exec>,
    /// Lines that did not parse (a process killed while writing one).
    pub malformed: usize,
}

impl NodeLog {
    /// Reads the log of one process of node `node`. `killed_at`: when the
    /// process was killed; its unfinished executions end then, `killed`.
    pub fn read(text: &str, node: usize, clock: &WallClock, killed_at: Option<Instant>) -> Self {
        let (journal, malformed) = Journal::from_log(text, clock);
        let mut executions: Vec<Exec> = Vec::new();
        let mut bad = 0;
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue; // counted by the journal
            };
            let (Some(key), Some(generation), Some(at)) = (
                v["key"].as_str(),
                v["generation"].as_u64(),
                v["at_us"].as_u64(),
            ) else {
                continue;
            };
            match v["event"].as_str() {
                Some("exec") => executions.push(Exec {
                    key: key.to_owned(),
                    generation,
                    node,
                    start: clock.instant(at),
                    end: None,
                    killed: false,
                }),
                Some("exec_end") => {
                    let started = executions
                        .iter_mut()
                        .rev()
                        .find(|e| e.key == key && e.generation == generation && e.end.is_none());
                    match started {
                        Some(e) => e.end = Some(clock.instant(at)),
                        None => bad += 1,
                    }
                }
                _ => {}
            }
        }
        if let Some(killed) = killed_at {
            for e in executions.iter_mut().filter(|e| e.end.is_none()) {
                e.end = Some(killed);
                e.killed = true;
            }
        }
        Self {
            journal,
            executions,
            malformed: malformed + bad,
        }
    }
}

/// The duplicate executions of a run, by cause.
#[derive(Debug, Default)]
pub struct Duplicates {
    /// How many per cause (one of the `pub const`s of this module).
    pub by_cause: BTreeMap<&'static str, u64>,
    /// One line per duplicate.
    pub listed: Vec<String>,
}

/// Cause: a generation ran twice at once (coordination state was lost).
pub const SAME_GEN: &str = "same generation executed twice (coordination state lost)";
/// Cause: a takeover while the earlier owner still ran.
pub const TAKEOVER: &str =
    "takeover while the earlier owner still ran (it was cut off from Redis for longer than its lease)";
/// Cause: the earlier owner's result never got committed.
pub const AFTER_UNCOMMITTED: &str =
    "re-run after the earlier owner's result was not committed (commit failed, fenced or never reached Redis)";
/// Cause: the earlier owner's process was killed mid-work.
pub const AFTER_KILLED: &str =
    "takeover after the earlier owner's process was killed mid-work (its lease expired)";
/// Cause: a committed result was lost.
pub const AFTER_COMMITTED: &str = "re-run after a committed result (result lost)";

/// Every execution of a key after its first, with its cause. `flight_of`
/// maps a request key to its flight (for the journal's commits).
pub fn duplicates(
    executions: &[Exec],
    journal: &Journal,
    flight_of: impl Fn(&str) -> FlightId,
) -> Duplicates {
    let mut by_key: BTreeMap<&str, Vec<&Exec>> = BTreeMap::new();
    for e in executions {
        by_key.entry(&e.key).or_default().push(e);
    }
    let mut out = Duplicates::default();
    for (key, mut execs) in by_key {
        if execs.len() < 2 {
            continue;
        }
        execs.sort_by_key(|e| e.start);
        let done = journal.committed_generations(&flight_of(key));
        for (i, e) in execs.iter().enumerate().skip(1) {
            let earlier = &execs[..i];
            let overlapping = earlier
                .iter()
                .find(|p| p.end.is_none_or(|end| end > e.start));
            let cause = match overlapping {
                Some(p) if p.generation == e.generation => SAME_GEN,
                Some(_) => TAKEOVER,
                None if earlier.iter().any(|p| done.contains(&p.generation)) => AFTER_COMMITTED,
                // The latest earlier run is the one this run replaced.
                None if earlier.last().is_some_and(|p| p.killed) => AFTER_KILLED,
                None => AFTER_UNCOMMITTED,
            };
            *out.by_cause.entry(cause).or_default() += 1;
            out.listed.push(format!(
                "  {key}: gen {} on node {} after (gen, node) {:?} -> {cause}",
                e.generation,
                e.node,
                earlier
                    .iter()
                    .map(|p| (p.generation, p.node))
                    .collect::<Vec<_>>()
            ));
        }
    }
    out
}

// ----------------------------------------------------------------- faults

/// What the Redis faults act on.
#[derive(Debug)]
pub enum Topology {
    /// One server (fsync-always AOF), each node behind its own proxy.
    Standalone(Arc<Mutex<RedisServer>>),
    /// A primary, a replica and three sentinels.
    Sentinel(Arc<RedisSentinel>),
    /// A Redis Cluster of primaries (no proxies); its faults are slot
    /// migrations.
    Cluster(Arc<RedisCluster>),
}

/// One Redis with an fsync-always AOF (a kill and restart loses no
/// acknowledged write, so the generation history is one and "at most one
/// committed result per (key, generation)" holds across restarts), and a
/// [`FaultProxy`] to it for each of `nodes` nodes.
pub fn start_standalone(
    nodes: usize,
) -> Result<(Topology, Vec<FaultProxy>), crate::RedisServerError> {
    let redis = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"])?;
    let proxies = (0..nodes)
        .map(|_| FaultProxy::start(redis.addr()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((Topology::Standalone(Arc::new(Mutex::new(redis))), proxies))
}

/// One fault of a schedule.
#[derive(Clone, Copy, Debug)]
pub enum Chaos {
    /// Redis SIGKILL, down for `down`, restarted on its port.
    KillRestart {
        /// How long Redis stays down.
        down: Duration,
    },
    /// Redis SIGSTOP, SIGCONT after `dur`.
    Pause {
        /// How long Redis is frozen.
        dur: Duration,
    },
    /// The node's proxy answers nothing (a partition).
    Blackhole {
        /// The node.
        node: usize,
        /// For how long.
        dur: Duration,
    },
    /// A blackhole ended by resetting every connection.
    BlackholeThenReset {
        /// The node.
        node: usize,
        /// For how long.
        dur: Duration,
    },
    /// The node's proxy resets every connection.
    Reset {
        /// The node.
        node: usize,
    },
    /// The node's proxy delays every chunk.
    Latency {
        /// The node.
        node: usize,
        /// The added delay.
        delay: Duration,
        /// For how long.
        dur: Duration,
    },
    /// The node's proxy cuts replies in the middle.
    CutMidReply {
        /// The node.
        node: usize,
        /// For how long.
        dur: Duration,
    },
    /// A forced Sentinel failover.
    Failover,
    /// The Sentinel primary SIGSTOPped (past 1 s the sentinels fail over).
    PausePrimary {
        /// How long it is frozen.
        dur: Duration,
    },
    /// The node's process SIGKILLed while it runs a flight, restarted after
    /// `down` (applied by the multi-process runner, not by [`apply`]).
    KillNode {
        /// The node.
        node: usize,
        /// How long it stays down.
        down: Duration,
    },
    /// The cluster slot of the current window's key number `key` (modulo
    /// the keys per window, see [`Load::live_key`]) moved to the next
    /// primary while the load runs: held `pause` in MIGRATING/IMPORTING
    /// before and again after its keys move, so clients meet `TRYAGAIN`
    /// and `ASK`, then `MOVED` ([`migrate_slot`]). Applied by the runner,
    /// which knows which slot holds a key, not by [`apply`].
    MigrateSlot {
        /// The key, by number.
        key: usize,
        /// Each of the two holds.
        pause: Duration,
    },
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..hi))
}

impl Chaos {
    /// The name of [`Chaos::KillNode`] in a summary.
    pub const KILL_NODE: &'static str = "node process SIGKILL mid-work+restart";

    /// The name in a summary.
    pub fn name(&self) -> &'static str {
        match self {
            Self::KillRestart { .. } => "redis kill+restart",
            Self::Pause { .. } => "redis SIGSTOP/SIGCONT",
            Self::Blackhole { .. } => "proxy blackhole",
            Self::BlackholeThenReset { .. } => "proxy blackhole+reset",
            Self::Reset { .. } => "proxy reset",
            Self::Latency { .. } => "proxy latency",
            Self::CutMidReply { .. } => "proxy cut mid-reply",
            Self::Failover => "sentinel failover",
            Self::PausePrimary { .. } => "primary SIGSTOP/SIGCONT",
            Self::KillNode { .. } => Self::KILL_NODE,
            Self::MigrateSlot { .. } => "cluster slot migration",
        }
    }

    /// How long it lasts.
    pub fn length(&self) -> Duration {
        match *self {
            Self::KillRestart { down } | Self::KillNode { down, .. } => down,
            Self::Pause { dur }
            | Self::Blackhole { dur, .. }
            | Self::BlackholeThenReset { dur, .. }
            | Self::Latency { dur, .. }
            | Self::CutMidReply { dur, .. }
            | Self::PausePrimary { dur } => dur,
            Self::MigrateSlot { pause, .. } => pause * 2,
            Self::Reset { .. } | Self::Failover => Duration::ZERO,
        }
    }

    /// A fault for one Redis and `nodes` proxied nodes: Redis kill and
    /// restart or SIGSTOP, or a proxy fault on one node.
    pub fn standalone(rng: &mut StdRng, nodes: usize) -> Self {
        let node = rng.random_range(0..nodes);
        let kind = rng_kind(rng, 7);
        Self::standalone_kind(rng, node, kind)
    }

    /// Kills a node process mid-work and restarts it after 0.2 to 2 s.
    pub fn kill_node(rng: &mut StdRng, nodes: usize) -> Self {
        Self::KillNode {
            node: rng.random_range(0..nodes),
            down: ms(rng, 200, 2000),
        }
    }

    fn standalone_kind(rng: &mut StdRng, node: usize, kind: u32) -> Self {
        match kind {
            0 => Self::KillRestart {
                down: ms(rng, 100, 2000),
            },
            1 => Self::Pause {
                dur: ms(rng, 200, 3000),
            },
            2 => Self::Blackhole {
                node,
                dur: ms(rng, 200, 3000),
            },
            3 => Self::BlackholeThenReset {
                node,
                dur: ms(rng, 500, 3000),
            },
            4 => Self::Reset { node },
            5 => Self::Latency {
                node,
                delay: ms(rng, 5, 150),
                dur: ms(rng, 500, 3000),
            },
            _ => Self::CutMidReply {
                node,
                dur: ms(rng, 100, 1000),
            },
        }
    }

    /// A Sentinel fault: a forced failover or a frozen primary.
    pub fn sentinel(rng: &mut StdRng, nodes: usize) -> Self {
        // Drawn for the same sequence as the other schedules.
        let _node = rng.random_range(0..nodes);
        match rng_kind(rng, 2) {
            0 => Self::Failover,
            _ => Self::PausePrimary {
                dur: ms(rng, 200, 3000),
            },
        }
    }

    /// A cluster fault: the slot of a live key migrated, each hold 0.1 to
    /// 1.5 s.
    pub fn cluster(rng: &mut StdRng, nodes: usize) -> Self {
        // Drawn for the same sequence as the other schedules.
        let _node = rng.random_range(0..nodes);
        Self::MigrateSlot {
            key: rng.random_range(0..1024),
            pause: ms(rng, 100, 1500),
        }
    }
}

fn rng_kind(rng: &mut StdRng, kinds: u32) -> u32 {
    rng.random_range(0..kinds)
}

/// The schedule: (start offset, fault), from the seed alone. Faults start
/// from 2 s, with 1 to 3.5 s of calm between them, and the last 5 s are
/// calm, so every flight can finish before the checks.
pub fn schedule(
    seed: u64,
    total: Duration,
    mut pick: impl FnMut(&mut StdRng) -> Chaos,
) -> Vec<(Duration, Chaos)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = Duration::from_secs(2);
    let end = total.saturating_sub(Duration::from_secs(5));
    while t < end {
        let fault = pick(&mut rng);
        out.push((t, fault));
        t += fault.length() + ms(&mut rng, 1000, 3500);
    }
    out
}

fn proxy<'a>(proxies: &[&'a FaultProxy], i: usize) -> &'a FaultProxy {
    proxies
        .get(i)
        .copied()
        .expect("standalone nodes have proxies")
}

/// Applies a Redis or proxy fault and waits until it is over. `proxies`
/// are the nodes' proxies, by node. Panics on a fault that does not apply
/// to `topology`, and on [`Chaos::KillNode`] (the runner of the node
/// processes applies it).
pub async fn apply(fault: Chaos, topology: &Topology, proxies: &[&FaultProxy]) {
    match (fault, topology) {
        (Chaos::KillRestart { down }, Topology::Standalone(redis)) => {
            let r = redis.clone();
            blocking("kill", move || lock(&r).kill()).await;
            tokio::time::sleep(down).await;
            let r = redis.clone();
            blocking("restart", move || lock(&r).restart())
                .await
                .expect("redis restarts");
        }
        (Chaos::Pause { dur }, Topology::Standalone(redis)) => {
            let r = redis.clone();
            blocking("pause", move || lock(&r).pause()).await.unwrap();
            tokio::time::sleep(dur).await;
            let r = redis.clone();
            blocking("resume", move || lock(&r).resume()).await.unwrap();
        }
        (Chaos::Blackhole { node, dur }, _) => {
            proxy(proxies, node).set(Fault::Blackhole);
            tokio::time::sleep(dur).await;
            proxy(proxies, node).set(Fault::Pass);
        }
        (Chaos::BlackholeThenReset { node, dur }, _) => {
            proxy(proxies, node).set(Fault::Blackhole);
            tokio::time::sleep(dur).await;
            proxy(proxies, node).reset_all();
            proxy(proxies, node).set(Fault::Pass);
        }
        (Chaos::Reset { node }, _) => proxy(proxies, node).reset_all(),
        (Chaos::Latency { node, delay, dur }, _) => {
            proxy(proxies, node).set(Fault::Latency(delay));
            tokio::time::sleep(dur).await;
            proxy(proxies, node).set(Fault::Pass);
        }
        (Chaos::CutMidReply { node, dur }, _) => {
            proxy(proxies, node).set(Fault::CutMidReply);
            tokio::time::sleep(dur).await;
            proxy(proxies, node).set(Fault::Pass);
        }
        (Chaos::Failover, Topology::Sentinel(s)) => {
            let s = s.clone();
            // An automatic failover may be running already: then wait for it.
            let done = blocking("failover", move || s.failover(Duration::from_secs(20))).await;
            if let Err(e) = done {
                eprintln!("  failover: {e}");
            }
        }
        (Chaos::PausePrimary { dur }, Topology::Sentinel(s)) => pause_primary(s, dur).await,
        (other, _) => panic!("{other:?} does not apply to this topology"),
    }
}

/// Moves `slot` to the primary after its owner ([`Chaos::MigrateSlot`]),
/// holding `pause` before and after its keys move; returns the nodes it
/// moved between. Panics if the cluster refuses.
pub async fn migrate_slot(
    cluster: &Arc<RedisCluster>,
    slot: u16,
    pause: Duration,
) -> (usize, usize) {
    let c = cluster.clone();
    blocking("slot migration", move || {
        let from = c.slot_owner(slot)?;
        let to = (from + 1) % c.nodes().len();
        c.migrate_slot(slot, to, pause).map(|()| (from, to))
    })
    .await
    .expect("the slot migrates")
}

/// SIGSTOP/SIGCONT the primary of the sentinel set (it stays owned, and
/// killed on drop, by the testkit), then let an automatic failover settle.
async fn pause_primary(s: &Arc<RedisSentinel>, dur: Duration) {
    let Ok(port) = s.primary_port() else {
        return;
    };
    let pid = s
        .data_nodes()
        .iter()
        .find(|d| d.port() == port)
        .and_then(RedisServer::pid);
    let Some(pid) = pid else { return };
    let _ = crate::redis::send_signal(pid, "-STOP");
    tokio::time::sleep(dur).await;
    let _ = crate::redis::send_signal(pid, "-CONT");
    let s = s.clone();
    blocking("settle", move || {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            let role = s.primary().ok().and_then(|p| match p.cmd(&["ROLE"]) {
                Ok(Resp::Array(Some(items))) => {
                    items.first().and_then(|r| r.as_str().map(str::to_owned))
                }
                _ => None,
            });
            if role.as_deref() == Some("master") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await;
}

/// Runs `plan` from `started` until `total`: waits for each fault's time,
/// calls `tick` (about every 250 ms and before each fault, for memory
/// samples) and `apply`. Faults that would start after `total` (slow ones
/// ate the time) are skipped. Returns how many of each kind were applied.
pub async fn drive<F, Fut>(
    plan: &[(Duration, Chaos)],
    started: Instant,
    total: Duration,
    mut apply: F,
    mut tick: impl FnMut(),
) -> BTreeMap<&'static str, u64>
where
    F: FnMut(Chaos) -> Fut,
    Fut: Future<Output = ()>,
{
    let verbose = std::env::var_os("FLIGHTDECK_CHAOS_VERBOSE").is_some();
    let mut applied: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (at, fault) in plan {
        if started.elapsed() >= total {
            break;
        }
        while started.elapsed() < *at {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tick();
        if verbose {
            eprintln!("  {:>6.1}s {fault:?}", started.elapsed().as_secs_f64());
        }
        apply(*fault).await;
        if verbose {
            eprintln!("  {:>6.1}s done", started.elapsed().as_secs_f64());
        }
        *applied.entry(fault.name()).or_default() += 1;
    }
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_millis(250)).await;
        tick();
    }
    applied
}

// ------------------------------------------------------------------- load

/// What one request came to.
#[derive(Debug)]
pub enum Attempt {
    /// A value (`key|...`).
    Value(String),
    /// An error, by class.
    Error(String),
    /// Not sent (its node is down).
    Skipped,
}

/// The outcomes of a run's requests.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Values.
    pub ok: AtomicU64,
    /// Requests that outlived [`REQUEST_DEADLINE`].
    pub hung: AtomicU64,
    /// Values for another key.
    pub wrong_key: AtomicU64,
    /// Errors by class.
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// The slowest request.
    pub slowest_ms: AtomicU64,
}

/// A load of `keys` keys per time window: every worker requests the same K
/// keys (`k{i}.w{n}`) for one window, then moves on, so each key is one
/// burst of coalescing and any second execution is a duplicate.
#[derive(Debug)]
pub struct Load {
    /// The run's seed.
    pub seed: u64,
    /// Keys per window.
    pub keys: usize,
    /// The window.
    pub window: Duration,
    /// When the load started.
    pub started: Instant,
    /// Set to stop the workers.
    pub stop: AtomicBool,
    /// What the requests came to.
    pub out: Outcomes,
}

impl Load {
    /// A load starting now.
    pub fn new(seed: u64, keys: usize, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            seed,
            keys,
            window,
            started: Instant::now(),
            stop: AtomicBool::new(false),
            out: Outcomes::default(),
        })
    }

    /// The name of key number `i` (modulo [`keys`](Self::keys)) of the
    /// current window: `k{i}.w{n}`.
    pub fn live_key(&self, i: usize) -> String {
        let w = self.started.elapsed().as_millis() / self.window.as_millis();
        format!("k{}.w{w}", i % self.keys.max(1))
    }
}

/// One worker: until the load stops, requests a key of the current window
/// through `call` (bounded by [`REQUEST_DEADLINE`]), records the outcome,
/// pauses 0–40 ms.
pub async fn worker<F, Fut>(load: Arc<Load>, seed: u64, mut call: F)
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Attempt>,
{
    let mut rng = StdRng::seed_from_u64(seed);
    while !load.stop.load(Ordering::SeqCst) {
        let key = load.live_key(rng.random_range(0..load.keys));
        let began = Instant::now();
        let out = &load.out;
        match timeout(REQUEST_DEADLINE, call(key.clone())).await {
            Err(_) => {
                out.hung.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Attempt::Value(v)) => {
                if v.split('|').next() != Some(key.as_str()) {
                    out.wrong_key.fetch_add(1, Ordering::SeqCst);
                }
                out.ok.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Attempt::Error(class)) => {
                *lock(&out.errors).entry(class).or_default() += 1;
            }
            Ok(Attempt::Skipped) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        let took = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        out.slowest_ms.fetch_max(took, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    }
}

// ----------------------------------------------------------------- memory

/// The resident set of this process (`/proc/self/statm`), 0 if unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// The resident set of process `pid` (`VmRSS` of `/proc/PID/status`), 0 if
/// unknown (e.g. it is gone).
pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// RSS samples of one process.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// Which process ("test process", "node 1 (pid 123)").
    pub label: String,
    /// At a quarter of the run (or of its life), warmed up.
    pub warm: u64,
    /// After the load stopped.
    pub end: u64,
    /// Every sample, in order.
    pub samples: Vec<u64>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

impl Memory {
    /// Growth from warm to end.
    pub fn growth(&self) -> u64 {
        self.end.saturating_sub(self.warm)
    }
}

// ---------------------------------------------------------------- summary

/// Everything a run's summary prints and checks.
#[derive(Debug)]
pub struct Summary<'a> {
    /// The run's name.
    pub name: &'a str,
    /// Its seed.
    pub seed: u64,
    /// Its length.
    pub secs: u64,
    /// How many nodes.
    pub nodes: usize,
    /// The load.
    pub load: &'a Load,
    /// Faults applied, by kind.
    pub applied: &'a BTreeMap<&'static str, u64>,
    /// What the coordination backend granted and accepted, every node.
    pub journal: &'a Journal,
    /// Every execution, every node.
    pub executions: &'a [Exec],
    /// How long the in-flight maps took to empty after the load stopped.
    pub drained: Duration,
    /// What the drained maps are.
    pub drained_what: &'a str,
    /// Memory, per process.
    pub memory: &'a [Memory],
    /// More lines to print (proxy statistics, ...).
    pub extra: Vec<String>,
}

impl Summary<'_> {
    /// Prints the summary, then asserts the invariants: no hung request,
    /// no result for another key, some values, memory growth under 96 MiB
    /// per process; with `strict`, also no stale commit, at most one
    /// committed result per (key, generation), generations per flight
    /// strictly increasing, no generation run twice at once, no committed
    /// result re-run.
    /// `flight_of` maps a request key to its flight.
    pub fn print_and_check(&self, strict: bool, flight_of: impl Fn(&str) -> FlightId) {
        let j = self.journal;
        let execs = self.executions;
        let dups = duplicates(execs, j, flight_of);
        let stale = j.stale_commits();
        let per_gen = j.max_committed_per_generation();
        let order = j.generation_order_violations();
        let out = &self.load.out;
        let hung = out.hung.load(Ordering::SeqCst);
        let wrong = out.wrong_key.load(Ordering::SeqCst);
        let ok = out.ok.load(Ordering::SeqCst);
        let errors = lock(&out.errors).clone();
        let count = |want: Option<bool>| j.commits.iter().filter(|c| c.committed == want).count();
        let distinct_keys: HashSet<&str> = execs.iter().map(|e| e.key.as_str()).collect();

        println!(
            "==== chaos summary: {} (seed {}, {} s, {} nodes, {} keys per window) ====",
            self.name, self.seed, self.secs, self.nodes, self.load.keys
        );
        println!("faults applied: {:?}", self.applied);
        println!(
            "requests: {ok} ok, errors by class {errors:?}, slowest {} ms (deadline {REQUEST_DEADLINE:?})",
            out.slowest_ms.load(Ordering::SeqCst)
        );
        println!("hung requests: {hung}");
        println!("results delivered for the wrong key: {wrong}");
        println!("stale commits: {}", stale.len());
        for s in &stale {
            println!("  {s}");
        }
        println!("committed results per (key, generation): at most {per_gen}");
        println!(
            "generations per flight not strictly increasing: {}",
            order.len()
        );
        for o in order.iter().take(20) {
            println!("  {o}");
        }
        println!(
            "executions: {} for {} keys; grants {} (takeovers {}); commits {} committed, {} fenced, {} failed; heartbeats lost {}, failed {}",
            execs.len(),
            distinct_keys.len(),
            j.grants.len(),
            j.takeovers(),
            count(Some(true)),
            count(Some(false)),
            count(None),
            j.heartbeats_lost,
            j.heartbeats_failed
        );
        println!(
            "duplicate executions: {} total",
            dups.by_cause.values().sum::<u64>()
        );
        for (cause, n) in &dups.by_cause {
            println!("  {n:>4}  {cause}");
        }
        for line in dups.listed.iter().take(20) {
            println!("{line}");
        }
        if dups.listed.len() > 20 {
            println!("  ... {} more", dups.listed.len() - 20);
        }
        println!(
            "in-flight maps: back to empty {:?} after the load stopped ({})",
            self.drained, self.drained_what
        );
        for m in self.memory {
            println!(
                "memory (RSS) of {}: {:.1} MiB at 1/4 of the run, {:.1} MiB at the end (growth {:.1} MiB); samples {:?}",
                m.label,
                mib(m.warm),
                mib(m.end),
                mib(m.growth()),
                m.samples
                    .iter()
                    .step_by((m.samples.len() / 8).max(1))
                    .map(|b| format!("{:.0}", mib(*b)))
                    .collect::<Vec<_>>()
            );
        }
        for line in &self.extra {
            println!("{line}");
        }

        assert_eq!(hung, 0, "every request ends by its deadline");
        assert_eq!(wrong, 0, "no result for another key");
        assert!(ok > 0, "some requests got a value");
        for m in self.memory {
            // Generous: the journals themselves grow with the run.
            assert!(
                m.growth() < 96 * 1024 * 1024,
                "memory of {} grew by {:.1} MiB",
                m.label,
                mib(m.growth())
            );
        }
        if strict {
            assert!(stale.is_empty(), "no commit by a fenced owner");
            assert!(
                per_gen <= 1,
                "at most one committed result per (key, generation)"
            );
            assert!(
                order.is_empty(),
                "generations per flight strictly increase across the run"
            );
            assert_eq!(dups.by_cause.get(SAME_GEN), None, "AOF keeps generations");
            assert_eq!(
                dups.by_cause.get(AFTER_COMMITTED),
                None,
                "results outlive the run"
            );
        }
    }
}
