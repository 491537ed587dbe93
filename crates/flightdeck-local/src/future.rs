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

use crate::group::{Flight, Group, Msg, Work};

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
            sleep: Option<Pin<Box<Sleep>>>,
            since: Instant,
        },
        // Waiting for the flight's message.
        Waiting {
            rx: oneshot::Receiver<Msg<Sh::Shared>>,
            // Armed (and allocated) on the first poll that has to wait; a
            // call that completes at once never touches the timer wheel.
            sleep: Option<Pin<Box<Sleep>>>,
            timeout: Option<std::time::Duration>,
            guard: WaiterGuard<Sh::Shared>,
            fallback: Option<(S, Req)>,
            since: Instant,
            span: tracing::Span,
        },
        // The result was not shareable: this waiter runs the service itself.
        RunAlone { #[pin] fut: Oneshot<S, Req> },
        // Decided at call time (replay, rejection).
        Ready { out: Option<Result<Sh::Output, BoxError>> },
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
        let since = work.flight().started;
        Self {
            state: State::Lead {
                lead: LeaderGuard { work: Some(work) },
                sleep: None,
                since,
            },
            share,
        }
    }

    pub(crate) fn wait(
        group: Arc<Group<Sh::Shared>>,
        flight: Arc<Flight<Sh::Shared>>,
        rx: oneshot::Receiver<Msg<Sh::Shared>>,
        fallback: (S, Req),
        share: Sh,
    ) -> Self {
        let since = Instant::now();
        let fallback = Some(fallback);
        let timeout = group.policy.wait_timeout;
        let span = tracing::debug_span!(
            "flight_wait",
            role = "waiter",
            stage = %flight.key.stage(),
            key = %flight.key.digest().short(),
        );
        Self {
            state: State::Waiting {
                rx,
                sleep: None,
                timeout,
                guard: WaiterGuard {
                    group,
                    flight,
                    armed: true,
                },
                fallback,
                since,
                span,
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
                        .poll(cx)
                        .map(|r| r.map(|v| this.share.passthrough(v)).map_err(Into::into));
                }
                StateProj::Ready { out } => {
                    return Poll::Ready(
                        out.take().expect("ResponseFuture polled after completion"),
                    );
                }
                StateProj::Lead { lead, sleep, since } => {
                    return lead.poll_work(cx, sleep, *since, this.share);
                }
                StateProj::Waiting {
                    rx,
                    sleep,
                    timeout,
                    guard,
                    fallback,
                    since,
                    span,
                } => {
                    let _entered = span.enter();
                    let msg = match Pin::new(rx).poll(cx) {
                        Poll::Ready(msg) => msg,
                        Poll::Pending => {
                            if timed_out(sleep, *timeout, *since, cx) {
                                return Poll::Ready(Err(guard.timed_out(since.elapsed())));
                            }
                            return Poll::Pending;
                        }
                    };
                    // The flight is over for this waiter: nothing to cancel.
                    guard.armed = false;
                    let key = &guard.flight.key;
                    guard.flight.metrics.waited(since.elapsed().as_secs_f64());
                    // Built only on the error paths: 10,000 waiters cloning
                    // one shared name from two threads is a contended
                    // atomic apiece.
                    let stage = || Some(key.stage().clone());
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
                                guard.flight.metrics.unshared();
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
                fut: Oneshot::new(svc, req),
            });
        }
    }
}

/// Tells the flight when a waiter leaves before its result arrived (its
/// future was dropped, or it timed out), so the last one out can cancel.
struct WaiterGuard<V: Clone + Send + 'static> {
    group: Arc<Group<V>>,
    flight: Arc<Flight<V>>,
    armed: bool,
}

impl<V: Clone + Send + 'static> WaiterGuard<V> {
    fn timed_out(&mut self, waited: std::time::Duration) -> BoxError {
        self.armed = false;
        self.group.depart(&self.flight, true, false);
        wait_timeout_error(&self.flight, waited)
    }
}

impl<V: Clone + Send + 'static> Drop for WaiterGuard<V> {
    fn drop(&mut self) {
        if self.armed {
            self.group.depart(&self.flight, false, false);
        }
    }
}

/// The leader's hold on the work. Dropped before the work finished, it hands
/// the work to a task of its own (or cancels it if nobody else waits).
struct LeaderGuard<V: Clone + Send + 'static> {
    work: Option<Work<V>>,
}

impl<V: Clone + Send + 'static> LeaderGuard<V> {
    fn poll_work<T, Sh>(
        &mut self,
        cx: &mut Context<'_>,
        sleep: &mut Option<Pin<Box<Sleep>>>,
        since: Instant,
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
                if timed_out(sleep, work.policy().wait_timeout, since, cx) {
                    return Poll::Ready(Err(self.timed_out(since.elapsed())));
                }
                return Poll::Pending;
            }
        };
        let stage = || Some(work.flight().key.stage().clone());
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
            Some(work) => {
                let err = wait_timeout_error(work.flight(), waited);
                work.leader_left(true);
                err
            }
            None => Box::new(FlightAbandoned::new(None)),
        }
    }
}

impl<V: Clone + Send + 'static> Drop for LeaderGuard<V> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            work.leader_left(false);
        }
    }
}

fn wait_timeout_error<V>(flight: &Flight<V>, waited: std::time::Duration) -> BoxError {
    let key = &flight.key;
    flight.metrics.wait_timeout();
    tracing::debug!(stage = %key.stage(), key = %key.digest().short(), ?waited, "timed out waiting; the flight goes on");
    Box::new(WaitTimeout::new(Some(key.stage().clone()), waited))
}

/// Polls the wait-timeout timer, arming it on the first poll that waits (a
/// call that completes at once never touches the timer wheel).
fn timed_out(
    sleep: &mut Option<Pin<Box<Sleep>>>,
    timeout: Option<std::time::Duration>,
    since: Instant,
    cx: &mut Context<'_>,
) -> bool {
    let Some(timeout) = timeout else {
        return false;
    };
    sleep
        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(since + timeout)))
        .as_mut()
        .poll(cx)
        .is_ready()
}
