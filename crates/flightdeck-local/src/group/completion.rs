//! The duty to deliver a flight's outcome exactly once: [`Completion`]
//! ends the flight with the work's outcome, or, dropped without one (an
//! abort, a runtime shutting down, a panic unwinding), as abandoned or
//! panicked, so that no waiter is ever left hanging.

use std::mem;
use std::sync::Arc;

use flightdeck_core::metric::Generation;
use tokio::time::Instant;

use super::delivery::{Msg, Outcome};
use super::slot::{Expired, FlightId, Leader};
use super::Group;
use crate::metrics::StageMetrics;

/// Ends the flight when the work is dropped without finishing: an abort,
/// or the runtime shutting down (waiters get `FlightAbandoned`), or a panic
/// unwinding through `call` (waiters get `WorkPanicked`).
pub(crate) struct Completion<V: Clone + Send + Sync + 'static> {
    pub(super) group: Arc<Group<V>>,
    pub(super) flight: FlightId,
    /// The stage's metric handles (`None`: the first stage's).
    metrics: Option<Arc<StageMetrics>>,
    /// When the work was first polled, read only when executions are timed
    /// (a recorder records them).
    pub(super) began: Option<Instant>,
    /// `metrics.timed()`, kept at hand for the first poll.
    pub(super) timed: bool,
    /// The metrics generation the flight is counted under.
    gen: Generation,
    /// Whether the flight was told when the work's first poll returned
    /// pending (the flight TTL counts from there, recorder or not; a flight
    /// done in its first poll never reads the clock for it).
    pub(super) told: bool,
    pub(super) done: bool,
    /// Whether the flight's value is kept for replay (the policy replays,
    /// and the leader's
    /// [`FlightWork::replay_here`](crate::FlightWork::replay_here) agrees).
    pub(super) replays: bool,
}

impl<V: Clone + Send + Sync + 'static> Completion<V> {
    /// The completion of the flight `leader` started, and the result the
    /// flight replaced (to drop once the completion is armed). `replays`:
    /// whether its value is kept for replay.
    pub(crate) fn new(
        group: Arc<Group<V>>,
        leader: Leader<V>,
        replays: bool,
    ) -> (Self, Expired<V>) {
        let Leader {
            flight,
            metrics,
            gen,
            timed,
            expired,
        } = leader;
        let completion = Self {
            group,
            flight,
            metrics,
            began: None,
            timed,
            gen,
            told: false,
            done: false,
            replays,
        };
        (completion, expired)
    }

    /// Counts the flight in (owner, active flights). Called once armed:
    /// should the recorder panic, dropping the completion ends the flight
    /// (its waiters hear `WorkPanicked`).
    #[inline]
    pub(crate) fn started(&self) {
        self.metrics().started(self.gen);
    }

    /// The metric handles of the flight's stage.
    pub(super) fn metrics(&self) -> &StageMetrics {
        self.group.metrics.kept(&self.metrics)
    }

    /// Delivers the outcome (with `replay`, the copy of its value to keep
    /// for replay); returns the leader's message (if the leader is still
    /// there) and schedules the end of a replay window.
    #[inline(always)]
    pub(super) fn complete(&mut self, outcome: Outcome<V>, replay: Option<V>) -> Option<Msg<V>> {
        if mem::replace(&mut self.done, true) {
            return None;
        }
        // Work that ran to its end. `began` first: untimed, it is `None`
        // and the outcome is not looked at.
        let began = self
            .began
            .filter(|_| !matches!(outcome, Outcome::Panicked | Outcome::Abandoned));
        self.group
            .finish(self.flight, self.metrics(), outcome, replay, began)
    }
}

impl<V: Clone + Send + Sync + 'static> Completion<V> {
    /// Dropped without an outcome: the flight ends as abandoned, or as
    /// panicked when a panic unwinds. Out of line: every flight's drop
    /// checks `done`, hardly any gets here.
    #[cold]
    #[inline(never)]
    fn abandon(&mut self) {
        let outcome = if std::thread::panicking() {
            Outcome::Panicked
        } else {
            Outcome::Abandoned
        };
        let _ = self.complete(outcome, None);
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for Completion<V> {
    fn drop(&mut self) {
        // Nothing when the outcome was delivered already.
        if !self.done {
            self.abandon();
        }
    }
}
