//! An in-memory [`Backend`] with the semantics of the Redis scripts, for
//! fast unit tests of L2 logic (with paused tokio time), plus fault
//! injection.
//!
//! It is not a substitute for the Redis tests: the conformance suite in
//! [`conformance`](crate::conformance) runs against both.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_distributed::backend::{Acquired, Backend, LeaseTerms};
//! use flightdeck_distributed::{FlightId, OwnerToken};
//! use flightdeck_testkit::MemoryBackend;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let backend = MemoryBackend::new();
//! let flight = FlightId::of(&FlightKey::from_bytes(StageName::new("s").unwrap(), "k"));
//! let terms = LeaseTerms {
//!     lease: Duration::from_secs(1),
//!     state_ttl: Duration::from_secs(10),
//!     allow_takeover: true,
//! };
//! let a = OwnerToken::random();
//! let b = OwnerToken::random();
//! let first = backend.acquire(&flight, &a, &terms).await.unwrap();
//! assert_eq!(first, Acquired::Owner { generation: 1, takeover: false });
//! assert!(matches!(backend.acquire(&flight, &b, &terms).await.unwrap(), Acquired::Follower { .. }));
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, FlightId,
    LeaseTerms, Notice, OwnerToken, Released, Renewal, ResultStatus, StoredResult, Subscription,
};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// The in-memory backend. Clones share the same store (like two clients of
/// one Redis).
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    flights: Mutex<HashMap<FlightId, Flight>>,
    channels: Mutex<HashMap<FlightId, broadcast::Sender<Notice>>>,
    faults: Faults,
    calls: Calls,
}

#[derive(Default)]
struct Faults {
    unavailable: AtomicBool,
    fail_commits: AtomicBool,
    fail_heartbeats: AtomicBool,
    drop_notices: AtomicBool,
}

/// How many times each backend call was made.
#[derive(Default)]
struct Calls {
    acquire: AtomicU64,
    heartbeat: AtomicU64,
    commit: AtomicU64,
    abandon: AtomicU64,
    subscribe: AtomicU64,
}

/// Counts of calls made to a [`MemoryBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// `acquire` calls.
    pub acquire: u64,
    /// `heartbeat` calls.
    pub heartbeat: u64,
    /// `commit` calls.
    pub commit: u64,
    /// `abandon` calls.
    pub abandon: u64,
    /// `subscribe` calls.
    pub subscribe: u64,
}

#[derive(Default)]
struct Flight {
    lease: Option<Lease>,
    gen: u64,
    cgen: u64,
    state_expires: Option<Instant>,
    result: Option<Stored>,
}

struct Lease {
    token: OwnerToken,
    gen: u64,
    expires: Instant,
}

struct Stored {
    gen: u64,
    token: OwnerToken,
    status: ResultStatus,
    payload: Bytes,
    expires: Instant,
}

impl Flight {
    /// Drops whatever expired, like Redis does lazily.
    fn expire(&mut self, now: Instant) {
        if self.lease.as_ref().is_some_and(|l| l.expires <= now) {
            self.lease = None;
        }
        if self.result.as_ref().is_some_and(|r| r.expires <= now) {
            self.result = None;
        }
        if self.state_expires.is_some_and(|t| t <= now) {
            self.gen = 0;
            self.cgen = 0;
            self.state_expires = None;
        }
    }
}

fn unavailable() -> BackendError {
    BackendError::unavailable("memory backend: injected outage")
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn flights(&self) -> MutexGuard<'_, HashMap<FlightId, Flight>> {
        // A panic while holding the lock cannot leave a half-written flight
        // that matters to a test more than the panic itself.
        self.inner.flights.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, flight: &FlightId, notice: Notice) {
        if self.inner.faults.drop_notices.load(Ordering::Relaxed) {
            return;
        }
        let channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = channels.get(flight) {
            let _ = tx.send(notice);
        }
    }

    fn check(&self) -> Result<(), BackendError> {
        if self.inner.faults.unavailable.load(Ordering::Relaxed) {
            Err(unavailable())
        } else {
            Ok(())
        }
    }

    /// Makes every call fail with an "unavailable" error (or heals it).
    pub fn set_unavailable(&self, yes: bool) {
        self.inner.faults.unavailable.store(yes, Ordering::Relaxed);
    }

    /// Makes commits fail with an "outcome unknown" error, without writing.
    pub fn set_fail_commits(&self, yes: bool) {
        self.inner.faults.fail_commits.store(yes, Ordering::Relaxed);
    }

    /// Makes heartbeats fail with an "unavailable" error, so a running
    /// owner's lease runs out (a network partition around one owner).
    pub fn set_fail_heartbeats(&self, yes: bool) {
        self.inner
            .faults
            .fail_heartbeats
            .store(yes, Ordering::Relaxed);
    }

    /// Drops every notice (a broken pub/sub): followers must poll.
    pub fn set_drop_notices(&self, yes: bool) {
        self.inner.faults.drop_notices.store(yes, Ordering::Relaxed);
    }

    /// Stores raw bytes as a flight's successful result (a corrupt or
    /// foreign value), with generation 1.
    pub fn put_raw_result(&self, flight: &FlightId, payload: Bytes, ttl: Duration) {
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        f.result = Some(Stored {
            gen: 1,
            token: OwnerToken::random(),
            status: ResultStatus::Ok,
            payload,
            expires: Instant::now() + ttl,
        });
    }

    /// Deletes a flight's stored result (as if its TTL ran out).
    pub fn remove_result(&self, flight: &FlightId) {
        if let Some(f) = self.flights().get_mut(flight) {
            f.result = None;
        }
    }

    /// The calls made so far.
    pub fn calls(&self) -> CallCounts {
        let c = &self.inner.calls;
        CallCounts {
            acquire: c.acquire.load(Ordering::Relaxed),
            heartbeat: c.heartbeat.load(Ordering::Relaxed),
            commit: c.commit.load(Ordering::Relaxed),
            abandon: c.abandon.load(Ordering::Relaxed),
            subscribe: c.subscribe.load(Ordering::Relaxed),
        }
    }

    /// How many subscriptions to `flight` are alive.
    pub fn subscribers(&self, flight: &FlightId) -> usize {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(flight)
            .map_or(0, broadcast::Sender::receiver_count)
    }

    fn acquire_now(&self, flight: &FlightId, token: &OwnerToken, terms: &LeaseTerms) -> Acquired {
        let now = Instant::now();
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        f.expire(now);
        if let Some(r) = &f.result {
            return Acquired::Hit(StoredResult {
                generation: r.gen,
                status: r.status,
                payload: r.payload.clone(),
            });
        }
        if let Some(l) = &f.lease {
            if l.token == *token {
                return Acquired::Owner {
                    generation: l.gen,
                    takeover: false,
                };
            }
            return Acquired::Follower {
                generation: l.gen,
                lease_remaining: l.expires - now,
            };
        }
        let takeover = f.gen > f.cgen;
        if takeover && !terms.allow_takeover {
            return Acquired::Expired { generation: f.gen };
        }
        f.gen += 1;
        f.lease = Some(Lease {
            token: token.clone(),
            gen: f.gen,
            expires: now + terms.lease,
        });
        f.state_expires = Some(now + terms.state_ttl);
        Acquired::Owner {
            generation: f.gen,
            takeover,
        }
    }

    fn commit_now(
        &self,
        flight: &FlightId,
        token: &OwnerToken,
        gen: u64,
        args: &CommitArgs,
    ) -> Committed {
        let now = Instant::now();
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        f.expire(now);
        if let Some(r) = &f.result {
            if r.gen == gen && r.token == *token {
                return Committed::Committed;
            }
            if r.gen >= gen {
                return Committed::Fenced;
            }
        }
        let ok = match &f.lease {
            Some(l) => l.token == *token && l.gen == gen,
            None => f.gen == gen && f.cgen < gen,
        };
        if !ok {
            return Committed::Fenced;
        }
        f.cgen = gen;
        f.state_expires = Some(now + args.state_ttl);
        f.result = Some(Stored {
            gen,
            token: token.clone(),
            status: ResultStatus::Ok,
            payload: args.payload.clone(),
            expires: now + args.ttl,
        });
        f.lease = None;
        drop(flights);
        let inline = (args.payload.len() <= args.inline_below).then(|| args.payload.clone());
        self.publish(
            flight,
            Notice::Committed {
                generation: gen,
                inline,
            },
        );
        Committed::Committed
    }

    fn abandon_now(
        &self,
        flight: &FlightId,
        token: &OwnerToken,
        gen: u64,
        args: &AbandonArgs,
    ) -> Released {
        let now = Instant::now();
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        f.expire(now);
        if !f
            .lease
            .as_ref()
            .is_some_and(|l| l.token == *token && l.gen == gen)
        {
            return Released::NotOwner;
        }
        f.lease = None;
        f.cgen = gen;
        f.state_expires = Some(now + args.state_ttl);
        if let Some(msg) = &args.failure {
            // Like the script: an empty message is not cached.
            if !msg.is_empty() && !args.failure_ttl.is_zero() {
                f.result = Some(Stored {
                    gen,
                    token: token.clone(),
                    status: ResultStatus::Failed,
                    payload: msg.clone(),
                    expires: now + args.failure_ttl,
                });
            }
        }
        drop(flights);
        self.publish(flight, Notice::Abandoned { generation: gen });
        Released::Released
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// Drops the subscription's sender once the last receiver is gone.
struct Unsubscribe {
    backend: MemoryBackend,
    flight: FlightId,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut channels = self
            .backend
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // `Subscription` drops its receiver before this guard.
        if channels
            .get(&self.flight)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            channels.remove(&self.flight);
        }
    }
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.inner.calls.acquire.fetch_add(1, Ordering::Relaxed);
        let res = self
            .check()
            .map(|()| self.acquire_now(flight, token, terms));
        Box::pin(async move { res })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        self.inner.calls.heartbeat.fetch_add(1, Ordering::Relaxed);
        let res = self.check().and_then(|()| {
            if self.inner.faults.fail_heartbeats.load(Ordering::Relaxed) {
                return Err(BackendError::unavailable(
                    "memory backend: injected heartbeat failure",
                ));
            }
            let now = Instant::now();
            let mut flights = self.flights();
            let f = flights.entry(*flight).or_default();
            f.expire(now);
            let renewal = match &mut f.lease {
                Some(l) if l.token == *token && l.gen == generation => {
                    l.expires = now + terms.lease;
                    f.state_expires = Some(now + terms.state_ttl);
                    Renewal::Renewed
                }
                _ => Renewal::Lost,
            };
            Ok(renewal)
        });
        Box::pin(async move { res })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        self.inner.calls.commit.fetch_add(1, Ordering::Relaxed);
        let res = self.check().and_then(|()| {
            if self.inner.faults.fail_commits.load(Ordering::Relaxed) {
                Err(BackendError::outcome_unknown(
                    "memory backend: injected commit failure",
                ))
            } else {
                Ok(self.commit_now(flight, token, generation, args))
            }
        });
        Box::pin(async move { res })
    }

    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released> {
        self.inner.calls.abandon.fetch_add(1, Ordering::Relaxed);
        let res = self
            .check()
            .map(|()| self.abandon_now(flight, token, generation, args));
        Box::pin(async move { res })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        let res = self.check().map(|()| {
            let now = Instant::now();
            let mut flights = self.flights();
            let f = flights.entry(*flight).or_default();
            f.expire(now);
            f.gen += 1;
            f.cgen = f.gen;
            f.state_expires = Some(now + state_ttl);
            f.lease = None;
            f.result = None;
            let generation = f.gen;
            drop(flights);
            self.publish(flight, Notice::Abandoned { generation });
            generation
        });
        Box::pin(async move { res })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        self.inner.calls.subscribe.fetch_add(1, Ordering::Relaxed);
        let res = self.check().map(|()| {
            let mut channels = self
                .inner
                .channels
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let rx = channels
                .entry(*flight)
                .or_insert_with(|| broadcast::channel(64).0)
                .subscribe();
            Subscription::new(
                rx,
                Unsubscribe {
                    backend: self.clone(),
                    flight: *flight,
                },
            )
        });
        Box::pin(async move { res })
    }
}
