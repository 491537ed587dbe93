//! The results a stage keeps on this node for its stale windows (and, with
//! a window on, for its local replay): one copy per key, bounded by count
//! and bytes, the oldest evicted first, each tagged with the generation of
//! the work that produced it so that a purge fences the work running when
//! it happened. A copy that goes (expired, evicted, too large to keep)
//! leaves a floor behind while a result of older work could still answer
//! elsewhere (the store's kept result): when the work the node gave ended,
//! so that nothing older answers or becomes the copy.
//!
//! Written by hand rather than taken from a cache crate: moka, mini-moka
//! and quick_cache read `std::time::Instant` (moka its own clock), so a
//! paused tokio clock cannot drive their expiry, and every window here is
//! tested on paused time. What is needed is small: a map, an insertion
//! order (which is also the age order: a copy is re-inserted whenever it
//! is replaced) and two counters.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use flightdeck_core::FlightKey;
use flightdeck_distributed::KeptHere;
use tokio::time::Instant;

use crate::stale::Served;

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Where a work starts: the generation its result is tagged with. A purge
/// of its key after this fences its result. Results are ordered by when
/// their work started (`at`), then by generation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    gen: u64,
    at: Instant,
}

impl Ticket {
    /// This ticket for a result that came from elsewhere (the store), of
    /// work that began `ago` before now (its age and its work time): as
    /// newly taken for a purge, ordered among results by its work's start.
    pub(crate) fn began_before(self, ago: Duration) -> Self {
        match Instant::now().checked_sub(ago) {
            Some(at) => Self { at, ..self },
            None => self,
        }
    }

    /// Its place among the key's results: its work's start, then its
    /// generation.
    fn order(&self) -> (Instant, u64) {
        (self.at, self.gen)
    }
}

/// A kept copy, as looked up.
#[derive(Debug)]
pub(crate) struct Look<V> {
    pub(crate) value: V,
    /// When the work that produced it ended.
    pub(crate) done: Instant,
    /// How long that work took (XFetch's scale).
    pub(crate) took: Duration,
    /// A failure answered by it throttles the work until then.
    pub(crate) retry_until: Option<Instant>,
    /// The generation of the work that produced it: which copy this is.
    pub(crate) gen: u64,
}

/// What remains of a key's copy once it went: the result of the work that
/// took `gen`, which ended at `done`, was given on this node. Until
/// `until`, no result of work that started before it becomes the copy,
/// and no kept result of the store's whose work started before `done`
/// answers in its place.
#[derive(Clone, Copy)]
struct Floor {
    /// The given result's work's start and generation (see
    /// [`Ticket::order`]).
    order: (Instant, u64),
    done: Instant,
    until: Instant,
}

/// How a flight ended (see [`Kept::note_answer`]).
#[derive(Clone, Copy)]
struct Note {
    /// Its leader's arrival.
    tag: u64,
    /// When it ended, in the same order.
    end: u64,
    served: Option<Served>,
}

/// How many flights' notes a key keeps: more than run at once but for a
/// purge or a waiter's run alone beside a flight.
const NOTES_PER_KEY: usize = 4;

/// How many keys' notes are kept: a flight's callers read its note as it
/// ends, so only the flights that end together need theirs; more would
/// only hold memory under a churn of keys.
const NOTES_MAX_KEYS: usize = 4096;

/// `key`'s last response could not be shared: its callers run their own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass;

/// What became of a result offered to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// It is the key's copy now.
    Kept,
    /// A purge of its key (or a newer result) came after its work started:
    /// dropped.
    Fenced,
    /// Larger than the byte bound: not kept (and the older copy is gone:
    /// it must never answer once a newer result was given).
    TooLarge,
}

struct Entry<V> {
    value: V,
    size: usize,
    done: Instant,
    took: Duration,
    /// When its work started (see [`Ticket::order`]).
    started: Instant,
    gen: u64,
    seq: u64,
    refreshing: bool,
    retry_until: Option<Instant>,
}

struct Inner<V> {
    map: Map<FlightKey, Entry<V>>,
    /// Insertion order: `seq` → key, oldest first.
    order: BTreeMap<u64, FlightKey>,
    bytes: usize,
    /// The generation of each key's last purge, the oldest first in
    /// `purge_order`, at most `max_entries` of them; a result whose work
    /// started before `purge_floor` (the newest purge forgotten) is
    /// fenced whatever its key.
    purged: Map<FlightKey, u64>,
    purge_order: VecDeque<(u64, FlightKey)>,
    purge_floor: u64,
    /// Keys whose last response could not be shared, until when
    /// (hit-for-pass), at most `max_entries`, oldest first.
    passes: Map<FlightKey, Instant>,
    pass_order: VecDeque<(Instant, FlightKey)>,
    /// How each key's last flights were answered (see
    /// [`Kept::note_answer`]), at most `NOTES_PER_KEY` per key, oldest
    /// first, and at most `max_entries` (and `NOTES_MAX_KEYS`) keys.
    answers: Map<FlightKey, Vec<Note>>,
    answer_order: VecDeque<FlightKey>,
    /// Each key's runs in the local fallback (its coordination failed:
    /// the store was unreachable; or it was not asked): when the last one
    /// ended, in the same order, and whether the store was down. At most
    /// `max_entries`.
    fallbacks: Map<FlightKey, Fallbacks>,
    /// What remains of copies that went (see [`Floor`]), at most
    /// `max_floors`, in the order they were left.
    floors: Map<FlightKey, Floor>,
    floor_order: VecDeque<(Instant, FlightKey)>,
    /// The refreshes the store granted that run on this node, by key (the
    /// ids of their marks, see [`Kept::mark_refresh`]): one per running
    /// refresh, gone when it ends.
    granted: Map<FlightKey, Vec<u64>>,
}

/// A key's runs in the local fallback (see [`Kept::begin_fallback`]).
#[derive(Clone, Copy, Default)]
struct Fallbacks {
    /// When the last one ended (0: none remembered).
    ended: u64,
    /// How many run now.
    running: u32,
    /// Whether the store was down for the last one to begin or end.
    down: bool,
}

/// One stage's kept results on this node.
pub(crate) struct Kept<V> {
    inner: Mutex<Inner<V>>,
    /// Generations (tickets, purges) and sequence numbers: one total
    /// order, so a ticket taken before a purge is below the purge's.
    next: AtomicU64,
    max_entries: usize,
    max_bytes: usize,
    /// Past a copy's `done`, how long it may still answer at all (its
    /// freshness plus the longest window): then it is dropped.
    keep_for: Duration,
    /// Past a copy's `done`, how long what remains of it (its floor)
    /// still keeps older work from answering: `keep_for` plus how long
    /// after the copy's end a result of work that started before it may
    /// reach the store.
    floor_for: Duration,
    /// How many floors are kept: `max_entries`, and no more than a quarter
    /// of `max_bytes` holds at [`FLOOR_COST`] each (a churn of keys whose
    /// copies the byte bound evicts leaves one floor per key).
    max_floors: usize,
}

/// What a floor holds in memory, about, as measured (a churn of 1M keys
/// whose copies the byte bound evicts: ~650 bytes per floor, its key twice
/// with what it points to, its instants, the map's overhead).
const FLOOR_COST: usize = 640;

impl<V: Clone> Kept<V> {
    /// `settle`: how long after a work's start its result may still reach
    /// the store (its floor outlives a copy's `keep_for` by that).
    pub(crate) fn new(
        max_entries: usize,
        max_bytes: usize,
        keep_for: Duration,
        settle: Duration,
    ) -> Self {
        Self {
            inner: Mutex::new(Inner {
                map: Map::default(),
                order: BTreeMap::new(),
                bytes: 0,
                purged: Map::default(),
                purge_order: VecDeque::new(),
                purge_floor: 0,
                passes: Map::default(),
                pass_order: VecDeque::new(),
                answers: Map::default(),
                answer_order: VecDeque::new(),
                fallbacks: Map::default(),
                floors: Map::default(),
                floor_order: VecDeque::new(),
                granted: Map::default(),
            }),
            next: AtomicU64::new(0),
            max_entries,
            max_bytes,
            keep_for,
            floor_for: keep_for.saturating_add(settle),
            max_floors: max_entries.min(max_bytes / 4 / FLOOR_COST).max(1),
        }
    }

    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn lock(&self) -> MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A work starts now.
    pub(crate) fn ticket(&self) -> Ticket {
        self.ticket_at(Instant::now())
    }

    /// A work starts at `at` (now, read already).
    pub(crate) fn ticket_at(&self, at: Instant) -> Ticket {
        Ticket {
            gen: self.next(),
            at,
        }
    }

    /// Where a caller of `key` stands among the flights that end: a flight
    /// that ends after this answered it, or a later caller.
    pub(crate) fn arrival(&self) -> u64 {
        self.next()
    }

    /// Where the order stands now, taking no place in it (a read, not an
    /// increment): every arrival taken before is at most this.
    pub(crate) fn now_at(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    /// Notes how `key`'s flight that ends now was answered: `tag`, its
    /// leader's [`arrival`](Self::arrival); `served`, how the store
    /// answered it itself (a hit, a stale result) or that it ran in the
    /// local fallback, `None` for neither. Every flight that could ask the
    /// store notes, `None` too, so that a caller that joined it finds its
    /// note, not that of another flight of the key running beside it (one
    /// a purge left); a run here that never could (LOCAL_ONLY, a caller's
    /// own run) notes nothing, and its leader, reading its own tag, finds
    /// nothing.
    pub(crate) fn note_answer(&self, key: &FlightKey, tag: u64, served: Option<Served>) {
        let end = self.next();
        let mut inner = self.lock();
        if !inner.answers.contains_key(key) {
            // Bounded: the keys noted longest ago go first (a caller whose
            // note went is told nothing of how the store answered it).
            inner.answer_order.push_back(key.clone());
            while inner.answer_order.len() > self.max_entries.min(NOTES_MAX_KEYS) {
                if let Some(old) = inner.answer_order.pop_front() {
                    inner.answers.remove(&old);
                }
            }
        }
        let notes = inner.answers.entry(key.clone()).or_default();
        if notes.len() >= NOTES_PER_KEY {
            notes.remove(0);
        }
        notes.push(Note { tag, end, served });
    }

    /// How the flight of `key` that answered a caller was answered, if
    /// the store answered it itself or it ran in the local fallback. The
    /// caller took `arrival` (its tag, had it led) before it joined its
    /// key's flights and `joined_at` right after: as their leader (or
    /// alone), the note of its own run; as a caller that `joined` a
    /// flight, the note of the latest-led flight that began before it
    /// joined and ended after it arrived (its leader may have begun
    /// between the two, on another thread).
    pub(crate) fn answer_since(
        &self,
        key: &FlightKey,
        (arrival, joined_at): (u64, u64),
        joined: bool,
    ) -> Option<Served> {
        let inner = self.lock();
        let notes = inner.answers.get(key)?;
        let note = if joined {
            notes
                .iter()
                .filter(|n| n.tag <= joined_at && n.end > arrival)
                .max_by_key(|n| n.tag)
        } else {
            notes.iter().find(|n| n.tag == arrival)
        };
        note?.served
    }

    /// A run of `key` in the local fallback begins now: its flight could
    /// not reach the store (`down`), or was not sent there (a breaker's
    /// ramp held it back, or a local guard refused it). It ends with
    /// [`end_fallback`](Self::end_fallback).
    pub(crate) fn begin_fallback(&self, key: &FlightKey, down: bool) {
        self.with_fallbacks(key, |f| {
            f.running += 1;
            f.down = down;
        });
    }

    /// A run of `key` in the local fallback (begun with
    /// [`begin_fallback`](Self::begin_fallback)) ends now.
    pub(crate) fn end_fallback(&self, key: &FlightKey, down: bool) {
        let seq = self.next();
        self.with_fallbacks(key, |f| {
            f.running = f.running.saturating_sub(1);
            f.ended = seq;
            f.down = down;
        });
    }

    fn with_fallbacks(&self, key: &FlightKey, change: impl FnOnce(&mut Fallbacks)) {
        let mut inner = self.lock();
        if inner.fallbacks.len() >= self.max_entries && !inner.fallbacks.contains_key(key) {
            // Bounded: forgetting only costs a copy's answer (a failure
            // or a soft timeout the copy could have answered is the
            // caller's).
            inner.fallbacks.clear();
        }
        change(inner.fallbacks.entry(key.clone()).or_default());
    }

    /// Whether a run of `key` in the local fallback ended after a caller's
    /// `arrival` (the flight it was answered by did not reach the store),
    /// and if so whether the store was down.
    pub(crate) fn fell_back_since(&self, key: &FlightKey, arrival: u64) -> Option<bool> {
        let inner = self.lock();
        let f = inner.fallbacks.get(key)?;
        (f.ended > arrival).then_some(f.down)
    }

    /// Whether a run of `key` in the local fallback runs now or ended
    /// after a caller's `arrival` (the flight it waits on did not reach
    /// the store: on this node a key has one flight at a time), and if so
    /// whether the store was down.
    pub(crate) fn falling_back(&self, key: &FlightKey, arrival: u64) -> Option<bool> {
        let inner = self.lock();
        let f = inner.fallbacks.get(key)?;
        (f.running > 0 || f.ended > arrival).then_some(f.down)
    }

    /// Whether `key`'s callers run their own requests now (hit-for-pass),
    /// and else its copy, if it may still answer: one look under the lock.
    pub(crate) fn find(&self, key: &FlightKey) -> Result<Option<Look<V>>, Pass> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.passes.is_empty() && inner.passes.get(key).is_some_and(|until| now < *until) {
            return Err(Pass);
        }
        Ok(inner.look(key, now, self.bounds()))
    }

    /// The copy of `key`, if it may still answer.
    pub(crate) fn look(&self, key: &FlightKey) -> Option<Look<V>> {
        let now = Instant::now();
        self.lock().look(key, now, self.bounds())
    }

    /// `key`'s copy as L2 weighs it against the store's kept result: the
    /// copy, if it may still answer, else what remains of it (its
    /// [`Floor`]), in one look under the lock and one clock read.
    pub(crate) fn here(&self, key: &FlightKey) -> Option<KeptHere<V>> {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(l) = inner.look(key, now, self.bounds()) {
            let ended = now.saturating_duration_since(l.done);
            return Some(KeptHere::copy(l.value, ended, l.took));
        }
        let done = inner.floor_done(key, now)?;
        Some(KeptHere::gone(now.saturating_duration_since(done)))
    }

    /// When the work of `key`'s copy ended, or, once it went, of what
    /// remains of it (its [`Floor`]): asked again by a kept result standing
    /// by (see [`flightdeck_distributed::Execute::kept_end`]).
    pub(crate) fn ended(&self, key: &FlightKey) -> Option<Instant> {
        let now = Instant::now();
        let inner = self.lock();
        match inner.map.get(key) {
            Some(e) => Some(e.done),
            None => inner.floor_done(key, now),
        }
    }

    /// When the work of the result last given of `key` ended, once its
    /// copy went (see [`Floor`]): no stale result of work that started
    /// before then answers.
    pub(crate) fn floor(&self, key: &FlightKey) -> Option<Instant> {
        let now = Instant::now();
        self.lock().floor_done(key, now)
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            keep_for: self.keep_for,
            floor_for: self.floor_for,
            max_floors: self.max_floors,
        }
    }

    /// Whether the copy of generation `gen` is still `key`'s and may
    /// still answer: not purged, replaced or expired since it was looked
    /// up.
    pub(crate) fn holds(&self, key: &FlightKey, gen: u64) -> bool {
        self.look(key).is_some_and(|l| l.gen == gen)
    }

    /// Offers the result of the work that took `ticket`, `age` old when
    /// it came (zero: done now; a result another node stored: as old as
    /// the store says).
    pub(crate) fn put(
        &self,
        key: &FlightKey,
        ticket: Ticket,
        value: V,
        size: usize,
        age: Duration,
    ) -> Put {
        let now = Instant::now();
        let done = now.checked_sub(age).unwrap_or(now);
        let bounds = self.bounds();
        let mut inner = self.lock();
        let purged = inner.purged.get(key).copied().unwrap_or(0);
        if ticket.gen < inner.purge_floor || purged > ticket.gen {
            inner.drop_older(key, ticket.order());
            inner.leave_floor(key, ticket.order(), done, now, bounds);
            return Put::Fenced;
        }
        if inner
            .floors
            .get(key)
            .is_some_and(|f| f.order > ticket.order())
        {
            return Put::Fenced;
        }
        let (refreshing, seq) = match inner.map.get(key) {
            Some(e) if (e.started, e.gen) > ticket.order() => return Put::Fenced,
            Some(e) => (e.refreshing, e.seq),
            None => (false, 0),
        };
        if size > self.max_bytes {
            inner.drop_older(key, ticket.order());
            inner.leave_floor(key, ticket.order(), done, now, bounds);
            return Put::TooLarge;
        }
        if seq != 0 {
            inner.remove(key);
        }
        inner.floors.remove(key);
        let seq = self.next();
        inner.order.insert(seq, key.clone());
        inner.bytes += size;
        inner.map.insert(
            key.clone(),
            Entry {
                value,
                size,
                done,
                took: done.saturating_duration_since(ticket.at),
                started: ticket.at,
                gen: ticket.gen,
                seq,
                refreshing,
                retry_until: None,
            },
        );
        // The oldest go first: past their time, then past the bounds.
        while let Some((&_, oldest)) = inner.order.first_key_value() {
            let e = &inner.map[oldest];
            let expired = now.saturating_duration_since(e.done) > self.keep_for;
            if !expired && inner.map.len() <= self.max_entries && inner.bytes <= self.max_bytes {
                break;
            }
            let oldest = oldest.clone();
            inner.retire(&oldest, now, bounds);
        }
        Put::Kept
    }

    /// The generation of `key`'s last purge (0: none remembered), to tell
    /// whether one happened meanwhile.
    pub(crate) fn purged(&self, key: &FlightKey) -> u64 {
        let inner = self.lock();
        inner
            .purged
            .get(key)
            .copied()
            .unwrap_or(0)
            .max(inner.purge_floor)
    }

    /// Claims the one refresh of `key`'s copy (`None` when one runs,
    /// this node's own or one the store granted it), until the returned
    /// claim is dropped: when the refresh's task ends, or is dropped with a
    /// runtime shutting down.
    pub(crate) fn claim_refresh(self: &Arc<Self>, key: &FlightKey) -> Option<RefreshClaim<V>> {
        let mut inner = self.lock();
        if inner.granted.contains_key(key) {
            return None;
        }
        match inner.map.get_mut(key) {
            Some(e) if !e.refreshing => e.refreshing = true,
            _ => return None,
        }
        Some(RefreshClaim {
            kept: Arc::clone(self),
            key: key.clone(),
        })
    }

    /// Marks a refresh of `key` that the store granted, running here
    /// until the mark is dropped: meanwhile this node claims no refresh of
    /// its own (its mode may have changed since the grant). A purge of
    /// the key passes it by, as it passes this node's own.
    pub(crate) fn mark_refresh(self: &Arc<Self>, key: &FlightKey) -> GrantedRefresh<V> {
        let id = self.next();
        self.lock().granted.entry(key.clone()).or_default().push(id);
        GrantedRefresh {
            kept: Arc::clone(self),
            key: key.clone(),
            id,
        }
    }

    /// The refresh of `key` ended (whatever became of it).
    fn end_refresh(&self, key: &FlightKey) {
        if let Some(e) = self.lock().map.get_mut(key) {
            e.refreshing = false;
        }
    }

    /// A failure was answered by `key`'s copy: it answers alone until
    /// `until` (`stale-retry-after`).
    pub(crate) fn throttle(&self, key: &FlightKey, until: Instant) {
        if let Some(e) = self.lock().map.get_mut(key) {
            e.retry_until = Some(until);
        }
    }

    /// Purges `key`: its copy goes, and every work that started before
    /// now is fenced from bringing it back (as the copy's, or as a stale
    /// answer of the store's: see [`Floor`]).
    pub(crate) fn purge(&self, key: &FlightKey) {
        let now = Instant::now();
        let bounds = self.bounds();
        let mut inner = self.lock();
        inner.remove(key);
        // Its hit-for-pass goes too: the next response decides anew; and
        // a refresh the store granted no longer keeps this node's own.
        inner.passes.remove(key);
        inner.granted.remove(key);
        let gen = self.next();
        // What remains of it is the purge: no stale result of the store's
        // whose work started before now answers here, even one a failover
        // brought back after the store acknowledged the purge.
        inner.leave_floor(key, (now, gen), now, now, bounds);
        inner.purged.insert(key.clone(), gen);
        inner.purge_order.push_back((gen, key.clone()));
        while inner.purge_order.len() > self.max_entries {
            let Some((old, k)) = inner.purge_order.pop_front() else {
                break;
            };
            if inner.purged.get(&k) == Some(&old) {
                inner.purged.remove(&k);
            }
            inner.purge_floor = inner.purge_floor.max(old);
        }
    }

    /// Remembers that `key`'s last response, of the work that took
    /// `ticket`, could not be shared, until `until`; not when a purge of
    /// `key` came after that work started.
    pub(crate) fn pass(&self, key: &FlightKey, ticket: Ticket, until: Instant) {
        let now = Instant::now();
        let mut inner = self.lock();
        let purged = inner.purged.get(key).copied().unwrap_or(0);
        if ticket.gen < inner.purge_floor || purged > ticket.gen {
            return;
        }
        inner.passes.insert(key.clone(), until);
        inner.pass_order.push_back((until, key.clone()));
        let inner = &mut *inner;
        trim(&mut inner.pass_order, now, self.max_entries, |k, at| {
            if inner.passes.get(&k) == Some(&at) {
                inner.passes.remove(&k);
            }
        });
    }

    /// Copies kept, and their bytes.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.map.len(), inner.bytes)
    }
}

/// What a copy's lifetime is measured by (see [`Kept`]).
#[derive(Clone, Copy)]
struct Bounds {
    keep_for: Duration,
    floor_for: Duration,
    max_floors: usize,
}

impl<V: Clone> Inner<V> {
    /// When the work of `key`'s last given result ended, while its floor
    /// (see [`Floor`]) holds at `now`.
    fn floor_done(&self, key: &FlightKey, now: Instant) -> Option<Instant> {
        let f = self.floors.get(key)?;
        (now < f.until).then_some(f.done)
    }

    fn look(&mut self, key: &FlightKey, now: Instant, bounds: Bounds) -> Option<Look<V>> {
        let e = self.map.get(key)?;
        if now.saturating_duration_since(e.done) > bounds.keep_for {
            self.retire(key, now, bounds);
            return None;
        }
        Some(Look {
            value: e.value.clone(),
            done: e.done,
            took: e.took,
            retry_until: e.retry_until,
            gen: e.gen,
        })
    }
}

impl<V> Inner<V> {
    fn remove(&mut self, key: &FlightKey) {
        if let Some(e) = self.map.remove(key) {
            self.order.remove(&e.seq);
            self.bytes -= e.size;
        }
    }

    /// `key`'s copy goes (expired or evicted), leaving its floor.
    fn retire(&mut self, key: &FlightKey, now: Instant, bounds: Bounds) {
        if let Some(e) = self.map.remove(key) {
            self.order.remove(&e.seq);
            self.bytes -= e.size;
            self.leave_floor(key, (e.started, e.gen), e.done, now, bounds);
        }
    }

    /// A result of the work at `order` was given but is not kept (fenced
    /// by a purge, too large): nothing older answers after it, an older
    /// copy included (its floor is left with [`leave_floor`](Self::leave_floor)).
    fn drop_older(&mut self, key: &FlightKey, order: (Instant, u64)) {
        if self
            .map
            .get(key)
            .is_some_and(|e| (e.started, e.gen) < order)
        {
            self.remove(key);
        }
    }

    /// The result of the work at `order` (see [`Ticket::order`]), done at
    /// `done`, was given but is not (or no longer) `key`'s copy: see
    /// [`Floor`]. The newest started stays; the oldest go first past their
    /// time or the count.
    fn leave_floor(
        &mut self,
        key: &FlightKey,
        order: (Instant, u64),
        done: Instant,
        now: Instant,
        b: Bounds,
    ) {
        let until = done + b.floor_for;
        let newer = self.floors.get(key).is_some_and(|f| f.order > order);
        if until > now && !newer {
            self.floors
                .insert(key.clone(), Floor { order, done, until });
            self.floor_order.push_back((until, key.clone()));
        }
        trim(&mut self.floor_order, now, b.max_floors, |k, at| {
            if self.floors.get(&k).is_some_and(|f| f.until == at) {
                self.floors.remove(&k);
            }
        });
    }
}

/// Pops from `order` (when each entry ends, in the order they were left)
/// what has ended by `now`, and the oldest past `max`, handing each to
/// `drop` (which keeps an entry left again since, ending at another time).
fn trim(
    order: &mut VecDeque<(Instant, FlightKey)>,
    now: Instant,
    max: usize,
    mut drop: impl FnMut(FlightKey, Instant),
) {
    while let Some((at, _)) = order.front() {
        if *at > now && order.len() <= max {
            break;
        }
        if let Some((at, k)) = order.pop_front() {
            drop(k, at);
        }
    }
}

/// A key's claimed refresh on this node: ended when dropped.
pub(crate) struct RefreshClaim<V: Clone> {
    kept: Arc<Kept<V>>,
    key: FlightKey,
}

impl<V: Clone> Drop for RefreshClaim<V> {
    fn drop(&mut self) {
        self.kept.end_refresh(&self.key);
    }
}

/// A refresh the store granted, running on this node (see
/// [`Kept::mark_refresh`]).
pub(crate) struct GrantedRefresh<V: Clone> {
    kept: Arc<Kept<V>>,
    key: FlightKey,
    id: u64,
}

impl<V: Clone> Drop for GrantedRefresh<V> {
    fn drop(&mut self) {
        let mut inner = self.kept.lock();
        if let Some(ids) = inner.granted.get_mut(&self.key) {
            ids.retain(|&id| id != self.id);
            if ids.is_empty() {
                inner.granted.remove(&self.key);
            }
        }
    }
}

impl<V> std::fmt::Debug for Kept<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use flightdeck_core::StageName;

    use super::*;

    fn key(i: usize) -> FlightKey {
        FlightKey::from_bytes(StageName::new("kept").unwrap(), i.to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn churn_stays_within_count_and_bytes() {
        let kept = Kept::<Vec<u8>>::new(100, 5_000, Duration::from_secs(3600), Duration::ZERO);
        for i in 0..10_000 {
            let size = 10 + i % 90;
            let t = kept.ticket();
            assert_eq!(
                kept.put(&key(i), t, vec![0; size], size, Duration::ZERO),
                Put::Kept
            );
            let (n, bytes) = kept.usage();
            assert!(n <= 100 && bytes <= 5_000, "{n} copies, {bytes} bytes");
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // The newest stay, the oldest went.
        assert!(kept.look(&key(9_999)).is_some());
        assert!(kept.look(&key(0)).is_none());
        let t = kept.ticket();
        assert_eq!(
            kept.put(&key(1), t, vec![0; 6_000], 6_000, Duration::ZERO),
            Put::TooLarge
        );
    }

    /// A refresh the store granted, running here, keeps this node from
    /// claiming one of its own (seeds 3123145 and 3211498 of the
    /// simulation: after a switch to local-only, the node's callers
    /// started a refresh beside it); its end, or a purge, frees the claim.
    #[tokio::test(start_paused = true)]
    async fn a_granted_refresh_running_here_holds_off_the_nodes_own() {
        let kept = Arc::new(Kept::<u32>::new(
            10,
            1_000,
            Duration::from_secs(60),
            Duration::ZERO,
        ));
        let t = kept.ticket();
        assert_eq!(kept.put(&key(1), t, 1, 4, Duration::ZERO), Put::Kept);
        let granted = kept.mark_refresh(&key(1));
        let second = kept.mark_refresh(&key(1));
        assert!(kept.claim_refresh(&key(1)).is_none(), "one runs here");
        drop(granted);
        assert!(kept.claim_refresh(&key(1)).is_none(), "another still runs");
        drop(second);
        let claim = kept.claim_refresh(&key(1));
        assert!(claim.is_some(), "none runs any more");
        drop(claim);
        let _running = kept.mark_refresh(&key(1));
        kept.purge(&key(1));
        let t = kept.ticket();
        assert_eq!(kept.put(&key(1), t, 2, 4, Duration::ZERO), Put::Kept);
        assert!(
            kept.claim_refresh(&key(1)).is_some(),
            "a purge passes the running refresh by"
        );
        assert!(kept.claim_refresh(&key(2)).is_none(), "no copy, no refresh");
    }

    #[tokio::test(start_paused = true)]
    async fn expired_copies_go_and_purges_fence_older_work() {
        let kept = Kept::<u32>::new(10, 1_000, Duration::from_secs(10), Duration::ZERO);
        let early = kept.ticket();
        let t = kept.ticket();
        assert_eq!(kept.put(&key(1), t, 1, 4, Duration::ZERO), Put::Kept);
        // An older work's result never replaces a newer one.
        assert_eq!(kept.put(&key(1), early, 0, 4, Duration::ZERO), Put::Fenced);
        let running = kept.ticket();
        kept.purge(&key(1));
        assert!(kept.look(&key(1)).is_none());
        assert_eq!(
            kept.put(&key(1), running, 2, 4, Duration::ZERO),
            Put::Fenced
        );
        let after = kept.ticket();
        assert_eq!(kept.put(&key(1), after, 3, 4, Duration::ZERO), Put::Kept);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(kept.look(&key(1)).is_none(), "past its windows");
    }

    /// A result given here whose work started after the copy's, fenced by
    /// a purge its flight's ticket predates, is not kept; the older copy
    /// then goes too: it must never answer after a newer result was given
    /// (seed 5158570 of the simulation: a follower was given another
    /// node's newer result, and the node's own older copy answered stale
    /// after it).
    #[tokio::test(start_paused = true)]
    async fn a_newer_result_given_but_fenced_retires_the_older_copy() {
        let ms = Duration::from_millis;
        let kept = Kept::<u32>::new(10, 1_000, Duration::from_secs(10), ms(500));
        // A follower's flight takes its ticket; a purge; the node's own
        // work starts and ends, and becomes the copy.
        let follower = kept.ticket();
        kept.purge(&key(1));
        let own = kept.ticket();
        tokio::time::advance(ms(50)).await;
        // (the other node's work starts here)
        tokio::time::advance(ms(100)).await;
        assert_eq!(kept.put(&key(1), own, 0, 4, Duration::ZERO), Put::Kept);
        // The follower is given the other node's result, whose work began
        // 250 ms ago (ended 150 ms ago, took 100 ms): after the copy's.
        tokio::time::advance(ms(150)).await;
        let given = follower.began_before(ms(250));
        assert_eq!(kept.put(&key(1), given, 1, 4, ms(150)), Put::Fenced);
        assert!(
            kept.look(&key(1)).is_none(),
            "the older copy answers no more"
        );
        let ended = Instant::now() - ms(150);
        assert_eq!(kept.floor(&key(1)), Some(ended), "what was given stays");
        // A given result older than the copy leaves the copy alone.
        let stale = kept.ticket();
        kept.purge(&key(2));
        let own = kept.ticket();
        tokio::time::advance(ms(10)).await;
        assert_eq!(kept.put(&key(2), own, 2, 4, Duration::ZERO), Put::Kept);
        let older = stale.began_before(ms(500));
        assert_eq!(kept.put(&key(2), older, 3, 4, ms(5)), Put::Fenced);
        assert_eq!(kept.look(&key(2)).map(|l| l.value), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_that_went_keeps_older_work_out_until_its_floor_ends() {
        let secs = Duration::from_secs;
        let kept = Kept::<u32>::new(2, 1_000, secs(10), secs(5));
        let older = kept.ticket();
        let t = kept.ticket();
        assert_eq!(kept.put(&key(1), t, 1, 4, Duration::ZERO), Put::Kept);
        assert_eq!(kept.floor(&key(1)), None, "a copy is no floor");
        assert_eq!(kept.here(&key(1)).and_then(|h| h.value().copied()), Some(1));
        let done = Instant::now();
        tokio::time::advance(secs(11)).await;
        assert!(kept.look(&key(1)).is_none(), "past its windows");
        assert_eq!(kept.floor(&key(1)), Some(done), "what the node gave stays");
        let gone = kept.here(&key(1)).expect("its floor");
        assert_eq!((gone.value(), gone.ended()), (None, secs(11)));
        // Work that started before the given result's never becomes the
        // copy; work that started after it does, and the floor goes.
        assert_eq!(kept.put(&key(1), older, 0, 4, Duration::ZERO), Put::Fenced);
        let later = kept.ticket();
        assert_eq!(kept.put(&key(1), later, 2, 4, Duration::ZERO), Put::Kept);
        assert_eq!(kept.floor(&key(1)), None);
        // A floor ends `keep_for` + `settle` after the copy's end.
        tokio::time::advance(secs(11)).await;
        assert!(kept.look(&key(1)).is_none());
        assert!(kept.floor(&key(1)).is_some());
        tokio::time::advance(secs(4)).await;
        assert_eq!(kept.floor(&key(1)), None, "15 s after its end");
        // Evicted by the count, a copy leaves its floor too; so does a
        // given result too large to keep, or one a purge fenced.
        let (a, b) = (kept.ticket(), kept.ticket());
        kept.put(&key(2), a, 2, 4, Duration::ZERO);
        kept.put(&key(3), b, 3, 4, Duration::ZERO);
        let c = kept.ticket();
        kept.put(&key(4), c, 4, 4, Duration::ZERO);
        assert!(kept.look(&key(2)).is_none() && kept.floor(&key(2)).is_some());
        let big = kept.ticket();
        assert_eq!(
            kept.put(&key(5), big, 5, 2_000, Duration::ZERO),
            Put::TooLarge
        );
        assert!(kept.floor(&key(5)).is_some());
        let fenced = kept.ticket();
        kept.purge(&key(6));
        assert_eq!(kept.put(&key(6), fenced, 6, 4, Duration::ZERO), Put::Fenced);
        assert!(kept.floor(&key(6)).is_some());
        // At most `max_entries` floors: the oldest went.
        assert_eq!(kept.floor(&key(2)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn notes_are_read_by_their_own_callers_and_bounded_by_key() {
        let kept = Kept::<u32>::new(2, 1_000, Duration::from_secs(10), Duration::ZERO);
        let served = Some(Served::Fallback { collapsed: false });
        // Two flights of key 1 at once: each caller reads its own.
        let (a, b) = (kept.arrival(), kept.arrival());
        let joiner = (kept.arrival(), kept.arrival());
        kept.note_answer(&key(1), b, served);
        kept.note_answer(&key(1), a, None);
        assert_eq!(kept.answer_since(&key(1), (a, a), false), None);
        assert_eq!(kept.answer_since(&key(1), (b, b), false), served);
        assert_eq!(
            kept.answer_since(&key(1), joiner, true),
            served,
            "b's: the latest led"
        );
        // At most `max_entries` keys: the one noted longest ago goes first.
        for k in [2, 3] {
            let t = kept.arrival();
            kept.note_answer(&key(k), t, served);
        }
        assert_eq!(kept.answer_since(&key(1), (b, b), false), None);
        let t = kept.arrival();
        kept.note_answer(&key(2), t, served);
        assert_eq!(kept.answer_since(&key(2), (t, t), false), served);
        // A caller that joined a flight whose leader began between its
        // arrival and its joining (another thread) reads that flight's.
        let arrived = kept.arrival();
        let leader = kept.arrival();
        let joined = kept.arrival();
        kept.note_answer(&key(3), leader, served);
        assert_eq!(kept.answer_since(&key(3), (arrived, joined), true), served);
    }
}
