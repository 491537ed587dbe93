use std::fmt;
use std::future::Future;
use std::task::{Context, Poll};

use flightdeck_core::error::BoxError;
use flightdeck_core::{KeySource, Serves, Share, Shareable, SharedForm};
use tokio::time::Instant;
use tower::util::ServiceExt;
use tower_service::Service;
use tracing::Instrument;

use crate::backend::Backend;
use crate::codec::ResultCodec;
use crate::fallback::Fallback;
use crate::future::ResponseFuture;
use crate::layer::DistributedFlightLayer;
use crate::work::{Execute, Fence, Role};

/// The service built by
/// [`DistributedFlightLayer`].
pub struct DistributedFlight<S, B, Sh, C, K, F, P> {
    pub(crate) inner: S,
    pub(crate) layer: DistributedFlightLayer<B, Sh, C, K, F, P>,
}

impl<S, B, Sh, C, K, F, P> DistributedFlight<S, B, Sh, C, K, F, P> {
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

impl<S: Clone, B, Sh: Clone, C, K: Clone, F: Clone, P> Clone
    for DistributedFlight<S, B, Sh, C, K, F, P>
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, B, Sh, C, K, F, P> fmt::Debug for DistributedFlight<S, B, Sh, C, K, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedFlight")
            .field("inner", &self.inner)
            .field("flights", &self.layer.flights)
            .finish_non_exhaustive()
    }
}

impl<S, Req, B, Sh, C, K, F, P> Service<Req> for DistributedFlight<S, B, Sh, C, K, F, P>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    B: Backend,
    Sh: Share<S::Response> + Serves<Req>,
    C: ResultCodec<<Sh as SharedForm>::Shared>,
    K: KeySource<Req>,
    F: Fence<Req>,
    P: Fallback<Req> + 'static,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, Sh, Sh::Output>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let share = self.layer.share.clone();
        let Some(key) = self.layer.keys.key(&req) else {
            return ResponseFuture::bypass(self.inner.call(req), share);
        };
        // The ready service runs the request; the clone takes its place
        // (tower-service's "be careful when cloning inner services").
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        // The span carries the stage and a short digest, never the raw key.
        let span = tracing::debug_span!(
            "distributed_flight",
            stage = %key.stage(),
            key = %key.digest().short(),
        );
        let flights = self.layer.flights.clone();
        let fallback = std::sync::Arc::clone(&self.layer.fallback);
        let exec = ServiceExec {
            svc,
            share: share.clone(),
            fence: self.layer.fence.clone(),
            metrics: flights.st.metrics.get(key.stage()),
        };
        ResponseFuture::flight(Box::pin(
            async move {
                let answer = flights.run(&key, req, exec, &*fallback).await?;
                // This caller's own result (it owned the flight), or one
                // another node stored (holding nothing meant for one caller
                // alone): the caller's own copy either way.
                Ok(match answer {
                    Shareable::Shared(v) => share.restore_leader_owned(v),
                    Shareable::Unshared(out, _) => out,
                })
            }
            .instrument(span),
        ))
    }
}

/// The inner service as the flight's work: fenced when it runs as the
/// owner, timed (`singleflight_execution_duration`) for every run.
struct ServiceExec<S, Sh, F> {
    svc: S,
    share: Sh,
    fence: F,
    metrics: std::sync::Arc<crate::metrics::StageMetrics>,
}

impl<S, Req, Sh, F> Execute<Req> for ServiceExec<S, Sh, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    F: Fence<Req>,
{
    type Shared = Sh::Shared;
    type Output = Sh::Output;

    fn execute(
        self,
        mut req: Req,
        role: Role,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send {
        let Self {
            svc,
            share,
            fence,
            metrics,
        } = self;
        if let Role::Owner(token) = role {
            fence.fence(&mut req, token);
        }
        let leader = share.leader(&req);
        let call = svc.oneshot(req);
        async move {
            let started = Instant::now();
            let resp = call.await.map_err(Into::into);
            let secs = started.elapsed().as_secs_f64();
            metrics.with(|m| m.execution.record(secs));
            Ok(match share.share(resp?).await? {
                Shareable::Shared(v) => Shareable::Shared(share.record(v, leader)),
                unshared => unshared,
            })
        }
    }

    fn serves(&self, shared: &Sh::Shared, req: &Req) -> bool {
        self.share.serves(shared, req)
    }
}
