//! How a flight's outcome reaches its callers: the messages, and their
//! delivery when the flight ends (a clone per waiter, the original to one
//! caller only).

use std::any::Any;

use flightdeck_core::{SharedError, Unshareable};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What a caller receives.
pub(crate) enum Msg<V> {
    Value(V),
    Error(SharedError),
    Panicked,
    /// The result could not be shared (and why): run your own request.
    Unshared(Unshareable),
    /// The unshared original output (a `FlightWork::Output`), for exactly
    /// one receiver: the leader, or the first waiter still there.
    Original(Box<dyn Any + Send>),
    /// The caller's time is up (its wait timeout or its deadline): sent by
    /// the group's timers instead of the outcome, or by a flight that ended
    /// at its deadline.
    Expired,
}

/// A message and when it was sent (so a waiter's wait is known without
/// reading the clock once per waiter).
pub(crate) type Letter<V> = (Msg<V>, Instant);

/// How the work ended.
pub(crate) enum Outcome<V> {
    Value(V),
    Error(SharedError),
    /// Not shareable (and why); the original output unless the leader took
    /// it.
    Unshared(Option<Box<dyn Any + Send>>, Unshareable),
    Panicked,
    /// Aborted or dropped without a result.
    Abandoned,
    /// Ended at the flight's deadline: the latest of its callers', so the
    /// time of every caller still there is up.
    Expired,
}

impl<V: Clone> Outcome<V> {
    /// A waiter's message of this outcome, when it has one (an unshared
    /// original is the leader's: the waiter runs alone).
    fn for_waiter(&self) -> Option<Msg<V>> {
        match self {
            Outcome::Value(v) => Some(Msg::Value(v.clone())),
            Outcome::Error(e) => Some(Msg::Error(e.clone())),
            Outcome::Panicked => Some(Msg::Panicked),
            Outcome::Unshared(_, why) => Some(Msg::Unshared(*why)),
            Outcome::Expired => Some(Msg::Expired),
            Outcome::Abandoned => None,
        }
    }
}

impl<V> Outcome<V> {
    /// The message of this outcome for its one receiver (the unshared
    /// original included); `None` when the work was abandoned.
    pub(crate) fn into_msg(self) -> Option<Msg<V>> {
        match self {
            Outcome::Value(v) => Some(Msg::Value(v)),
            Outcome::Error(e) => Some(Msg::Error(e)),
            Outcome::Panicked => Some(Msg::Panicked),
            Outcome::Unshared(original, _) => original.map(Msg::Original),
            Outcome::Expired => Some(Msg::Expired),
            Outcome::Abandoned => None,
        }
    }
}

/// Sends the outcome to the waiters; returns the leader's message when the
/// leader is still there (`leader`). With nobody else waiting, a value
/// moves to the leader uncloned.
pub(crate) fn deliver<V: Clone>(
    senders: Vec<Option<oneshot::Sender<Letter<V>>>>,
    outcome: Outcome<V>,
    leader: bool,
) -> Option<Msg<V>> {
    // A waiter whose time was up has been told already.
    if senders.iter().all(Option::is_none) {
        return if leader { outcome.into_msg() } else { None };
    }
    let senders = senders.into_iter().flatten();
    // Read once, and only when somebody waits.
    let at = Instant::now();
    match outcome {
        // The unshared original belongs to the leader; when the leader left,
        // to the first waiter still there. Everybody else runs alone.
        Outcome::Unshared(mut original, why) if !leader => {
            for tx in senders {
                let msg = match original.take() {
                    Some(o) => Msg::Original(o),
                    None => Msg::Unshared(why),
                };
                if let Err((Msg::Original(o), _)) = tx.send((msg, at)) {
                    original = Some(o);
                }
            }
            None
        }
        outcome => {
            for tx in senders {
                // Abandoned: dropping the senders tells the receivers.
                let Some(msg) = outcome.for_waiter() else {
                    break;
                };
                let _ = tx.send((msg, at));
            }
            if leader {
                outcome.into_msg()
            } else {
                None
            }
        }
    }
}
