use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::error::BoxError;
use flightdeck_core::share::{Share, SharedForm};
use tower_service::Service;
use tracing::Instrument;

use crate::backend::Backend;
use crate::codec::ResultCodec;
use crate::future::ResponseFuture;
use crate::layer::Flights;
use crate::request::FlightRequest;

/// The service built by
/// [`DistributedFlightLayer`](crate::DistributedFlightLayer).
pub struct DistributedFlight<S, B, Sh, C, K> {
    pub(crate) inner: S,
    pub(crate) state: Arc<Flights<B, Sh, C, K>>,
}

impl<S, B, Sh, C, K> DistributedFlight<S, B, Sh, C, K> {
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

impl<S: Clone, B, Sh, C, K> Clone for DistributedFlight<S, B, Sh, C, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: self.state.clone(),
        }
    }
}

impl<S: fmt::Debug, B, Sh, C, K> fmt::Debug for DistributedFlight<S, B, Sh, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedFlight")
            .field("inner", &self.inner)
            .field("policy", &self.state.policy)
            .finish_non_exhaustive()
    }
}

impl<S, Req, B, Sh, C, K> Service<Req> for DistributedFlight<S, B, Sh, C, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    B: Backend,
    Sh: Share<S::Response>,
    C: ResultCodec<<Sh as SharedForm>::Shared>,
    K: FlightRequest<Req>,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, Sh, Sh::Output>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(key) = self.state.keys.key(&req) else {
            return ResponseFuture::bypass(self.inner.call(req), self.state.share.clone());
        };
        // The ready service runs the request; the clone takes its place
        // (tower-service's "be careful when cloning inner services").
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // The span carries the stage and a short digest, never the raw key.
        let span = tracing::debug_span!(
            "distributed_flight",
            stage = %key.stage(),
            key = %key.digest().short(),
        );
        ResponseFuture::flight(Box::pin(
            crate::flow::run(self.state.clone(), inner, req, key).instrument(span),
        ))
    }
}
