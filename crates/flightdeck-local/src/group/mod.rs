//! The synchronization core: the in-flight map, one slot per flight.
//!
//! A flight's whole state (how many callers are left, its abort handle,
//! its waiters' expiries) lives in its slot, under its shard's lock: one
//! lock, no per-flight allocation for a flight without waiters. Its
//! waiters, once it has some, read its outcome from a board of their own
//! (see [`board`]), whose lock is taken under a shard's (by the timers)
//! or alone, never the other way round. Callers name their flight by
//! `(hash, id)`: `id` comes from a counter of the shard, so it is never
//! reused within the shard that the hash picks.
//!
//! A flight ends exactly once, and whoever ends it removes its slot under
//! the lock and then does the bookkeeping (count, gauge, delivery). A
//! caller that finds no slot with its id knows the flight already ended.
//!
//! The modules hold one concern each: [`slot`] what the map holds,
//! [`tokens`] the `max_flights` bound, [`delivery`] how an outcome reaches
//! the callers, [`board`] where the waiters read it, [`completion`] the
//! duty to deliver it exactly once, and [`detach`] the work that can move
//! from its leader to a task.

pub(crate) mod board;
pub(crate) mod completion;
pub(crate) mod delivery;
pub(crate) mod detach;
pub(crate) mod slot;
pub(crate) mod timers;
pub(crate) mod tokens;

use std::hash::BuildHasher;
use std::mem;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;

use flightdeck_core::error::{TooManyFlights, TooManyWaiters};
use flightdeck_core::time::later;
use flightdeck_core::FlightKey;
use hashbrown::hash_table::{Entry, HashTable};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use self::board::{Board, Teller};
use self::delivery::{deliver, Msg, Outcome};
use self::slot::{Expired, FlightId, Join, Leader, Place, Replay, Running, Shard, Slot, SlotState};
use self::timers::{Timeline, Timers};
use self::tokens::{TokenPool, Tokens};
use crate::flights::Caller;
use crate::metrics::{Registry, StageMetrics};
use crate::policy::{FlightPolicy, OnAbandon};

// Keys are BLAKE3 digests already; foldhash (seeded per process) is enough
// and much cheaper than SipHash on this path. The key is hashed once per
// lookup and kept in its slot (a `HashTable`, not a map: no second copy of
// the key).
type Hasher = foldhash::fast::RandomState;

pub(crate) struct Group<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hasher: Hasher,
    tokens: TokenPool,
    timers: Timers,
    /// This group, for the timer task (which holds it weakly).
    me: Weak<Self>,
    pub(crate) metrics: Registry,
    pub(crate) policy: FlightPolicy,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // None of the user's code (clones, recorders, drops of values) runs
    // under these locks, and what does cannot panic; but never let a
    // poisoned lock take the whole layer down.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V: Clone + Send + Sync + 'static> Group<V> {
    /// `time_work`: whether executions are timed here (see
    /// `StageMetrics::new`).
    pub(crate) fn new(policy: FlightPolicy, time_work: bool) -> Arc<Self> {
        policy.warn_if_degenerate();
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .saturating_mul(4)
            .next_power_of_two()
            .clamp(4, 256);
        Arc::new_cyclic(|me: &Weak<Self>| Self {
            shards: (0..n)
                .map(|_| {
                    Mutex::new(Shard {
                        table: HashTable::new(),
                        timers: Timeline::default(),
                        next_id: 0,
                        tokens: Tokens::default(),
                    })
                })
                .collect(),
            hasher: Hasher::default(),
            metrics: Registry::new(time_work),
            tokens: TokenPool::new(policy.max_flights, n),
            timers: Timers::new(),
            me: me.clone(),
            policy,
        })
    }

    fn hash(&self, key: &FlightKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: its upper half picks the shard, the table
    /// inside uses the lower bits and the top seven.
    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard<V>> {
        lock(&self.shards[(hash >> 32) as usize & (self.shards.len() - 1)])
    }

    /// Running flights right now.
    pub(crate) fn running(&self) -> usize {
        self.shards.iter().map(|s| lock(s).tokens.running).sum()
    }

    /// Entries in the map (running flights and replayable results).
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Joins the flight of `key`, or starts one (a copy of the key goes
    /// into its slot), on `caller`'s terms: its deadline extends the
    /// flight's (see `Running::deadline`), and its abandon rule is the
    /// flight's if it starts one (the policy's when `None`).
    pub(crate) fn join(&self, key: &FlightKey, caller: Caller) -> Join<V> {
        self.join_inlined(key, caller)
    }

    /// [`join`](Self::join), its code inlined into the caller's (see
    /// [`LocalFlights::run_inlined`](crate::LocalFlights::run_inlined)).
    #[inline(always)]
    pub(crate) fn join_inlined(&self, key: &FlightKey, caller: Caller) -> Join<V> {
        self.join_with(key, caller, |leader| leader)
    }

    /// [`join_inlined`](Self::join_inlined), a leader's [`Leader`] turned
    /// by `lead` into what its caller needs of it, once the shard's lock
    /// is released (`LocalFlight::call` builds its flight's completion
    /// there, straight into the answer, instead of reading a `Leader` out
    /// of the answer to build it).
    #[inline(always)]
    pub(crate) fn join_with<L>(
        &self,
        key: &FlightKey,
        caller: Caller,
        lead: impl FnOnce(Leader<V>) -> L,
    ) -> Join<V, L> {
        // Looked up before the lock: the first use of a stage registers its
        // handles with the recorder, which is not the shard's business (the
        // first stage's handles are borrowed, not reference-counted).
        let metrics = self.metrics.get(key.stage());
        // Resolved before the lock too: under a recorder seen for the first
        // time, the stage's handles are registered here (this flight is
        // counted in the active gauge when it starts).
        let (gen, timed) = metrics.resolve();
        // A bound of 0 turns every call away, the leader included.
        if self.policy.max_waiters == 0 {
            return self.reject(&metrics, key, true);
        }
        let hash = self.hash(key);
        let mut collected = false;
        loop {
            let mut guard = self.shard(hash);
            let shard = &mut *guard;
            let entry = shard.table.entry(
                hash,
                |s| s.current() && s.key == *key,
                |s| self.hash(&s.key),
            );
            let place = match entry {
                Entry::Vacant(v) => Place::Vacant(v),
                Entry::Occupied(mut e) => {
                    // Only here is the time needed: a fresh key reads no clock.
                    let now = Instant::now();
                    let slot = e.get_mut();
                    let id = FlightId { hash, id: slot.id };
                    match &mut slot.state {
                        SlotState::Replay(replay) => {
                            if now < replay.until {
                                // Cloned after the lock: `V::clone` is the
                                // user's code.
                                let replay = Arc::clone(replay);
                                drop(guard);
                                metrics.replay();
                                return Join::Replay(replay.value.clone());
                            }
                            // An expired result: its slot is reused.
                            Place::Reuse(e)
                        }
                        SlotState::Running(r) => {
                            let started = *r.started.get_or_insert(now);
                            if started
                                .checked_add(self.policy.flight_ttl)
                                .is_none_or(|end| now < end)
                            {
                                let joiners = r.joiners();
                                if joiners.live >= self.policy.max_waiters {
                                    drop(guard);
                                    return self.reject(&metrics, key, true);
                                }
                                let board =
                                    &joiners.board.get_or_insert_with(|| Teller(Board::new())).0;
                                let seat = (Arc::clone(board), joiners.joined);
                                // A waiter on a runtime the group's timers
                                // do not serve keeps its own clock.
                                let (expiry, own) = match self.expiry(now, caller.deadline) {
                                    Some(at) if !self.serves_here() => (None, Some(at)),
                                    expiry => (expiry, None),
                                };
                                if let Some(at) = expiry {
                                    joiners.expiries.push(std::cmp::Reverse((at, seat.1)));
                                }
                                joiners.joined += 1;
                                joiners.live += 1;
                                r.deadline = match (r.deadline, caller.deadline) {
                                    (Some(a), Some(b)) => Some(a.max(b)),
                                    _ => None,
                                };
                                match expiry.filter(|&at| {
                                    timers::arm(&mut shard.timers, r, hash, id.id, at)
                                }) {
                                    Some(at) => self.announce(guard, hash, at),
                                    None => drop(guard),
                                }
                                metrics.waiter();
                                return Join::Waiter(id, metrics.keep(), seat, now, own);
                            }
                            // Past its TTL, a running flight finishes for its
                            // own callers and keeps its slot; a new flight, if
                            // admitted, takes the key.
                            Place::Beside(id.id)
                        }
                    }
                }
            };
            if !self.tokens.admit(&mut shard.tokens) {
                drop(guard);
                // Other shards may keep spare tokens: collected once, then the
                // call is looked up again (the key's flight may exist by now).
                if !mem::replace(&mut collected, true) && self.collect() {
                    continue;
                }
                return self.reject(&metrics, key, false);
            }
            shard.next_id += 1;
            let id = FlightId {
                hash,
                id: shard.next_id,
            };
            let slot = Slot {
                key: key.clone(),
                id: id.id,
                state: SlotState::Running(Running {
                    started: None,
                    superseded: false,
                    finish: caller.on_abandon.unwrap_or(self.policy.on_abandon)
                        == OnAbandon::Finish,
                    deadline: caller.deadline,
                    timer: None,
                    leader_timer: None,
                    joiners: None,
                    gen,
                }),
            };
            let old = match place {
                Place::Vacant(v) => {
                    v.insert(slot);
                    None
                }
                // The expired result is dropped after the lock. Only a
                // replayed result's slot is reused (see `Place::Reuse`).
                Place::Reuse(e) => match mem::replace(e.into_mut(), slot).state {
                    SlotState::Replay(replay) => Some(replay),
                    SlotState::Running(_) => {
                        debug_assert!(false, "a running flight's slot was reused");
                        None
                    }
                },
                Place::Beside(old) => {
                    if let Some(r) = shard.running(hash, old) {
                        r.superseded = true;
                    }
                    shard.table.insert_unique(hash, slot, |s| self.hash(&s.key));
                    None
                }
            };
            drop(guard);
            // The expired result is dropped (`V::drop` is the user's code)
            // once the caller has armed the flight's completion.
            return Join::Leader(lead(Leader {
                flight: id,
                metrics: metrics.keep(),
                gen,
                timed,
                expired: Expired { _replaced: old },
            }));
        }
    }

    /// Sweeps every shard's spare tokens into the pool (see
    /// [`TokenPool::collect`]).
    fn collect(&self) -> bool {
        self.tokens
            .collect(|i, take| take(&mut lock(&self.shards[i]).tokens))
    }

    fn reject<L>(&self, metrics: &StageMetrics, key: &FlightKey, waiters: bool) -> Join<V, L> {
        metrics.rejected();
        let stage = Some(key.stage().clone());
        Join::Rejected(if waiters {
            Box::new(TooManyWaiters::new(stage, self.policy.max_waiters))
        } else {
            Box::new(TooManyFlights::new(stage, self.policy.max_flights))
        })
    }

    /// When a waiter that joins at `since` (with `deadline`, its own) must
    /// leave (see `timers::expiry_of`).
    fn expiry(&self, since: Instant, deadline: Option<Instant>) -> Option<Instant> {
        timers::expiry_of(self.policy.wait_timeout, since, deadline).map(|(at, _)| at)
    }

    /// The work's first poll returned pending at `at`: the flight TTL
    /// counts from there (unless a waiter found it running first). With
    /// `leader`, the leader polls it and must be woken at that instant
    /// (its expiry) if the work is still pending then.
    pub(crate) fn pending(&self, flight: FlightId, at: Instant, leader: Option<(Instant, &Waker)>) {
        let mut guard = self.shard(flight.hash);
        let shard = &mut *guard;
        let Some(r) = shard
            .table
            .find_mut(flight.hash, |s| s.id == flight.id)
            .and_then(Slot::running)
        else {
            return;
        };
        r.started.get_or_insert(at);
        let Some((expiry, waker)) = leader else {
            return;
        };
        r.leader_timer = Some((expiry, waker.clone()));
        if timers::arm(&mut shard.timers, r, flight.hash, flight.id, expiry) {
            self.announce(guard, flight.hash, expiry);
        }
    }

    /// The leader now polls the work with another waker.
    pub(crate) fn rewake(&self, flight: FlightId, waker: &Waker) {
        if let Some(r) = self.shard(flight.hash).running(flight.hash, flight.id) {
            if let Some((_, w)) = r.leader_timer.as_mut() {
                w.clone_from(waker);
            }
        }
    }

    /// The flight's deadline now (`Some(None)`: unbounded), `None` once it
    /// ended.
    pub(crate) fn flight_deadline(&self, flight: FlightId) -> Option<Option<Instant>> {
        self.shard(flight.hash)
            .running(flight.hash, flight.id)
            .map(|r| r.deadline)
    }

    /// Records the task that runs the work, so the flight can be cancelled.
    pub(crate) fn set_abort(&self, flight: FlightId, handle: AbortHandle) {
        match self.shard(flight.hash).running(flight.hash, flight.id) {
            Some(r) => r.joiners().abort = Some(handle),
            // Cancelled (or done) before the task existed.
            None => handle.abort(),
        }
    }

    /// A caller leaves before the flight ended: a waiter, or the leader
    /// (`leader`). The last one out cancels the flight, unless its leader
    /// asked it to finish. When a caller timed out waiting, the flight is
    /// not cancelled at once (a wait timeout never removes the flight for
    /// the callers still to come): with nobody left it is cancelled once
    /// its flight TTL has passed, so hung work never holds its token for
    /// ever. Returns whether the flight goes on (`false`: cancelled now, or
    /// ended before).
    pub(crate) fn depart(
        self: &Arc<Self>,
        flight: FlightId,
        timed_out: bool,
        leader: bool,
    ) -> bool {
        let mut waker = None;
        let mut guard = self.shard(flight.hash);
        let shard = &mut *guard;
        let Ok(mut e) = shard.table.find_entry(flight.hash, |s| s.id == flight.id) else {
            return false;
        };
        let Some(r) = e.get_mut().running() else {
            return false;
        };
        let finish = r.finish;
        let started = r.started;
        if leader {
            // Its waker is dropped after the lock (it is the user's code).
            waker = r.leader_timer.take();
        }
        let timer = r.timer;
        let joiners = r.joiners();
        joiners.leader_present &= !leader;
        joiners.live = joiners.live.saturating_sub(1);
        joiners.keep |= timed_out;
        if joiners.live > 0 || finish {
            return true;
        }
        if joiners.keep {
            drop(guard);
            self.cancel_when_unwanted(flight, started);
            return true;
        }
        let (slot, _) = e.remove();
        shard.disarm(flight.id, timer);
        self.tokens.release(&mut shard.tokens);
        drop(guard);
        drop(waker);
        self.cancelled(slot, leader);
        false
    }

    /// A flight that nobody waits for any more, kept because a caller timed
    /// out: cancelled once its flight TTL has passed (from when it started,
    /// or from now if it never did), unless a caller joined it meanwhile.
    fn cancel_when_unwanted(self: &Arc<Self>, flight: FlightId, started: Option<Instant>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let at = later(started.unwrap_or_else(Instant::now), self.policy.flight_ttl);
        let group = Arc::clone(self);
        drop(rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            let mut shard = group.shard(flight.hash);
            let Ok(mut e) = shard.table.find_entry(flight.hash, |s| s.id == flight.id) else {
                return;
            };
            let Some(r) = e.get_mut().running() else {
                return;
            };
            if r.joiners.as_ref().is_none_or(|j| j.live > 0) {
                return;
            }
            let timer = r.timer;
            let (slot, _) = e.remove();
            shard.disarm(flight.id, timer);
            group.tokens.release(&mut shard.tokens);
            drop(shard);
            tracing::debug!(stage = %slot.key.stage(), key = %slot.key.digest().short(), "flight TTL passed with nobody waiting: cancelled");
            group.cancelled(slot, false);
        }));
    }

    /// The bookkeeping of a cancelled flight whose slot was just removed:
    /// counted, and its work aborted if it runs on a task.
    fn cancelled(&self, slot: Slot<V>, leader: bool) {
        let metrics = self.metrics.get(slot.key.stage());
        if let SlotState::Running(r) = &slot.state {
            metrics.ended(r.gen, None);
        }
        metrics.cancelled();
        tracing::debug!(stage = %slot.key.stage(), key = %slot.key.digest().short(), leader, "last caller left: flight cancelled");
        if let SlotState::Running(Running {
            joiners: Some(joiners),
            ..
        }) = slot.state
        {
            if let Some(a) = joiners.abort {
                a.abort();
            }
        }
    }

    /// Ends a flight with its outcome and delivers it to the waiters.
    /// `replay` is a copy of the value to replay (made by the caller, out
    /// of the lock: `V::clone` is the user's code), `began` when the work
    /// began, for work that ran to its end. Returns the leader's message
    /// when the leader is still there; a value kept for replay is removed
    /// when its window ends.
    #[inline(always)]
    fn finish(
        self: &Arc<Self>,
        flight: FlightId,
        metrics: &StageMetrics,
        outcome: Outcome<V>,
        replay: Option<V>,
        began: Option<Instant>,
    ) -> Option<Msg<V>> {
        let until = replay
            .as_ref()
            .map(|_| later(Instant::now(), self.policy.replay_ttl));
        let mut shard = self.shard(flight.hash);
        let Ok(mut e) = shard.table.find_entry(flight.hash, |s| s.id == flight.id) else {
            // Cancelled: nobody is left to tell.
            return None;
        };
        let slot = e.get_mut();
        // For the log line of a panic, read before the slot goes.
        let panicked = matches!(outcome, Outcome::Panicked).then(|| slot.key.digest().short());
        let keeps_fields = slot.key.keeps_fields();
        let r = slot.running()?;
        let joiners = r.joiners.take();
        let gen = r.gen;
        let timer = r.timer.take();
        // Dropped after the lock (a waker is the user's code).
        let _leader_waker = r.leader_timer.take();
        let until = match (replay, until) {
            // A flight that outlived its TTL leaves the key to the newer one.
            (Some(value), Some(until)) if !r.superseded => {
                slot.state = SlotState::Replay(Arc::new(Replay { value, until }));
                Some(until)
            }
            // Nothing left in the running state owns anything (its
            // waiters' board and the leader's waker were taken above): it
            // is forgotten, not dropped, so that the removal does not copy
            // the whole slot out of the table only to drop nothing. A key
            // of fields owns them: that key is dropped.
            _ => {
                debug_assert!(r.owns_nothing());
                if keeps_fields {
                    let Slot { key, state, .. } = e.remove().0;
                    drop(key);
                    std::mem::forget(state);
                } else {
                    std::mem::forget(e.remove().0);
                }
                None
            }
        };
        shard.disarm(flight.id, timer);
        self.tokens.release(&mut shard.tokens);
        drop(shard);
        metrics.ended(gen, began);
        if let Some(key) = panicked {
            metrics.panicked();
            tracing::error!(stage = %metrics.stage, %key, "work panicked");
        }
        let leader = match joiners {
            // A waiter whose time was up has been told already: with every
            // waiter's up, nobody reads the board.
            Some(j) => {
                let board = j.board.as_ref().filter(|_| j.expired < j.joined);
                deliver(board.map(|b| &*b.0), outcome, j.leader_present)
            }
            // Nobody joined: the leader takes the outcome as it is.
            None => outcome.into_msg(),
        };
        if let Some(until) = until {
            self.expire_at(flight, until);
        }
        leader
    }

    /// Removes the replay entry of `flight` at `until`, the end of its
    /// window. Without a runtime the entry expires when its key is next
    /// looked up.
    fn expire_at(self: &Arc<Self>, flight: FlightId, until: Instant) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let group = Arc::clone(self);
            rt.spawn(async move {
                tokio::time::sleep_until(until).await;
                group.expire_replay(flight);
            });
        }
    }

    /// Forgets `key`: its replayed result goes, and a flight of it still
    /// running finishes for its own callers only (new callers start
    /// another; its result is not kept for replay). Returns whether
    /// anything was forgotten.
    pub(crate) fn forget(&self, key: &FlightKey) -> bool {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        let mut forgotten = false;
        // A purge passes a running flight by: the same move as a flight
        // that outlived its TTL (see `Place::Beside`).
        let running = shard.table.iter_hash_mut(hash);
        for slot in running.filter(|s| s.key == *key) {
            if let SlotState::Running(r) = &mut slot.state {
                forgotten |= !r.superseded;
                r.superseded = true;
            }
        }
        let replay = |s: &Slot<V>| s.key == *key && matches!(s.state, SlotState::Replay(_));
        let gone = shard
            .table
            .find_entry(hash, replay)
            .ok()
            .map(|e| e.remove().0);
        drop(shard);
        // The key and the value are dropped after the lock.
        forgotten | gone.is_some()
    }

    /// Removes a replay entry once its window is over.
    pub(crate) fn expire_replay(&self, flight: FlightId) {
        let mut shard = self.shard(flight.hash);
        let ours = |s: &Slot<V>| s.id == flight.id && matches!(s.state, SlotState::Replay(_));
        if let Ok(e) = shard.table.find_entry(flight.hash, ours) {
            // The key and the value are dropped after the lock.
            let slot = e.remove().0;
            drop(shard);
            drop(slot);
        }
    }
}

#[cfg(test)]
mod tests;
