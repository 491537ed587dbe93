//! The faults: what they act on ([`Topology`]), the seeded schedule,
//! and how each is applied to Redis and the nodes' proxies.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{blocking, lock};
use crate::{Fault, FaultProxy, RedisCluster, RedisSentinel, RedisServer, Resp};

/// What the Redis faults act on.
#[derive(Clone, Debug)]
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
    /// the keys per window, see [`Load::live_key`](super::Load::live_key)) moved to the next
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
/// killed on drop, by the harness), then let an automatic failover settle.
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
    let _ = crate::redis::send_signal(pid, Signal::SIGSTOP);
    tokio::time::sleep(dur).await;
    let _ = crate::redis::send_signal(pid, Signal::SIGCONT);
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
