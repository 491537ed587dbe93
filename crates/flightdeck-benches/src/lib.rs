//! Benchmarks only: see `benches/` (`cargo bench -p flightdeck-benches`).
//! What the bench programs share: the [`harness`] (criterion, paired
//! ratios, one row alone for callgrind), the peers' error type, our layer
//! set up the same way in each, and the [`Floor`] to compare both with;
//! the L2 benches' setup ([`l2`]).

pub mod harness;
pub mod l2;

use std::convert::Infallible;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use flightdeck_core::{BoxError, FlightKey, KeyEncoder, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use tower::{service_fn, Layer, Service};

/// CPU time this process has used, every thread's, user and system
/// (`getrusage`; a child such as wrk apart).
pub fn cpu_time() -> std::time::Duration {
    use std::time::Duration;
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(u.user_time()) + tv(u.system_time())
}

/// The error type the peers' services return (they need `Clone`).
#[derive(Debug, Clone)]
pub struct PeerError;

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("peer error")
    }
}

impl std::error::Error for PeerError {}

/// Keys repeat every this many calls, long after each flight finished.
pub const KEYS: usize = 4096;

/// `KEYS` distinct keys of the stage `bench`, built once.
pub fn prebuilt_keys() -> Vec<FlightKey> {
    let stage = StageName::new("bench").expect("a valid stage name");
    (0..KEYS as u64)
        .map(|n| {
            KeyEncoder::new()
                .field(&n.to_le_bytes())
                .finish_key(stage.clone(), None)
        })
        .collect()
}

/// `LocalFlight` over a service that answers at once, keyed by the key that
/// comes with the request (as when `KeyLayer` computed it upstream): the
/// coalescing machinery alone.
pub fn local_prebuilt() -> impl Service<
    (FlightKey, u64),
    Response = u64,
    Error = BoxError,
    Future = impl std::future::Future<Output = Result<u64, BoxError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    LocalFlightLayer::with_key(FlightPolicy::new(), |r: &(FlightKey, u64)| {
        Some(r.0.clone())
    })
    .layer(service_fn(|r: (FlightKey, u64)| async move {
        Ok::<_, Infallible>(r.1)
    }))
}

/// The least that any single-flight map with detachable work does per call
/// on a fresh key, and nothing else: hash the key, insert it into a
/// sharded, mutex-guarded table, box the work (so that it could move to a
/// task of its own if its caller left), run it, remove the key. No bounds,
/// no waiters, no TTLs, no metrics, no panic handling, no tracing.
///
/// With `clocks`, it also reads the (tokio) clock at the start and the end
/// of the work, as an execution-time histogram needs.
///
/// A bench row, not a usable single-flight: it exists so that a layer's
/// cost can be read against what its data structure alone costs on the
/// same machine in the same run.
#[derive(Debug)]
pub struct Floor {
    shards: Box<[Mutex<FloorShard>]>,
    hasher: foldhash::fast::RandomState,
}

/// The last id given out, and `(hash, id)` per running flight.
type FloorShard = (u64, hashbrown::HashTable<(u64, u64)>);

impl Default for Floor {
    fn default() -> Self {
        Self {
            shards: (0..16)
                .map(|_| Mutex::new((0, hashbrown::HashTable::new())))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl Floor {
    /// Runs `work` as the flight of `key`.
    pub async fn call<F>(self: &Arc<Self>, key: u64, work: F, clocks: bool) -> u64
    where
        F: Future<Output = u64> + Send + 'static,
    {
        let hash = self.hasher.hash_one(key);
        let shard = (hash >> 32) as usize & (self.shards.len() - 1);
        let id = {
            let mut guard = self.shards[shard].lock().unwrap();
            let (next, table) = &mut *guard;
            *next += 1;
            table.insert_unique(hash, (hash, *next), |e| e.0);
            *next
        };
        let began = clocks.then(tokio::time::Instant::now);
        let owner = Arc::clone(self);
        let work: Pin<Box<dyn Future<Output = u64> + Send>> = Box::pin(work);
        let out = work.await;
        if let Some(t) = began {
            std::hint::black_box(t.elapsed());
        }
        let mut guard = owner.shards[shard].lock().unwrap();
        if let Ok(e) = guard.1.find_entry(hash, |e| e.1 == id) {
            e.remove();
        }
        out
    }
}
