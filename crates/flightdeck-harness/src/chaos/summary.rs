//! Memory samples of the processes of a run, and the summary every run
//! prints and checks.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use flightdeck_distributed::FlightId;

use super::{
    duplicates, lock, ownerless_bound, ownerless_waits, Exec, LeaseScan, Load, AFTER_COMMITTED,
    CALL_TIMEOUT, LEASE, REQUEST_DEADLINE, SAME_GEN,
};
use crate::Journal;

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
    /// How long a committed result is fresh (the nodes' `replay-ttl`): a
    /// run after that is a refresh, not a duplicate of a lost result.
    pub fresh: Duration,
    /// How long the in-flight maps took to empty after the load stopped.
    pub drained: Duration,
    /// What the drained maps are.
    pub drained_what: &'a str,
    /// The flight records on Redis once every node was idle, and the
    /// leases still held among them ([`scan_leases`](super::scan_leases)).
    pub leases: &'a LeaseScan,
    /// Memory, per process.
    pub memory: &'a [Memory],
    /// More lines to print (proxy statistics, ...).
    pub extra: Vec<String>,
}

impl Summary<'_> {
    /// Prints the summary (with the availability of each shard), then
    /// asserts the invariants: no hung request, no result for another key,
    /// some values, some on every shard, memory growth under 96 MiB
    /// per process; with `strict`, also no stale commit, at most one
    /// committed result per (key, generation), generations per flight
    /// strictly increasing, no generation run twice at once, no committed
    /// result re-run while fresh, no lease left held once every node was idle (an
    /// orphan), no follower seeing a lease with no live owner for longer
    /// than the lease plus slack ([`ownerless_waits`]); and the lease scan
    /// saw the run's flight records.
    /// `flight_of` maps a request key to its flight.
    pub fn print_and_check(&self, strict: bool, flight_of: impl Fn(&str) -> FlightId) {
        let j = self.journal;
        let execs = self.executions;
        let dups = duplicates(execs, j, flight_of, self.fresh);
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
        let ownerless = ownerless_waits(j, ownerless_bound(LEASE, CALL_TIMEOUT));
        let granted: HashSet<&str> = j.grants.iter().map(|g| g.token.as_str()).collect();
        let leases = self.leases;

        println!(
            "==== chaos summary: {} (seed {}, {} s, {} nodes, {} keys per window) ====",
            self.name, self.seed, self.secs, self.nodes, self.load.keys
        );
        println!("faults applied: {:?}", self.applied);
        println!(
            "requests: {ok} ok, errors by class {errors:?}, slowest {} ms (deadline {REQUEST_DEADLINE:?})",
            out.slowest_ms.load(Ordering::SeqCst)
        );
        let by_shard = lock(&out.by_shard).clone();
        println!(
            "availability by shard (serving the key when the request was sent): {}",
            by_shard
                .iter()
                .map(|(shard, (ok, failed))| format!(
                    "{shard} {:.1}% ({ok} of {})",
                    100.0 * *ok as f64 / (ok + failed).max(1) as f64,
                    ok + failed
                ))
                .collect::<Vec<_>>()
                .join(", ")
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
            "orphaned leases at the end (held once every node was idle, so by no running flight): {} of {} flight records",
            leases.held.len(),
            leases.records
        );
        for l in leases.held.iter().take(20) {
            let whose = if granted.contains(l.token.as_str()) {
                "granted to a node that walked away"
            } else {
                "its grant never reached a node"
            };
            println!(
                "  {} on port {}: generation {}, {:?} left; {whose}",
                l.key, l.port, l.generation, l.remaining
            );
        }
        println!(
            "follower waits on a lease with no live owner: {} (longest {:?}); longer than the lease + slack ({:?}): {}",
            ownerless.waits,
            ownerless.longest,
            ownerless.bound,
            ownerless.violations.len()
        );
        for v in ownerless.violations.iter().take(20) {
            println!("{v}");
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
            "leases given up on and released by token: {} freed a lease, {} had nothing to free",
            j.releases_freed, j.releases_not_owner
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
        for (shard, (ok, _)) in &by_shard {
            assert!(*ok > 0, "shard {shard} served no request");
        }
        assert!(
            leases.records > 0,
            "the lease scan saw the run's flight records"
        );
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
            assert!(
                leases.held.is_empty(),
                "no lease is left held once every node is idle"
            );
            assert!(
                ownerless.violations.is_empty(),
                "no follower waits longer than the lease on a lease nobody holds"
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
