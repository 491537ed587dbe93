//! Answering anyway across nodes: what a flight does with a result the
//! store kept past its freshness ([`Acquired::Owner`] or
//! [`Acquired::Follower`] with a stale result beside, [`Acquired::Stale`])
//! under the stage's [`StaleWindows`](flightdeck_core::stale::StaleWindows),
//! and early refreshes of fresh hits.
//!
//! The store grants one refresh per key across the deployment (the
//! flight's lease) and throttles it after a failure; this module decides,
//! on each node, whether a caller answers the kept result at once
//! (`stale-while-revalidate`, the throttle), waits for the work with the
//! result standing by (`stale-if-error`, `soft-timeout`), and runs the
//! refreshes it was granted in the background, on the flights'
//! [`TaskTracker`](tokio_util::task::TaskTracker), bounded by the wait
//! timeout (the longest anyone waits for a result): a refresh cut there
//! drops its lease, which abandons it.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::error::{find, BoxError, LeaseLost, WaitTimeout, WorkPanicked};
use flightdeck_core::expiring::ExpiringMap;
use flightdeck_core::stale::{xfetch, Stale, StaleReason};
use flightdeck_core::{FlightKey, Shareable};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{
    Acquired, Ask, Backend, BackendError, FlightId, Notice, ResultStatus, StoredResult,
    Subscription,
};
use crate::codec::ResultCodec;
use crate::flights::{kept_reply, Cx, Judge, Named, State};
use crate::lease_release::TokenGuard;
use crate::metrics::{Op, Refresh, StageMetrics};
use crate::owner::Settled;
use crate::work::{Execute, KeptEnd, KeptHere};

/// How a caller of [`DistributedFlights::run_answered`] was answered.
///
/// [`DistributedFlights::run_answered`]: crate::DistributedFlights::run_answered
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answered {
    /// By the work this flight ran (here, or in the local fallback).
    Ran,
    /// By a stored result, fresh: `age` old by the store's clock, fresh
    /// for `fresh_for` more (or by this node's own copy of later work,
    /// standing in for the store's kept result while it is fresh: as old
    /// as the copy).
    Hit {
        /// How old the result is (since its commit, by the store's clock).
        age: Duration,
        /// How long it stays fresh.
        fresh_for: Duration,
        /// How long the work that produced it took.
        work_time: Duration,
    },
    /// By another node's result this flight waited for (its commit's
    /// notice, or a re-check that found it committed).
    Followed {
        /// How old it was when it came (a notice's: as old as it says).
        age: Duration,
        /// How long the work that produced it took, when the store told.
        work_time: Option<Duration>,
    },
    /// By a result past its freshness: why, and how old (by the store's
    /// clock).
    Stale {
        /// Why it answered, and how old it is.
        stale: Stale,
        /// How long the work that produced it took.
        work_time: Duration,
    },
}

impl Answered {
    /// The [`Stale`] marker of a stale answer.
    pub fn stale(&self) -> Option<Stale> {
        match self {
            Answered::Stale { stale, .. } => Some(*stale),
            _ => None,
        }
    }
}

/// A flight's answer, with how it was given.
pub(crate) type Reply<T, O> = Result<(Shareable<T, O>, Answered), BoxError>;

/// A refresh's work, owning all it needs, to finish in the background.
type Refreshing<T, O> = Pin<Box<dyn Future<Output = Result<Shareable<T, O>, BoxError>> + Send>>;

/// How a refresh's settling ended, told once it has.
type Told = oneshot::Receiver<Settled>;

/// Whether `past` is within `window` (a zero window is off).
pub(crate) fn within(past: Duration, window: Duration) -> bool {
    !window.is_zero() && past <= window
}

/// A copy already owned ([`Execute::kept_here`]'s) as
/// [`State::here_instead`] weighs one: when its work ended, how long it
/// took, then its value, if it may still answer.
pub(crate) fn owned<T>(
    here: Option<KeptHere<T>>,
) -> Option<(Duration, Duration, Option<impl FnOnce() -> T>)> {
    here.map(|h| {
        let (value, ended, took) = h.into_parts();
        (ended, took, value.map(|v| move || v))
    })
}

/// What answers in place of the store's kept result (see
/// [`State::here_instead`]).
enum Instead<T> {
    /// This node's copy, dated by its own end.
    Copy(T, StoredResult),
    /// Nothing of this node: the kept result's work started after the
    /// copy's ended, or there is no copy, or it does not serve the caller.
    Kept,
    /// Nothing at all: this node gave a result of work that ended after
    /// the kept result's started, and its copy went since.
    Neither,
}

/// `r` as it is `by` later (its age grows by this node's clock between
/// the store's answer and now).
fn aged(r: &StoredResult, by: Duration) -> StoredResult {
    StoredResult {
        age: r.age.saturating_add(by),
        ..r.clone()
    }
}

/// How many flights [`Purges`] and [`EndedHere`] remember at most.
const REMEMBERED: usize = 4096;

/// This node's purges ([`DistributedFlights::invalidate`]), so that a
/// stale result fetched from the store before a purge (or while one is on
/// its way to the store) never answers after it began.
///
/// A flight takes a [`mark`](Self::mark) as it sends its first acquire; a
/// stale result it got answers only if no purge of its key began since
/// (nor was running then). At most [`REMEMBERED`] keys are remembered;
/// past that, the finished ones are forgotten and every mark taken before
/// counts as purged (a stale answer the fewer, never one too many).
///
/// [`DistributedFlights::invalidate`]: crate::DistributedFlights::invalidate
#[derive(Default)]
pub(crate) struct Purges {
    /// Counts purge starts on this node.
    count: AtomicU64,
    inner: Mutex<PurgesInner>,
}

#[derive(Default)]
struct PurgesInner {
    /// Per key: the count at its last purge's start, and how many of its
    /// purges run now.
    keys: HashMap<FlightId, (u64, u32)>,
    /// Marks below this count as purged (keys were forgotten).
    floor: u64,
}

/// Where a flight stands among this node's purges: `None` when a purge of
/// its key was running as it asked (what it gets may predate it).
pub(crate) type PurgeMark = Option<u64>;

impl Purges {
    fn lock(&self) -> std::sync::MutexGuard<'_, PurgesInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mark of a flight of `flight` asking the store now.
    pub(crate) fn mark(&self, flight: &FlightId) -> PurgeMark {
        let inner = self.lock();
        match inner.keys.get(flight) {
            Some((_, running)) if *running > 0 => None,
            _ => Some(self.count.load(Ordering::SeqCst)),
        }
    }

    /// Whether a purge of `flight` began since `mark` was taken.
    pub(crate) fn since(&self, flight: &FlightId, mark: PurgeMark) -> bool {
        let Some(mark) = mark else {
            return true;
        };
        // No purge began anywhere on this node since the mark (each
        // begins by counting, under the lock): nothing to look up.
        if self.count.load(Ordering::SeqCst) == mark {
            return false;
        }
        let inner = self.lock();
        mark < inner.floor || inner.keys.get(flight).is_some_and(|(at, _)| *at > mark)
    }

    /// A purge of `flight` begins; it ends when the guard drops.
    pub(crate) fn begin<'a>(&'a self, flight: &FlightId) -> PurgeGuard<'a> {
        let mut inner = self.lock();
        let at = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if inner.keys.len() >= REMEMBERED && !inner.keys.contains_key(flight) {
            inner.keys.retain(|_, (_, running)| *running > 0);
            inner.floor = at;
        }
        let entry = inner.keys.entry(*flight).or_insert((at, 0));
        *entry = (at, entry.1 + 1);
        PurgeGuard {
            purges: self,
            flight: *flight,
        }
    }
}

/// A purge running (see [`Purges::begin`]).
pub(crate) struct PurgeGuard<'a> {
    purges: &'a Purges,
    flight: FlightId,
}

impl Drop for PurgeGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.purges.lock();
        if let Some((_, running)) = inner.keys.get_mut(&self.flight) {
            *running = running.saturating_sub(1);
        }
    }
}

/// The results this node's owners committed with stale windows on: per
/// flight, when the work of a few generations ended here (by this node's
/// clock), each until two leases and a call past its windows (a commit
/// held up on its way longer than that counts from its arrival at the
/// store). The store dates a result from its commit's arrival; on this
/// node a stale answer of it counts from the work's end, which a commit
/// delayed on its way (a slow or stalled store) would otherwise stretch.
/// Kept per flight: the newest generation, the newest whose commit is
/// known to have got into the store, and the newest other. The commits of
/// later runs here may never get through, however many, and the store then
/// keeps answering the last one that did. At most [`REMEMBERED`] flights,
/// the oldest go first.
pub(crate) struct EndedHere {
    flights: ExpiringMap<FlightId, [Option<Ended>; 3]>,
    /// Makes each flight's read and write one step.
    writing: Mutex<()>,
}

/// When the work of one generation ended here, and until when that is
/// remembered.
#[derive(Clone, Copy)]
struct Ended {
    generation: u64,
    at: Instant,
    until: Instant,
    /// Its commit got into the store.
    stored: bool,
}

impl Default for EndedHere {
    fn default() -> Self {
        Self {
            flights: ExpiringMap::new(REMEMBERED),
            writing: Mutex::new(()),
        }
    }
}

impl EndedHere {
    fn write(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The work of `generation` of `flight` ended at `ended`; its result
    /// is kept (and may answer) until `until`. Beside it stay the newest
    /// other generation remembered whose commit got into the store, and
    /// the newest other.
    pub(crate) fn remember(
        &self,
        flight: FlightId,
        generation: u64,
        ended: Instant,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        let this = Ended {
            generation,
            at: ended,
            until,
            stored: false,
        };
        let _writing = self.write();
        let held = self.flights.get(&flight).unwrap_or_default();
        let others = || {
            held.into_iter()
                .flatten()
                .filter(|e| e.generation != generation && e.until > now)
        };
        let stored = others().filter(|e| e.stored).max_by_key(|e| e.generation);
        let other = others()
            .filter(|e| Some(e.generation) != stored.map(|s| s.generation))
            .max_by_key(|e| e.generation);
        let until = [stored, other]
            .into_iter()
            .flatten()
            .fold(until, |u, e| u.max(e.until));
        self.flights
            .insert(flight, [Some(this), stored, other], until);
    }

    /// The commit of `generation` of `flight` got into the store.
    pub(crate) fn stored(&self, flight: FlightId, generation: u64) {
        let _writing = self.write();
        let Some(mut held) = self.flights.get(&flight) else {
            return;
        };
        let Some(e) = held
            .iter_mut()
            .flatten()
            .find(|e| e.generation == generation)
        else {
            return;
        };
        e.stored = true;
        let until = held.iter().flatten().map(|e| e.until).max();
        if let Some(until) = until {
            self.flights.insert(flight, held, until);
        }
    }

    /// When the work of `generation` of `flight` ended, if it ran here.
    fn ended(&self, flight: &FlightId, generation: u64) -> Option<Instant> {
        let now = Instant::now();
        self.flights
            .get(flight)?
            .into_iter()
            .flatten()
            .find(|e| e.generation == generation && e.until > now)
            .map(|e| e.at)
    }
}

/// Refreshes that another caller runs, known to this node from the store's
/// answer (FOLLOWER, with the kept result beside): until the store tells
/// this node the refresh ended (a commit, an abandon, a purge: a notice to
/// its inbox, which that answer subscribed to the flight) or the lease the
/// store gave runs out, this node's callers of the key are answered the
/// kept result within `stale-while-revalidate` without asking the store
/// again. One round trip per node per expiry, not one per caller: an
/// expiry answers at a hit's cost. A commit whose notice brings the result
/// (inline) answers that result next, fresh, without a round trip at the
/// refresh's end either (see [`State::watch_refresh`]). At most
/// [`REMEMBERED`] flights.
///
/// A hit (or a follower's result) answered on this node since is newer:
/// from then on the kept result never answers (a node never goes back to an older generation
/// than one it answered from the store).
pub(crate) struct RefreshesElsewhere {
    /// By the callers' key, not the flight's id: a caller answered here
    /// asks before anything of a flight is computed (the id is a digest
    /// of the key), and the watch keeps the id.
    flights: ExpiringMap<FlightKey, Arc<Watched>>,
    /// Per flight, the newest generation a hit answered on this node, for
    /// a lease.
    hits: ExpiringMap<FlightId, u64>,
}

impl Default for RefreshesElsewhere {
    fn default() -> Self {
        Self {
            flights: ExpiringMap::new(REMEMBERED),
            hits: ExpiringMap::new(REMEMBERED),
        }
    }
}

impl RefreshesElsewhere {
    /// Whether a hit newer than `generation` answered on this node.
    fn superseded(&self, flight: &FlightId, generation: u64) -> bool {
        self.hits.get(flight).is_some_and(|g| g > generation)
    }
}

/// A refresh running elsewhere: the kept result as the store answered it,
/// when, and this node's purges then.
struct Watched {
    flight: FlightId,
    /// As old as this node judged it at `at` (see [`State::honest`]): a
    /// caller's answer is that much older, by how long ago `at` was.
    kept: StoredResult,
    at: Instant,
    /// The stage's counters: the callers answered meanwhile look up
    /// nothing.
    metrics: Arc<StageMetrics>,
    /// The stage's `replay-ttl`: how long a result committed elsewhere is
    /// fresh once its notice came.
    fresh: Duration,
    purge_mark: PurgeMark,
    /// The kept result's value, once a caller decoded it: the callers
    /// answered it meanwhile share one decode. (`State` is not generic
    /// over the value's type: held as `Any`, a value of another type is
    /// decoded as it is asked for.)
    decoded: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Watched {
    /// The watch of the refresh's result, committed as `generation` with
    /// `payload` (its notice's inline result), received now: fresh for
    /// the stage's `replay-ttl` from now (the commit's trip and the
    /// notice's make it that much younger, as for a follower), its work
    /// at least as long as it ran since this node was told of it (a
    /// later-started copy here still answers instead). `None` when it is
    /// no newer than the result watched.
    fn committed(
        &self,
        generation: u64,
        payload: Bytes,
        work_time: Option<Duration>,
        age: Duration,
    ) -> Option<Arc<Watched>> {
        if generation <= self.kept.generation {
            return None;
        }
        let now = Instant::now();
        let since = now.saturating_duration_since(self.at);
        let kept = StoredResult {
            generation,
            status: ResultStatus::Ok,
            payload,
            age,
            ttl: self.fresh,
            work_time: work_time.map_or(since, |w| w.max(since.saturating_sub(age))),
        };
        Some(Arc::new(Watched {
            flight: self.flight,
            kept,
            at: now,
            metrics: Arc::clone(&self.metrics),
            fresh: self.fresh,
            purge_mark: self.purge_mark,
            decoded: OnceLock::new(),
        }))
    }

    /// The kept result's value: decoded once (with `decode`), and kept
    /// for the next callers. A result that does not decode (or is a
    /// cached failure) is not kept: each caller finds it so, as a flight
    /// does.
    fn value<T: Clone + Send + Sync + 'static>(
        &self,
        decode: impl FnOnce() -> Result<Option<T>, BackendError>,
    ) -> Option<T> {
        if let Some(v) = self.decoded.get().and_then(|d| d.downcast_ref::<T>()) {
            return Some(v.clone());
        }
        let value = decode().ok()??;
        let _ = self.decoded.set(Box::new(value.clone()));
        Some(value)
    }
}

impl<B: Backend, C: Send + Sync + 'static> State<B, C> {
    /// A caller of a key whose refresh this node knows runs elsewhere
    /// (with `stale-while-revalidate` on): the kept result the store
    /// answered (as old as it is now), within that window, unless this
    /// node purged the key since the store answered (the watch's purge
    /// mark: earlier than any flight's of the key since) or answered a
    /// newer result of it; this node's own copy (`kept_here`, see
    /// [`Execute::kept_here`]) instead when its work started later, as in
    /// [`usable`](Self::usable). `serves`: whether a result serves the
    /// caller's request. Counted as any kept answer. Nothing of a flight
    /// is needed: a flight asks it first, and so does the facade before
    /// it starts one ([`DistributedFlights::answer_during_refresh`]).
    ///
    /// [`DistributedFlights::answer_during_refresh`]: crate::DistributedFlights::answer_during_refresh
    pub(crate) fn during_refresh<T, V: FnOnce() -> T>(
        &self,
        key: &FlightKey,
        kept_here: impl FnOnce() -> Option<(Duration, Duration, Option<V>)>,
        serves: impl Fn(&T) -> bool,
    ) -> Option<(T, Answered)>
    where
        C: ResultCodec<T>,
        T: Clone + Send + Sync + 'static,
    {
        let revalidate = self.policy.stale().revalidate;
        if revalidate.is_zero() {
            return None;
        }
        let now = Instant::now();
        let watched = self.elsewhere.flights.get_at(key, now)?;
        let flight = &watched.flight;
        let named = Named::with(key.stage(), flight, &watched.metrics);
        if self.purges.since(flight, watched.purge_mark) {
            return None;
        }
        let kept = aged(&watched.kept, now.saturating_duration_since(watched.at));
        let (value, kept) = match self.here_instead(&kept, kept_here(), &serves) {
            Instead::Copy(value, kept) => (value, kept),
            Instead::Kept => {
                let value = watched.value(|| self.replay(named, &watched.kept))?;
                (serves(&value).then_some(value)?, kept)
            }
            Instead::Neither => return None,
        };
        within(kept.stale_for(), revalidate)
            .then(|| self.kept_answer(named, value, &kept, StaleReason::Revalidate))
    }

    /// The store answered FOLLOWER with `kept` beside: its refresh runs
    /// elsewhere for `lease_remaining` at most. Remembered until a notice
    /// about the flight comes through `notices` (an abandon, a purge, a
    /// lost message) or that lease runs out. A commit whose result came
    /// inline with its notice does not end it: that result answers this
    /// node's next callers at once, fresh, as it answers the followers
    /// that waited for it (see [`Watched::committed`]), so that no caller
    /// waits for a store call at the end of a refresh; the watch then
    /// lasts while that result is fresh (and the lease would have), and
    /// any later notice ends it.
    pub(crate) fn watch_refresh(
        self: &Arc<Self>,
        cx: &Cx,
        kept: StoredResult,
        lease_remaining: Duration,
        mut notices: Subscription,
    ) {
        if self.elsewhere.flights.contains_key(&cx.key)
            || self.elsewhere.superseded(&cx.flight, kept.generation)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let bound = lease_remaining.min(self.policy.lease_duration());
        let now = Instant::now();
        let generation = kept.generation;
        let watched = Arc::new(Watched {
            flight: cx.flight,
            kept: self.honest(&cx.flight, kept),
            at: now,
            metrics: Arc::clone(&cx.metrics),
            fresh: self.policy.replay_ttl_duration(),
            purge_mark: cx.purge_mark,
            decoded: OnceLock::new(),
        });
        let flights = &self.elsewhere.flights;
        flights.insert(cx.key.clone(), Arc::clone(&watched), now + bound);
        // A newer hit may have answered since the check above, before the
        // watch was in: then it goes. (`hit_here` records the hit, then
        // drops older watches: one of the two sees the other, and a
        // caller never has to ask.)
        if self.elsewhere.superseded(&cx.flight, generation) {
            flights.remove_if(&cx.key, |w| Arc::ptr_eq(w, &watched));
            return;
        }
        let (st, key, started) = (Arc::clone(self), cx.key.clone(), cx.started);
        // Not on the flights' tracker: nothing is left to finish when it
        // is cut, and `idle` need not wait for it.
        drop(rt.spawn(async move {
            let mut watched = watched;
            let mut until = now + bound;
            loop {
                let notice = tokio::time::timeout_at(until, notices.recv()).await;
                let next = match notice {
                    Ok(Some(Notice::Committed {
                        generation,
                        inline: Some(payload),
                        work_time,
                        age,
                    })) => watched.committed(generation, payload, work_time, age),
                    _ => None,
                };
                let Some(next) = next else { break };
                st.committed_elsewhere(&next, started);
                let fresh_until = Instant::now() + next.kept.ttl;
                let replaced = st.elsewhere.flights.replace_if(
                    &key,
                    |w| Arc::ptr_eq(w, &watched),
                    Arc::clone(&next),
                    fresh_until.min(until),
                );
                if !replaced {
                    return;
                }
                until = fresh_until.min(until);
                watched = next;
            }
            st.elsewhere
                .flights
                .remove_if(&key, |w| Arc::ptr_eq(w, &watched));
        }));
    }

    /// A watched refresh committed `next`'s result elsewhere, its notice
    /// received here: remembered as a follower that received it remembers
    /// it (the lost-result memory; a hit of that generation on this
    /// node), before any caller is answered it.
    fn committed_elsewhere(&self, next: &Watched, started: Instant) {
        let (flight, generation) = (next.flight, next.kept.generation);
        // With `commit_replicas`, only the owner learns whether the
        // commit was acknowledged, so only it remembers.
        if self.policy.commit_replica_count() == 0 {
            self.seen_commits
                .remember(flight, generation, started, next.kept.ttl);
        }
        let elsewhere = &self.elsewhere;
        if elsewhere.hits.get(&flight).is_none_or(|g| g < generation) {
            let until = Instant::now() + self.policy.lease_duration();
            elsewhere.hits.insert(flight, generation, until);
        }
    }

    /// A result of `generation` from the store answers on this node (a
    /// hit, or a follower's): what it knows of a refresh of an older
    /// result ends (see [`RefreshesElsewhere`]).
    pub(crate) fn hit_here(&self, cx: &Cx, generation: u64) {
        if self.policy.stale().revalidate.is_zero() {
            return;
        }
        let elsewhere = &self.elsewhere;
        let until = Instant::now() + self.policy.lease_duration();
        if elsewhere
            .hits
            .get(&cx.flight)
            .is_none_or(|g| g < generation)
        {
            elsewhere.hits.insert(cx.flight, generation, until);
        }
        elsewhere
            .flights
            .remove_if(&cx.key, |w| w.kept.generation < generation);
    }

    /// What a stage with stale windows asks of its first acquire.
    pub(crate) fn ask(&self) -> Ask {
        Ask {
            stale: !self.policy.stale().keep_stale().is_zero(),
            ..Ask::default()
        }
    }

    /// A kept result this caller may be answered: decoded, and serving
    /// its request.
    pub(crate) fn usable<Req, E>(
        &self,
        cx: &Cx,
        kept: Option<StoredResult>,
        exec: &E,
        req: &Req,
    ) -> Option<(E::Shared, StoredResult)>
    where
        C: ResultCodec<E::Shared>,
        E: Execute<Req>,
    {
        let kept = self.honest(&cx.flight, kept?);
        if self.purged(cx) {
            // Fetched before (or while) this node purged the key.
            return None;
        }
        let serves = |v: &E::Shared| exec.serves(v, req);
        let here = owned(exec.kept_here());
        match self.here_instead(&kept, here, serves) {
            Instead::Copy(value, kept) => return Some((value, kept)),
            Instead::Kept => {}
            Instead::Neither => return None,
        }
        let value = self.replay::<E::Shared>(cx.named(), &kept).ok()??;
        serves(&value).then_some((value, kept))
    }

    /// This node's own copy (`here`: see [`Execute::kept_here`]) answers
    /// instead of `kept`, when it `serves` the caller, unless `kept`'s
    /// work started after the copy's ended: this node gave the copy
    /// already (it is the latest-started work whose result the node
    /// gave), and the store's result started its work time before its
    /// commit, by the store's age. The copy is dated by its end, not by
    /// the start its work time gives: that time is the copy's flight's
    /// (a fallback run after a store call that failed includes the call),
    /// which would date it too early and let an older-started result of
    /// the store's answer in its place. Unsure, the copy answers: a
    /// result the node gave is never older than one it gave. When the
    /// copy went (expired, evicted) but `kept`'s work started before it
    /// ended, neither answers.
    fn here_instead<T>(
        &self,
        kept: &StoredResult,
        here: Option<(Duration, Duration, Option<impl FnOnce() -> T>)>,
        serves: impl Fn(&T) -> bool,
    ) -> Instead<T> {
        let Some((ended, took, value)) = here else {
            return Instead::Kept;
        };
        if ended >= kept.age.saturating_add(kept.work_time) {
            return Instead::Kept;
        }
        let Some(value) = value else {
            return Instead::Neither;
        };
        let value = value();
        if !serves(&value) {
            return Instead::Kept;
        }
        let ttl = self.policy.replay_ttl_duration();
        Instead::Copy(
            value,
            StoredResult {
                age: ended,
                ttl,
                work_time: took,
                ..kept.clone()
            },
        )
    }

    /// `kept` with its age since its work ended, as far as this node
    /// knows. The store counts from the commit's arrival, and the owner's
    /// commit asked for a `ttl` shortened by how long after the work's end
    /// it was sent: the age adds back what was taken off `replay-ttl`.
    /// When the work ran here, its age is by this node's clock since it
    /// ended, if that is longer (the commit's trip to the store).
    fn honest(&self, flight: &FlightId, kept: StoredResult) -> StoredResult {
        let fresh = self.policy.replay_ttl_duration();
        let age = kept.age.saturating_add(fresh.saturating_sub(kept.ttl));
        StoredResult {
            age: self.age_here(flight, kept.generation, age),
            ttl: fresh.max(kept.ttl),
            ..kept
        }
    }

    /// `age` of `generation`'s result, or, when its work ran here, how long
    /// ago it ended by this node's clock if that is longer.
    pub(crate) fn age_here(&self, flight: &FlightId, generation: u64, age: Duration) -> Duration {
        match self.ended_here.ended(flight, generation) {
            Some(ended) => age.max(ended.elapsed()),
            None => age,
        }
    }

    /// Whether this node purged the flight's key since it asked the store.
    fn purged(&self, cx: &Cx) -> bool {
        self.purges.since(&cx.flight, cx.purge_mark)
    }

    /// The answer from `kept` where the store's result, past its
    /// freshness, answers without waiting for the work (a refresh runs, or
    /// the store throttles one): a stale answer, counted; but when this
    /// node's own copy stands in for it (see [`usable`](Self::usable)) and
    /// is still fresh, a hit, which is no stale answer.
    pub(crate) fn kept_answer<T>(
        &self,
        named: Named<'_>,
        value: T,
        kept: &StoredResult,
        reason: StaleReason,
    ) -> (T, Answered) {
        if kept.age < kept.ttl {
            let hit = Answered::Hit {
                age: kept.age,
                fresh_for: kept.fresh_for(),
                work_time: kept.work_time,
            };
            return (value, hit);
        }
        self.stale_answer(named, value, kept, reason)
    }

    /// The answer from `kept`, counted.
    pub(crate) fn stale_answer<T>(
        &self,
        named: Named<'_>,
        value: T,
        kept: &StoredResult,
        reason: StaleReason,
    ) -> (T, Answered) {
        let stale = Stale {
            reason,
            age: kept.age,
        };
        self.count(named, |m| m.stale(stale));
        tracing::debug!(stage = %named.stage, flight = %named.flight, generation = kept.generation, reason = reason.as_str(), "answering a stale result");
        let work_time = kept.work_time;
        (value, Answered::Stale { stale, work_time })
    }

    /// This caller was granted the refresh of `kept` (past its
    /// freshness): within `stale-while-revalidate` it answers `kept` at
    /// once and the refresh runs in the background; otherwise the refresh
    /// runs here with `kept` standing by, answered if the work fails
    /// (within `stale-if-error`, the store then throttles the next
    /// refresh) or is still running at the soft timeout (the work goes
    /// on in the background).
    // An async block: see `State::decided`.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn refresh_stale<'a, Req, E>(
        self: &'a Arc<Self>,
        cx: &'a Cx,
        generation: u64,
        req: Req,
        exec: E,
        (value, kept): (E::Shared, StoredResult),
    ) -> impl Future<Output = Reply<E::Shared, E::Output>> + 'a
    where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        async move {
            let windows = self.policy.stale();
            let judge = exec.failures();
            let end = exec.kept_end();
            let (work, told) = self.refreshing(cx, generation, req, exec, Arc::clone(&judge));
            if within(kept.stale_for(), windows.revalidate) {
                drop(self.detach(cx, work, told, judge));
                return kept_reply(self.kept_answer(
                    cx.named(),
                    value,
                    &kept,
                    StaleReason::Revalidate,
                ));
            }
            let detach = |work| drop(self.detach(cx, work, told, Arc::clone(&judge)));
            self.stand_by(cx, &judge, (value, kept), end, work, detach)
                .await
        }
    }

    /// Another node refreshes `kept`: within `stale-while-revalidate`
    /// this caller answers it at once; otherwise it follows
    /// (`following`), and `kept` answers if that fails (within
    /// `stale-if-error`) or is still waiting at the soft timeout.
    pub(crate) async fn follow_stale<T: 'static, O, F>(
        &self,
        cx: &Cx,
        judge: Judge<T>,
        (value, kept): (T, StoredResult),
        end: Option<KeptEnd>,
        following: F,
    ) -> Reply<T, O>
    where
        F: Future<Output = Reply<T, O>>,
    {
        if within(kept.stale_for(), self.policy.stale().revalidate) {
            return kept_reply(self.kept_answer(cx.named(), value, &kept, StaleReason::Revalidate));
        }
        // How the following was answered (another node's result), told
        // past the kept result standing by.
        let came = OnceLock::new();
        let following = std::pin::pin!(async {
            let (out, how) = following.await?;
            let _ = came.set(how);
            Ok(out)
        });
        let reply = self
            .stand_by(cx, &judge, (value, kept), end, following, drop)
            .await;
        reply.map(|(out, how)| match (how, came.get()) {
            (Answered::Ran, Some(came)) => (out, *came),
            _ => (out, how),
        })
    }

    /// Waits for `work` with `kept` standing by: answered instead once the
    /// soft timeout passes (`work` then goes to `on_soft`), or when `work`
    /// fails (or its wait runs past the wait timeout: `wait_timeout`)
    /// within `stale-if-error`; never past its freshness plus the window
    /// that answers, nor once this node has a copy of newer work (`end`,
    /// see [`Execute::kept_end`]: a copy that ended after `kept`'s work
    /// started, or after the copy standing in as `kept` ended, came
    /// meanwhile: this node gave it, or may have).
    async fn stand_by<T: 'static, O, F>(
        &self,
        cx: &Cx,
        judge: &Judge<T>,
        (value, kept): (T, StoredResult),
        end: Option<KeptEnd>,
        mut work: F,
        on_soft: impl FnOnce(F),
    ) -> Reply<T, O>
    where
        F: Future<Output = Result<Shareable<T, O>, BoxError>> + Unpin,
    {
        let windows = self.policy.stale();
        let received = Instant::now();
        // Past its bar, a copy's end is of newer work than what stands by.
        let bar = end.map(|end| {
            let started = received.checked_sub(kept.age.saturating_add(kept.work_time));
            let bar = end.now().max(started).unwrap_or(received);
            (end, bar)
        });
        let superseded = || {
            bar.as_ref()
                .is_some_and(|(end, bar)| end.now().is_some_and(|done| done > *bar))
        };
        let out = if windows.soft_timeout.is_zero() {
            (&mut work).await
        } else {
            match tokio::time::timeout(windows.soft_timeout, &mut work).await {
                Ok(out) => out,
                Err(_) => {
                    let now = aged(&kept, received.elapsed());
                    if within(now.stale_for(), windows.keep_stale())
                        && !self.purged(cx)
                        && !superseded()
                    {
                        on_soft(work);
                        let answer =
                            self.stale_answer(cx.named(), value, &now, StaleReason::SoftTimeout);
                        return kept_reply(answer);
                    }
                    // Too old by now, or of older work than a copy that
                    // came meanwhile: the caller waits on.
                    (&mut work).await
                }
            }
        };
        let now = aged(&kept, received.elapsed());
        // A wait that ran past `wait-timeout` (this node's following of a
        // refresh elsewhere) is answered the same way, whatever the judge
        // says, as itself: the work did not fail.
        let waited_out = out
            .as_ref()
            .is_err_and(|e| find::<WaitTimeout>(e.as_ref()).is_some());
        let why = if waited_out {
            StaleReason::WaitTimeout
        } else {
            StaleReason::Error
        };
        let answers = waited_out || failed(&**judge, &out);
        if within(now.stale_for(), windows.if_error) && answers && !self.purged(cx) && !superseded()
        {
            return kept_reply(self.stale_answer(cx.named(), value, &now, why));
        }
        out.map(|s| (s, Answered::Ran))
    }

    /// A hit near the end of its freshness: with `early-refresh` on, XFetch
    /// decides whether this caller refreshes it, and the store grants one
    /// such refresh (a lease: the others keep their hit). The caller is
    /// answered the hit at once: the grant is asked, and a granted refresh
    /// runs, in the background.
    pub(crate) fn refresh_early<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        hit: &StoredResult,
        req: Req,
        exec: E,
    ) where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        let early = self.policy.stale().early_refresh;
        let left = hit.fresh_for();
        if !within(left, early) || left.is_zero() || !xfetch(left, hit.work_time) {
            return;
        }
        let stage = cx.stage().clone();
        let grant = Arc::clone(self).early_grant(cx.clone(), req, exec, None);
        // Granted, the refresh runs on its own task: nothing to wait for.
        let task = async move { drop(grant.await) };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(self.tasks.spawn_on(task, &rt)),
            Err(_) => tracing::debug!(%stage, "no runtime for an early refresh"),
        }
    }

    /// Asks the store for the early refresh of `cx`'s fresh result, and
    /// runs it in the background when granted (see
    /// [`refresh_early`](Self::refresh_early)): its task then, which ends
    /// with the refresh (`None` without a runtime). `copy_age`:
    /// how old the result is that the caller chose to refresh, when it
    /// chose by its own copy, not by the store's answer: a grant beside a
    /// result whose work started after that one ended (another node
    /// refreshed it already) is given back, not run.
    // An async block: see `State::decided`.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn early_grant<Req, E>(
        self: Arc<Self>,
        cx: Cx,
        req: Req,
        exec: E,
        copy_age: Option<Duration>,
    ) -> impl Future<Output = Option<JoinHandle<()>>>
    where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        async move {
            let st = self;
            let ask = Ask {
                early: true,
                ..st.ask()
            };
            // Dropped mid-call (a runtime shutting down), it releases what
            // the token may hold.
            let mut guard = TokenGuard::new(&st, &cx);
            let granted = st.acquire(&cx, Op::Acquire, &mut guard, ask).await;
            let Ok(Acquired::Owner {
                generation, stale, ..
            }) = granted
            else {
                return None;
            };
            let newer = |kept: &StoredResult| {
                copy_age.is_some_and(|age| kept.age.saturating_add(kept.work_time) < age)
            };
            if stale.as_ref().is_some_and(newer) {
                tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, "a newer result is stored: no early refresh");
                // Given back at once; a release that fails is left to the
                // guard, which lists the token for release in the background.
                let terms = cx.terms.state_ttl;
                let release = st.backend.release(&cx.flight, &cx.token, terms);
                if st.timed(&cx, Op::Release, release).await.is_err() {
                    guard.suspect();
                }
                return None;
            }
            guard.owned();
            cx.metrics.with(|m| m.owner.increment(1));
            tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, "refreshing a hit early");
            let judge = exec.failures();
            let (work, told) = st.refreshing(&cx, generation, req, exec, Arc::clone(&judge));
            st.detach(&cx, work, told, judge)
        }
    }

    /// The refresh of `generation` (granted to this caller), owning all it
    /// needs, and how its settling ends; its lease lives from now on.
    fn refreshing<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        generation: u64,
        req: Req,
        exec: E,
        judge: Judge<E::Shared>,
    ) -> (Refreshing<E::Shared, E::Output>, Told)
    where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        let (st, cx) = (Arc::clone(self), cx.clone());
        let (tell, told) = oneshot::channel();
        // Held while the refresh runs, its end included (see
        // `Execute::refresh_mark`).
        let mark = exec.refresh_mark();
        let work = Box::pin(async move {
            let _mark = mark;
            st.own_judged(&cx, generation, req, exec, Some(&judge), Some(tell))
                .await
        });
        (work, told)
    }

    /// Finishes a refresh in the background (see the module docs), and
    /// counts how it ended: a result its commit (`told`) got into the
    /// store as `committed`, one the store fenced (a purge came after the
    /// refresh began) as `fenced`, one that never got into the store (the
    /// commit's attempts ran out) as `write_failed`. Without a runtime
    /// (it is shutting down), it is dropped: its lease is abandoned.
    fn detach<T, O>(
        &self,
        cx: &Cx,
        work: Refreshing<T, O>,
        told: Told,
        judge: Judge<T>,
    ) -> Option<JoinHandle<()>>
    where
        T: Send + 'static,
        O: Send + 'static,
    {
        let bound = self.policy.wait_timeout_duration();
        let stage = cx.stage().clone();
        let cx = cx.clone();
        let task = async move {
            // A panic of the work ends the refresh as a failure (counted as
            // one): its lease is dropped with it, which abandons it.
            let mut work = work;
            let caught = std::future::poll_fn(move |ctx| {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    work.as_mut().poll(ctx)
                })) {
                    Ok(polled) => polled,
                    Err(_) => {
                        std::task::Poll::Ready(Err(Box::new(WorkPanicked::new(None)) as BoxError))
                    }
                }
            });
            let how = match tokio::time::timeout(bound, caught).await {
                Err(_) => Refresh::Abandoned,
                Ok(out) if failed(&*judge, &out) => Refresh::Failed,
                // The settling is bounded (a lease of retries at most).
                Ok(Ok(Shareable::Shared(_))) => match told.await {
                    Ok(Settled::Stored) => Refresh::Committed,
                    Ok(Settled::Fenced) => Refresh::Fenced,
                    // Its commit never got through (or was never sent:
                    // the result could not be stored, or the settling
                    // could not run): it replaced nothing.
                    Ok(Settled::Unstored) | Err(_) => Refresh::WriteFailed,
                },
                // Not shareable: nothing replaced the kept result.
                Ok(Ok(Shareable::Unshared(..))) => Refresh::Failed,
                Ok(Err(e)) if e.is::<LeaseLost>() => Refresh::Fenced,
                Ok(Err(_)) => Refresh::Failed,
            };
            tracing::debug!(stage = %cx.stage(), flight = %cx.flight, outcome = ?how, "background refresh ended");
            cx.metrics.with(|m| m.refresh(how));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => Some(self.tasks.spawn_on(task, &rt)),
            Err(_) => {
                tracing::debug!(%stage, "no runtime for a background refresh");
                None
            }
        }
    }
}

/// Whether `out` failed as `judge` says (an unshared output is an
/// answer).
fn failed<T: 'static, O>(
    judge: &dyn flightdeck_core::stale::Failures<T>,
    out: &Result<Shareable<T, O>, BoxError>,
) -> bool {
    match out {
        Ok(Shareable::Shared(v)) => judge.failed(Ok(v)),
        Ok(Shareable::Unshared(..)) => false,
        Err(e) => judge.failed(Err(e)),
    }
}
