//! The synchronization core: the in-flight map, one entry per key.
//!
//! Lock order: a shard lock may be held while taking a flight's lock, never
//! the other way round. Every transition of a flight to "finished" happens
//! under its lock and exactly once (`finished` goes false → true once), and
//! whoever makes it does the bookkeeping: count, gauge, map entry.

use std::any::Any;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::mem;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use flightdeck_core::error::{TooManyFlights, TooManyWaiters};
use flightdeck_core::metric;
use flightdeck_core::{BoxError, FlightKey, SharedError};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::Instant;

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
    Unshared(Box<dyn Any + Send>),
    Panicked,
    /// Aborted or dropped without a result.
    Abandoned,
}

enum Slot<V> {
    Running(Arc<Flight<V>>),
    Replay { value: V, until: Instant, id: u64 },
}

pub(crate) struct Flight<V> {
    id: u64,
    pub(crate) key: FlightKey,
    started: Instant,
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
    abort: Option<AbortHandle>,
}

pub(crate) enum Join<V> {
    Leader(Arc<Flight<V>>, oneshot::Receiver<Msg<V>>),
    Waiter(Arc<Flight<V>>, oneshot::Receiver<Msg<V>>),
    Replay(V),
    Rejected(BoxError),
}

type Shard<V> = Mutex<HashMap<FlightKey, Slot<V>>>;

pub(crate) struct Group<V> {
    shards: Box<[Shard<V>]>,
    hasher: RandomState,
    running: AtomicUsize,
    next_id: AtomicU64,
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
            shards: (0..n).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            running: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            policy,
        }
    }

    fn shard(&self, key: &FlightKey) -> &Shard<V> {
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h & (self.shards.len() - 1)]
    }

    /// Running flights right now.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Entries in the map (running flights and replayable results).
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub(crate) fn join(&self, key: &FlightKey) -> Join<V> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        match shard.get(key) {
            Some(Slot::Replay { value, until, .. }) if now < *until => {
                return Join::Replay(value.clone());
            }
            Some(Slot::Running(f)) if now < f.started + self.policy.flight_ttl => {
                let mut st = lock(&f.state);
                if !st.finished {
                    if st.live >= self.policy.max_waiters {
                        return Join::Rejected(Box::new(TooManyWaiters::new(
                            Some(key.stage().clone()),
                            self.policy.max_waiters,
                        )));
                    }
                    let (tx, rx) = oneshot::channel();
                    st.senders.push(tx);
                    st.live += 1;
                    drop(st);
                    return Join::Waiter(Arc::clone(f), rx);
                }
            }
            _ => {}
        }
        // Start a new flight (replacing an expired or finished entry; an
        // older flight still running past its TTL finishes for its own
        // waiters and leaves this entry alone).
        if self.running.fetch_add(1, Ordering::AcqRel) >= self.policy.max_flights {
            self.running.fetch_sub(1, Ordering::AcqRel);
            return Join::Rejected(Box::new(TooManyFlights::new(
                Some(key.stage().clone()),
                self.policy.max_flights,
            )));
        }
        let (tx, rx) = oneshot::channel();
        let flight = Arc::new(Flight {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key: key.clone(),
            started: now,
            state: Mutex::new(FlightState {
                senders: vec![tx],
                live: 1,
                keep: false,
                finished: false,
                abort: None,
            }),
        });
        shard.insert(key.clone(), Slot::Running(Arc::clone(&flight)));
        drop(shard);
        metrics::gauge!(metric::ACTIVE_FLIGHTS, metric::LABEL_STAGE => stage_label(key))
            .increment(1.0);
        Join::Leader(flight, rx)
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

    /// A waiter leaves before it got its message.
    pub(crate) fn leave(&self, flight: &Flight<V>, timed_out: bool) {
        let abort = {
            let mut st = lock(&flight.state);
            st.live = st.live.saturating_sub(1);
            st.keep |= timed_out;
            let cancel = st.live == 0
                && !st.finished
                && !st.keep
                && self.policy.on_abandon == OnAbandon::Cancel;
            if !cancel {
                return;
            }
            st.finished = true;
            st.senders.clear();
            st.abort.take()
        };
        self.retire(flight, None);
        metrics::counter!(metric::LOCAL_CANCELLED_TOTAL, metric::LABEL_STAGE => stage_label(&flight.key))
            .increment(1);
        tracing::debug!(stage = %flight.key.stage(), key = %flight.key.digest().short(), "last waiter left: flight cancelled");
        if let Some(a) = abort {
            a.abort();
        }
    }

    /// Ends a flight with its outcome and delivers it. Returns the replay
    /// deadline when the value was kept for replay.
    pub(crate) fn finish(&self, flight: &Flight<V>, outcome: Outcome<V>) -> Option<Instant> {
        let senders = {
            let mut st = lock(&flight.state);
            if st.finished {
                return None;
            }
            st.finished = true;
            st.abort = None;
            mem::take(&mut st.senders)
        };
        let replay = match &outcome {
            Outcome::Value(v) if !self.policy.replay_ttl.is_zero() => {
                Some((v.clone(), Instant::now() + self.policy.replay_ttl))
            }
            _ => None,
        };
        let until = replay.as_ref().map(|(_, u)| *u);
        self.retire(flight, replay);
        deliver(senders, outcome);
        until
    }

    /// Bookkeeping of a flight that just finished: the count, the gauge,
    /// and its map entry (replaced by a replay entry, or removed), unless a
    /// newer flight took the key.
    fn retire(&self, flight: &Flight<V>, replay: Option<(V, Instant)>) {
        self.running.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!(metric::ACTIVE_FLIGHTS, metric::LABEL_STAGE => stage_label(&flight.key))
            .decrement(1.0);
        let mut shard = lock(self.shard(&flight.key));
        if let Entry::Occupied(mut e) = shard.entry(flight.key.clone()) {
            if matches!(e.get(), Slot::Running(f) if f.id == flight.id) {
                match replay {
                    Some((value, until)) => {
                        e.insert(Slot::Replay {
                            value,
                            until,
                            id: flight.id,
                        });
                    }
                    None => {
                        e.remove();
                    }
                }
            }
        }
    }

    /// Removes a replay entry once its window is over.
    pub(crate) fn expire_replay(&self, key: &FlightKey, id: u64) {
        let mut shard = lock(self.shard(key));
        if let Entry::Occupied(e) = shard.entry(key.clone()) {
            if matches!(e.get(), Slot::Replay { id: rid, .. } if *rid == id) {
                e.remove();
            }
        }
    }
}

impl<V> Flight<V> {
    pub(crate) fn id(&self) -> u64 {
        self.id
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
            // The original goes to the first receiver still there (the
            // leader unless it left); everybody else runs alone.
            let mut original = Some(original);
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

pub(crate) fn stage_label(key: &FlightKey) -> metrics::SharedString {
    metrics::SharedString::from(Arc::clone(key.stage().as_arc()))
}

/// Ends the flight when the work's future is dropped without finishing:
/// a panic (every waiter gets `WorkPanicked`), an abort, or the runtime
/// shutting down (waiters get `FlightAbandoned`).
pub(crate) struct Completion<V: Clone + Send + 'static> {
    pub(crate) group: Arc<Group<V>>,
    pub(crate) flight: Arc<Flight<V>>,
    pub(crate) done: bool,
}

impl<V: Clone + Send + 'static> Completion<V> {
    /// Delivers the outcome; keeps a replayable value until its window ends.
    pub(crate) async fn complete(mut self, outcome: Outcome<V>) {
        self.done = true;
        if let Some(until) = self.group.finish(&self.flight, outcome) {
            tokio::time::sleep_until(until).await;
            self.group.expire_replay(&self.flight.key, self.flight.id());
        }
    }
}

impl<V: Clone + Send + 'static> Drop for Completion<V> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let outcome = if std::thread::panicking() {
            metrics::counter!(metric::LOCAL_PANIC_TOTAL, metric::LABEL_STAGE => stage_label(&self.flight.key))
                .increment(1);
            tracing::error!(stage = %self.flight.key.stage(), key = %self.flight.key.digest().short(), "work panicked");
            Outcome::Panicked
        } else {
            Outcome::Abandoned
        };
        self.group.finish(&self.flight, outcome);
    }
}
