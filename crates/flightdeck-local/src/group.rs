//! The synchronization core: the in-flight map, one entry per key.
//!
//! Lock order: a shard lock may be held while taking a flight's lock, never
//! the other way round. Every transition of a flight to "finished" happens
//! under its lock and exactly once (`finished` goes false → true once), and
//! whoever makes it does the bookkeeping: count, gauge, map entry.

use std::any::Any;
use std::future::Future;
use std::hash::BuildHasher;
use std::mem;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use flightdeck_core::error::{TooManyFlights, TooManyWaiters};
use flightdeck_core::{BoxError, FlightKey, SharedError};
use hashbrown::hash_table::{Entry, HashTable};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::metrics::{Registry, StageMetrics};
use crate::policy::{FlightPolicy, OnAbandon};

/// What a waiter receives.
pub(crate) enum Msg<V> {
    Value(V),
    Error(SharedError),
    Panicked,
    /// The result could not be shared: run the service yourself.
    Unshared,
    /// The unshared original response (an `Sh::Output`), for exactly one
    /// receiver: the leader, or the first waiter still there.
    Original(Box<dyn Any + Send>),
}

/// How the work ended.
pub(crate) enum Outcome<V> {
    Value(V),
    Error(SharedError),
    /// Not shareable; the original response unless the leader took it.
    Unshared(Option<Box<dyn Any + Send>>),
    Panicked,
    /// Aborted or dropped without a result.
    Abandoned,
}

enum Slot<V> {
    Running(Arc<Flight<V>>),
    /// `flight` is the address of the flight whose result this is: the task
    /// that ends the window holds that flight, so the address is not reused
    /// while it matters.
    Replay {
        key: FlightKey,
        value: V,
        until: Instant,
        flight: usize,
    },
}

impl<V> Slot<V> {
    fn key(&self) -> &FlightKey {
        match self {
            Slot::Running(f) => &f.key,
            Slot::Replay { key, .. } => key,
        }
    }
}

pub(crate) struct Flight<V> {
    pub(crate) key: FlightKey,
    pub(crate) metrics: Arc<StageMetrics>,
    pub(crate) started: Instant,
    state: Mutex<FlightState<V>>,
}

struct FlightState<V> {
    senders: Vec<oneshot::Sender<Msg<V>>>,
    /// Callers still waiting (leader included).
    live: usize,
    /// A waiter timed out: the work is kept even if nobody else waits, so
    /// the timeout never removes the flight.
    keep: bool,
    finished: bool,
    /// The leader is polling the work inline. When it leaves early the work
    /// is handed to a task of its own (or cancelled).
    leader_present: bool,
    abort: Option<AbortHandle>,
}

pub(crate) enum Join<V> {
    Leader(Arc<Flight<V>>),
    Waiter(Arc<Flight<V>>, oneshot::Receiver<Msg<V>>),
    Replay(V),
    Rejected(BoxError),
}

// Keys are BLAKE3 digests already; foldhash (seeded per process) is enough
// and much cheaper than SipHash on this path. The key is hashed once per
// lookup and kept in its slot (a `HashTable`, not a map: no second copy of
// the key).
type Hasher = foldhash::fast::RandomState;
type Shard<V> = Mutex<HashTable<Slot<V>>>;

pub(crate) struct Group<V> {
    shards: Box<[Shard<V>]>,
    hasher: Hasher,
    running: AtomicUsize,
    metrics: Registry,
    pub(crate) policy: FlightPolicy,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code under these locks can panic, but never let a poisoned lock
    // take the whole layer down.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V: Clone + Send + 'static> Group<V> {
    pub(crate) fn new(policy: FlightPolicy) -> Self {
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .saturating_mul(4)
            .next_power_of_two()
            .clamp(4, 256);
        Self {
            shards: (0..n).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: Hasher::default(),
            metrics: Registry::default(),
            running: AtomicUsize::new(0),
            policy,
        }
    }

    fn hash(&self, key: &FlightKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: its upper half picks the shard, the table
    /// inside uses the lower bits and the top seven.
    fn shard(&self, hash: u64) -> &Shard<V> {
        &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)]
    }

    /// Running flights right now.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Entries in the map (running flights and replayable results).
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Joins the flight of `key`, or starts one (the key moves into it).
    pub(crate) fn join(&self, key: FlightKey) -> Join<V> {
        let now = Instant::now();
        let hash = self.hash(&key);
        let mut shard = lock(self.shard(hash));
        let entry = shard.entry(hash, |s| s.key() == &key, |s| self.hash(s.key()));
        if let Entry::Occupied(e) = &entry {
            match e.get() {
                Slot::Replay { value, until, .. } if now < *until => {
                    let value = value.clone();
                    drop(shard);
                    self.metrics.stage(key.stage()).replay();
                    return Join::Replay(value);
                }
                Slot::Running(f) if now < f.started + self.policy.flight_ttl => {
                    let mut st = lock(&f.state);
                    if !st.finished {
                        if st.live >= self.policy.max_waiters {
                            f.metrics.rejected();
                            return Join::Rejected(Box::new(TooManyWaiters::new(
                                Some(key.stage().clone()),
                                self.policy.max_waiters,
                            )));
                        }
                        let (tx, rx) = oneshot::channel();
                        st.senders.push(tx);
                        st.live += 1;
                        drop(st);
                        f.metrics.waiter();
                        return Join::Waiter(Arc::clone(f), rx);
                    }
                }
                _ => {}
            }
        }
        // Start a new flight (replacing an expired or finished entry; an
        // older flight still running past its TTL finishes for its own
        // waiters and leaves this entry alone).
        let metrics = self.metrics.stage(key.stage());
        if self.running.fetch_add(1, Ordering::AcqRel) >= self.policy.max_flights {
            self.running.fetch_sub(1, Ordering::AcqRel);
            metrics.rejected();
            return Join::Rejected(Box::new(TooManyFlights::new(
                Some(key.stage().clone()),
                self.policy.max_flights,
            )));
        }
        let flight = Arc::new(Flight {
            key,
            metrics,
            started: now,
            state: Mutex::new(FlightState {
                senders: Vec::new(),
                live: 1,
                keep: false,
                finished: false,
                leader_present: true,
                abort: None,
            }),
        });
        entry.insert(Slot::Running(Arc::clone(&flight)));
        drop(shard);
        flight.metrics.started();
        Join::Leader(flight)
    }

    /// Records the task that runs the work, so the flight can be cancelled.
    pub(crate) fn set_abort(&self, flight: &Flight<V>, handle: AbortHandle) {
        let mut st = lock(&flight.state);
        if st.finished {
            // Cancelled before the task existed.
            handle.abort();
        } else {
            st.abort = Some(handle);
        }
    }

    /// A caller leaves before the flight ended: a waiter, or the leader
    /// (`leader`). The last one out cancels the flight, unless a waiter
    /// timed out (the timeout never removes the flight) or the policy says
    /// finish. Returns whether it was cancelled.
    pub(crate) fn depart(&self, flight: &Flight<V>, timed_out: bool, leader: bool) -> bool {
        let abort = {
            let mut st = lock(&flight.state);
            st.leader_present &= !leader;
            st.live = st.live.saturating_sub(1);
            st.keep |= timed_out;
            let cancel = st.live == 0
                && !st.finished
                && !st.keep
                && self.policy.on_abandon == OnAbandon::Cancel;
            if !cancel {
                return false;
            }
            st.finished = true;
            st.senders.clear();
            st.abort.take()
        };
        self.retire(flight, None, None);
        flight.metrics.cancelled();
        tracing::debug!(stage = %flight.key.stage(), key = %flight.key.digest().short(), leader, "last caller left: flight cancelled");
        if let Some(a) = abort {
            a.abort();
        }
        true
    }

    /// Ends a flight with its outcome (and the execution time of work that
    /// ran to its end) and delivers it to the waiters. Returns the leader's
    /// message when the leader is still there, and the replay deadline when
    /// the value was kept for replay.
    fn finish(
        &self,
        flight: &Flight<V>,
        outcome: Outcome<V>,
        executed_secs: Option<f64>,
    ) -> (Option<Msg<V>>, Option<Instant>) {
        let (senders, leader_present) = {
            let mut st = lock(&flight.state);
            if st.finished {
                return (None, None);
            }
            st.finished = true;
            st.abort = None;
            (mem::take(&mut st.senders), st.leader_present)
        };
        let replay = match &outcome {
            Outcome::Value(v) if !self.policy.replay_ttl.is_zero() => {
                Some((v.clone(), Instant::now() + self.policy.replay_ttl))
            }
            _ => None,
        };
        let until = replay.as_ref().map(|(_, u)| *u);
        self.retire(flight, replay, executed_secs);
        let (leader, outcome) = if leader_present {
            match outcome {
                Outcome::Value(v) => (Some(Msg::Value(v.clone())), Outcome::Value(v)),
                Outcome::Error(e) => (Some(Msg::Error(e.clone())), Outcome::Error(e)),
                Outcome::Panicked => (Some(Msg::Panicked), Outcome::Panicked),
                // The unshared original belongs to the leader.
                Outcome::Unshared(Some(o)) => (Some(Msg::Original(o)), Outcome::Unshared(None)),
                other => (None, other),
            }
        } else {
            (None, outcome)
        };
        deliver(senders, outcome);
        (leader, until)
    }

    /// Bookkeeping of a flight that just finished: the count, the gauge,
    /// and its map entry (replaced by a replay entry, or removed), unless a
    /// newer flight took the key.
    fn retire(&self, flight: &Flight<V>, replay: Option<(V, Instant)>, executed_secs: Option<f64>) {
        self.running.fetch_sub(1, Ordering::AcqRel);
        flight.metrics.ended(executed_secs);
        let hash = self.hash(&flight.key);
        let mut shard = lock(self.shard(hash));
        let ours = |s: &Slot<V>| matches!(s, Slot::Running(f) if std::ptr::eq(&**f, flight));
        if let Ok(e) = shard.find_entry(hash, ours) {
            match replay {
                Some((value, until)) => {
                    *e.into_mut() = Slot::Replay {
                        key: flight.key.clone(),
                        value,
                        until,
                        flight: flight.addr(),
                    };
                }
                None => {
                    e.remove();
                }
            }
        }
    }

    /// Removes a replay entry once its window is over.
    pub(crate) fn expire_replay(&self, flight: &Flight<V>) {
        let hash = self.hash(&flight.key);
        let mut shard = lock(self.shard(hash));
        let addr = flight.addr();
        let ours = |s: &Slot<V>| matches!(s, Slot::Replay { flight, .. } if *flight == addr);
        if let Ok(e) = shard.find_entry(hash, ours) {
            e.remove();
        }
    }
}

impl<V> Flight<V> {
    fn addr(&self) -> usize {
        self as *const Self as usize
    }
}

fn deliver<V: Clone>(senders: Vec<oneshot::Sender<Msg<V>>>, outcome: Outcome<V>) {
    match outcome {
        Outcome::Value(v) => {
            for tx in senders {
                let _ = tx.send(Msg::Value(v.clone()));
            }
        }
        Outcome::Error(e) => {
            for tx in senders {
                let _ = tx.send(Msg::Error(e.clone()));
            }
        }
        Outcome::Panicked => {
            for tx in senders {
                let _ = tx.send(Msg::Panicked);
            }
        }
        Outcome::Unshared(original) => {
            // When the leader left, the original goes to the first waiter
            // still there; everybody else runs alone.
            let mut original = original;
            for tx in senders {
                match original.take() {
                    Some(o) => {
                        if let Err(Msg::Original(o)) = tx.send(Msg::Original(o)) {
                            original = Some(o);
                        }
                    }
                    None => {
                        let _ = tx.send(Msg::Unshared);
                    }
                }
            }
        }
        // Dropping the senders tells the receivers.
        Outcome::Abandoned => drop(senders),
    }
}

/// Ends the flight when the work is dropped without finishing: an abort,
/// or the runtime shutting down (waiters get `FlightAbandoned`), or a panic
/// unwinding through `call` (waiters get `WorkPanicked`).
pub(crate) struct Completion<V: Clone + Send + 'static> {
    pub(crate) group: Arc<Group<V>>,
    pub(crate) flight: Arc<Flight<V>>,
    pub(crate) done: bool,
}

impl<V: Clone + Send + 'static> Completion<V> {
    /// Delivers the outcome; returns the leader's message (if the leader is
    /// still there) and schedules the end of a replay window.
    pub(crate) fn complete(&mut self, outcome: Outcome<V>) -> Option<Msg<V>> {
        if mem::replace(&mut self.done, true) {
            return None;
        }
        let flight = &self.flight;
        let executed = match &outcome {
            Outcome::Panicked => {
                flight.metrics.panicked();
                tracing::error!(stage = %flight.key.stage(), key = %flight.key.digest().short(), "work panicked");
                None
            }
            Outcome::Abandoned => None,
            _ => Some(flight.started.elapsed().as_secs_f64()),
        };
        let (leader, until) = self.group.finish(flight, outcome, executed);
        if let Some(until) = until {
            let group = Arc::clone(&self.group);
            let flight = Arc::clone(&self.flight);
            // Without a runtime the entry simply expires on its next lookup.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tokio::time::sleep_until(until).await;
                    group.expire_replay(&flight);
                });
            }
        }
        leader
    }
}

impl<V: Clone + Send + 'static> Drop for Completion<V> {
    fn drop(&mut self) {
        // Nothing when the outcome was delivered already.
        let _ = self.complete(if std::thread::panicking() {
            Outcome::Panicked
        } else {
            Outcome::Abandoned
        });
    }
}

/// The inner service's future and the sharing step, boxed so that it can
/// move from the leader (who polls it inline) to a task of its own when the
/// leader leaves early.
pub(crate) type BoxWork<V> = Pin<Box<dyn Future<Output = Outcome<V>> + Send>>;

/// The work of one flight and the duty to deliver its outcome.
pub(crate) struct Work<V: Clone + Send + 'static> {
    fut: BoxWork<V>,
    completion: Completion<V>,
}

impl<V: Clone + Send + 'static> Work<V> {
    pub(crate) fn new(fut: BoxWork<V>, completion: Completion<V>) -> Self {
        Self { fut, completion }
    }

    pub(crate) fn flight(&self) -> &Flight<V> {
        &self.completion.flight
    }

    pub(crate) fn policy(&self) -> &FlightPolicy {
        &self.completion.group.policy
    }

    /// Polls the work. A panic in it becomes `Outcome::Panicked` (for every
    /// waiter, and for whoever polls), never an unwind through the caller.
    fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<Outcome<V>> {
        let fut = &mut self.fut;
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(p) => p,
            Err(_panic) => Poll::Ready(Outcome::Panicked),
        }
    }

    /// Polls the work; when it ends, delivers the outcome and returns the
    /// leader's message (`None` when nothing is left for the leader). Not
    /// to be polled again after that.
    pub(crate) fn poll_msg(&mut self, cx: &mut Context<'_>) -> Poll<Option<Msg<V>>> {
        let outcome = std::task::ready!(self.poll_outcome(cx));
        Poll::Ready(self.completion.complete(outcome))
    }

    /// The leader leaves before the work finished (dropped, or timed out).
    /// The work is handed to a task of its own if anybody may still want
    /// the result, and cancelled otherwise.
    pub(crate) fn leader_left(self, timed_out: bool) {
        let group = Arc::clone(&self.completion.group);
        if group.depart(&self.completion.flight, timed_out, true) {
            // Dropping the work finds the flight finished: nothing else.
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let flight = Arc::clone(&self.completion.flight);
                let task = rt.spawn(Detached(self));
                group.set_abort(&flight, task.abort_handle());
            }
            // No runtime (it is shutting down): dropping the work ends the
            // flight as abandoned, waiters get `FlightAbandoned`.
            Err(_) => drop(self),
        }
    }
}

/// The work on a task of its own, after its leader left.
struct Detached<V: Clone + Send + 'static>(Work<V>);

impl<V: Clone + Send + 'static> Future for Detached<V> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_msg(cx).map(drop)
    }
}
