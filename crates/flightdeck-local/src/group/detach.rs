//! The work of a flight, movable: the leader polls it inline (no task on
//! the common path), and when the leader leaves early while others still
//! want the result, it moves to a task of its own.

use std::future::Future;
use std::mem;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::completion::Completion;
use super::delivery::{Msg, Outcome};
use super::timers::expiry_of;
use crate::metrics::StageMetrics;

pin_project! {
    /// The inner service's future and the sharing step, with the duty to
    /// deliver their outcome, in one allocation: it can move from the
    /// leader (who polls it inline) to a task of its own when the leader
    /// leaves early.
    // Fields drop in order: the work first, then the completion, so that
    // waiters hear "abandoned" only once the work is gone.
    struct MovableWork<V, F>
    where
        V: Clone,
        V: Send,
        V: Sync,
        V: 'static,
    {
        #[pin]
        fut: F,
        completion: Completion<V>,
        // The flight's deadline, when its leader had one (see
        // `Running::deadline`): checked, and moved on, when it fires.
        deadline: FlightDeadline,
        // The leader's clock, used while the leader polls (here rather
        // than in the leader's future, which callers move around).
        clock: LeaderClock,
    }
}

/// What the leader (or the detached task) sees of a `MovableWork`.
trait Drive<V: Clone + Send + Sync + 'static>: Send {
    /// Polls the work; see [`Work::poll_msg`].
    fn poll_msg(self: Pin<&mut Self>, cx: &mut Context<'_>, leader: bool) -> Poll<Option<Msg<V>>>;
    fn completion(self: Pin<&mut Self>) -> &mut Completion<V>;
    fn clock(self: Pin<&mut Self>) -> &mut LeaderClock;
}

impl<V, F> Drive<V> for MovableWork<V, F>
where
    V: Clone + Send + Sync + 'static,
    F: Future<Output = Outcome<V>> + Send,
{
    fn poll_msg(self: Pin<&mut Self>, cx: &mut Context<'_>, leader: bool) -> Poll<Option<Msg<V>>> {
        let this = self.project();
        let leader = leader.then_some(this.clock);
        let c = this.completion;
        if c.timed && c.began.is_none() {
            c.began = Some(Instant::now());
        }
        let fut = this.fut;
        // The copy kept for replay is made here, where a panic in the
        // user's `Clone` is caught like one in the work.
        let replaying = c.replays;
        let mut replay = None;
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let polled = fut.poll(cx);
            if let (true, Poll::Ready(Outcome::Value(v))) = (replaying, &polled) {
                replay = Some(v.clone());
            }
            polled
        }));
        let outcome = match polled {
            Ok(Poll::Ready(outcome)) => outcome,
            Ok(Poll::Pending) => {
                if !mem::replace(&mut c.told, true) {
                    // One clock read for the flight TTL and the leader's
                    // wait, and one lock for both.
                    let now = Instant::now();
                    let timeout = c.group.policy.wait_timeout;
                    let timer =
                        leader.and_then(|l| l.arm(timeout, now, cx, || c.group.serves_here()));
                    c.group
                        .pending(c.flight, now, timer.map(|at| (at, cx.waker())));
                } else if let Some(l) = leader {
                    l.rewake(c, cx);
                }
                if !out_of_time(this.deadline, c, cx) {
                    return Poll::Pending;
                }
                // Every caller left at its own deadline: the work is not
                // wanted any more (dropping it releases what it holds).
                tracing::debug!(stage = %c.metrics().stage, "the flight's deadline passed: ended");
                Outcome::Expired
            }
            Err(_panic) => Outcome::Panicked,
        };
        Poll::Ready(c.complete(outcome, replay))
    }

    fn completion(self: Pin<&mut Self>) -> &mut Completion<V> {
        self.project().completion
    }

    fn clock(self: Pin<&mut Self>) -> &mut LeaderClock {
        self.project().clock
    }
}

/// The flight's deadline timer. Its `Sleep` is made by the first poll
/// that leaves the work pending on a runtime: a flight done in its first
/// poll needs none, and outside a runtime there is no clock to make one
/// on (the deadline is then checked once a runtime polls the work).
enum FlightDeadline {
    None,
    At(Instant),
    Sleep(Pin<Box<Sleep>>),
}

/// Whether the flight's deadline has passed: when its timer fires, the
/// flight's deadline is read again (callers who joined since may have
/// extended it, or lifted it) and the timer moved on if need be.
fn out_of_time<V: Clone + Send + Sync + 'static>(
    deadline: &mut FlightDeadline,
    c: &Completion<V>,
    cx: &mut Context<'_>,
) -> bool {
    loop {
        let sleep = match deadline {
            FlightDeadline::None => return false,
            FlightDeadline::At(at) => {
                if tokio::runtime::Handle::try_current().is_err() {
                    return false;
                }
                *deadline = FlightDeadline::Sleep(Box::pin(tokio::time::sleep_until(*at)));
                continue;
            }
            FlightDeadline::Sleep(sleep) => sleep,
        };
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        match c.group.flight_deadline(c.flight) {
            Some(Some(at)) if at > Instant::now() => sleep.as_mut().reset(at),
            Some(None) => *deadline = FlightDeadline::None,
            // Passed, or the flight ended already.
            _ => return true,
        }
    }
}

/// The leader's clock (the earlier of its wait timeout and its own
/// deadline), armed at the end of the work's first pending poll, in the
/// group's timers (see `timers`): no timer of its own.
pub(crate) struct LeaderClock {
    /// The leader's own deadline.
    deadline: Option<Instant>,
    state: ClockState,
    /// Its own timer, when it runs on a runtime that the group's timers
    /// do not serve (see `Group::serves_here`).
    own: Option<Pin<Box<Sleep>>>,
}

#[derive(Clone, Copy)]
enum ClockState {
    Unarmed,
    /// Due `at`; `deadline`: it is the leader's deadline (otherwise its
    /// wait timeout, counted from `since`). `waker`: which waker the
    /// group's timers hold (its data and vtable addresses, compared as
    /// `Waker::will_wake` does; the timers hold a clone, so they are not
    /// reused meanwhile). `fresh`: armed by the poll that is under way.
    Armed {
        at: Instant,
        since: Instant,
        deadline: bool,
        waker: (usize, usize),
        fresh: bool,
    },
    /// Neither a wait timeout nor a deadline.
    Never,
}

/// Why a caller's time is up.
#[derive(Clone, Copy)]
pub(crate) enum Expiry {
    /// The policy's wait timeout, after waiting this long.
    Waited(std::time::Duration),
    /// The caller's own deadline.
    Deadline,
}

fn waker_id(w: &Waker) -> (usize, usize) {
    (w.data() as usize, std::ptr::from_ref(w.vtable()) as usize)
}

impl LeaderClock {
    pub(crate) fn new(deadline: Option<Instant>) -> Self {
        Self {
            deadline,
            state: ClockState::Unarmed,
            own: None,
        }
    }

    /// Arms the clock at `now`; returns when the group's timers must wake
    /// `cx`'s waker (`None`: never, or the clock is its own: when
    /// `served` says the group's timers do not serve this runtime).
    fn arm(
        &mut self,
        timeout: Option<std::time::Duration>,
        now: Instant,
        cx: &mut Context<'_>,
        served: impl FnOnce() -> bool,
    ) -> Option<Instant> {
        match expiry_of(timeout, now, self.deadline) {
            Some((at, deadline)) => {
                self.state = ClockState::Armed {
                    at,
                    since: now,
                    deadline,
                    waker: waker_id(cx.waker()),
                    fresh: true,
                };
                if served() {
                    return Some(at);
                }
                let own = self.own.insert(Box::pin(tokio::time::sleep_until(at)));
                // Registers the waker; `expired` reads the clock.
                let _ = own.as_mut().poll(cx);
                None
            }
            None => {
                self.state = ClockState::Never;
                None
            }
        }
    }

    /// The leader polls with `cx`'s waker: the timers get it if it is
    /// another (its own timer, every time).
    fn rewake<V: Clone + Send + Sync + 'static>(
        &mut self,
        c: &Completion<V>,
        cx: &mut Context<'_>,
    ) {
        if let Some(own) = &mut self.own {
            let _ = own.as_mut().poll(cx);
            return;
        }
        let waker = cx.waker();
        if let ClockState::Armed { waker: held, .. } = &mut self.state {
            let id = waker_id(waker);
            if *held != id {
                *held = id;
                c.group.rewake(c.flight, waker);
            }
        }
    }

    /// Whether the leader's time is up, after a poll that left the work
    /// pending (the clock is read only once armed, and not by the poll
    /// that armed it).
    pub(crate) fn expired(&mut self) -> Option<Expiry> {
        let ClockState::Armed {
            at,
            since,
            deadline,
            fresh,
            ..
        } = &mut self.state
        else {
            return None;
        };
        let now = if mem::replace(fresh, false) {
            *since
        } else {
            Instant::now()
        };
        (now >= *at).then(|| {
            if *deadline {
                Expiry::Deadline
            } else {
                Expiry::Waited(now.saturating_duration_since(*since))
            }
        })
    }
}

/// The work of one flight and the duty to deliver its outcome.
pub(crate) struct Work<V: Clone + Send + Sync + 'static> {
    cell: Pin<Box<dyn Drive<V>>>,
}

impl<V: Clone + Send + Sync + 'static> Work<V> {
    /// `deadline`: the leader's own (the flight's, until callers join).
    /// `fut` builds the work's future, into the cell's allocation: a
    /// future built first and then moved into its box is copied there
    /// whole, on every flight.
    #[inline]
    pub(crate) fn new<F>(
        completion: Completion<V>,
        fut: impl FnOnce() -> F,
        deadline: Option<Instant>,
    ) -> Self
    where
        F: Future<Output = Outcome<V>> + Send + 'static,
    {
        let cell = Box::new_uninit();
        let cell = Box::write(
            cell,
            MovableWork {
                fut: fut(),
                completion,
                deadline: deadline.map_or(FlightDeadline::None, FlightDeadline::At),
                clock: LeaderClock::new(deadline),
            },
        );
        Self {
            cell: Box::into_pin(cell),
        }
    }

    /// The allocation of a work whose future `F` its caller builds after
    /// it (see [`fill`](Self::fill)), as [`new`](Self::new) does with its
    /// closure.
    #[inline(always)]
    pub(crate) fn cell<F>() -> Cell<V, F> {
        Cell(Box::new_uninit())
    }

    /// [`new`](Self::new), with the work's future `fut` built by the
    /// caller after its `cell`'s allocation: written into it, without a
    /// closure to carry what the future is built from (a request, copied
    /// into the closure, and out of it).
    #[inline(always)]
    pub(crate) fn fill<F>(
        cell: Cell<V, F>,
        completion: Completion<V>,
        fut: F,
        deadline: Option<Instant>,
    ) -> Self
    where
        F: Future<Output = Outcome<V>> + Send + 'static,
    {
        let cell = Box::write(
            cell.0,
            MovableWork {
                fut,
                completion,
                deadline: deadline.map_or(FlightDeadline::None, FlightDeadline::At),
                clock: LeaderClock::new(deadline),
            },
        );
        Self {
            cell: Box::into_pin(cell),
        }
    }

    fn completion(&mut self) -> &mut Completion<V> {
        self.cell.as_mut().completion()
    }

    /// The metric handles of the flight's stage.
    pub(crate) fn metrics(&mut self) -> &StageMetrics {
        self.completion().metrics()
    }

    /// Polls the work; when it ends, delivers the outcome and returns the
    /// leader's message (`None` when nothing is left for the leader). Not
    /// to be polled again after that. A panic in the work becomes
    /// `Outcome::Panicked` (for every waiter, and for whoever polls), never
    /// an unwind through the caller.
    ///
    /// `leader`: the leader polls (its clock is armed by the work's first
    /// pending poll).
    pub(crate) fn poll_msg(&mut self, cx: &mut Context<'_>, leader: bool) -> Poll<Option<Msg<V>>> {
        self.cell.as_mut().poll_msg(cx, leader)
    }

    /// Whether the leader's time is up (see [`LeaderClock::expired`]).
    pub(crate) fn leader_expired(&mut self) -> Option<Expiry> {
        self.cell.as_mut().clock().expired()
    }

    /// The leader leaves before the work finished (dropped, or timed out).
    /// The work is handed to a task of its own if anybody may still want
    /// the result, and cancelled otherwise.
    pub(crate) fn leader_left(mut self, timed_out: bool) {
        let c = self.completion();
        let group = Arc::clone(&c.group);
        let flight = c.flight;
        if !group.depart(flight, timed_out, true) {
            // Dropping the work finds nothing left to do.
            c.done = true;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let task = rt.spawn(Detached(self));
                group.set_abort(flight, task.abort_handle());
            }
            // No runtime (it is shutting down): dropping the work ends the
            // flight as abandoned, waiters get `FlightAbandoned`.
            Err(_) => drop(self),
        }
    }
}

/// The allocation of a work, its future not yet built (see [`Work::cell`]).
pub(crate) struct Cell<V: Clone + Send + Sync + 'static, F>(
    Box<std::mem::MaybeUninit<MovableWork<V, F>>>,
);

/// The work on a task of its own, after its leader left.
struct Detached<V: Clone + Send + Sync + 'static>(Work<V>);

impl<V: Clone + Send + Sync + 'static> Future for Detached<V> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_msg(cx, false).map(drop)
    }
}
