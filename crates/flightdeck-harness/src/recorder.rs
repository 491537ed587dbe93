//! A [`Backend`] wrapper that keeps a [`Journal`] of what the backend
//! granted and accepted (grants with their generation, commits with their
//! answer, lost heartbeats), and checks the invariants a chaos run must
//! keep: no stale commit, at most one committed result per (flight,
//! generation), generations per flight strictly increasing across the
//! whole run.
//!
//! Times are taken on the client: a grant when its request was sent and
//! when its reply arrived, a commit when it was sent. So "a commit of
//! generation g sent after the reply that granted g' > g" means the server
//! ran the commit after the grant, and it must have been fenced. Likewise
//! a grant sent after another grant's reply arrived ran later on the
//! server, so its generation must be the larger one.
//!
//! It also keeps what followers saw (which holder generation each
//! FOLLOWER answer named, first and last), so a run can tell waits on a
//! live owner from waits on a lease nobody holds any more.
//!
//! A recorder can also write every event as a JSON line to an
//! [`EventLog`] (flushed line by line, so a killed process loses nothing it
//! recorded); [`Journal::from_log`] reads such lines back, so the journals
//! of several node processes can be merged. Logged times are wall-clock
//! microseconds, which one machine's processes share; [`WallClock`] maps
//! them onto the reader's clock.
//!
//! ```
//! use flightdeck_distributed::Backend;
//! use flightdeck_harness::Recorder;
//! use flightdeck_test::{conformance, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let backend = Recorder::new(MemoryBackend::new());
//! conformance::owner_follower_hit(&backend).await;
//! let journal = backend.journal();
//! assert!(journal.stale_commits().is_empty());
//! assert!(journal.max_committed_per_generation() <= 1);
//! assert!(journal.generation_order_violations().is_empty());
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flightdeck_core::Digest;
use flightdeck_distributed::backend::{
    Acquired, Ask, Backend, BackendFuture, CommitArgs, Committed, FlightId, LeaseTerms, OwnerToken,
    Released, Renewal,
};
use serde_json::{json, Value};

pub use crate::eventlog::{wall_us, EventLog, SharedBuffer, WallClock};
use tokio::time::Instant;

/// One grant of a flight.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The flight.
    pub flight: FlightId,
    /// The generation granted.
    pub generation: u64,
    /// Whether it took over a dead owner's flight.
    pub takeover: bool,
    /// The token it was granted to (empty in logs that lack it).
    pub token: String,
    /// When the ACQUIRE that got it was sent.
    pub sent: Instant,
    /// When the reply arrived.
    pub at: Instant,
}

/// One commit attempt.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    /// The flight.
    pub flight: FlightId,
    /// The committing generation.
    pub generation: u64,
    /// The owner's token.
    pub token: String,
    /// When it was sent.
    pub sent: Instant,
    /// `Some(true)`: committed, `Some(false)`: fenced, `None`: failed (the
    /// outcome is unknown).
    pub committed: Option<bool>,
}

/// What one follower saw of one holder: the FOLLOWER answers that named
/// the same owner's generation (the backend said its lease was live).
#[derive(Clone, Debug)]
pub struct Followed {
    /// The flight.
    pub flight: FlightId,
    /// The holder's generation the answers named.
    pub generation: u64,
    /// The follower's token.
    pub token: String,
    /// When the first such answer's request was sent.
    pub first_sent: Instant,
    /// When the last such answer arrived.
    pub last_at: Instant,
    /// How many such answers.
    pub answers: u64,
}

/// What a [`Recorder`] saw.
#[derive(Clone, Debug, Default)]
pub struct Journal {
    /// Every grant (OWNER answer).
    pub grants: Vec<Grant>,
    /// Every commit attempt.
    pub commits: Vec<CommitRecord>,
    /// Heartbeats answered LOST.
    pub heartbeats_lost: u64,
    /// Heartbeats that failed (error).
    pub heartbeats_failed: u64,
    /// RELEASEs by token (of leases a node gave up on) that freed a lease.
    pub releases_freed: u64,
    /// RELEASEs by token answered NOT_OWNER (nothing to free).
    pub releases_not_owner: u64,
    /// FOLLOWER answers, by (follower token, holder generation).
    pub followed: HashMap<(String, u64), Followed>,
    /// Tokens granted in a process that was killed afterwards, with the
    /// time of the kill (set by whoever reads that process's log).
    pub killed: HashMap<String, Instant>,
}

impl Journal {
    /// Accepted commits of a generation sent after a newer generation of
    /// the same flight had been granted (each described in one line).
    pub fn stale_commits(&self) -> Vec<String> {
        let mut by_flight: HashMap<FlightId, Vec<&Grant>> = HashMap::new();
        for g in &self.grants {
            by_flight.entry(g.flight).or_default().push(g);
        }
        self.commits
            .iter()
            .filter(|c| c.committed == Some(true))
            .filter_map(|c| {
                let newer = by_flight
                    .get(&c.flight)?
                    .iter()
                    .find(|g| g.generation > c.generation && g.at < c.sent)?;
                Some(format!(
                    "{:?}: generation {} committed after generation {} was granted",
                    c.flight, c.generation, newer.generation
                ))
            })
            .collect()
    }

    /// The largest number of different owners whose commit of one (flight,
    /// generation) was accepted (a retry by the same owner counts once).
    pub fn max_committed_per_generation(&self) -> usize {
        let mut owners: HashMap<(FlightId, u64), HashSet<&str>> = HashMap::new();
        for c in self.commits.iter().filter(|c| c.committed == Some(true)) {
            owners
                .entry((c.flight, c.generation))
                .or_default()
                .insert(&c.token);
        }
        owners.values().map(HashSet::len).max().unwrap_or(0)
    }

    /// The generations of `flight` whose commit was accepted.
    pub fn committed_generations(&self, flight: &FlightId) -> HashSet<u64> {
        self.commits
            .iter()
            .filter(|c| c.committed == Some(true) && c.flight == *flight)
            .map(|c| c.generation)
            .collect()
    }

    /// Grants that break "generations per flight strictly increase across
    /// the whole run" (each described in one line): a grant sent after
    /// another grant's reply arrived (so it ran later on the server) with
    /// a smaller generation, or the same generation for another token; and
    /// one generation granted to two tokens, whatever the order. (A retry
    /// of an ACQUIRE with the same token legitimately answers the same
    /// generation.)
    pub fn generation_order_violations(&self) -> Vec<String> {
        let mut by_flight: HashMap<FlightId, Vec<&Grant>> = HashMap::new();
        for g in &self.grants {
            by_flight.entry(g.flight).or_default().push(g);
        }
        let mut out = Vec::new();
        for (flight, grants) in by_flight {
            for (i, a) in grants.iter().enumerate() {
                for b in &grants[i + 1..] {
                    let repeat = a.generation == b.generation && a.token != b.token;
                    let (first, then) = if a.at < b.sent {
                        (a, b)
                    } else if b.at < a.sent {
                        (b, a)
                    } else {
                        // Concurrent: only a repeat is a violation.
                        if repeat {
                            out.push(format!(
                                "{flight:?}: generation {} granted to two tokens at once",
                                a.generation
                            ));
                        }
                        continue;
                    };
                    if then.generation < first.generation || repeat {
                        out.push(format!(
                            "{flight:?}: generation {} granted {:?} after generation {} was",
                            then.generation,
                            then.sent.saturating_duration_since(first.at),
                            first.generation
                        ));
                    }
                }
            }
        }
        out
    }

    /// Adds one FOLLOWER answer naming `generation`.
    fn follower_answer(
        &mut self,
        flight: FlightId,
        token: &str,
        generation: u64,
        sent: Instant,
        at: Instant,
    ) {
        self.followed
            .entry((token.to_owned(), generation))
            .and_modify(|f| {
                f.first_sent = f.first_sent.min(sent);
                f.last_at = f.last_at.max(at);
                f.answers += 1;
            })
            .or_insert_with(|| Followed {
                flight,
                generation,
                token: token.to_owned(),
                first_sent: sent,
                last_at: at,
                answers: 1,
            });
    }

    /// Marks every token granted so far as belonging to a process killed
    /// `at` (for the journal of one killed process).
    pub fn killed_at(&mut self, at: Instant) {
        for g in &self.grants {
            self.killed.entry(g.token.clone()).or_insert(at);
        }
    }

    /// Grants that took over a dead owner's flight.
    pub fn takeovers(&self) -> usize {
        self.grants.iter().filter(|g| g.takeover).count()
    }

    /// Adds `other`'s records (another node's journal).
    pub fn merge(&mut self, other: Journal) {
        self.grants.extend(other.grants);
        self.commits.extend(other.commits);
        self.heartbeats_lost += other.heartbeats_lost;
        self.heartbeats_failed += other.heartbeats_failed;
        self.releases_freed += other.releases_freed;
        self.releases_not_owner += other.releases_not_owner;
        self.followed.extend(other.followed);
        self.killed.extend(other.killed);
    }

    /// The journal in the JSON lines of an [`EventLog`], times mapped by
    /// `clock`. Lines of other events are skipped; so is a line that does
    /// not parse (a process killed while writing it), counted in the
    /// second value.
    pub fn from_log(text: &str, clock: &WallClock) -> (Self, usize) {
        let mut out = Self::default();
        let mut malformed = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                malformed += 1;
                continue;
            };
            if out.read_event(&v, clock).is_none() {
                malformed += 1;
            }
        }
        (out, malformed)
    }

    /// Reads one event; `None` when a field is missing.
    fn read_event(&mut self, v: &Value, clock: &WallClock) -> Option<()> {
        let generation = || v["generation"].as_u64();
        let flight = || flight_of_hex(v["flight"].as_str()?);
        match v["event"].as_str()? {
            "grant" => {
                let at = v["at_us"].as_u64()?;
                self.grants.push(Grant {
                    flight: flight()?,
                    generation: generation()?,
                    takeover: v["takeover"].as_bool()?,
                    token: v["token"].as_str().unwrap_or_default().to_owned(),
                    sent: clock.instant(v["sent_us"].as_u64().unwrap_or(at)),
                    at: clock.instant(at),
                });
            }
            "commit" => self.commits.push(CommitRecord {
                flight: flight()?,
                generation: generation()?,
                token: v["token"].as_str()?.to_owned(),
                sent: clock.instant(v["sent_us"].as_u64()?),
                committed: v["committed"].as_bool(),
            }),
            "follower" => self.follower_answer(
                flight()?,
                v["token"].as_str()?,
                generation()?,
                clock.instant(v["sent_us"].as_u64()?),
                clock.instant(v["at_us"].as_u64()?),
            ),
            "release" if v["freed"].as_bool()? => self.releases_freed += 1,
            "release" => self.releases_not_owner += 1,
            "heartbeat_lost" => self.heartbeats_lost += 1,
            "heartbeat_failed" => self.heartbeats_failed += 1,
            _ => {}
        }
        Some(())
    }
}

fn flight_of_hex(hex: &str) -> Option<FlightId> {
    let mut bytes = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(FlightId::from_digest(Digest::from_bytes(bytes)))
}

/// Wraps a backend and records a [`Journal`] (see the module docs). Clones
/// share the journal.
#[derive(Clone)]
pub struct Recorder<B> {
    inner: B,
    journal: Arc<Mutex<Journal>>,
    log: Option<EventLog>,
}

impl<B> Recorder<B> {
    /// Wraps `inner` with an empty journal.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            journal: Arc::default(),
            log: None,
        }
    }

    /// Also writes every event to `log` (see the module docs).
    pub fn logging_to(mut self, log: EventLog) -> Self {
        self.log = Some(log);
        self
    }

    /// Wraps `inner`, recording into a journal shared with other recorders
    /// (one per node of a multi-node test).
    pub fn sharing(inner: B, other: &Recorder<impl Sized>) -> Self {
        Self {
            inner,
            journal: other.journal.clone(),
            log: other.log.clone(),
        }
    }

    /// A copy of the journal so far.
    pub fn journal(&self) -> Journal {
        self.lock().clone()
    }

    /// The wrapped backend.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self, event: impl FnOnce() -> Value) {
        if let Some(log) = &self.log {
            log.write(&event());
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for Recorder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let j = self.lock();
        f.debug_struct("Recorder")
            .field("inner", &self.inner)
            .field("grants", &j.grants.len())
            .field("commits", &j.commits.len())
            .finish()
    }
}

impl<B: Backend> Recorder<B> {
    /// `call` (the inner backend's acquire or re-check), recorded.
    fn recorded<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        call: impl FnOnce() -> BackendFuture<'a, Acquired> + Send + 'a,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            // Sent from here: the call is made after this instant.
            let (sent, sent_us) = (Instant::now(), wall_us());
            let answer = call().await?;
            if let Acquired::Follower { generation, .. } = answer {
                let at_us = wall_us();
                self.log(|| {
                    json!({"event": "follower", "flight": flight.to_hex(), "generation": generation,
                        "token": token.as_str(), "sent_us": sent_us, "at_us": at_us})
                });
                let at = Instant::now();
                self.lock()
                    .follower_answer(*flight, token.as_str(), generation, sent, at);
            }
            if let Acquired::Owner {
                generation,
                takeover,
                ..
            } = answer
            {
                self.log(|| {
                    json!({"event": "grant", "flight": flight.to_hex(), "generation": generation,
                        "takeover": takeover, "token": token.as_str(), "sent_us": sent_us,
                        "at_us": wall_us()})
                });
                self.lock().grants.push(Grant {
                    flight: *flight,
                    generation,
                    takeover,
                    token: token.as_str().to_owned(),
                    sent,
                    at: Instant::now(),
                });
            }
            Ok(answer)
        })
    }
}

impl<B: Backend> Backend for Recorder<B> {
    /// Re-checks are recorded as acquires.
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.recorded(flight, token, move || {
            self.inner.acquire_with(flight, token, ask, terms)
        })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        Box::pin(async move {
            let answer = self.inner.heartbeat(flight, token, generation, terms).await;
            match &answer {
                Ok(Renewal::Lost) => {
                    self.log(|| json!({"event": "heartbeat_lost"}));
                    self.lock().heartbeats_lost += 1;
                }
                Err(_) => {
                    self.log(|| json!({"event": "heartbeat_failed"}));
                    self.lock().heartbeats_failed += 1;
                }
                Ok(Renewal::Renewed) => {}
            }
            answer
        })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        Box::pin(async move {
            let (sent, sent_us) = (Instant::now(), wall_us());
            let answer = self.inner.commit(flight, token, generation, args).await;
            let committed = match &answer {
                Ok(Committed::Committed) => Some(true),
                Ok(Committed::Fenced) => Some(false),
                Err(_) => None,
            };
            self.log(|| {
                json!({"event": "commit", "flight": flight.to_hex(), "generation": generation,
                    "token": token.as_str(), "sent_us": sent_us, "committed": committed})
            });
            self.lock().commits.push(CommitRecord {
                flight: *flight,
                generation,
                token: token.as_str().to_owned(),
                sent,
                committed,
            });
            answer
        })
    }

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        Box::pin(async move {
            let answer = self.inner.release(flight, token, state_ttl).await;
            if let Ok(released) = &answer {
                let freed = *released == Released::Released;
                self.log(|| json!({"event": "release", "freed": freed}));
                let mut j = self.lock();
                if freed {
                    j.releases_freed += 1;
                } else {
                    j.releases_not_owner += 1;
                }
            }
            answer
        })
    }

    flightdeck_distributed::forward_backend!(inner => abandon, invalidate, subscribe, join_subscription, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}
