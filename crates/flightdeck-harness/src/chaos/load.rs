//! A run's settings (from the environment), the L2 policy every chaos
//! node uses, and the keyed load: windows of keys, the workers that
//! request them, and what the requests came to.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_distributed::DistributedPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use tokio::time::{timeout, Instant};

use super::lock;

/// Every request must end (value or typed error) within this bound: L1
/// wait, two acquire attempts, a follower's wait and takeover, the work,
/// commit attempts.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(12);

/// The lease of a chaos run's flights.
pub const LEASE: Duration = Duration::from_millis(1500);

/// The deadline of each backend call of a chaos node (also its Redis
/// clients' command timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_millis(300);

/// The L2 policy of every chaos node: a short lease with heartbeats well
/// inside it, polls as the fallback of lost notices, a bounded wait, results
/// kept longer than the run's windows, three commit attempts.
pub fn distributed_policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(LEASE)
        .heartbeat(Duration::from_millis(400))
        .poll_interval(Duration::from_millis(200))
        .wait_timeout(Duration::from_secs(5))
        .replay_ttl(Duration::from_secs(120))
        .call_timeout(CALL_TIMEOUT)
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

/// How long the chaos work runs for `key`: fixed per key, 30 ms to 1.23 s
/// (some longer than a heartbeat, a few close to the lease).
pub fn work_duration(key: &str) -> Duration {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    Duration::from_millis(30 + h.finish() % 1200)
}

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
    /// Per shard (the one serving the key's flight when the request was
    /// sent, see [`Load::shard_by`]; `whole` when not sharded): requests
    /// that got a value, and those that did not (an error or hung).
    pub by_shard: Mutex<BTreeMap<String, (u64, u64)>>,
}

/// Names the shard serving a request key's flight.
pub struct ShardOf(Box<dyn Fn(&str) -> String + Send + Sync>);

impl std::fmt::Debug for ShardOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardOf(..)")
    }
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
    /// How a key maps to its shard, once set.
    shard_of: std::sync::OnceLock<ShardOf>,
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
            shard_of: std::sync::OnceLock::new(),
        })
    }

    /// Counts the requests per shard with `shard_of` (e.g. a sharded
    /// backend's `Backend::shard` of the key's flight), asked when each
    /// request is sent; the first call wins.
    pub fn shard_by(&self, shard_of: impl Fn(&str) -> String + Send + Sync + 'static) {
        let _ = self.shard_of.set(ShardOf(Box::new(shard_of)));
    }

    fn shard(&self, key: &str) -> String {
        self.shard_of
            .get()
            .map_or_else(|| "whole".to_owned(), |f| (f.0)(key))
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
        let shard = load.shard(&key);
        let served = match timeout(REQUEST_DEADLINE, call(key.clone())).await {
            Err(_) => {
                out.hung.fetch_add(1, Ordering::SeqCst);
                false
            }
            Ok(Attempt::Value(v)) => {
                if v.split('|').next() != Some(key.as_str()) {
                    out.wrong_key.fetch_add(1, Ordering::SeqCst);
                }
                out.ok.fetch_add(1, Ordering::SeqCst);
                true
            }
            Ok(Attempt::Error(class)) => {
                *lock(&out.errors).entry(class).or_default() += 1;
                false
            }
            Ok(Attempt::Skipped) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        {
            let mut by_shard = lock(&out.by_shard);
            let counts = by_shard.entry(shard).or_default();
            if served {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        let took = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        out.slowest_ms.fetch_max(took, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    }
}
