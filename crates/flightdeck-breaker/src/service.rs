//! The tower service.

use std::task::{Context, Poll};

use flightdeck_core::BoxError;
use tower_service::Service;

use crate::breaker::Breaker;
use crate::classify::{Classify, ErrIsFailure};
use crate::future::ResponseFuture;

/// A service guarded by a circuit breaker (see [`CircuitBreakerLayer`](crate::CircuitBreakerLayer)).
///
/// Readiness is the inner service's: the breaker decides in `call`, so a
/// rejection is immediate even where `poll_ready` is not awaited (axum).
#[derive(Debug, Clone)]
pub struct CircuitBreaker<S, C = ErrIsFailure> {
    inner: S,
    breaker: Breaker,
    classifier: C,
}

impl<S, C> CircuitBreaker<S, C> {
    /// Wraps `inner` with `breaker`.
    pub fn new(inner: S, breaker: Breaker, classifier: C) -> Self {
        Self {
            inner,
            breaker,
            classifier,
        }
    }

    /// The shared breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
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

impl<S, C, Req> Service<Req> for CircuitBreaker<S, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.breaker.try_acquire() {
            Ok(permit) => {
                ResponseFuture::running(self.inner.call(req), permit, self.classifier.clone())
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}
