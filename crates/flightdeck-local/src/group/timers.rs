//! The callers' clocks (wait timeouts and deadlines), one timer per group
//! instead of one per caller.
//!
//! A tokio `Sleep` per caller costs a registration in the runtime's timer
//! wheel, a removal when the caller is done, and a scan of the wheel on
//! each park while it is there: several hundred instructions per flight on
//! a path that costs about a thousand, and 10,000 removals when 10,000
//! waiters wake at once. Nearly every such timer is removed long before it
//! fires. So the callers' expiries live in the flights' slots instead,
//! under the shard locks that the callers take anyway:
//!
//! - each running flight with an expiry has one entry in its shard's
//!   `timers`: the earliest of its leader's expiry and its waiters';
//! - a leader's expiry and waker sit in the flight's slot; a waiter's
//!   expiry sits in the flight's heap of waiter expiries, with its index
//!   on the flight's board, which is also how it is told (see `board`);
//! - one task per group (the [`Driver`]) sleeps until the earliest entry of
//!   all shards, which `armed` announces; it fires what is due, under each
//!   shard's lock, and sleeps again.
//!
//! A caller whose expiry is later than the one armed (nearly all of them:
//! the wait timeout is the same for everybody) only reads `armed`. An
//! entry is removed when its flight ends, under the lock that ends it.
//!
//! The driver runs on one runtime, the group's *home*: the first one
//! that needed it, until it ends. A caller on another runtime keeps a
//! tokio timer of its own instead ([`Group::serves_here`]): a home runtime
//! that is no longer driven (its `block_on` returned) or is busy must
//! never hold a caller of another runtime past its time.
//!
//! Without a tokio runtime nothing fires (there is no clock to wait on).
//! The driver's sleep stays set for the earliest expiry it was armed for
//! even when that flight ends first (it then fires once, finds nothing
//! due, and re-arms or idles): so a runtime with a paused clock that goes
//! idle advances to it, as it would to any other timer.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use flightdeck_core::rt::runtime_id;
use tokio::time::{Instant, Sleep};

use super::slot::{Running, Shard, Slot};
use super::{lock, Group};

/// Nothing armed.
const IDLE: u64 = u64::MAX;

/// The group's side of the timers: when the driver is armed, and how to
/// reach it.
pub(crate) struct Timers {
    /// Instants are kept as nanoseconds after this one.
    base: Instant,
    /// When the driver fires next (`IDLE`: never). Lowered by whoever
    /// inserts an earlier entry; set by the driver when it has fired.
    armed: AtomicU64,
    /// Bumped before anything raises `armed` ([`Timers::disarm_all`]), so
    /// that a shard's note that the driver fires by some instant
    /// ([`Timeline::covers`]) holds only as long as its epoch is current.
    epoch: AtomicU64,
    /// The runtime the driver runs on (see [`runtime_id`]); 0: none.
    /// Written under `driver`'s lock.
    home: AtomicU64,
    driver: Mutex<DriverState>,
}

#[derive(Default)]
struct DriverState {
    /// A driver task exists (on some runtime).
    running: bool,
    waker: Option<Waker>,
}

impl Timers {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            armed: AtomicU64::new(IDLE),
            epoch: AtomicU64::new(0),
            home: AtomicU64::new(0),
            driver: Mutex::default(),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        let n = at.saturating_duration_since(self.base).as_nanos();
        u64::try_from(n).unwrap_or(IDLE - 1).min(IDLE - 1)
    }

    /// Nothing armed any more: the only way `armed` goes up. The epoch
    /// moves first, so every shard's note of what is armed is stale
    /// before `armed` is raised.
    fn disarm_all(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.armed.store(IDLE, Ordering::SeqCst);
    }

    fn instant(&self, nanos: u64) -> Instant {
        flightdeck_core::time::later(self.base, std::time::Duration::from_nanos(nanos))
    }
}

impl Drop for Timers {
    fn drop(&mut self) {
        // The group is gone: the driver finds nothing to upgrade and ends.
        let waker = lock(&self.driver).waker.take();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// When a caller that waits from `since` must leave: the earlier of its
/// wait `timeout` and its own `deadline`, and whether that is the deadline
/// (`None`: never; a timeout too long to add to an instant never ends).
pub(crate) fn expiry_of(
    timeout: Option<std::time::Duration>,
    since: Instant,
    deadline: Option<Instant>,
) -> Option<(Instant, bool)> {
    let waited = timeout.and_then(|t| since.checked_add(t));
    match (waited, deadline) {
        (Some(w), Some(d)) if d <= w => Some((d, true)),
        (Some(w), _) => Some((w, false)),
        (None, Some(d)) => Some((d, true)),
        (None, None) => None,
    }
}

/// A waiter's expiry in its flight's heap: when, and its index on the
/// flight's board.
pub(crate) type WaiterExpiry = Reverse<(Instant, usize)>;

impl<V> Running<V> {
    /// The earliest expiry among the leader's and the waiters'.
    fn next_expiry(&self) -> Option<Instant> {
        let leader = self.leader_timer.as_ref().map(|(at, _)| *at);
        let waiters = self
            .joiners
            .as_ref()
            .and_then(|j| j.expiries.peek())
            .map(|Reverse((at, _))| *at);
        match (leader, waiters) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A shard's entries, `(when, flight id, key hash)`, sorted by when. A
/// sorted deque rather than a tree: nearly every entry is `now + the wait
/// timeout`, so it goes at the back, and flights mostly end in the order
/// they started or right after they started, so their entries leave from
/// either end.
#[derive(Default)]
pub(crate) struct Timeline {
    q: VecDeque<(Instant, u64, u64)>,
    /// `(epoch, at)`: as of the driver's epoch `epoch`, the driver was
    /// known to fire by `at` (see [`Group::announce`]). Read and written
    /// under the shard's lock.
    covered: Option<(u64, Instant)>,
}

impl Timeline {
    fn insert(&mut self, at: Instant, id: u64, hash: u64) {
        let q = &mut self.q;
        match q.back() {
            Some(last) if last.0 > at => {
                let i = q.partition_point(|e| e.0 <= at);
                q.insert(i, (at, id, hash));
            }
            // The common case (see above), without `insert`'s general
            // shuffling.
            _ => q.push_back((at, id, hash)),
        }
    }

    fn remove(&mut self, at: Instant, id: u64) {
        let q = &mut self.q;
        if q.back().is_some_and(|e| e.1 == id) {
            q.pop_back();
        } else if q.front().is_some_and(|e| e.1 == id) {
            q.pop_front();
        } else {
            let from = q.partition_point(|e| e.0 < at);
            let found = (from..q.len())
                .take_while(|&i| q[i].0 == at)
                .find(|&i| q[i].1 == id);
            if let Some(i) = found {
                q.remove(i);
            }
        }
    }

    /// The earliest entry, removed if it is due at `now`.
    fn pop_due(&mut self, now: Instant) -> Option<(Instant, u64, u64)> {
        self.q
            .front()
            .is_some_and(|e| e.0 <= now)
            .then(|| self.q.pop_front())?
    }

    fn first(&self) -> Option<Instant> {
        self.q.front().map(|e| e.0)
    }

    /// Whether, as of `epoch`, the driver is known to fire by `at`.
    fn covers(&self, epoch: u64, at: Instant) -> bool {
        self.covered.is_some_and(|(e, c)| e == epoch && c <= at)
    }

    /// Records that, as of `epoch`, the driver fires by `at`.
    fn cover(&mut self, epoch: u64, at: Instant) {
        if !self.covers(epoch, at) {
            self.covered = Some((epoch, at));
        }
    }

    /// Entries (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
}

/// Makes sure the flight `(hash, id)`, running as `r`, has an entry in
/// `timers` no later than `at`. Returns whether an entry was added or
/// moved earlier (the driver may have to hear of it).
pub(super) fn arm<V>(
    timers: &mut Timeline,
    r: &mut Running<V>,
    hash: u64,
    id: u64,
    at: Instant,
) -> bool {
    match r.timer {
        Some(t) if t <= at => false,
        old => {
            if let Some(t) = old {
                timers.remove(t, id);
            }
            r.timer = Some(at);
            timers.insert(at, id, hash);
            true
        }
    }
}

impl<V> Shard<V> {
    /// Removes the entry of a flight that ends.
    pub(super) fn disarm(&mut self, id: u64, timer: Option<Instant>) {
        if let Some(t) = timer {
            self.timers.remove(t, id);
        }
    }

    /// Fires every entry due at `now`: the leaders' wakers to wake, and the
    /// waiters' to wake once their boards say their time is up (so that no
    /// flight delivers to them any more). Returns the shard's next entry.
    fn fire(&mut self, now: Instant, wakers: &mut Vec<Waker>) -> Option<Instant> {
        let mut again = Vec::new();
        while let Some((_, id, hash)) = self.timers.pop_due(now) {
            let Some(r) = self
                .table
                .find_mut(hash, |s| s.id == id)
                .and_then(Slot::running)
            else {
                continue;
            };
            r.timer = None;
            if r.leader_timer.as_ref().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, w)) = r.leader_timer.take() {
                    wakers.push(w);
                }
            }
            if let Some(j) = r.joiners.as_mut() {
                while let Some(&Reverse((at, i))) = j.expiries.peek() {
                    if at > now {
                        break;
                    }
                    j.expiries.pop();
                    if let Some(board) = &j.board {
                        j.expired += 1;
                        wakers.extend(board.0.expire(i, now));
                    }
                }
            }
            if let Some(next) = r.next_expiry() {
                r.timer = Some(next);
                again.push((next, id, hash));
            }
        }
        for (at, id, hash) in again {
            self.timers.insert(at, id, hash);
        }
        self.timers.first()
    }
}

impl<V: Clone + Send + Sync + 'static> Group<V> {
    /// Whether the group's timers serve a caller on the current runtime:
    /// the driver runs on it, or starts on it now. Otherwise the caller
    /// keeps a timer of its own (see the module docs). Outside a runtime:
    /// yes (nothing fires there; the next driver fires every entry
    /// first).
    pub(crate) fn serves_here(&self) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return true;
        };
        let here = runtime_id(&rt);
        match self.timers.home.load(Ordering::Acquire) {
            0 => {}
            home => return home == here,
        }
        let driver = lock(&self.timers.driver);
        if driver.running {
            return self.timers.home.load(Ordering::Acquire) == here;
        }
        self.start_driver(driver, &rt, here);
        true
    }

    /// Starts the driver on `rt` (whose id is `here`), which becomes home.
    /// The lock is let go before the spawn: a runtime that is shutting
    /// down drops the driver at once, and its drop takes the lock.
    fn start_driver(
        &self,
        mut driver: MutexGuard<'_, DriverState>,
        rt: &tokio::runtime::Handle,
        here: u64,
    ) {
        driver.running = true;
        self.timers.home.store(here, Ordering::Release);
        drop(driver);
        drop(rt.spawn(Driver {
            group: self.me.clone(),
            sleep: None,
            fresh: true,
        }));
    }

    /// Makes sure the driver fires by `at`, an entry just added under
    /// `shard` (the lock `guard` holds). The common case reads neither
    /// the clock's base nor `armed`: the shard noted that, in the current
    /// epoch, the driver fires by something no later than `at`. Sound
    /// because `armed` only goes down within an epoch, and the epoch is
    /// read under the lock that added the entry: a fire that raises
    /// `armed` bumped the epoch first, so it either came before this read
    /// (the note is stale) or reads this shard after the lock is let go
    /// (it sees the entry).
    pub(super) fn announce(&self, guard: MutexGuard<'_, Shard<V>>, hash: u64, at: Instant) {
        let epoch = self.timers.epoch.load(Ordering::SeqCst);
        if guard.timers.covers(epoch, at) {
            return;
        }
        drop(guard);
        if self.armed(at) {
            self.shard(hash).timers.cover(epoch, at);
        }
    }

    /// Makes sure a driver fires by `at`; returns whether one will (none
    /// does outside a runtime while no driver runs).
    fn armed(&self, at: Instant) -> bool {
        let nanos = self.timers.nanos(at);
        // The common case: a driver armed for earlier fires first and finds
        // this entry then.
        if nanos >= self.timers.armed.load(Ordering::SeqCst) {
            return true;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // `armed` promises that a driver fires by then. Outside a
            // runtime only a running driver can keep that promise: with
            // none, it is not made (the entry waits for the next driver,
            // which fires every entry first). Under the lock, so that the
            // driver cannot end between the check and the promise.
            let driver = lock(&self.timers.driver);
            if driver.running && self.timers.armed.fetch_min(nanos, Ordering::SeqCst) > nanos {
                if let Some(w) = &driver.waker {
                    w.wake_by_ref();
                }
            }
            return driver.running;
        };
        if self.timers.armed.fetch_min(nanos, Ordering::SeqCst) <= nanos {
            return true;
        }
        let driver = lock(&self.timers.driver);
        if driver.running {
            if let Some(w) = &driver.waker {
                w.wake_by_ref();
            }
            return true;
        }
        self.start_driver(driver, &rt, runtime_id(&rt));
        true
    }

    /// Fires what is due in every shard, then arms the driver for the
    /// earliest entry left.
    fn fire(&self) {
        // Set before the shards are read: an entry added meanwhile is either
        // seen below, or lowers `armed` again (and wakes the driver).
        self.timers.disarm_all();
        let now = Instant::now();
        let mut next = IDLE;
        let mut wakers = Vec::new();
        for shard in self.shards.iter() {
            let earliest = lock(shard).fire(now, &mut wakers);
            if let Some(at) = earliest {
                next = next.min(self.timers.nanos(at));
            }
            // Out of the lock: a waker is the user's code.
            for w in wakers.drain(..) {
                w.wake();
            }
        }
        self.timers.armed.fetch_min(next, Ordering::SeqCst);
    }
}

/// The group's timer task: sleeps until `armed`, fires, and again. Holds
/// the group weakly; ends with it.
struct Driver<V> {
    group: Weak<Group<V>>,
    /// The sleep, and the `armed` value it was set for.
    sleep: Option<(Pin<Box<Sleep>>, u64)>,
    /// Not polled yet: it fires first, to arm itself for the entries that
    /// a driver gone with its runtime left behind.
    fresh: bool,
}

impl<V: Clone + Send + Sync + 'static> Future for Driver<V> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let Some(group) = self.group.upgrade() else {
                return Poll::Ready(());
            };
            if std::mem::take(&mut self.fresh) {
                group.fire();
            }
            {
                // Registered before `armed` is read: an entry that lowers it
                // afterwards wakes this waker.
                let mut d = lock(&group.timers.driver);
                if d.waker.as_ref().is_none_or(|w| !w.will_wake(cx.waker())) {
                    d.waker = Some(cx.waker().clone());
                }
            }
            let armed = group.timers.armed.load(Ordering::SeqCst);
            if armed == IDLE {
                return Poll::Pending;
            }
            let at = group.timers.instant(armed);
            drop(group);
            match &mut self.sleep {
                Some((sleep, set)) if *set == armed => {}
                Some((sleep, set)) => {
                    sleep.as_mut().reset(at);
                    *set = armed;
                }
                none => *none = Some((Box::pin(tokio::time::sleep_until(at)), armed)),
            }
            if let Some((sleep, _)) = &mut self.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            let Some(group) = self.group.upgrade() else {
                return Poll::Ready(());
            };
            group.fire();
        }
    }
}

impl<V> Drop for Driver<V> {
    fn drop(&mut self) {
        // Dropped with its runtime (or done): the next entry starts another.
        if let Some(group) = self.group.upgrade() {
            let mut d = lock(&group.timers.driver);
            d.running = false;
            d.waker = None;
            group.timers.home.store(0, Ordering::Release);
            // So that the next entry, whenever it is due, starts one.
            group.timers.disarm_all();
        }
    }
}
