//! Response future of [`LocalFlight`](crate::LocalFlight).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::error::{FlightAbandoned, WaitTimeout, WorkPanicked};
use flightdeck_core::{BoxError, Share};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tower::util::Oneshot;
use tower_service::Service;

use crate::group::{FlightId, Group, Letter, Msg, Work};
use crate::metrics::StageMetrics;

pin_project! {
    /// Response future of [`LocalFlight`](crate::LocalFlight).
    ///
    /// Waiting is event-driven: the future sleeps on a oneshot channel (and
    /// on its wait-timeout timer) and is woken exactly once, when the
    /// flight ends.
    pub struct ResponseFuture<S, Req, Sh>
    where
        S: Service<Req>,
        Sh: Share<S::Response>,
    {
        #[pin]
        state: State<S, Req, Sh>,
        share: Sh,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, Sh>
    where
        S: Service<Req>,
        Sh: Share<S::Response>,
    {
        // Not coalescable: the inner service's own future.
        Bypass { #[pin] fut: S::Future },
        // The leader polls the work itself.
        Lead {
            lead: LeaderGuard<Sh::Shared>,
            // Allocated on the first poll that has to wait.
            timer: Option<Pin<Box<Timer>>>,
        },
        // Waiting for the flight's message (boxed: the future stays small
        // for the leader, who moves it around most).
        Waiting { wait: Pin<Box<Wait<S, Req, Sh::Shared>>> },
        // The result was not shareable: this waiter runs the service itself.
        RunAlone { fut: Pin<Box<Oneshot<S, Req>>> },
        // Decided at call time (replay, rejection).
        Ready { out: Option<Result<Sh::Output, BoxError>> },
    }
}

pin_project! {
    /// A waiter's state.
    #[project = WaitProj]
    struct Wait<S, Req, V>
    where
        V: Clone,
        V: Send,
        V: Sync,
        V: 'static,
    {
        rx: oneshot::Receiver<Letter<V>>,
        // Armed on the first poll that has to wait: a waiter whose result
        // is there at once never touches the timer wheel.
        #[pin]
        timer: Timer,
        guard: WaiterGuard<V>,
        fallback: Option<(S, Req)>,
        since: Instant,
        span: tracing::Span,
    }
}

pin_project! {
    /// A caller's wait-timeout timer, armed on its first pending poll.
    #[project = TimerProj]
    enum Timer {
        Unarmed,
        Armed { #[pin] sleep: Sleep, since: Instant },
    }
}

impl Timer {
    /// How long the caller waited, once `timeout` has passed since
    /// `since()` (read when the timer is armed). A timeout too long to add
    /// to an instant never ends.
    fn expired(
        mut self: Pin<&mut Self>,
        timeout: Option<std::time::Duration>,
        since: impl FnOnce() -> Instant,
        cx: &mut Context<'_>,
    ) -> Option<std::time::Duration> {
        let timeout = timeout?;
        if let TimerProj::Unarmed = self.as_mut().project() {
            let since = since();
            let deadline = since.checked_add(timeout)?;
            self.set(Timer::Armed {
                sleep: tokio::time::sleep_until(deadline),
                since,
            });
        }
        match self.project() {
            TimerProj::Armed { sleep, since } => sleep.poll(cx).is_ready().then(|| since.elapsed()),
            TimerProj::Unarmed => None,
        }
    }
}

impl<S, Req, Sh> ResponseFuture<S, Req, Sh>
where
    S: Service<Req>,
    Sh: Share<S::Response>,
{
    pub(crate) fn bypass(fut: S::Future, share: Sh) -> Self {
        Self {
            state: State::Bypass { fut },
            share,
        }
    }

    pub(crate) fn ready(out: Result<Sh::Output, BoxError>, share: Sh) -> Self {
        Self {
            state: State::Ready { out: Some(out) },
            share,
        }
    }

    pub(crate) fn lead(work: Work<Sh::Shared>, share: Sh) -> Self {
        Self {
            state: State::Lead {
                lead: LeaderGuard { work: Some(work) },
                timer: None,
            },
            share,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait(
        group: Arc<Group<Sh::Shared>>,
        flight: FlightId,
        metrics: Option<Arc<StageMetrics>>,
        rx: oneshot::Receiver<Letter<Sh::Shared>>,
        since: Instant,
        fallback: (S, Req),
        span: tracing::Span,
        share: Sh,
    ) -> Self {
        Self {
            state: State::Waiting {
                wait: Box::pin(Wait {
                    rx,
                    timer: Timer::Unarmed,
                    guard: WaiterGuard {
                        group,
                        flight,
                        metrics,
                        armed: true,
                    },
                    fallback: Some(fallback),
                    since,
                    span,
                }),
            },
            share,
        }
    }
}

impl<S, Req, Sh> fmt::Debug for ResponseFuture<S, Req, Sh>
where
    S: Service<Req>,
    Sh: Share<S::Response>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Bypass { .. } => "bypass",
            State::Lead { .. } => "lead",
            State::Waiting { .. } => "waiting",
            State::RunAlone { .. } => "run-alone",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, Req, Sh> Future for ResponseFuture<S, Req, Sh>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
{
    type Output = Result<Sh::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let run_alone = match this.state.as_mut().project() {
                StateProj::Bypass { fut } => {
                    return fut
                        .poll(cx)
                        .map(|r| r.map(|v| this.share.passthrough(v)).map_err(Into::into));
                }
                StateProj::RunAlone { fut } => {
                    return fut
                        .as_mut()
                        .poll(cx)
                        .map(|r| r.map(|v| this.share.passthrough(v)).map_err(Into::into));
                }
                StateProj::Ready { out } => {
                    return Poll::Ready(
                        out.take().expect("ResponseFuture polled after completion"),
                    );
                }
                StateProj::Lead { lead, timer } => {
                    return lead.poll_work(cx, timer, this.share);
                }
                StateProj::Waiting { wait } => {
                    let WaitProj {
                        rx,
                        timer,
                        guard,
                        fallback,
                        since,
                        span,
                    } = wait.as_mut().project();
                    let _entered = span.enter();
                    let msg = match Pin::new(rx).poll(cx) {
                        Poll::Ready(msg) => msg,
                        Poll::Pending => {
                            let timeout = guard.group.policy.wait_timeout;
                            if let Some(waited) = timer.expired(timeout, || *since, cx) {
                                return Poll::Ready(Err(guard.timed_out(waited)));
                            }
                            return Poll::Pending;
                        }
                    };
                    // The flight is over for this waiter: nothing to cancel.
                    guard.armed = false;
                    let metrics = guard.metrics();
                    // Until the result was sent (no clock read per waiter),
                    // or, when the flight ended without a word, until now.
                    let waited = match &msg {
                        Ok((_, sent)) => sent.saturating_duration_since(*since),
                        Err(_) => since.elapsed(),
                    };
                    metrics.waited(waited.as_secs_f64());
                    let msg = msg.map(|(msg, _)| msg);
                    // Built only on the error paths: 10,000 waiters cloning
                    // one shared name from two threads is a contended
                    // atomic apiece.
                    let stage = || Some(metrics.stage.clone());
                    match msg {
                        Ok(Msg::Value(v)) => return Poll::Ready(Ok(this.share.restore(&v))),
                        Ok(Msg::Error(e)) => return Poll::Ready(Err(Box::new(e))),
                        Ok(Msg::Panicked) => {
                            return Poll::Ready(Err(Box::new(WorkPanicked::new(stage()))))
                        }
                        Ok(Msg::Original(o)) => {
                            return Poll::Ready(match o.downcast::<Sh::Output>() {
                                Ok(out) => Ok(*out),
                                Err(_) => Err(Box::new(FlightAbandoned::new(stage()))),
                            });
                        }
                        Ok(Msg::Unshared) => match fallback.take() {
                            Some(run) => {
                                metrics.unshared();
                                run
                            }
                            None => {
                                return Poll::Ready(Err(Box::new(FlightAbandoned::new(stage()))))
                            }
                        },
                        Err(_) => return Poll::Ready(Err(Box::new(FlightAbandoned::new(stage())))),
                    }
                }
            };
            let (svc, req) = run_alone;
            this.state.set(State::RunAlone {
                fut: Box::pin(Oneshot::new(svc, req)),
            });
        }
    }
}

/// Tells the flight when a waiter leaves before its result arrived (its
/// future was dropped, or it timed out), so the last one out can cancel.
struct WaiterGuard<V: Clone + Send + Sync + 'static> {
    group: Arc<Group<V>>,
    flight: FlightId,
    /// `None`: the group's first stage.
    metrics: Option<Arc<StageMetrics>>,
    armed: bool,
}

impl<V: Clone + Send + Sync + 'static> WaiterGuard<V> {
    fn metrics(&self) -> &StageMetrics {
        self.group.metrics.kept(&self.metrics)
    }

    fn timed_out(&mut self, waited: std::time::Duration) -> BoxError {
        self.armed = false;
        self.group.depart(self.flight, true, false);
        wait_timeout_error(self.metrics(), waited)
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for WaiterGuard<V> {
    fn drop(&mut self) {
        if self.armed {
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
    fn poll_work<T, Sh>(
        &mut self,
        cx: &mut Context<'_>,
        timer: &mut Option<Pin<Box<Timer>>>,
        share: &Sh,
    ) -> Poll<Result<Sh::Output, BoxError>>
    where
        Sh: Share<T, Shared = V>,
    {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(Box::new(FlightAbandoned::new(None))));
        };
        // A panic in the work becomes an error for everybody, the leader
        // included, instead of unwinding through the caller.
        let msg = match work.poll_msg(cx) {
            Poll::Ready(msg) => msg,
            Poll::Pending => {
                // The leader's wait counts from its work's first pending
                // poll, which this is when the timer is still unarmed.
                let timeout = work.policy().wait_timeout;
                let timer = timer.get_or_insert_with(|| Box::pin(Timer::Unarmed));
                if let Some(waited) = timer.as_mut().expired(timeout, Instant::now, cx) {
                    return Poll::Ready(Err(self.timed_out(waited)));
                }
                return Poll::Pending;
            }
        };
        // Built only on the error paths.
        let mut stage = || Some(work.metrics().stage.clone());
        let out = match msg {
            Some(Msg::Value(v)) => Ok(share.restore(&v)),
            Some(Msg::Error(e)) => Err(Box::new(e) as BoxError),
            Some(Msg::Panicked) => Err(Box::new(WorkPanicked::new(stage())) as BoxError),
            Some(Msg::Original(o)) => match o.downcast::<Sh::Output>() {
                Ok(out) => Ok(*out),
                Err(_) => Err(Box::new(FlightAbandoned::new(stage())) as BoxError),
            },
            Some(Msg::Unshared) | None => Err(Box::new(FlightAbandoned::new(stage())) as BoxError),
        };
        self.work = None;
        Poll::Ready(out)
    }

    fn timed_out(&mut self, waited: std::time::Duration) -> BoxError {
        match self.work.take() {
            Some(mut work) => {
                let err = wait_timeout_error(work.metrics(), waited);
                work.leader_left(true);
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

fn wait_timeout_error(metrics: &StageMetrics, waited: std::time::Duration) -> BoxError {
    metrics.wait_timeout();
    tracing::debug!(stage = %metrics.stage, ?waited, "timed out waiting; the flight goes on");
    Box::new(WaitTimeout::new(Some(metrics.stage.clone()), waited))
}
