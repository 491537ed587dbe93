//! The response future.
//!
//! Shaped for the common case, a call admitted at once: `Bulkhead::call`
//! builds the `Running` state from plain values (no branch of it writes a
//! whole future through a pointer, so the compiler builds it in place), and
//! `poll` handles `Running` inline and leaves the queue, its timer and
//! rejections to an out-of-line `poll_slow`. Measured in
//! `crates/flightdeck-breaker/benches/overhead.rs`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use flightdeck_core::time::later;
use flightdeck_core::BoxError;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use crate::error::QueueTimeout;
use crate::shared::{Acquire, Permit, Shared};

pin_project! {
    /// Response future of [`Bulkhead`](crate::Bulkhead): waits in the queue
    /// if it must, then runs the inner call holding a slot, released when
    /// the call finishes or the future is dropped.
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        Running {
            #[pin]
            fut: F,
            permit: Option<Permit>,
        },
        Queued {
            // Boxed: the waiting state (a timer, the service and the
            // request) is big, and most calls never wait; keeping it inline
            // would make every call's future that big.
            waiting: Box<Waiting<S, Req>>,
        },
        Rejected {
            err: Option<BoxError>,
        },
    }
}

/// A queued call: everything it needs to run once it gets a slot.
pub(crate) struct Waiting<S, Req> {
    slot: Acquire,
    sleep: Pin<Box<Sleep>>,
    svc: Option<S>,
    req: Option<Req>,
    timeout: Duration,
    shared: Arc<Shared>,
}

impl<S, Req> Waiting<S, Req> {
    /// Out of line: only queued calls pay for the timer and the box.
    #[inline(never)]
    pub(crate) fn boxed(
        slot: Acquire,
        svc: S,
        req: Req,
        timeout: Duration,
        shared: Arc<Shared>,
    ) -> Box<Self> {
        Box::new(Self {
            slot,
            // A timeout too long to add to the clock waits "for ever".
            sleep: Box::pin(sleep_until(later(Instant::now(), timeout))),
            svc: Some(svc),
            req: Some(req),
            timeout,
            shared,
        })
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    #[inline]
    pub(crate) fn running(fut: F, permit: Permit) -> Self {
        Self {
            state: State::Running {
                fut,
                permit: Some(permit),
            },
        }
    }

    #[inline]
    pub(crate) fn queued(waiting: Box<Waiting<S, Req>>) -> Self {
        Self {
            state: State::Queued { waiting },
        }
    }

    #[inline]
    pub(crate) fn rejected(err: BoxError) -> Self {
        Self {
            state: State::Rejected { err: Some(err) },
        }
    }
}

impl<F, S, Req> fmt::Debug for ResponseFuture<F, S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Queued { .. } => "queued",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, Req> Future for ResponseFuture<S::Future, S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let StateProj::Running { fut, permit } = self.as_mut().project().state.project() {
            let out = ready!(fut.poll(cx));
            // Free the slot as soon as the call is done.
            drop(permit.take());
            return Poll::Ready(out.map_err(Into::into));
        }
        self.poll_slow(cx)
    }
}

impl<S, Req> ResponseFuture<S::Future, S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    /// Queued or rejected: waits for a slot (or the queue timeout), then
    /// runs the call as `Running`.
    #[inline(never)]
    fn poll_slow(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, BoxError>> {
        let mut state = self.as_mut().project().state;
        let permit_and_call = match state.as_mut().project() {
            StateProj::Running { .. } => None,
            StateProj::Queued { waiting } => {
                let Waiting {
                    slot,
                    sleep,
                    svc,
                    req,
                    timeout,
                    shared,
                } = &mut **waiting;
                let permit = match Pin::new(slot).poll(cx) {
                    Poll::Ready(Some(permit)) => permit,
                    // The queue dropped the call: it never does, but do
                    // not hang if it did.
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(shared.full().into()));
                    }
                    Poll::Pending => {
                        ready!(sleep.as_mut().poll(cx));
                        shared.reject("queue_timeout");
                        let err = QueueTimeout::new(*timeout, shared.full());
                        return Poll::Ready(Err(err.into()));
                    }
                };
                let mut svc = svc.take().expect("queued future polled after completion");
                let req = req.take().expect("queued future polled after completion");
                Some((permit, svc.call(req)))
            }
            StateProj::Rejected { err } => {
                return Poll::Ready(Err(err.take().expect("polled after completion")));
            }
        };
        if let Some((permit, fut)) = permit_and_call {
            state.set(State::Running {
                fut,
                permit: Some(permit),
            });
        }
        self.poll(cx)
    }
}
