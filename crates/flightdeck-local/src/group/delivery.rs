//! How a flight's outcome reaches its callers: the messages, and their
//! delivery when the flight ends (posted once on the waiters' board, the
//! original to one caller only).

use std::any::Any;

use flightdeck_core::{SharedError, Unshareable};
use tokio::time::Instant;

use super::board::{Board, Told};

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

/// Posts the outcome on the waiters' board (when somebody may still read
/// it: not every waiter's time was up); returns the leader's message when
/// the leader is still there (`leader`). With nobody else waiting, a value
/// moves to the leader uncloned; otherwise the leader's copy is made once
/// the waiters are woken.
pub(crate) fn deliver<V: Clone>(
    board: Option<&Board<V>>,
    outcome: Outcome<V>,
    leader: bool,
) -> Option<Msg<V>> {
    let Some(board) = board else {
        return if leader { outcome.into_msg() } else { None };
    };
    // Read once, and only when somebody waits.
    let at = Instant::now();
    let (told, original) = match outcome {
        Outcome::Value(v) => (Told::Value(v), None),
        Outcome::Error(e) => (Told::Error(e), None),
        Outcome::Panicked => (Told::Panicked, None),
        // The unshared original belongs to the leader; when the leader left,
        // to the first waiter that reads the outcome if it was not meant for
        // the leader alone (see `hand_over`). Everybody else runs alone.
        Outcome::Unshared(original, why) => (Told::Unshared(why), original),
        Outcome::Expired => (Told::Expired, None),
        Outcome::Abandoned => (Told::Abandoned, None),
    };
    if !leader {
        // Only what any caller of the key may have: a response meant for
        // its own caller (a cookie, `private`, `Vary`) leaves with it.
        let original = original.filter(|_| matches!(told, Told::Unshared(why) if hand_over(why)));
        board.tell(told, at, original);
        return None;
    }
    let unshared = matches!(told, Told::Unshared(_));
    board.tell(told, at, None);
    if unshared {
        original.map(Msg::Original)
    } else {
        board.copy()
    }
}

/// Whether an unshared original may go to a waiter when its leader left:
/// a response unshared for its size or shape (a stream, a body over the
/// cap) answers any caller of the key; one meant for its own caller (it
/// sets a cookie, is `private` / `no-store` / `no-cache`, varies on
/// everything, or an adapter's own reason) never goes to another.
fn hand_over(why: Unshareable) -> bool {
    matches!(why, Unshareable::Stream | Unshareable::Oversize)
}
