//! The tower service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::BoxError;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::shared::{Admission, BulkheadHandle, Shared};

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
        match self.shared.try_admit() {
            Some(permit) => ResponseFuture::running(self.inner.call(req), permit),
            None => self.call_slow(req),
        }
    }
}

impl<S> Bulkhead<S> {
    /// Rate limit, queue or rejection: kept out of line so the fast path
    /// above stays small enough to inline.
    #[inline(never)]
    fn call_slow<Req>(&mut self, req: Req) -> ResponseFuture<S::Future, S, Req>
    where
        S: Service<Req> + Clone,
    {
        match self.shared.admit() {
            Ok(Admission::Now(permit)) => ResponseFuture::running(self.inner.call(req), permit),
            Ok(Admission::Queued(rx)) => {
                // The ready service goes with the request; a fresh clone
                // stays here and must be polled ready before its next call.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let timeout = self.shared.queue.map(|(_, t)| t).unwrap_or_default();
                ResponseFuture::queued(rx, ready, req, timeout, self.shared.clone())
            }
            Err(e) => ResponseFuture::rejected(e),
        }
    }
}
