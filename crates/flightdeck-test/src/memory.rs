//! An in-memory [`Backend`] with the semantics of the Redis scripts, for
//! fast unit tests of L2 logic (with paused tokio time), plus fault
//! injection.
//!
//! (Over 600 lines on purpose: one `Backend` method per script, each
//! mirroring its script in `flightdeck-redis/src/scripts.rs` check for
//! check, read side by side; the fault knobs and call counts are the rest.)
//!
//! It keeps the same record per flight as the Redis backend (last grant,
//! lease deadline, result, released tokens) with the same expiry. One
//! difference: its generations count up from 1 per flight (a per-flight
//! counter that outlives the record), where Redis's start from the
//! server's clock; both never repeat or decrease.
//!
//! For tests of your own service (one process, paused time), and of
//! flightdeck itself; it is not a substitute for tests against Redis
//! (flightdeck's conformance suite runs against both).
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_distributed::backend::{Acquired, Backend, LeaseTerms};
//! use flightdeck_distributed::{FlightId, OwnerToken};
//! use flightdeck_test::MemoryBackend;
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
//! assert_eq!(first, Acquired::Owner { generation: 1, takeover: false, stale: None });
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
    AbandonArgs, Acquired, Ask, Backend, BackendError, BackendFuture, CommitArgs, Committed,
    FlightId, LeaseTerms, Notice, OwnerToken, Released, Renewal, ResultStatus, StoredResult,
    Subscription, MAX_DURATION,
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
    inbox_down: AtomicBool,
}

/// How many times each backend call was made.
#[derive(Default)]
struct Calls {
    acquire: AtomicU64,
    heartbeat: AtomicU64,
    commit: AtomicU64,
    abandon: AtomicU64,
    release: AtomicU64,
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
    /// `release` calls.
    pub release: u64,
    /// `subscribe` calls.
    pub subscribe: u64,
}

/// One flight: its record (what Redis keeps in the flight's hash, with
/// the same fields and expiry) and the highest generation ever handed
/// out, which outlives the record: the memory backend's counterpart of the
/// server clock that keeps Redis's generations increasing.
#[derive(Clone, Default)]
struct Flight {
    high: u64,
    record: Option<Record>,
    /// The last invalidation's generation and how long it is remembered
    /// (`state_ttl`, whatever happens to the record).
    invalidated: Option<(u64, Instant)>,
}

#[derive(Clone)]
struct Record {
    /// The generation of the last grant or invalidation (0: none yet).
    gen: u64,
    /// The last grant's token (`None` after an invalidation).
    token: Option<OwnerToken>,
    /// The last grant's lease deadline; `None` once the grant ended
    /// (committed, abandoned, released, invalidated).
    deadline: Option<Instant>,
    /// The stored result (Redis: `rg`, `s`, `b`, `fu`, `ku`): it outlives
    /// later grants, until it expires or their commit replaces it.
    result: Option<Kept>,
    /// A failure cached by an abandon: beside the stored result, which an
    /// abandon never drops (it answers stale while the failure is
    /// replayed to those that take no stale result).
    failure: Option<Kept>,
    /// Until then an acquire asking for stale results answers the stored
    /// one and grants nothing: the throttle after a failed refresh
    /// ([`AbandonArgs::retry_after`]).
    retry_until: Option<Instant>,
    /// Tokens never granted the flight again (newest first): released,
    /// or whose attempt ended here (committed, abandoned, released).
    released: Vec<OwnerToken>,
    expires: Instant,
}

/// A stored result and how long it is kept.
#[derive(Clone)]
struct Kept {
    /// The generation that committed it (or abandoned with this failure).
    gen: u64,
    status: ResultStatus,
    payload: Bytes,
    /// When it was committed.
    at: Instant,
    /// How long it is fresh from `at`.
    ttl: Duration,
    /// How long its owner's work took.
    work_time: Duration,
    /// Replayed to new acquires until then.
    fresh_until: Instant,
    /// Replayed to re-checks of followers of `gen` or older until then
    /// (the later of `retain` and the stale window's end).
    keep_until: Instant,
    /// Answered stale (to acquires that ask for it) until then, from
    /// `fresh_until` on.
    stale_until: Instant,
}

impl Kept {
    /// Whether `follows` (a re-check's followed generation, `None` for an
    /// acquire) gets this result now.
    fn answers(&self, now: Instant, follows: Option<u64>) -> bool {
        now < self.fresh_until || (follows.is_some_and(|g| g <= self.gen) && now < self.keep_until)
    }

    /// Whether it is past its freshness and still kept to answer stale.
    fn stale_at(&self, now: Instant) -> bool {
        self.fresh_until <= now && now < self.stale_until
    }

    /// Until when the record must keep it.
    fn until(&self) -> Instant {
        self.keep_until.max(self.stale_until)
    }

    fn stored(&self, now: Instant) -> StoredResult {
        StoredResult {
            generation: self.gen,
            status: self.status,
            payload: self.payload.clone(),
            age: now.saturating_duration_since(self.at),
            ttl: self.ttl,
            work_time: self.work_time,
        }
    }
}

/// How many released tokens a record remembers (as the Redis scripts).
const RELEASED_KEPT: usize = 8;

/// Puts `token` first in a record's never-granted tokens, at most
/// [`RELEASED_KEPT`] of them.
fn remember(released: &mut Vec<OwnerToken>, token: OwnerToken) {
    released.retain(|t| *t != token);
    released.insert(0, token);
    released.truncate(RELEASED_KEPT);
}

impl Flight {
    /// The live record, after dropping it if it expired (like Redis does
    /// lazily).
    fn record(&mut self, now: Instant) -> Option<&mut Record> {
        if self.record.as_ref().is_some_and(|r| r.expires <= now) {
            self.record = None;
        }
        self.record.as_mut()
    }

    /// A generation larger than every one handed out before.
    fn next_gen(&mut self) -> u64 {
        self.high += 1;
        self.high
    }
}

/// `d`, at most [`MAX_DURATION`] (as the Redis backend sends it).
fn cap(d: Duration) -> Duration {
    d.min(MAX_DURATION)
}

/// `terms` with every duration at most [`MAX_DURATION`].
fn capped(terms: &LeaseTerms) -> LeaseTerms {
    LeaseTerms {
        lease: cap(terms.lease),
        state_ttl: cap(terms.state_ttl),
        ..*terms
    }
}

/// Redis keeps a key at least a millisecond (`PEXPIRE` of 0 deletes it).
fn key_ttl(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
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

    /// Takes the node's inbox out of force (a subscriber reconnecting):
    /// [`Backend::join_subscription`] answers `None`, so a follower
    /// subscribes and re-checks, as a Redis node does until its inbox is
    /// subscribed again.
    pub fn set_inbox_down(&self, yes: bool) {
        self.inner.faults.inbox_down.store(yes, Ordering::Relaxed);
    }

    /// Stores raw bytes as a flight's successful result (a corrupt or
    /// foreign value), with a generation larger than any before.
    pub fn put_raw_result(&self, flight: &FlightId, payload: Bytes, ttl: Duration) {
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        let gen = f.next_gen();
        let expires = Instant::now() + key_ttl(ttl);
        f.record = Some(Record {
            gen,
            token: Some(OwnerToken::random()),
            deadline: None,
            result: Some(Kept {
                gen,
                status: ResultStatus::Ok,
                payload,
                at: Instant::now(),
                ttl,
                work_time: Duration::ZERO,
                fresh_until: expires,
                keep_until: expires,
                stale_until: expires,
            }),
            failure: None,
            retry_until: None,
            released: Vec::new(),
            expires,
        });
    }

    /// Deletes a flight's stored result (as if its TTL ran out).
    pub fn remove_result(&self, flight: &FlightId) {
        if let Some(f) = self.flights().get_mut(flight) {
            if f.record
                .as_ref()
                .is_some_and(|r| r.result.is_some() || r.failure.is_some())
            {
                f.record = None;
            }
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
            release: c.release.load(Ordering::Relaxed),
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

    fn acquire_now(
        &self,
        flight: &FlightId,
        token: &OwnerToken,
        ask: Ask,
        terms: &LeaseTerms,
    ) -> Result<Acquired, BackendError> {
        let now = Instant::now();
        let terms = &capped(terms);
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        let record = f.record(now);
        let live = record
            .as_ref()
            .and_then(|r| r.deadline)
            .filter(|d| *d > now);
        let mine = record
            .as_ref()
            .is_some_and(|r| r.token.as_ref() == Some(token));
        // The token that holds the live lease is its owner, unless a result
        // answers it as a hit, whatever else the record says by now (a
        // cached failure, a throttle, the not-after of a resent ACQUIRE): an
        // earlier attempt of its ACQUIRE was applied and only this token
        // ends the lease, so a retry answers OWNER, as the Redis script does.
        let held = live.is_some() && mine;
        if !held && ask.not_after.is_some_and(|t| now >= t) {
            return Err(BackendError::unavailable(
                "memory backend: acquire past its not-after, nothing granted",
            ));
        }
        let mut takeover = false;
        let mut released = Vec::new();
        let mut kept = None;
        let mut failure = None;
        let mut beside = None;
        if let Some(r) = record {
            let throttled = r.retry_until.is_some_and(|u| now < u);
            let failed = r.failure.as_ref().is_some_and(|k| now < k.fresh_until);
            if let Some(k) = r.result.as_ref().filter(|k| k.answers(now, ask.follows)) {
                // An early refresh of a fresh result is granted unless
                // someone refreshes it already, or the last refresh
                // failed (its failure or its throttle still runs).
                let early = ask.early
                    && ask.follows.is_none()
                    && now < k.fresh_until
                    && !throttled
                    && !failed
                    && (mine || live.is_none());
                if !early {
                    return Ok(Acquired::Hit(k.stored(now)));
                }
                beside = Some(k.stored(now));
            } else if ask.stale {
                beside = r
                    .result
                    .as_ref()
                    .filter(|k| k.status == ResultStatus::Ok && k.stale_at(now))
                    .map(|k| k.stored(now));
            }
            if beside.is_none() && !held {
                if let Some(k) = r.failure.as_ref().filter(|k| k.answers(now, ask.follows)) {
                    return Ok(Acquired::Hit(k.stored(now)));
                }
            }
            if let Some(stale) = beside.as_ref().filter(|_| throttled && !held) {
                return Ok(Acquired::Stale(stale.clone()));
            }
            if mine {
                if live.is_some() {
                    return Ok(Acquired::Owner {
                        generation: r.gen,
                        takeover: false,
                        stale: beside,
                    });
                }
                if r.deadline.is_none() {
                    // This attempt ended (released or abandoned).
                    return Ok(Acquired::Expired { generation: r.gen });
                }
            } else if let Some(deadline) = live {
                return Ok(Acquired::Follower {
                    generation: r.gen,
                    lease_remaining: deadline - now,
                    stale: beside,
                });
            }
            if r.deadline.is_some() {
                // The last grant's lease ran out without a commit or abandon.
                if !terms.allow_takeover {
                    return Ok(Acquired::Expired { generation: r.gen });
                }
                takeover = true;
            }
            if r.released.contains(token) {
                return Ok(Acquired::Expired { generation: r.gen });
            }
            released = std::mem::take(&mut r.released);
            kept = r.result.take().filter(|k| k.until() > now);
            failure = r.failure.take().filter(|k| k.until() > now);
        }
        let gen = f.next_gen();
        // A grant keeps a result still kept for waiters or to answer
        // stale, and never shortens its life.
        let expires = [&kept, &failure]
            .into_iter()
            .flatten()
            .map(Kept::until)
            .fold(now + key_ttl(terms.record_ttl()), Instant::max);
        f.record = Some(Record {
            gen,
            token: Some(token.clone()),
            deadline: Some(now + terms.lease),
            result: kept,
            failure,
            retry_until: None,
            released,
            expires,
        });
        Ok(Acquired::Owner {
            generation: gen,
            takeover,
            stale: beside,
        })
    }

    /// The record whose last grant is (token, generation) and has not
    /// ended, if any.
    fn open_grant<'f>(
        f: &'f mut Flight,
        now: Instant,
        token: &OwnerToken,
        gen: u64,
    ) -> Option<&'f mut Record> {
        f.record(now)
            .filter(|r| r.gen == gen && r.token.as_ref() == Some(token))
    }

    fn heartbeat_now(
        &self,
        flight: &FlightId,
        token: &OwnerToken,
        gen: u64,
        terms: &LeaseTerms,
    ) -> Renewal {
        let now = Instant::now();
        let terms = &capped(terms);
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        match Self::open_grant(f, now, token, gen) {
            Some(r) if r.deadline.is_some_and(|d| d > now) => {
                r.deadline = Some(now + terms.lease);
                r.expires = [&r.result, &r.failure]
                    .into_iter()
                    .flatten()
                    .map(Kept::until)
                    .fold(now + key_ttl(terms.record_ttl()), Instant::max);
                Renewal::Renewed
            }
            _ => Renewal::Lost,
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
        let args = &CommitArgs {
            ttl: cap(args.ttl),
            retain: cap(args.retain),
            stale_for: cap(args.stale_for),
            work_time: cap(args.work_time),
            ..args.clone()
        };
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        let Some(r) = Self::open_grant(f, now, token, gen) else {
            return Committed::Fenced;
        };
        match (r.result.as_ref().filter(|k| k.gen == gen), r.deadline) {
            // A retry of this commit.
            (Some(k), _) if k.status == ResultStatus::Ok => return Committed::Committed,
            // Abandoned (with or without a cached failure), or released.
            (Some(_), _) | (None, None) => return Committed::Fenced,
            (None, Some(_)) => {}
        }
        r.deadline = None;
        // Dated as the owner says (see `CommitArgs::sent`), never later
        // than now.
        let at = args.sent.map_or(now, |sent| sent.min(now));
        let fresh_until = at + args.ttl;
        let stale_until = fresh_until + args.stale_for;
        // As the scripts' `ku`: the waiters get it as long as it is kept.
        let keep_until = stale_until.max(now + args.retain);
        r.failure = None;
        r.retry_until = None;
        r.result = Some(Kept {
            gen,
            status: ResultStatus::Ok,
            payload: args.payload.clone(),
            at,
            ttl: args.ttl,
            work_time: args.work_time,
            fresh_until,
            keep_until,
            stale_until,
        });
        r.expires = now + key_ttl((args.ttl + args.stale_for).max(args.retain));
        remember(&mut r.released, token.clone());
        drop(flights);
        let inline = (args.payload.len() <= args.inline_below).then(|| args.payload.clone());
        self.publish(
            flight,
            Notice::Committed {
                generation: gen,
                inline,
                work_time: Some(args.work_time),
                age: now.saturating_duration_since(at),
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
        let args = &AbandonArgs {
            failure_ttl: cap(args.failure_ttl),
            retry_after: cap(args.retry_after),
            ..args.clone()
        };
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        let Some(r) = Self::open_grant(f, now, token, gen).filter(|r| r.deadline.is_some()) else {
            return Released::NotOwner;
        };
        r.deadline = None;
        remember(&mut r.released, token.clone());
        // A refresh failed while a result is kept to answer stale (fresh
        // or not): throttle the next one.
        let stale_kept = r.result.as_ref().is_some_and(|k| now < k.stale_until);
        if stale_kept && !args.retry_after.is_zero() {
            r.retry_until = Some(now + args.retry_after);
        }
        if let Some(msg) = &args.failure {
            // Like the script: an empty message is not cached.
            if !msg.is_empty() && !args.failure_ttl.is_zero() {
                let until = now + args.failure_ttl;
                r.failure = Some(Kept {
                    gen,
                    status: ResultStatus::Failed,
                    payload: msg.clone(),
                    at: now,
                    ttl: args.failure_ttl,
                    work_time: Duration::ZERO,
                    fresh_until: until,
                    keep_until: until,
                    stale_until: until,
                });
                // Never shortens the stored result's life.
                let kept = r.result.as_ref().map_or(now, Kept::until);
                r.expires = kept.max(now + key_ttl(args.failure_ttl));
            }
        }
        drop(flights);
        self.publish(flight, Notice::Abandoned { generation: gen });
        Released::Released
    }

    fn release_now(&self, flight: &FlightId, token: &OwnerToken, state_ttl: Duration) -> Released {
        let now = Instant::now();
        let state_ttl = cap(state_ttl);
        let mut flights = self.flights();
        let f = flights.entry(*flight).or_default();
        match f.record(now) {
            Some(r) if r.token.as_ref() == Some(token) && r.deadline.is_some() => {
                r.deadline = None;
                remember(&mut r.released, token.clone());
                let generation = r.gen;
                drop(flights);
                self.publish(flight, Notice::Abandoned { generation });
                return Released::Released;
            }
            Some(r) => remember(&mut r.released, token.clone()),
            None => {
                f.record = Some(Record {
                    gen: 0,
                    token: None,
                    deadline: None,
                    result: None,
                    failure: None,
                    retry_until: None,
                    released: vec![token.clone()],
                    expires: now + key_ttl(state_ttl),
                });
            }
        }
        Released::NotOwner
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
    /// Counted as an acquire, re-checks too. From its [`Ask::not_after`]
    /// on (in tokio time, this store's clock; at that instant its caller's
    /// timeout fires too) it grants nothing, changes nothing and answers
    /// *unavailable*, as the Redis script answers `LATE`.
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.inner.calls.acquire.fetch_add(1, Ordering::Relaxed);
        let res = self
            .check()
            .and_then(|()| self.acquire_now(flight, token, ask, terms));
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
            let renewal = self.heartbeat_now(flight, token, generation, terms);
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

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        self.inner.calls.release.fetch_add(1, Ordering::Relaxed);
        let res = self
            .check()
            .map(|()| self.release_now(flight, token, state_ttl));
        Box::pin(async move { res })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        let res = self.check().map(|()| {
            let now = Instant::now();
            let state_ttl = cap(state_ttl);
            let mut flights = self.flights();
            let f = flights.entry(*flight).or_default();
            let released = f
                .record(now)
                .map(|r| std::mem::take(&mut r.released))
                .unwrap_or_default();
            let generation = f.next_gen();
            f.record = Some(Record {
                gen: generation,
                token: None,
                deadline: None,
                result: None,
                failure: None,
                retry_until: None,
                released,
                expires: now + key_ttl(state_ttl),
            });
            f.invalidated = Some((generation, now + key_ttl(state_ttl)));
            drop(flights);
            self.publish(flight, Notice::Abandoned { generation });
            generation
        });
        Box::pin(async move { res })
    }

    fn invalidated_since<'a>(
        &'a self,
        flight: &'a FlightId,
        generation: u64,
    ) -> BackendFuture<'a, Option<bool>> {
        let res = self.check().map(|()| {
            let flights = self.flights();
            let now = Instant::now();
            let since = flights
                .get(flight)
                .and_then(|f| f.invalidated)
                .is_some_and(|(i, until)| until > now && i > generation);
            Some(since)
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

    /// The flight's channel, as a node's inbox that is in force (see the
    /// Redis backend): notices are sent under the same lock, so it hears
    /// every notice sent from now on. `None` while
    /// [`set_inbox_down`](MemoryBackend::set_inbox_down) says so: the
    /// follower then subscribes and re-checks.
    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        if self.inner.faults.inbox_down.load(Ordering::Relaxed) {
            return None;
        }
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tx = channels
            .entry(*flight)
            .or_insert_with(|| broadcast::channel(64).0);
        Some(Subscription::new(
            tx.subscribe(),
            Unsubscribe {
                backend: self.clone(),
                flight: *flight,
            },
        ))
    }
}

/// The records of a [`MemoryBackend`] at one moment
/// ([`MemoryBackend::snapshot`]): what a replica had received when its
/// primary failed, for [`MemoryBackend::restore`].
#[derive(Clone)]
pub struct MemorySnapshot {
    flights: HashMap<FlightId, Flight>,
}

impl fmt::Debug for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySnapshot")
            .field("flights", &self.flights.len())
            .finish()
    }
}

/// Test hooks for fault injection by a simulation (`flightdeck-sim`): a
/// failover that loses the last unreplicated writes, a record that
/// expires now, the leases that are live, and what a record remembers.
impl MemoryBackend {
    /// A copy of every flight's record now (see [`restore`](Self::restore)).
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            flights: self.flights().clone(),
        }
    }

    /// A failover to a replica that had received the writes up to
    /// `snapshot` only: every record goes back to what it was then (those
    /// written since are lost, those deleted since come back). The highest
    /// generation of each flight is kept, as Redis's server clock keeps
    /// its generations increasing through a failover. Subscriptions stay.
    pub fn restore(&self, snapshot: &MemorySnapshot) {
        let mut flights = self.flights();
        let highs: Vec<(FlightId, u64)> = flights.iter().map(|(id, f)| (*id, f.high)).collect();
        *flights = snapshot.flights.clone();
        for (id, high) in highs {
            let f = flights.entry(id).or_default();
            f.high = f.high.max(high);
        }
    }

    /// Drops a flight's record, as if its TTL ran out now (its lease,
    /// result and released tokens with it; generations still never go
    /// back).
    pub fn expire(&self, flight: &FlightId) {
        if let Some(f) = self.flights().get_mut(flight) {
            f.record = None;
        }
    }

    /// Whether the flight's live record remembers `token` among those
    /// never granted it again (released, or whose attempt ended here).
    /// The memory lasts as long as the record: once it expired (or a
    /// failover lost it), a late ACQUIRE of the token is granted.
    pub fn remembers(&self, flight: &FlightId, token: &OwnerToken) -> bool {
        let now = Instant::now();
        self.flights()
            .get_mut(flight)
            .and_then(|f| f.record(now))
            .is_some_and(|r| {
                r.released.contains(token)
                    || (r.token.as_ref() == Some(token) && r.deadline.is_none())
            })
    }

    /// The leases live now: (flight, holder, generation).
    pub fn live_leases(&self) -> Vec<(FlightId, OwnerToken, u64)> {
        let now = Instant::now();
        let mut flights = self.flights();
        let mut out = Vec::new();
        for (id, f) in flights.iter_mut() {
            if let Some(r) = f.record(now) {
                if let (Some(token), Some(d)) = (&r.token, r.deadline) {
                    if d > now {
                        out.push((*id, token.clone(), r.gen));
                    }
                }
            }
        }
        out
    }
}
