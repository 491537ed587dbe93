//! The tower service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::BoxError;
use tower_service::Service;

use crate::future::{ResponseFuture, Waiting};
use crate::shared::{Acquire, Admission, BulkheadHandle, Shared};

/// A service behind a bulkhead (see [`BulkheadLayer`](crate::BulkheadLayer)).
///
/// Readiness is the inner service's; the bulkhead decides in `call`, so a
/// full bulkhead rejects at once even where `poll_ready` is not awaited
/// (axum), and a clone never inherits a reserved slot. A queued call holds
/// the ready inner service (a clone takes its place) until it gets a slot;
/// that is why `S: Clone`.
#[derive(Clone)]
pub struct Bulkhead<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Bulkhead<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The shared handle.
    pub fn handle(&self) -> BulkheadHandle {
        BulkheadHandle {
            shared: self.shared.clone(),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Bulkhead<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("inner", &self.inner)
            .field("handle", &self.handle())
            .finish()
    }
}

impl<S, Req> Service<Req> for Bulkhead<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        // Every branch hands back plain values (a permit, a box, an error)
        // and the future is built here from them: a branch returning a
        // whole future by pointer would make the compiler build it in a
        // temporary and copy it, on the fast path too.
        let permit = match self.shared.try_admit() {
            Some(permit) => permit,
            None => match self.shared.admit() {
                Ok(Admission::Now(permit)) => permit,
                Ok(Admission::Queued(slot)) => {
                    return ResponseFuture::queued(self.wait(slot, req));
                }
                Err(e) => return ResponseFuture::rejected(e),
            },
        };
        ResponseFuture::running(self.inner.call(req), permit)
    }
}

impl<S> Bulkhead<S> {
    /// A queued call: the ready service goes with the request; a fresh
    /// clone stays here and must be polled ready before its next call.
    /// Out of line, so the fast path above stays small enough to inline.
    #[inline(never)]
    fn wait<Req>(&mut self, slot: Acquire, req: Req) -> Box<Waiting<S, Req>>
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let timeout = self.shared.queue.map(|(_, t)| t).unwrap_or_default();
        Waiting::boxed(slot, ready, req, timeout, self.shared.clone())
    }
}
