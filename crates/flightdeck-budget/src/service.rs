//! The tower service.

use std::task::{Context, Poll};

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::time::later;
use flightdeck_core::BoxError;
use tokio::time::Instant;
use tower_service::Service;

use crate::deadline::{Deadline, Phase};
use crate::future::ResponseFuture;
use crate::inbound::Inbound;
use crate::layer::BudgetLayer;

/// A service with a time budget (see [`BudgetLayer`]).
#[derive(Debug, Clone)]
pub struct Budget<S, X> {
    inner: S,
    cfg: BudgetLayer<X>,
}

impl<S, X> Budget<S, X> {
    /// Wraps `inner` with the settings of `layer`.
    pub fn new(inner: S, layer: BudgetLayer<X>) -> Self {
        Self { inner, cfg: layer }
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

impl<S, X, Req> Service<Req> for Budget<S, X>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    X: Inbound<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let now = Instant::now();
        let inbound = match self.cfg.inbound.inbound(&req) {
            Ok(d) => d,
            Err(e) => return ResponseFuture::failed(e.into()),
        };
        let mut at = later(now, self.cfg.total);
        if let Some(d) = inbound {
            at = at.min(later(now, d));
        }
        let mut deadline = Deadline::new(at, self.cfg.slices);
        if let Some(outer) = self.cfg.inbound.existing(&req) {
            deadline = deadline.min(outer);
        }
        if deadline.remaining_at(now).is_zero() {
            return ResponseFuture::failed(DeadlineExceeded::new("request").into());
        }
        self.cfg.inbound.attach(&mut req, deadline);
        let end = now + deadline.slice_at(Phase::Execution, now);
        ResponseFuture::running(self.inner.call(req), end)
    }
}
