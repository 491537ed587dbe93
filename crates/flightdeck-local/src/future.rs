//! Response future of [`LocalFlight`](crate::LocalFlight).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::error::{FlightAbandoned, WaitTimeout, WorkPanicked};
use flightdeck_core::{metric, BoxError, Share};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tower::util::Oneshot;
use tower_service::Service;

use crate::group::{stage_label, Flight, Group, Msg};

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
        // Waiting for the flight's message (leader and waiters alike).
        Waiting {
            rx: oneshot::Receiver<Msg<Sh::Shared>>,
            #[pin]
            sleep: Option<Sleep>,
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

    pub(crate) fn wait(
        group: Arc<Group<Sh::Shared>>,
        flight: Arc<Flight<Sh::Shared>>,
        rx: oneshot::Receiver<Msg<Sh::Shared>>,
        fallback: Option<(S, Req)>,
        share: Sh,
    ) -> Self {
        let since = Instant::now();
        let span = tracing::debug_span!(
            "flight_wait",
            role = if fallback.is_some() { "waiter" } else { "leader" },
            stage = %flight.key.stage(),
            key = %flight.key.digest().short(),
        );
        let sleep = group
            .policy
            .wait_timeout
            .map(|t| tokio::time::sleep_until(since + t));
        Self {
            state: State::Waiting {
                rx,
                sleep,
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
                StateProj::Waiting {
                    rx,
                    sleep,
                    guard,
                    fallback,
                    since,
                    span,
                } => {
                    let _entered = span.enter();
                    let msg = match Pin::new(rx).poll(cx) {
                        Poll::Ready(msg) => msg,
                        Poll::Pending => {
                            if let Some(sleep) = sleep.as_pin_mut() {
                                if sleep.poll(cx).is_ready() {
                                    return Poll::Ready(Err(guard.timed_out(since.elapsed())));
                                }
                            }
                            return Poll::Pending;
                        }
                    };
                    // The flight is over for this waiter: nothing to cancel.
                    guard.armed = false;
                    let key = &guard.flight.key;
                    metrics::histogram!(metric::WAIT_DURATION, metric::LABEL_STAGE => stage_label(key))
                        .record(since.elapsed().as_secs_f64());
                    let stage = Some(key.stage().clone());
                    match msg {
                        Ok(Msg::Value(v)) => return Poll::Ready(Ok(this.share.restore(&v))),
                        Ok(Msg::Error(e)) => return Poll::Ready(Err(Box::new(e))),
                        Ok(Msg::Panicked) => {
                            return Poll::Ready(Err(Box::new(WorkPanicked::new(stage))))
                        }
                        Ok(Msg::Original(o)) => {
                            return Poll::Ready(match o.downcast::<Sh::Output>() {
                                Ok(out) => Ok(*out),
                                Err(_) => Err(Box::new(FlightAbandoned::new(stage))),
                            });
                        }
                        Ok(Msg::Unshared) => match fallback.take() {
                            Some(run) => {
                                metrics::counter!(metric::LOCAL_UNSHARED_TOTAL, metric::LABEL_STAGE => stage_label(key))
                                    .increment(1);
                                run
                            }
                            None => return Poll::Ready(Err(Box::new(FlightAbandoned::new(stage)))),
                        },
                        Err(_) => return Poll::Ready(Err(Box::new(FlightAbandoned::new(stage)))),
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
        self.group.leave(&self.flight, true);
        let key = &self.flight.key;
        metrics::counter!(metric::WAIT_TIMEOUT_TOTAL, metric::LABEL_STAGE => stage_label(key))
            .increment(1);
        tracing::debug!(stage = %key.stage(), key = %key.digest().short(), ?waited, "waiter timed out; flight goes on");
        Box::new(WaitTimeout::new(Some(key.stage().clone()), waited))
    }
}

impl<V: Clone + Send + 'static> Drop for WaiterGuard<V> {
    fn drop(&mut self) {
        if self.armed {
            self.group.leave(&self.flight, false);
        }
    }
}
