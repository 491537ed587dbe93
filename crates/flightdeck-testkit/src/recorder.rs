//! A [`Backend`] wrapper that keeps a [`Journal`] of what the backend
//! granted and accepted (grants with their generation, commits with their
//! answer, lost heartbeats), and checks the invariants a chaos run must
//! keep: no stale commit, at most one committed result per (flight,
//! generation).
//!
//! Times are taken on the client: a grant when its reply arrived, a commit
//! when it was sent. So "a commit of generation g sent after the reply that
//! granted g' > g" means the server ran the commit after the grant, and it
//! must have been fenced.
//!
//! ```
//! use flightdeck_distributed::Backend;
//! use flightdeck_testkit::{conformance, MemoryBackend, Recorder};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let backend = Recorder::new(MemoryBackend::new());
//! conformance::owner_follower_hit(&backend).await;
//! let journal = backend.journal();
//! assert!(journal.stale_commits().is_empty());
//! assert!(journal.max_committed_per_generation() <= 1);
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use flightdeck_distributed::backend::{
    Acquired, Backend, BackendFuture, CommitArgs, Committed, FlightId, LeaseTerms, OwnerToken,
    Renewal,
};
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

    /// Grants that took over a dead owner's flight.
    pub fn takeovers(&self) -> usize {
        self.grants.iter().filter(|g| g.takeover).count()
    }
}

/// Wraps a backend and records a [`Journal`] (see the module docs). Clones
/// share the journal.
#[derive(Clone)]
pub struct Recorder<B> {
    inner: B,
    journal: Arc<Mutex<Journal>>,
}

impl<B> Recorder<B> {
    /// Wraps `inner` with an empty journal.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            journal: Arc::default(),
        }
    }

    /// Wraps `inner`, recording into a journal shared with other recorders
    /// (one per node of a multi-node test).
    pub fn sharing(inner: B, other: &Recorder<impl Sized>) -> Self {
        Self {
            inner,
            journal: other.journal.clone(),
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

impl<B: Backend> Backend for Recorder<B> {
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            let answer = self.inner.acquire(flight, token, terms).await?;
            if let Acquired::Owner {
                generation,
                takeover,
            } = answer
            {
                self.lock().grants.push(Grant {
                    flight: *flight,
                    generation,
                    takeover,
                    at: Instant::now(),
                });
            }
            Ok(answer)
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
                Ok(Renewal::Lost) => self.lock().heartbeats_lost += 1,
                Err(_) => self.lock().heartbeats_failed += 1,
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
            let sent = Instant::now();
            let answer = self.inner.commit(flight, token, generation, args).await;
            self.lock().commits.push(CommitRecord {
                flight: *flight,
                generation,
                token: token.as_str().to_owned(),
                sent,
                committed: match &answer {
                    Ok(Committed::Committed) => Some(true),
                    Ok(Committed::Fenced) => Some(false),
                    Err(_) => None,
                },
            });
            answer
        })
    }

    flightdeck_distributed::forward_backend!(inner => abandon, invalidate, subscribe);
}
