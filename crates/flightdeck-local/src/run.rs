//! The future of one caller of [`LocalFlights::run`](crate::LocalFlights::run).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::error::{DeadlineExceeded, FlightAbandoned, WaitTimeout, WorkPanicked};
use flightdeck_core::{BoxError, FlightKey, Shareable, SharedError, Unshareable};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tracing::Instrument;

use crate::flights::{Caller, FlightWork};
use crate::group::board::Board;
use crate::group::completion::Completion;
use crate::group::delivery::{Msg, Outcome};
use crate::group::detach::{Expiry, Work};
use crate::group::slot::{FlightId, Join, Leader};
use crate::group::timers::expiry_of;
use crate::group::Group;
use crate::metrics::{StageMetrics, WaitTime};

/// What a flight's work produces.
pub(crate) type Produced<V, O> = Result<Shareable<V, O>, BoxError>;

/// What one caller of a flight gets.
#[derive(Debug)]
pub enum Answer<V, O> {
    /// The flight's shared result, to this caller as its leader (or as
    /// the caller that ran its own request): its own copy (see
    /// `Share::restore_leader`, which may give it what strangers never
    /// get, such as its own cookies).
    Led(V),
    /// The flight's shared result, handed to this caller (a waiter, or a
    /// replay).
    Shared(V),
    /// An output of this caller's own that was not shared (the leader's
    /// unshareable response, or a waiter's own run).
    Own(O),
}

impl<V, O> Answer<V, O> {
    /// The answer to a caller of its own work's result.
    fn own(produced: Shareable<V, O>) -> Self {
        match produced {
            Shareable::Shared(v) => Answer::Led(v),
            Shareable::Unshared(o, _) => Answer::Own(o),
        }
    }
}

/// What a waiter's poll gives: its answer, or its work back when it must run it.
type Waited<V, W> = Result<Result<Answer<V, <W as FlightWork<V>>::Output>, BoxError>, W>;

type Alone<V, O> = Pin<Box<dyn Future<Output = Result<Answer<V, O>, BoxError>> + Send>>;

pin_project! {
    /// The future of one caller of [`LocalFlights::run`](crate::LocalFlights::run).
    ///
    /// Waiting is event-driven: a waiter sleeps on its flight's board (and
    /// on its timer) and is woken exactly once, when the flight ends. The
    /// leader polls the work itself; dropped (or out of time) before the
    /// work finished, it hands the work to a task of its own when others
    /// still want the result, and cancels it otherwise (unless the flight
    /// was started to finish).
    pub struct Run<V, W>
    where
        V: Clone,
        V: Send,
        V: Sync,
        V: 'static,
        W: FlightWork<V>,
    {
        #[pin]
        state: State<V, W>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<V, W>
    where
        V: Clone,
        V: Send,
        V: Sync,
        V: 'static,
        W: FlightWork<V>,
    {
        // The leader polls the work itself.
        Lead { lead: LeaderGuard<V> },
        // Waiting for the flight's message (boxed: the future stays small
        // for the leader, who moves it around most).
        Waiting { wait: Pin<Box<Wait<V, W>>> },
        // The result was not shared with this caller: it runs its own.
        Alone { fut: Alone<V, W::Output> },
        // Decided at call time (replay, rejection).
        Ready { out: Option<Result<Answer<V, W::Output>, BoxError>> },
    }
}

pin_project! {
    /// A waiter's state.
    #[project = WaitProj]
    struct Wait<V, W>
    where
        V: Clone,
        V: Send,
        V: Sync,
        V: 'static,
    {
        // Its expiry is in the flight (see `group::timers`): when its time
        // is up, its flight's board (in `guard`) says so. On a runtime the
        // group's timers do not serve, its own clock says so instead.
        clock: Option<Pin<Box<Sleep>>>,
        guard: WaiterGuard<V>,
        work: Option<W>,
        // Lent to its work, should it run its own.
        key: FlightKey,
        since: Instant,
        deadline: Option<Instant>,
        span: tracing::Span,
    }
}

impl<V, W> Run<V, W>
where
    V: Clone + Send + Sync + 'static,
    W: FlightWork<V>,
{
    pub(crate) fn ready(out: Result<Answer<V, W::Output>, BoxError>) -> Self {
        Self {
            state: State::Ready { out: Some(out) },
        }
    }

    /// `INLINED`: the map's lookup inlined here (see
    /// [`LocalFlights::run_inlined`](crate::LocalFlights::run_inlined)).
    #[inline]
    pub(crate) fn start<const INLINED: bool>(
        group: &Arc<Group<V>>,
        key: &FlightKey,
        caller: Caller,
        work: W,
    ) -> Self {
        let joined = if INLINED {
            group.join_inlined(key, caller)
        } else {
            group.join(key, caller)
        };
        match joined {
            Join::Leader(leader) => {
                let completion = arm_leader(group, leader, || work.replay_here());
                // A disabled span is not worth a wrapper polled every time.
                let span = flight_span("leader", key);
                let work = if span.is_disabled() {
                    Work::new(completion, || outcome(work.lead(key)), caller.deadline)
                } else {
                    let fut = || outcome(work.lead(key)).instrument(span);
                    Work::new(completion, fut, caller.deadline)
                };
                Self::led(work)
            }
            joined => Self::joined(group, key, caller, joined, work),
        }
    }

    /// The run of a caller whose lookup found a flight to join, a result
    /// to replay, or no room (not [`Join::Leader`]: see [`arm_leader`]).
    #[inline(always)]
    pub(crate) fn joined<L>(
        group: &Arc<Group<V>>,
        key: &FlightKey,
        caller: Caller,
        joined: Join<V, L>,
        mut work: W,
    ) -> Self {
        let state = match joined {
            Join::Replay(value) => {
                if work.serves(&value) {
                    State::Ready {
                        out: Some(Ok(Answer::Shared(value))),
                    }
                } else {
                    group.metrics.get(key.stage()).unshared(Unshareable::Vary);
                    // No flight runs: this caller leads its own way (in
                    // HYBRID through the store, which may hold a result
                    // that serves it), outside the local flight.
                    State::Alone {
                        fut: alone(work, caller.deadline, key, Own::Lead),
                    }
                }
            }
            Join::Rejected(err) => State::Ready {
                out: Some(Err(err)),
            },
            Join::Waiter(flight, metrics, (board, seat), since, own) => {
                work.waiting();
                State::Waiting {
                    wait: Box::pin(Wait {
                        clock: own.map(|at| Box::pin(tokio::time::sleep_until(at))),
                        guard: WaiterGuard {
                            group: Arc::clone(group),
                            flight,
                            metrics,
                            board,
                            seat,
                            armed: true,
                        },
                        work: Some(work),
                        key: key.clone(),
                        since,
                        deadline: caller.deadline,
                        span: flight_span("waiter", key),
                    }),
                }
            }
            Join::Leader(_) => unreachable!("a leader's run starts from `arm_leader`"),
        };
        Self { state }
    }

    /// The run of the leader of a flight, polling its work.
    #[inline(always)]
    pub(crate) fn led(work: Work<V>) -> Self {
        Self {
            state: State::Lead {
                lead: LeaderGuard { work: Some(work) },
            },
        }
    }
}

/// The completion of the flight `leader` started, armed: its leader's
/// work is built (and its request consumed) only after this, so that
/// should building it panic, waiters that already joined get
/// `WorkPanicked` (the completion, dropped, ends the flight).
/// `replay_here`: the leader's say on whether its value is kept for
/// replay (see [`FlightWork::replay_here`]), asked only when the
/// policy replays.
#[inline(always)]
pub(crate) fn arm_leader<V: Clone + Send + Sync + 'static>(
    group: &Arc<Group<V>>,
    leader: Leader<V>,
    replay_here: impl FnOnce() -> bool,
) -> Completion<V> {
    // Whether its value is kept for replay: the policy's replay TTL,
    // and its leader's say.
    let replays = !group.policy.replay_ttl.is_zero() && replay_here();
    // Armed before starting the work (or dropping the result it
    // replaced): if starting it panics, waiters that already joined
    // get `WorkPanicked`.
    let (completion, expired) = Completion::new(Arc::clone(group), leader, replays);
    completion.started();
    drop(expired);
    completion
}

/// A flight's span (only waiters and leaders have a flight to trace).
/// Inlined: where it is disabled, a test of the level in force.
#[inline(always)]
pub(crate) fn flight_span(role: &'static str, key: &FlightKey) -> tracing::Span {
    tracing::debug_span!(
        "flight",
        role,
        stage = %key.stage(),
        key = %key.digest().short(),
    )
}

/// A leader's span, `None` where it would be disabled (a disabled span is
/// not worth a wrapper polled every time). Below the debug level nothing
/// is built: no span to test, and none to drop.
#[inline(always)]
pub(crate) fn leader_span(key: &FlightKey) -> Option<tracing::Span> {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    Some(flight_span("leader", key)).filter(|span| !span.is_disabled())
}

/// How a caller the flight's result did not serve runs its work.
#[derive(Clone, Copy)]
enum Own {
    /// [`FlightWork::alone`]: a waiter of a flight that ran.
    Alone,
    /// [`FlightWork::lead`]: a replay that did not serve it (no flight
    /// runs; its own run may coordinate as a leader's does).
    Lead,
}

/// A caller's own run of its work (the flight's result did not serve it),
/// within its own deadline: it still ends by it, as every caller does. A
/// caller whose deadline has passed runs nothing. A panic of the work is
/// caught, as in a flight's: the caller gets `WorkPanicked`.
fn alone<V: 'static, W: FlightWork<V>>(
    work: W,
    deadline: Option<Instant>,
    key: &FlightKey,
    own: Own,
) -> Alone<V, W::Output> {
    let out_of_time = || Box::new(DeadlineExceeded::new("request")) as BoxError;
    let late = deadline.is_some_and(|at| at <= Instant::now());
    let run = (!late).then(|| {
        type Run<V, O> = Pin<Box<dyn Future<Output = Result<Shareable<V, O>, BoxError>> + Send>>;
        let mut run: Run<V, W::Output> = match own {
            Own::Alone => Box::pin(work.alone(key)),
            Own::Lead => Box::pin(work.lead(key)),
        };
        let stage = key.stage().clone();
        std::future::poll_fn(move |cx| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.as_mut().poll(cx)))
                .unwrap_or_else(|_panic| {
                    Poll::Ready(Err(
                        Box::new(WorkPanicked::new(Some(stage.clone()))) as BoxError
                    ))
                })
        })
    });
    Box::pin(async move {
        let out = match (run, deadline) {
            (None, _) => Err(out_of_time()),
            (Some(run), None) => run.await,
            (Some(run), Some(at)) => tokio::time::timeout_at(at, run)
                .await
                .unwrap_or_else(|_| Err(out_of_time())),
        };
        out.map(Answer::own)
    })
}

/// The work's answer as the flight's outcome.
pub(crate) fn outcome<F>(work: F) -> Outcomes<F> {
    Outcomes { work }
}

pin_project! {
    /// The future of [`outcome`]: a plain map, not an `async fn`, whose
    /// state machine (and the call a poll of it costs) every flight would
    /// pay for.
    pub(crate) struct Outcomes<F> {
        #[pin]
        work: F,
    }
}

impl<F, V, O> Future for Outcomes<F>
where
    F: Future<Output = Produced<V, O>>,
    O: Send + 'static,
{
    type Output = Outcome<V>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome<V>> {
        self.project().work.poll(cx).map(|produced| match produced {
            Ok(Shareable::Shared(v)) => Outcome::Value(v),
            Ok(Shareable::Unshared(o, why)) => Outcome::Unshared(Some(Box::new(o)), why),
            Err(e) => Outcome::Error(SharedError::new(e)),
        })
    }
}

impl<V, W> fmt::Debug for Run<V, W>
where
    V: Clone + Send + Sync + 'static,
    W: FlightWork<V>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Lead { .. } => "lead",
            State::Waiting { .. } => "waiting",
            State::Alone { .. } => "alone",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("Run").field("state", &state).finish()
    }
}

impl<V, W> Future for Run<V, W>
where
    V: Clone + Send + Sync + 'static,
    W: FlightWork<V>,
{
    type Output = Result<Answer<V, W::Output>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let (work, deadline, key) =
                match this.state.as_mut().project() {
                    StateProj::Alone { fut } => return fut.as_mut().poll(cx),
                    StateProj::Ready { out } => {
                        return Poll::Ready(out.take().unwrap_or_else(|| {
                            Err(Box::new(FlightAbandoned::new(None)) as BoxError)
                        }));
                    }
                    StateProj::Lead { lead } => return lead.poll_work::<W::Output>(cx),
                    StateProj::Waiting { wait } => match wait.as_mut().poll_wait(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(out)) => return Poll::Ready(out),
                        Poll::Ready(Err(work)) => (work, wait.deadline, wait.key.clone()),
                    },
                };
            this.state.set(State::Alone {
                fut: alone(work, deadline, &key, Own::Alone),
            });
        }
    }
}

impl<V, W> Wait<V, W>
where
    V: Clone + Send + Sync + 'static,
    W: FlightWork<V>,
{
    /// Polls a waiter: its answer, or its work when it must run its own.
    fn poll_wait(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Waited<V, W>> {
        let WaitProj {
            clock,
            guard,
            work,
            since,
            key: _,
            deadline,
            span,
        } = self.project();
        let _entered = span.enter();
        let msg = match guard.board.poll(guard.seat, cx) {
            Poll::Ready(msg) => msg,
            Poll::Pending => match clock.as_mut().map(|c| c.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Ok((Msg::Expired, Instant::now())),
                _ => return Poll::Pending,
            },
        };
        if let Ok((Msg::Expired, at)) = &msg {
            // Its wait timeout, or its own deadline, whichever came first.
            let timeout = guard.group.policy.wait_timeout;
            let expiry = match expiry_of(timeout, *since, *deadline) {
                Some((_, true)) => Expiry::Deadline,
                _ => Expiry::Waited(at.saturating_duration_since(*since)),
            };
            return Poll::Ready(Ok(Err(guard.left(expiry))));
        }
        // The flight is over for this waiter: nothing to cancel.
        guard.armed = false;
        let metrics = guard.metrics();
        // Until the result was sent (no clock read per waiter), or, when
        // the flight ended without a word, until now.
        metrics.waited(WaitTime {
            since: *since,
            sent: msg.as_ref().ok().map(|(_, sent)| *sent),
        });
        // Built only on the error paths: 10,000 waiters cloning one shared
        // name from two threads is a contended atomic apiece.
        let stage = || Some(metrics.stage.clone());
        let abandoned =
            || Poll::Ready(Ok(Err(Box::new(FlightAbandoned::new(stage())) as BoxError)));
        let why = match msg.map(|(msg, _)| msg) {
            Ok(Msg::Value(v)) => {
                if work.as_ref().is_none_or(|w| w.serves(&v)) {
                    return Poll::Ready(Ok(Ok(Answer::Shared(v))));
                }
                Unshareable::Vary
            }
            Ok(Msg::Error(e)) => return Poll::Ready(Ok(Err(Box::new(e)))),
            Ok(Msg::Panicked) => return Poll::Ready(Ok(Err(Box::new(WorkPanicked::new(stage()))))),
            Ok(Msg::Original(o)) => {
                return match o.downcast::<W::Output>() {
                    Ok(out) => Poll::Ready(Ok(Ok(Answer::Own(*out)))),
                    Err(_) => abandoned(),
                };
            }
            Ok(Msg::Unshared(why)) => why,
            Ok(Msg::Expired) | Err(_) => return abandoned(),
        };
        match work.take() {
            Some(work) => {
                metrics.unshared(why);
                Poll::Ready(Err(work))
            }
            None => abandoned(),
        }
    }
}

/// Tells the flight when a waiter leaves before its result arrived (its
/// future was dropped, or its time was up), so the last one out can cancel.
struct WaiterGuard<V: Clone + Send + Sync + 'static> {
    group: Arc<Group<V>>,
    flight: FlightId,
    /// `None`: the group's first stage.
    metrics: Option<Arc<StageMetrics>>,
    /// Where it is told, and its index there.
    board: Arc<Board<V>>,
    seat: usize,
    armed: bool,
}

impl<V: Clone + Send + Sync + 'static> WaiterGuard<V> {
    fn metrics(&self) -> &StageMetrics {
        self.group.metrics.kept(&self.metrics)
    }

    /// The waiter's time is up: it leaves, the flight goes on.
    fn left(&mut self, expiry: Expiry) -> BoxError {
        self.armed = false;
        let timed_out = matches!(expiry, Expiry::Waited(_));
        self.board.leave(self.seat);
        self.group.depart(self.flight, timed_out, false);
        expiry_error(self.metrics(), expiry)
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for WaiterGuard<V> {
    fn drop(&mut self) {
        if self.armed {
            // Its waker goes first: a flight it cancels wakes nobody.
            self.board.leave(self.seat);
            self.group.depart(self.flight, false, false);
        }
    }
}

/// The leader's hold on the work. Dropped before the work finished, it hands
/// the work to a task of its own (or cancels it if nobody else waits).
struct LeaderGuard<V: Clone + Send + Sync + 'static> {
    work: Option<Work<V>>,
}

impl<V: Clone + Send + Sync + 'static> LeaderGuard<V> {
    #[inline(always)]
    fn poll_work<O: Send + 'static>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Answer<V, O>, BoxError>> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(Box::new(FlightAbandoned::new(None))));
        };
        // A panic in the work becomes an error for everybody, the leader
        // included, instead of unwinding through the caller. The leader's
        // wait counts from its work's first pending poll (which arms the
        // clock).
        let msg = match work.poll_msg(cx, true) {
            Poll::Ready(msg) => msg,
            Poll::Pending => {
                if let Some(expiry) = work.leader_expired() {
                    return Poll::Ready(Err(self.left(expiry)));
                }
                return Poll::Pending;
            }
        };
        // Built only on the error paths.
        let mut stage = || Some(work.metrics().stage.clone());
        let out = match msg {
            Some(Msg::Value(v)) => Ok(Answer::Led(v)),
            Some(Msg::Error(e)) => Err(Box::new(e) as BoxError),
            Some(Msg::Panicked) => Err(Box::new(WorkPanicked::new(stage())) as BoxError),
            Some(Msg::Original(o)) => match o.downcast::<O>() {
                Ok(out) => Ok(Answer::Own(*out)),
                Err(_) => Err(Box::new(FlightAbandoned::new(stage())) as BoxError),
            },
            // The flight ended at its deadline, which was the leader's.
            Some(Msg::Expired) => Err(Box::new(DeadlineExceeded::new("request")) as BoxError),
            Some(Msg::Unshared(_)) | None => {
                Err(Box::new(FlightAbandoned::new(stage())) as BoxError)
            }
        };
        self.work = None;
        Poll::Ready(out)
    }

    /// The leader's time is up: it leaves, the work goes on for the others.
    fn left(&mut self, expiry: Expiry) -> BoxError {
        match self.work.take() {
            Some(mut work) => {
                let err = expiry_error(work.metrics(), expiry);
                work.leader_left(matches!(expiry, Expiry::Waited(_)));
                err
            }
            None => Box::new(FlightAbandoned::new(None)),
        }
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for LeaderGuard<V> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            work.leader_left(false);
        }
    }
}

fn expiry_error(metrics: &StageMetrics, expiry: Expiry) -> BoxError {
    match expiry {
        Expiry::Waited(waited) => {
            metrics.wait_timeout();
            tracing::debug!(stage = %metrics.stage, ?waited, "timed out waiting; the flight goes on");
            Box::new(WaitTimeout::new(Some(metrics.stage.clone()), waited))
        }
        Expiry::Deadline => {
            tracing::debug!(stage = %metrics.stage, "the caller's deadline passed; the flight goes on");
            Box::new(DeadlineExceeded::new("request"))
        }
    }
}
