//! What the in-flight map holds: one slot per flight (running, or a
//! finished result kept for replay), and the handles callers keep on it.

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::task::Waker;

use flightdeck_core::metric::Generation;
use flightdeck_core::{BoxError, FlightKey};
use hashbrown::hash_table::HashTable;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::board::{Board, Teller};
use super::timers::{Timeline, WaiterExpiry};
use super::tokens::Tokens;
use crate::metrics::StageMetrics;

pub(super) struct Slot<V> {
    pub(super) key: FlightKey,
    pub(super) id: u64,
    pub(super) state: SlotState<V>,
}

pub(super) enum SlotState<V> {
    Running(Running<V>),
    /// A finished result, served to newcomers until its window ends
    /// (shared, so that the lock is not held while it is cloned).
    Replay(Arc<Replay<V>>),
}

pub(crate) struct Replay<V> {
    pub(super) value: V,
    pub(super) until: Instant,
}

/// A running flight, small enough to move in and out of the table cheaply:
/// what only waiters, detached work and timeouts need is allocated when
/// they first need it.
pub(super) struct Running<V> {
    /// When the work's first poll returned pending (or when a caller first
    /// found the flight running, if that came first): the flight TTL
    /// counts from here.
    pub(super) started: Option<Instant>,
    /// A newer flight took the key (this one outlived its TTL): it finishes
    /// for its own callers and is joined by nobody.
    pub(super) superseded: bool,
    /// When its last caller is gone the work finishes anyway
    /// ([`OnAbandon::Finish`](crate::OnAbandon::Finish)), as its leader
    /// asked on arrival.
    pub(super) finish: bool,
    /// The flight's deadline: the latest of its callers' deadlines, or
    /// `None` once one caller had none. Past it, every caller has left (each
    /// at its own deadline) and the flight ends.
    pub(super) deadline: Option<Instant>,
    /// Its entry in the shard's timers (see `timers`), if it has one.
    pub(super) timer: Option<Instant>,
    /// The leader's expiry (its wait timeout or deadline) and its waker,
    /// while the leader polls the work and has one.
    pub(super) leader_timer: Option<(Instant, Waker)>,
    pub(super) joiners: Option<Box<Joiners<V>>>,
    /// The metrics generation the flight is counted under.
    pub(super) gen: Generation,
}

/// The part of a running flight that exists once somebody tried to join it
/// (or was turned away by `max_waiters`), or the leader left.
pub(super) struct Joiners<V> {
    /// Where the waiters are told (from the first waiter on).
    pub(super) board: Option<Teller<V>>,
    /// Waiters that joined (the next one's index on the board).
    pub(super) joined: usize,
    /// Waiters whose time was up (told so on the board).
    pub(super) expired: usize,
    /// The waiters' expiries, earliest first, with their index on the
    /// board.
    pub(super) expiries: BinaryHeap<WaiterExpiry>,
    /// Callers still waiting (leader included).
    pub(super) live: usize,
    /// A waiter timed out: the work is kept even if nobody else waits, so
    /// the timeout never removes the flight at once (see
    /// `Group::unwanted`).
    pub(super) keep: bool,
    /// The leader is polling the work inline. When it leaves early the work
    /// is handed to a task of its own (or cancelled).
    pub(super) leader_present: bool,
    pub(super) abort: Option<AbortHandle>,
}

impl<V> Running<V> {
    /// Whether dropping it would free nothing (its waiters' part and the
    /// leader's waker are gone).
    pub(super) fn owns_nothing(&self) -> bool {
        self.joiners.is_none() && self.leader_timer.is_none()
    }

    pub(super) fn joiners(&mut self) -> &mut Joiners<V> {
        // Without it, the flight has its leader alone.
        self.joiners.get_or_insert_with(|| {
            Box::new(Joiners {
                board: None,
                joined: 0,
                expired: 0,
                expiries: BinaryHeap::new(),
                live: 1,
                keep: false,
                leader_present: true,
                abort: None,
            })
        })
    }
}

pub(super) struct Shard<V> {
    pub(super) table: HashTable<Slot<V>>,
    /// One entry per running flight with an expiry (see `timers`).
    pub(super) timers: Timeline,
    pub(super) next_id: u64,
    pub(super) tokens: Tokens,
}

impl<V> Shard<V> {
    /// The running flight `id` of this shard (`hash` is its key's).
    pub(super) fn running(&mut self, hash: u64, id: u64) -> Option<&mut Running<V>> {
        self.table
            .find_mut(hash, |s| s.id == id)
            .and_then(Slot::running)
    }
}

impl<V> Slot<V> {
    /// Whether lookups of its key find this slot.
    pub(super) fn current(&self) -> bool {
        !matches!(&self.state, SlotState::Running(r) if r.superseded)
    }

    pub(super) fn running(&mut self) -> Option<&mut Running<V>> {
        match &mut self.state {
            SlotState::Running(r) => Some(r),
            SlotState::Replay(_) => None,
        }
    }
}

/// A caller's handle on its flight.
#[derive(Clone, Copy)]
pub(crate) struct FlightId {
    pub(super) hash: u64,
    pub(super) id: u64,
}

/// Where a new flight's slot goes.
pub(super) enum Place<'a, V> {
    Vacant(hashbrown::hash_table::VacantEntry<'a, Slot<V>>),
    /// Over an expired result of the same key.
    Reuse(hashbrown::hash_table::OccupiedEntry<'a, Slot<V>>),
    /// Next to a flight that outlived its TTL (its id: it is superseded once
    /// the new flight is admitted).
    Beside(u64),
}

/// An expired result that a new flight replaced, to be dropped by the
/// caller once the new flight's completion is armed.
pub(crate) struct Expired<V> {
    pub(super) _replaced: Option<Arc<Replay<V>>>,
}

/// A caller that starts a flight: its name, its stage's metrics (`None`:
/// the group's first stage), the metrics generation it is counted under,
/// whether executions are timed, and the result it replaced.
pub(crate) struct Leader<V> {
    pub(crate) flight: FlightId,
    pub(crate) metrics: Option<Arc<StageMetrics>>,
    pub(crate) gen: Generation,
    pub(crate) timed: bool,
    pub(crate) expired: Expired<V>,
}

/// `L`: what the leader's caller made of its [`Leader`] (see
/// `Group::join_with`).
pub(crate) enum Join<V, L = Leader<V>> {
    /// With the stage's metric handles (`None`: the first stage's, see
    /// `Registry::kept`), whether its execution is timed, and the result
    /// it replaced.
    Leader(L),
    /// With the stage's metric handles, its board and index there, when
    /// it joined, and its expiry when it keeps its own clock (see
    /// `Group::serves_here`).
    Waiter(
        FlightId,
        Option<Arc<StageMetrics>>,
        (Arc<Board<V>>, usize),
        Instant,
        Option<Instant>,
    ),
    Replay(V),
    Rejected(BoxError),
}
