//! The bulkhead's slots: a count of free slots, taken and given back with
//! one atomic operation each, and behind a lock a queue of the calls that
//! wait for one, served in arrival order.
//!
//! Written by hand rather than with tokio's `Semaphore` (fair and FIFO,
//! and what the bulkhead used before): its `add_permits` takes the
//! semaphore's waiter lock on every release, waiters or not, which
//! doubled the bulkhead's cost on the path every call takes
//! (`crates/flightdeck-benches/README.md`, 2026-12-05). Here only a call
//! that must wait, and a release or raise while one waits, take the lock.
//!
//! One word holds both the free count and whether calls wait: `free << 1
//! | WAITING`. The free count goes below zero when the limit is lowered
//! under running calls (a debt that their releases pay before any slot is
//! free again). While the flag is set the count's slots are the queue's:
//! the fast path takes none, and whoever adds to the count serves the
//! queue under the lock; the flag is cleared, under the lock, only with
//! the queue empty.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use crate::sync::{AtomicIsize, Mutex, MutexGuard, Ordering};

/// Calls wait in the queue: the count's free slots are theirs.
const WAITING: isize = 1;
/// One slot, in the word's units.
const ONE: isize = 2;

/// The most slots counted: a larger limit counts as this many (it is
/// never reached by running calls).
pub(crate) const MAX_SLOTS: usize = (isize::MAX >> 2) as usize;

/// The count's share of a limit.
pub(crate) fn slots(limit: usize) -> isize {
    // Lossless: `MAX_SLOTS` fits an `isize`.
    limit.min(MAX_SLOTS) as isize
}

/// A queued call's end of the hand-off: the slot, or nothing if the
/// queue dropped it (it never does while the bulkhead lives).
pub(crate) type Handoff<P> = oneshot::Receiver<P>;

/// What [`Slots::wait`] gives a call.
pub(crate) enum Wait<P> {
    /// A slot freed since the fast path looked, and nobody queued first.
    Now,
    /// A place in the queue; the slot comes through the hand-off.
    Queued(Handoff<P>),
}

/// Free slots and the queue of calls waiting for one; `P` is the token a
/// queued call is handed (the bulkhead's permit, which gives the slot
/// back when dropped).
pub(crate) struct Slots<P> {
    state: AtomicIsize,
    queue: Mutex<VecDeque<oneshot::Sender<P>>>,
}

impl<P> Slots<P> {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            state: AtomicIsize::new(slots(limit) * ONE),
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// Takes a free slot, if there is one and no call waits for it.
    #[inline]
    pub(crate) fn try_take(&self) -> bool {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            // Fewer than one free slot, or calls waiting.
            if s < ONE || s & WAITING != 0 {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(s, s - ONE, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Gives a call's slot back: it pays the debt first, then is free.
    /// True when calls wait: the caller must then [`serve`](Self::serve)
    /// them.
    #[inline]
    #[must_use]
    pub(crate) fn give_back_one(&self) -> bool {
        self.state.fetch_add(ONE, Ordering::Release) & WAITING != 0
    }

    /// Gives `n` slots back (a raise of the limit), as
    /// [`give_back_one`](Self::give_back_one) does one.
    #[must_use]
    pub(crate) fn give_back(&self, n: usize) -> bool {
        self.state.fetch_add(slots(n) * ONE, Ordering::Release) & WAITING != 0
    }

    /// Takes `n` slots away (a lowering of the limit): free ones at once,
    /// held ones as a debt their releases pay.
    pub(crate) fn take_away(&self, n: usize) {
        self.state.fetch_sub(slots(n) * ONE, Ordering::AcqRel);
    }

    /// Free slots now; below zero, the debt.
    pub(crate) fn free(&self) -> isize {
        self.state.load(Ordering::Acquire) >> 1
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<oneshot::Sender<P>>> {
        crate::sync::lock(&self.queue)
    }

    /// Takes a free slot under the lock, and clears the flag with it if
    /// the queue is empty.
    fn take_locked(&self, queue_empty: bool) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            if s < ONE {
                return false;
            }
            let mut next = s - ONE;
            if queue_empty {
                next &= !WAITING;
            }
            match self
                .state
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// A call that found no free slot: a slot after all if one was freed
    /// since and nobody queued before it, else a place at the back of the
    /// queue. The caller bounds the queue's length.
    pub(crate) fn wait(&self, mint: impl Fn() -> P, defuse: impl Fn(P)) -> Wait<P> {
        let mut queue = self.queue();
        // From here on, the fast path takes no slot and whoever gives one
        // back serves the queue.
        self.state.fetch_or(WAITING, Ordering::AcqRel);
        queue.retain(|tx| !tx.is_closed());
        if queue.is_empty() && self.take_locked(true) {
            return Wait::Now;
        }
        let (tx, rx) = oneshot::channel();
        queue.push_back(tx);
        // A release that freed a slot meanwhile serves after us; serving
        // here too only hands that slot on sooner, in order.
        self.serve_locked(&mut queue, mint, defuse);
        Wait::Queued(rx)
    }

    /// Hands free slots to the calls waiting, in arrival order; when none
    /// is left waiting, lets the fast path take the rest.
    #[cold]
    #[inline(never)]
    pub(crate) fn serve(&self, mint: impl Fn() -> P, defuse: impl Fn(P)) {
        let mut queue = self.queue();
        self.serve_locked(&mut queue, mint, defuse);
    }

    fn serve_locked(
        &self,
        queue: &mut VecDeque<oneshot::Sender<P>>,
        mint: impl Fn() -> P,
        defuse: impl Fn(P),
    ) {
        while !queue.is_empty() && self.take_locked(false) {
            let mut served = false;
            while let Some(tx) = queue.pop_front() {
                match tx.send(mint()) {
                    Ok(()) => {
                        served = true;
                        break;
                    }
                    // That call stopped waiting (its queue timeout): the
                    // token goes back unused (dropping it here would give
                    // the slot back under the lock), the next call gets it.
                    Err(unsent) => defuse(unsent),
                }
            }
            if !served {
                // Nobody left to take it: the slot is free again.
                self.state.fetch_add(ONE, Ordering::AcqRel);
            }
        }
        if queue.is_empty() {
            self.state.fetch_and(!WAITING, Ordering::AcqRel);
        }
    }
}

/// Every interleaving of takes, releases, a lowering of the limit and a
/// queued call keeps the count: the slots handed out never exceed the
/// limit, none is lost, and the queued call is served once one is free.
#[cfg(all(test, flightdeck_loom))]
mod loom_model {
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    use super::*;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// The test's token: counts the slots held, and gives its slot back
    /// (serving the queue as the bulkhead's permit does) when released.
    struct Held {
        slots: Arc<Slots<()>>,
        held: Arc<AtomicUsize>,
    }

    impl Held {
        fn take(slots: &Arc<Slots<()>>, held: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
            if !slots.try_take() {
                return None;
            }
            let now = held.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(now <= limit, "{now} slots held, limit {limit}");
            Some(Self {
                slots: slots.clone(),
                held: held.clone(),
            })
        }

        fn release(self) {
            self.held.fetch_sub(1, Ordering::SeqCst);
            if self.slots.give_back_one() {
                self.slots.serve(|| (), |()| {});
            }
        }
    }

    /// A bulkhead of one slot, and the call holding it.
    fn one_held() -> (Arc<Slots<()>>, Held) {
        let slots = Arc::new(Slots::<()>::new(1));
        let held = Arc::new(AtomicUsize::new(0));
        let first = Held::take(&slots, &held, 1).expect("a free slot");
        (slots, first)
    }

    /// Two callers take and release a slot each while the limit drops
    /// from 2 to 1: at most 2 held before the drop, and the count ends at
    /// the new limit with nothing held.
    #[test]
    fn loom_takes_releases_and_a_lowering_keep_the_count() {
        model(|| {
            let slots = Arc::new(Slots::<()>::new(2));
            let held = Arc::new(AtomicUsize::new(0));
            let callers: Vec<_> = (0..2)
                .map(|_| {
                    let (slots, held) = (slots.clone(), held.clone());
                    loom::thread::spawn(move || {
                        if let Some(h) = Held::take(&slots, &held, 2) {
                            h.release();
                        }
                    })
                })
                .collect();
            slots.take_away(1);
            for c in callers {
                c.join().unwrap();
            }
            assert_eq!(slots.free(), 1, "the new limit, all free");
        });
    }

    /// One slot, held; a second call queues while the first releases:
    /// whatever the order, the queued call gets the slot (now or through
    /// the hand-off).
    #[test]
    fn loom_a_release_racing_a_call_that_queues_hands_it_the_slot() {
        model(|| {
            let (slots, first) = one_held();
            let releaser = loom::thread::spawn(move || first.release());
            let got = slots.try_take()
                || match slots.wait(|| (), |()| {}) {
                    Wait::Now => true,
                    Wait::Queued(mut rx) => {
                        releaser.join().unwrap();
                        assert!(rx.try_recv().is_ok(), "the release served the queue");
                        assert_eq!(slots.free(), 0, "the slot went to the queue");
                        return;
                    }
                };
            assert!(got);
            releaser.join().unwrap();
            assert_eq!(slots.free(), 0);
        });
    }

    /// A call waits for the one slot; its holder releases it while a new
    /// call tries the fast path: the slot goes to the waiting call.
    #[test]
    fn loom_a_freed_slot_goes_to_the_queue_not_to_a_new_call() {
        model(|| {
            let (slots, first) = one_held();
            let Wait::Queued(mut rx) = slots.wait(|| (), |()| {}) else {
                panic!("no slot is free");
            };
            let releaser = loom::thread::spawn(move || first.release());
            let newcomer = {
                let slots = slots.clone();
                loom::thread::spawn(move || slots.try_take())
            };
            releaser.join().unwrap();
            assert!(!newcomer.join().unwrap(), "a new call overtook the queue");
            assert!(rx.try_recv().is_ok(), "the release served the queue");
            assert_eq!(slots.free(), 0);
        });
    }
}
