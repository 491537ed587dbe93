//! The owner's lease, kept by the owner itself from the grant until its
//! flight is settled.
//!
//! An owner renews its lease every heartbeat interval **until its commit or
//! abandon has returned**, not only while the work runs: reading and
//! sharing the response, encoding it and the commit attempts all happen
//! under a live lease, so a slow body or a slow commit never lets a
//! follower take over (and run the work a second time). The value goes to
//! the owner's callers as soon as it exists; the commit (with its retries)
//! goes on in the background. A lease whose owner is dropped mid-work (its
//! caller left and nobody asked the flight to finish) is abandoned at
//! once, so followers race again without waiting for it to expire.
//!
//! **No task at the grant.** Most flights' work is short: a task of its
//! own per lease would cost a thread hop at every grant (a worker woken to
//! run it) and another to hand it the value. Instead the owner's own
//! future drives the heartbeats while the work runs ([`Working`]: the work
//! is polled first, so work that is ready at its first poll arms no
//! timer). When the work returns, its settling (the commit or abandon with
//! its retries, under the same heartbeat schedule until the call has
//! returned, then the replicas) is polled once right there, in the owner's
//! task, so the COMMIT is on its way before the value goes to the callers;
//! only what is left of it (waiting for the answer) runs on as a
//! background task, which
//! [`DistributedFlights::idle`](crate::DistributedFlights::idle) waits for.
//! A heartbeat timer is armed only when a heartbeat can fall due before
//! the step being waited for has ended ([`During`]): a commit answered
//! within its call deadline, long before the next heartbeat, arms none.
//! The price: heartbeats during the work need the owner's future to be
//! polled, so work that blocks its thread for longer than the lease lets
//! the lease lapse (the policy's docs say so).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::time::Backoff;
use pin_project_lite::pin_project;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{sleep, sleep_until, Instant, Sleep};
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::backend::{
    AbandonArgs, Backend, BackendError, BackendErrorKind, CommitArgs, Committed, Renewal,
};
use crate::flights::{Cx, State};
use crate::metrics::{Op, Replicas};

/// A commit or abandon that failed is tried again after 20 ms, then after
/// twice the last pause, at least 100 ms and at most 2 s, while the lease
/// lasts.
const SETTLE_FIRST_PAUSE: Duration = Duration::from_millis(20);
const SETTLE_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(100), Duration::from_secs(2));

/// How the owner settles its flight.
pub(crate) enum Finish {
    /// Store this (encoded) result, whose work took this long.
    Commit(Bytes, Duration),
    /// Release the flight, caching this failure message when the stage
    /// caches failures.
    Abandon(Option<Bytes>),
    /// Release the flight after a failed refresh of a kept result: the
    /// store answers that result stale, and grants nothing, for this long
    /// (with the failure, cached as [`Finish::Abandon`] caches it).
    Throttle(Option<Bytes>, Duration),
}

/// How a flight's settling ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Its result is in the store.
    Stored,
    /// Its commit was fenced: a newer owner (or a purge) holds the
    /// flight, the result replaced nothing.
    Fenced,
    /// Nothing was stored: it abandoned, or its commit never got through.
    Unstored,
}

/// The owner's hold on its lease, from the grant until
/// [`finish`](Self::finish) hands the flight's settling to the background
/// (dropped unfinished, it abandons the lease there).
pub(crate) struct Lease<'a, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    st: &'a Arc<State<B, C>>,
    cx: &'a Cx,
    generation: u64,
    /// `None` once the settling took them over.
    beats: Option<Heartbeats>,
    /// Counts the lease as background coordination from its grant on (it
    /// goes with the settling): [`DistributedFlights::idle`] waits for an
    /// owner still at work, whose commit is still to come.
    ///
    /// [`DistributedFlights::idle`]: crate::DistributedFlights::idle
    tracked: Option<TaskTrackerToken>,
    /// Told how the settling ended, if anyone asked
    /// ([`tell`](Self::tell)).
    told: Option<oneshot::Sender<Settled>>,
}

impl<'a, B, C> Lease<'a, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    /// The lease of `generation`, granted just now: its first heartbeat
    /// is due an interval from now.
    pub(crate) fn new(st: &'a Arc<State<B, C>>, cx: &'a Cx, generation: u64) -> Self {
        Self {
            st,
            cx,
            generation,
            beats: Some(Heartbeats::new(generation, st.policy.heartbeat_interval())),
            tracked: Some(st.tasks.token()),
            told: None,
        }
    }

    /// Has `to` told how the settling ends (a refresh counts its outcome
    /// by it). Dropped untold when the lease never settles.
    pub(crate) fn tell(&mut self, to: oneshot::Sender<Settled>) {
        self.told = Some(to);
    }

    /// Runs the owner's `work` under the lease (see [`Working`]).
    pub(crate) fn run<F: Future>(&mut self, work: F) -> Working<'_, 'a, B, C, F> {
        Working {
            work,
            cancels: self.st.policy.cancels_on_lease_loss(),
            lease: self,
        }
    }

    /// Settles the flight: its first call leaves now, from the owner's
    /// task; the rest (the answer, retries, heartbeats until then, the
    /// replicas) runs on in the background.
    pub(crate) fn finish(mut self, how: Finish) {
        let Some((settling, rt)) = self.hand_over() else {
            return;
        };
        let mut settling = Box::pin(settling.run(how));
        // Polled once here, so the call is sent without waiting for a
        // worker to run a new task (the answer often comes back before one
        // would have started). A waker that does nothing is enough: the
        // task it is spawned on polls it again before it waits for
        // anything.
        let polled = settling
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        if polled.is_pending() {
            drop(self.st.tasks.spawn_on(settling, &rt));
        }
    }

    /// The settling, with the heartbeats (their schedule, one in flight),
    /// and the runtime to finish it on; `None` when it was handed over
    /// already, or there is no runtime (it is shutting down: the lease
    /// expires on its own).
    fn hand_over(&mut self) -> Option<(Settling<B, C>, Handle)> {
        let beats = self.beats.take()?;
        let tracked = self.tracked.take()?;
        let Ok(rt) = Handle::try_current() else {
            tracing::debug!(stage = %self.cx.stage(), "no runtime to settle the lease");
            return None;
        };
        let settling = Settling {
            st: Arc::clone(self.st),
            cx: self.cx.clone(),
            generation: self.generation,
            beats,
            _tracked: tracked,
            told: self.told.take(),
        };
        Some((settling, rt))
    }
}

impl<B, C> Drop for Lease<'_, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    fn drop(&mut self) {
        // Unfinished: the owner's future went away mid-work (or its work
        // was cancelled as the lease was lost). Abandoned from a task, not
        // polled here: a drop may come while unwinding, or while the
        // runtime shuts down.
        if let Some((settling, rt)) = self.hand_over() {
            drop(
                self.st
                    .tasks
                    .spawn_on(settling.run(Finish::Abandon(None)), &rt),
            );
        }
    }
}

pin_project! {
    /// The owner's work, with the lease's heartbeats driven alongside by
    /// the owner's own task. Resolves to the work's output, or `None` when
    /// a heartbeat found the lease gone and the policy cancels the work
    /// then (dropped with this future).
    pub(crate) struct Working<'l, 'a, B, C, F>
    where
        B: Backend,
        C: Send,
        C: Sync,
        C: 'static,
    {
        #[pin]
        work: F,
        lease: &'l mut Lease<'a, B, C>,
        cancels: bool,
    }
}

impl<B, C, F> Future for Working<'_, '_, B, C, F>
where
    B: Backend,
    C: Send + Sync + 'static,
    F: Future,
{
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The work first: work that is ready at its first poll arms no
        // timer.
        if let Poll::Ready(out) = this.work.poll(task) {
            return Poll::Ready(Some(out));
        }
        let lease = &mut **this.lease;
        let lost = match &mut lease.beats {
            Some(beats) => beats.poll(task, lease.st, lease.cx, None).is_ready(),
            None => false,
        };
        if lost && *this.cancels {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

/// The owner's heartbeats, due every interval from the grant, driven by
/// whatever waits on the owner's behalf: its work, then each step of its
/// settling.
pub(crate) struct Heartbeats {
    generation: u64,
    every: Duration,
    /// When the next one is due.
    next: Instant,
    /// Armed the first time a heartbeat may fall due while the owner
    /// waits, then reset for each next one. Boxed: it moves with the
    /// schedule from the owner's future into its settling.
    timer: Option<Pin<Box<Sleep>>>,
    /// The heartbeat on its way, if any.
    call: Option<Renewing>,
    /// A heartbeat found the lease gone: no more are sent.
    lost: bool,
    /// When the last heartbeat that renewed the lease, or may have (its
    /// outcome unknown: its answer lost, or cut at the call timeout), was
    /// answered: the store had renewed it by then, if at all, for one
    /// lease.
    renewed: Option<Instant>,
}

/// A heartbeat's call, owning what it needs (it moves as the timer does).
type Renewing = Pin<Box<dyn Future<Output = Result<Renewal, BackendError>> + Send>>;

impl Heartbeats {
    fn new(generation: u64, every: Duration) -> Self {
        Self {
            generation,
            every,
            next: Instant::now() + every,
            timer: None,
            call: None,
            lost: false,
            renewed: None,
        }
    }

    /// Sends the heartbeats that fall due, and takes their answers; with
    /// `until`, only those due before it: whoever polls this then polls it
    /// again once `until` has passed, so no timer is armed for a later
    /// one. Ready once a heartbeat found the lease gone (nothing more to
    /// send or wait for).
    ///
    /// Polled with the task's coop budget lifted: the work polled just
    /// before may have used it up (a stream that always has data, tokio's
    /// `consume_budget`), and a timer or call polled on an empty budget
    /// answers `Pending` however late it is, so the lease would lapse
    /// while its owner works.
    fn poll<B, C>(
        &mut self,
        task: &mut Context<'_>,
        st: &Arc<State<B, C>>,
        cx: &Cx,
        until: Option<Instant>,
    ) -> Poll<()>
    where
        B: Backend,
        C: Send + Sync + 'static,
    {
        let due = std::future::poll_fn(|task| loop {
            if self.lost {
                return Poll::Ready(());
            }
            if let Some(call) = &mut self.call {
                let res = ready!(call.as_mut().poll(task));
                self.call = None;
                self.answered(&res);
                if let Ok(Renewal::Lost) = res {
                    cx.metrics.with(|m| m.heartbeat_lost.increment(1));
                    tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation = self.generation, "lease lost while the owner still holds its flight; its commit will be fenced");
                    self.lost = true;
                    continue;
                }
                // Renewed, or a transient failure (the lease may still be
                // ours): the next one at the next tick.
            }
            if until.is_some_and(|until| self.next >= until) {
                return Poll::Pending;
            }
            let next = self.next;
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(sleep_until(next)));
            if timer.deadline() != next {
                timer.as_mut().reset(next);
            }
            ready!(timer.as_mut().poll(task));
            self.next += self.every;
            self.call = Some(renew(st, cx, self.generation));
        });
        std::pin::pin!(tokio::task::coop::unconstrained(due)).poll(task)
    }

    /// Notes when a heartbeat renewed the lease, or may have.
    fn answered(&mut self, res: &Result<Renewal, BackendError>) {
        let renewed = match res {
            Ok(Renewal::Renewed) => true,
            Ok(Renewal::Lost) => false,
            Err(e) => e.kind() == BackendErrorKind::OutcomeUnknown,
        };
        if renewed {
            self.renewed = Some(Instant::now());
        }
    }

    /// After a settling that gave up with the lease maybe still held: sends
    /// no more heartbeats, takes the answer of the one on its way (its call
    /// is cut at the call timeout), and waits until the last renewal has
    /// run out, so that the node is idle only once its lease is over. A
    /// heartbeat whose answer never came may still land later: like a late
    /// ACQUIRE, a known limit (docs/guarantees.md).
    async fn lapse(mut self, lease: Duration) {
        if let Some(call) = self.call.take() {
            let res = call.await;
            self.answered(&res);
        }
        if let Some(at) = self.renewed.filter(|_| !self.lost) {
            sleep_until(at + lease).await;
        }
    }

    /// `step` of the settling, which has surely ended `within` from its
    /// first poll, with the heartbeats due before then.
    fn during<'a, B, C, F>(
        &'a mut self,
        st: &'a Arc<State<B, C>>,
        cx: &'a Cx,
        within: Duration,
        step: F,
    ) -> During<'a, B, C, F> {
        During {
            step,
            beats: self,
            st,
            cx,
            within,
            ends: None,
        }
    }
}

/// One heartbeat. A box per heartbeat interval is nothing next to its
/// round trip.
fn renew<B, C>(st: &Arc<State<B, C>>, cx: &Cx, generation: u64) -> Renewing
where
    B: Backend,
    C: Send + Sync + 'static,
{
    let (st, cx) = (Arc::clone(st), cx.clone());
    Box::pin(async move {
        let call = st
            .backend
            .heartbeat(&cx.flight, &cx.token, generation, &cx.terms);
        st.timed(&cx, Op::Heartbeat, call).await
    })
}

pin_project! {
    /// A step of the settling (a call, the pause before the next try),
    /// with the heartbeats that fall due before it has surely ended: in the
    /// common case, a commit answered long before the next heartbeat, no
    /// timer is armed for them.
    struct During<'a, B, C, F> {
        #[pin]
        step: F,
        beats: &'a mut Heartbeats,
        st: &'a Arc<State<B, C>>,
        cx: &'a Cx,
        within: Duration,
        // `within` from the step's first `Pending`: its own deadline (a
        // call's timeout, a pause) started before, so it has ended by then.
        ends: Option<Instant>,
    }
}

impl<B, C, F> Future for During<'_, B, C, F>
where
    B: Backend,
    C: Send + Sync + 'static,
    F: Future,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.step.poll(task) {
            return Poll::Ready(out);
        }
        let within = *this.within;
        let ends = *this.ends.get_or_insert_with(|| Instant::now() + within);
        // A lost lease settles all the same (a commit is then fenced).
        let _ = this.beats.poll(task, this.st, this.cx, Some(ends));
        Poll::Pending
    }
}

/// An owner's settling, owning all it needs, for the background.
struct Settling<B, C> {
    /// The lease's count in the background work, until its settling ends.
    _tracked: TaskTrackerToken,
    st: Arc<State<B, C>>,
    cx: Cx,
    generation: u64,
    beats: Heartbeats,
    told: Option<oneshot::Sender<Settled>>,
}

impl<B, C> Settling<B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    /// Settles the flight (with heartbeats until the settling call has
    /// returned), then waits for the replicas a commit needs.
    // An async block: an `async fn` would hold the settling twice (see
    // `State::decided`).
    #[allow(clippy::manual_async_fn)]
    fn run(mut self, how: Finish) -> impl Future<Output = ()> {
        async move {
            let (settled, held) =
                settle(&self.st, &self.cx, self.generation, how, &mut self.beats).await;
            if let Some(to) = self.told.take() {
                // Nobody listening any more is fine: it was only asked.
                let _ = to.send(settled);
            }
            // A settled flight needs no more heartbeats (and must not count a
            // heartbeat answered after its commit as a lost lease). One that
            // gave up waits until the lease its heartbeats kept is over.
            if held {
                self.beats.lapse(self.st.policy.lease_duration()).await;
            } else {
                drop(self.beats);
            }
            let committed = settled == Settled::Stored;
            let (st, cx, generation) = (&self.st, &self.cx, self.generation);
            // Remembered as a result the store must keep (its later absence
            // counts as lost) once it is as durable as the stage asks.
            if committed && wait_replicas(st, cx, generation).await {
                st.seen_commits.remember(
                    cx.flight,
                    generation,
                    cx.started,
                    st.policy.replay_ttl_duration(),
                );
            }
            // Named so that the block owns it: a block captures only the
            // fields it names, and the token, named nowhere else, would go
            // when the block is made, not when the settling ends.
            drop(self._tracked);
        }
    }
}

/// Commits or abandons, with retries. A commit is tried
/// `commit_attempts` times; when the last attempt failed for want of the
/// backend it is counted and logged, and tried on (backing off from 100 ms
/// to 2 s) until one lease has passed: followers on other nodes wait that
/// long before one of them runs the work again, and a result stored in the
/// meantime reaches them instead. Safe to repeat: a commit is idempotent
/// for (token, generation), and fenced once a newer owner holds the flight.
/// An abandon is retried the same way, so followers race again as soon as
/// the backend answers. How it ended, and whether it gave up (its lease
/// may still be held: see `Heartbeats::lapse`).
async fn settle<B, C>(
    st: &Arc<State<B, C>>,
    cx: &Cx,
    generation: u64,
    how: Finish,
    beats: &mut Heartbeats,
) -> (Settled, bool)
where
    B: Backend,
    C: Send + Sync + 'static,
{
    let until = Instant::now() + st.policy.lease_duration();
    let retry_after = match &how {
        Finish::Throttle(_, d) => *d,
        _ => Duration::ZERO,
    };
    match how {
        Finish::Commit(payload, work_time) => {
            // The work ended as the settling began. With stale windows, the
            // result's freshness (and so its windows) counts from there, as
            // on this node, not from a commit that retries delayed: a stale
            // answer is never older than freshness + window since the work
            // ended.
            let ended = Instant::now();
            let keep_stale = st.policy.stale().keep_stale();
            let replay_ttl = st.policy.replay_ttl_duration();
            // A commit delayed on its way lands later than sent: this node
            // counts its stale answers of it from the work's end. Remembered
            // past its windows for as long as the settling may retry (a
            // lease) plus a lease and a call: a commit held up on its way
            // longer than that counts from its arrival there.
            if !keep_stale.is_zero() {
                let landed = 2 * st.policy.lease_duration() + cx.call_timeout;
                let until = ended + replay_ttl.saturating_add(keep_stale) + landed;
                st.ended_here.remember(cx.flight, generation, ended, until);
            }
            let args = CommitArgs {
                payload,
                ttl: replay_ttl,
                retain: st.policy.waiter_retention(),
                stale_for: keep_stale,
                work_time,
                inline_below: st.policy.inline_below_bytes(),
                state_ttl: cx.terms.state_ttl,
                // Dated from the work's end, whichever attempt lands: the
                // store then tells its age (and the start of its work, its
                // age plus its work time, which orders results on every
                // node) as from here, not from a retry that went later.
                sent: (!keep_stale.is_zero()).then_some(ended),
            };
            let attempts = st.policy.commit_attempt_count();
            let mut attempt = 0;
            let mut pause = SETTLE_FIRST_PAUSE;
            loop {
                attempt += 1;
                let call = st.timed(
                    cx,
                    Op::Commit,
                    st.backend.commit(&cx.flight, &cx.token, generation, &args),
                );
                let res = beats.during(st, cx, cx.call_timeout, call).await;
                let err = match res {
                    Ok(Committed::Committed) => {
                        if !keep_stale.is_zero() {
                            st.ended_here.stored(cx.flight, generation);
                        }
                        if attempt > attempts {
                            tracing::info!(stage = %cx.stage(), flight = %cx.flight, generation, "commit settled in the background");
                        }
                        return (Settled::Stored, false);
                    }
                    Ok(Committed::Fenced) => {
                        cx.metrics.with(|m| m.fenced.increment(1));
                        tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, "commit fenced: a newer owner holds the flight; the value served this node's callers");
                        return (Settled::Fenced, false);
                    }
                    Err(e) => e,
                };
                if attempt == attempts || err.kind() == BackendErrorKind::Protocol {
                    cx.metrics.with(|m| m.result_write_failure.increment(1));
                    tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, error = %err, "result write failed; the value served this node's callers");
                }
                if !retry(st, cx, beats, &err, &mut pause, until).await {
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, "result never stored; the lease ends and followers take over");
                    return (Settled::Unstored, true);
                }
            }
        }
        Finish::Abandon(failure) | Finish::Throttle(failure, _) => {
            let failure_ttl = st.policy.failure_ttl_duration();
            let args = AbandonArgs {
                failure: failure.filter(|_| !failure_ttl.is_zero()),
                failure_ttl,
                retry_after,
                state_ttl: cx.terms.state_ttl,
            };
            let mut pause = SETTLE_FIRST_PAUSE;
            loop {
                let call = st.timed(
                    cx,
                    Op::Abandon,
                    st.backend.abandon(&cx.flight, &cx.token, generation, &args),
                );
                let res = beats.during(st, cx, cx.call_timeout, call).await;
                match res {
                    Ok(_) => return (Settled::Unstored, false),
                    Err(e) => {
                        if !retry(st, cx, beats, &e, &mut pause, until).await {
                            // The lease expires on its own; followers then
                            // take over.
                            tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, error = %e, "abandon failed");
                            return (Settled::Unstored, true);
                        }
                    }
                }
            }
        }
    }
}

/// After a commit: waits for the policy's `commit_replicas` replicas to
/// acknowledge it (nothing when it is 0), counts and logs the outcome.
/// Whether the commit is as durable as the stage asks (always, without a
/// wait): only then is it remembered as a result the store must keep. One
/// acknowledged by fewer replicas was counted `short` (or `failed`) here,
/// at the commit, and a failover may drop it without a second count.
async fn wait_replicas<B: Backend, C: Send + Sync + 'static>(
    st: &State<B, C>,
    cx: &Cx,
    generation: u64,
) -> bool {
    let wanted = st.policy.commit_replica_count();
    if wanted == 0 {
        return true;
    }
    let timeout = st.policy.commit_replicas_timeout_duration();
    let res = st
        .timed(
            cx,
            Op::WaitReplicas,
            st.backend.wait_replicas(&cx.flight, wanted, timeout),
        )
        .await;
    match res {
        Ok(Some(acked)) if acked >= wanted => {
            cx.metrics.with(|m| m.replicas(Replicas::Acked));
            return true;
        }
        Ok(Some(acked)) => {
            cx.metrics.with(|m| m.replicas(Replicas::Short));
            tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, acked, wanted, "commit acknowledged by fewer replicas than asked; a failover now may lose it");
        }
        Ok(None) => {
            cx.metrics.with(|m| m.replicas(Replicas::Failed));
            tracing::debug!(stage = %cx.stage(), "commit-replicas is set but the backend has no replicas to ask");
        }
        Err(e) => {
            cx.metrics.with(|m| m.replicas(Replicas::Failed));
            tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, error = %e, "waiting for replicas after a commit failed");
        }
    }
    false
}

/// Waits (under heartbeats) before another try of a call that failed with
/// `err`: `false` when it is not worth one (a protocol error, or no time
/// left before `until`).
async fn retry<B, C>(
    st: &Arc<State<B, C>>,
    cx: &Cx,
    beats: &mut Heartbeats,
    err: &BackendError,
    pause: &mut Duration,
    until: Instant,
) -> bool
where
    B: Backend,
    C: Send + Sync + 'static,
{
    if err.kind() == BackendErrorKind::Protocol || Instant::now() + *pause >= until {
        return false;
    }
    beats.during(st, cx, *pause, sleep(*pause)).await;
    *pause = SETTLE_BACKOFF.next(*pause);
    true
}
