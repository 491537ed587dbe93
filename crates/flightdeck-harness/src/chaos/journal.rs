//! What the journals and executions of a run say once it is over: every
//! execution with its node and generation (also from node processes'
//! logs), the duplicate executions by cause, and followers that waited on
//! a lease no live owner held.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_distributed::FlightId;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::recorder::{wall_us, EventLog, WallClock};
use crate::Journal;

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
        let (mut journal, malformed) = Journal::from_log(text, clock);
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
            journal.killed_at(killed);
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
/// Cause: the latest committed result was past its freshness (a refresh).
pub const REFRESHED: &str = "refresh of a committed result past its freshness";

/// How much earlier than its work's end plus its freshness a stored
/// result may stop being fresh: Redis keeps time in whole milliseconds.
const STORE_CLOCK_SLACK: Duration = Duration::from_millis(5);

/// Every execution of a key after its first, with its cause. `flight_of`
/// maps a request key to its flight (for the journal's commits); `fresh`:
/// how long a committed result is fresh from its work's end (the store
/// counts from the commit's arrival, with the freshness shortened by the
/// time since the work ended when it was sent, so never less than that).
/// A run that starts once the latest committed result is past it is a
/// refresh, not a lost result.
pub fn duplicates(
    executions: &[Exec],
    journal: &Journal,
    flight_of: impl Fn(&str) -> FlightId,
    fresh: Duration,
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
            // The store keeps the newest committed generation's result.
            let committed = earlier
                .iter()
                .filter(|p| done.contains(&p.generation))
                .max_by_key(|p| p.generation)
                .and_then(|p| p.end);
            let expired = committed.is_some_and(|end| {
                end.checked_add(fresh)
                    .is_some_and(|stale| e.start + STORE_CLOCK_SLACK >= stale)
            });
            let cause = match overlapping {
                Some(p) if p.generation == e.generation => SAME_GEN,
                Some(_) => TAKEOVER,
                None if expired => REFRESHED,
                None if committed.is_some() => AFTER_COMMITTED,
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

// ------------------------------------------------------- ownerless waits

/// How long a follower may see one lease live when nobody extends it: the
/// lease, plus the request of its first look sent up to a call timeout
/// before the lease began and its last answer received up to a call
/// timeout after it ended, plus 250 ms of scheduling.
pub fn ownerless_bound(lease: Duration, call_timeout: Duration) -> Duration {
    lease + call_timeout * 2 + Duration::from_millis(250)
}

/// Followers that waited on a lease no live owner held: the holder's
/// grant never reached its node (an acquire whose answer was lost or came
/// too late: an orphan), or the holder's process had been killed before
/// the wait began. Nobody heartbeats such a lease, and its node releases
/// it once Redis answers, so no follower may see it live for longer than
/// the lease plus slack.
#[derive(Debug, Default)]
pub struct OwnerlessWaits {
    /// (follower, holder generation) pairs whose first FOLLOWER answer
    /// named a generation no live owner held.
    pub waits: usize,
    /// The longest of them, from the first look sent to the last FOLLOWER
    /// answer naming that generation.
    pub longest: Duration,
    /// The bound ([`ownerless_bound`]).
    pub bound: Duration,
    /// The waits longer than the bound, one line each.
    pub violations: Vec<String>,
}

/// The waits of [`OwnerlessWaits`] in `journal` (every node's, merged).
pub fn ownerless_waits(journal: &Journal, bound: Duration) -> OwnerlessWaits {
    let owners: HashMap<(FlightId, u64), &str> = journal
        .grants
        .iter()
        .map(|g| ((g.flight, g.generation), g.token.as_str()))
        .collect();
    let mut out = OwnerlessWaits {
        bound,
        ..OwnerlessWaits::default()
    };
    let mut followed: Vec<_> = journal.followed.values().collect();
    followed.sort_by_key(|f| f.first_sent);
    for f in followed {
        let alive = owners
            .get(&(f.flight, f.generation))
            .is_some_and(|token| journal.killed.get(*token).is_none_or(|k| *k > f.first_sent));
        if alive {
            continue;
        }
        out.waits += 1;
        let span = f.last_at.saturating_duration_since(f.first_sent);
        out.longest = out.longest.max(span);
        if span > bound {
            let holder = if owners.contains_key(&(f.flight, f.generation)) {
                "its owner's process was killed"
            } else {
                "its grant never reached a node"
            };
            out.violations.push(format!(
                "  {:?}: a follower saw generation {} live for {span:?} ({} answers); {holder}",
                f.flight, f.generation, f.answers
            ));
        }
    }
    out
}
