//! A flight's waiters: one board per flight, where the outcome is posted
//! once and every waiter reads it, instead of a channel per waiter.
//!
//! A channel per waiter costs an allocation when the waiter joins, a send
//! (an atomic handshake and a move of the message) by the leader, and the
//! channel's release when the waiter wakes: with 10,000 waiters on one key,
//! that is what stood between their wake and tokio's `Notify`'s. On the
//! board the leader stores the outcome once, takes the waiters' wakers in
//! one move and wakes them; each woken waiter reads the outcome without a
//! lock (and clones a shared value on its own thread, not the leader's).
//!
//! A waiter is named by its index, given when it joins. Its waker sits in
//! the board from its first poll. A waiter whose time is up (see
//! `timers`) is marked expired here before the flight ends, if at all: the
//! timers only reach running flights, under the shard lock that ends
//! them. So a waiter that reads an outcome checks first whether it was
//! told its time was up (one atomic load when nobody's was).

use std::any::Any;
use std::collections::BTreeMap;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use flightdeck_core::{SharedError, Unshareable};
use tokio::time::Instant;

use super::delivery::{Letter, Msg};
use super::lock;

/// The outcome as the waiters read it (the unshared original, which goes
/// to one waiter only, waits apart in the board's state).
pub(crate) enum Told<V> {
    Value(V),
    Error(SharedError),
    Panicked,
    Unshared(Unshareable),
    Expired,
    /// Ended without a word (the work was abandoned).
    Abandoned,
}

/// The flight ended without a word for this waiter.
#[derive(Debug)]
pub(crate) struct Abandoned;

pub(crate) struct Board<V> {
    /// The outcome and when it was posted; set once, under `state`'s lock.
    told: OnceLock<(Told<V>, Instant)>,
    /// Some waiter's time was up (set under `state`'s lock, before the
    /// outcome if ever it comes).
    any_expired: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The waiters' wakers, by index (from their first poll); taken when
    /// they are woken, or when they leave.
    wakers: Vec<Option<Waker>>,
    /// The waiters whose time was up, and when (nearly always none).
    expired: BTreeMap<usize, Instant>,
    /// The unshared original output, for the first waiter that reads the
    /// outcome (when the leader left).
    original: Option<Box<dyn Any + Send>>,
}

impl State {
    fn expired(&self, i: usize) -> Option<Instant> {
        self.expired.get(&i).copied()
    }
}

impl<V> Board<V> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            told: OnceLock::new(),
            any_expired: AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    /// Waiter `i`'s time is up (at `now`), the flight still running: it is
    /// told so, and its waker (if any) is returned, to wake out of the
    /// locks.
    pub(crate) fn expire(&self, i: usize, now: Instant) -> Option<Waker> {
        let mut state = lock(&self.state);
        if self.told.get().is_some() {
            return None;
        }
        state.expired.insert(i, now);
        self.any_expired.store(true, Ordering::Release);
        state.wakers.get_mut(i).and_then(Option::take)
    }

    /// Waiter `i` left before the flight ended: its waker goes, and its
    /// expiry if it had one (nobody reads its seat again).
    pub(crate) fn leave(&self, i: usize) {
        let waker = {
            let mut state = lock(&self.state);
            state.expired.remove(&i);
            state.wakers.get_mut(i).and_then(Option::take)
        };
        drop(waker);
    }

    /// Posts the outcome (and the unshared original, for the first waiter
    /// that reads it) and wakes every waiter. Once only: later posts are
    /// ignored.
    pub(crate) fn tell(&self, told: Told<V>, at: Instant, original: Option<Box<dyn Any + Send>>) {
        let wakers = {
            let mut state = lock(&self.state);
            if self.told.get().is_some() {
                drop(state);
                drop((told, original));
                return;
            }
            state.original = original;
            let _ = self.told.set((told, at));
            mem::take(&mut state.wakers)
        };
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }
}

impl<V: Clone> Board<V> {
    /// Polls waiter `i`: its message once the flight ended or its time was
    /// up.
    #[inline]
    pub(crate) fn poll(
        &self,
        i: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Letter<V>, Abandoned>> {
        match self.told.get() {
            // The fan-out's path: woken once the outcome is posted.
            Some(told) => Poll::Ready(self.read(i, told)),
            None => self.register(i, cx),
        }
    }

    /// Polls waiter `i` before the outcome was seen: under the lock, its
    /// waker is kept unless the outcome was posted or its time is up.
    #[inline(never)]
    fn register(&self, i: usize, cx: &mut Context<'_>) -> Poll<Result<Letter<V>, Abandoned>> {
        let mut state = lock(&self.state);
        // Posted meanwhile (the outcome is set under the lock).
        if let Some(told) = self.told.get() {
            drop(state);
            return Poll::Ready(self.read(i, told));
        }
        if let Some(at) = state.expired(i) {
            return Poll::Ready(Ok((Msg::Expired, at)));
        }
        if state.wakers.len() <= i {
            state.wakers.resize_with(i + 1, || None);
        }
        let old = match &mut state.wakers[i] {
            Some(w) if w.will_wake(cx.waker()) => None,
            slot => slot.replace(cx.waker().clone()),
        };
        drop(state);
        // Dropped out of the lock: a waker is the user's code.
        drop(old);
        Poll::Pending
    }

    /// Waiter `i`'s message of the posted outcome.
    #[inline]
    fn read(&self, i: usize, (told, at): &(Told<V>, Instant)) -> Result<Letter<V>, Abandoned> {
        if self.any_expired.load(Ordering::Acquire) {
            if let Some(at) = lock(&self.state).expired(i) {
                return Ok((Msg::Expired, at));
            }
        }
        let msg = match told {
            Told::Unshared(why) => match lock(&self.state).original.take() {
                Some(original) => Msg::Original(original),
                None => Msg::Unshared(*why),
            },
            told => told.copy().ok_or(Abandoned)?,
        };
        Ok((msg, *at))
    }

    /// The posted outcome's message for one more receiver (the leader):
    /// a copy of a value or an error.
    pub(crate) fn copy(&self) -> Option<Msg<V>> {
        self.told.get().and_then(|(told, _)| told.copy())
    }
}

impl<V: Clone> Told<V> {
    /// A receiver's message of this outcome (not for `Unshared`, whose
    /// original is handed out apart; `None`: abandoned). A value whose
    /// `Clone` panics is a panic of the flight for this receiver, caught
    /// here: it does not unwind through the caller's task (each receiver
    /// clones on its own).
    fn copy(&self) -> Option<Msg<V>> {
        match self {
            Told::Value(v) => Some(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.clone()))
                    .map_or(Msg::Panicked, Msg::Value),
            ),
            Told::Error(e) => Some(Msg::Error(e.clone())),
            Told::Panicked => Some(Msg::Panicked),
            Told::Unshared(why) => Some(Msg::Unshared(*why)),
            Told::Expired => Some(Msg::Expired),
            Told::Abandoned => None,
        }
    }
}

/// The flight's hold on its board: dropped before the outcome was posted
/// (the flight cancelled, or a panic unwinding through its delivery), it
/// tells the waiters the flight was abandoned, as their channels' drop did.
pub(crate) struct Teller<V>(pub(crate) Arc<Board<V>>);

impl<V> Drop for Teller<V> {
    fn drop(&mut self) {
        if self.0.told.get().is_none() {
            self.0.tell(Told::Abandoned, Instant::now(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use tokio::time::Instant;

    use super::{Board, Teller, Told};
    use crate::group::delivery::Msg;

    fn poll(board: &Board<u32>, i: usize) -> Poll<Option<Msg<u32>>> {
        let mut cx = Context::from_waker(Waker::noop());
        board.poll(i, &mut cx).map(|r| r.ok().map(|(msg, _)| msg))
    }

    #[test]
    fn a_waiter_whose_time_was_up_hears_so_after_the_outcome_too() {
        let board = Board::new();
        assert!(poll(&board, 0).is_pending());
        assert!(poll(&board, 1).is_pending());
        let at = Instant::now();
        assert!(board.expire(1, at).is_some(), "its waker, to wake");
        assert!(matches!(poll(&board, 1), Poll::Ready(Some(Msg::Expired))));
        board.tell(Told::Value(7), at, None);
        assert!(matches!(poll(&board, 0), Poll::Ready(Some(Msg::Value(7)))));
        assert!(matches!(poll(&board, 1), Poll::Ready(Some(Msg::Expired))));
        // A waiter that joined but never polled reads it too.
        assert!(matches!(poll(&board, 2), Poll::Ready(Some(Msg::Value(7)))));
    }

    #[test]
    fn the_original_goes_to_the_first_reader_only() {
        let board = Board::<u32>::new();
        let why = flightdeck_core::Unshareable::Stream;
        board.tell(Told::Unshared(why), Instant::now(), Some(Box::new(5u8)));
        assert!(matches!(
            poll(&board, 1),
            Poll::Ready(Some(Msg::Original(_)))
        ));
        assert!(matches!(
            poll(&board, 0),
            Poll::Ready(Some(Msg::Unshared(_)))
        ));
    }

    #[test]
    fn a_board_dropped_untold_says_abandoned() {
        let board = Board::<u32>::new();
        assert!(poll(&board, 0).is_pending());
        drop(Teller(board.clone()));
        assert!(matches!(poll(&board, 0), Poll::Ready(None)));
        // Posted once: a later outcome is not read.
        board.tell(Told::Value(1), Instant::now(), None);
        assert!(matches!(poll(&board, 0), Poll::Ready(None)));
    }
}
