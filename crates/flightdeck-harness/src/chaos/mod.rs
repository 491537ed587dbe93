//! The parts of a chaos run that do not depend on how the nodes run: a
//! seeded fault schedule and its application to Redis and to the nodes'
//! [`FaultProxy`](crate::FaultProxy)s, a keyed load with its outcomes, the
//! executions and their duplicates by cause, the leases left on Redis at
//! the end, and the printed and checked summary (the invariants of
//! `docs/guarantees.md`). By file:
//!
//! - `load`: the run's settings, the L2 policy of every node, the keyed
//!   load and its outcomes;
//! - `faults`: the topologies, the seeded schedule and how each fault is
//!   applied;
//! - `journal`: what the journals and executions say afterwards
//!   (duplicates by cause, followers waiting on a lease nobody holds);
//! - `leases`: the scan of Redis for leases still held at the end;
//! - `summary`: memory samples and the printed, checked summary;
//! - `answers`: a run with the stale windows on, what each request was
//!   answered and the checks over every answer (the age bound, no
//!   generation going back on a node).
//!
//! Two suites use it: `flightdeck-redis/tests/chaos.rs` (N L1 + L2 stacks
//! in one test process) and `flightdeck-harness/tests/chaos_nodes.rs` (N
//! `flightdeck-node` processes driven over HTTP, which adds killing and
//! restarting a node process, [`Chaos::KillNode`]). The in-process suite
//! also runs over a Redis Cluster with live slot migrations
//! ([`Chaos::MigrateSlot`]).
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_harness::chaos::{schedule, Chaos};
//!
//! // Faults for 3 nodes over 60 s: the same for the same seed, none in
//! // the calm last 5 s.
//! let total = Duration::from_secs(60);
//! let plan = schedule(7, total, |rng| Chaos::standalone(rng, 3));
//! let again = schedule(7, total, |rng| Chaos::standalone(rng, 3));
//! assert_eq!(format!("{plan:?}"), format!("{again:?}"));
//! assert!(plan.iter().all(|(at, _)| *at < Duration::from_secs(55)));
//! ```

mod answers;
mod faults;
mod journal;
mod leases;
mod load;
mod summary;

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::timeout;

pub use answers::*;
pub use faults::*;
pub use journal::*;
pub use leases::*;
pub use load::*;
pub use summary::*;

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
