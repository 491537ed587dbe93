use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::{BoxError, Share, SharedForm};
use tower_service::Service;
use tracing::Instrument;

use crate::future::ResponseFuture;
use crate::group::{Completion, Group, Join, Outcome, Work};
use crate::key::KeyExtractor;

/// The service built by [`LocalFlightLayer`](crate::LocalFlightLayer).
pub struct LocalFlight<S, K, Sh: SharedForm> {
    inner: S,
    key: K,
    share: Sh,
    group: Arc<Group<Sh::Shared>>,
}

impl<S, K, Sh: SharedForm> LocalFlight<S, K, Sh> {
    pub(crate) fn from_parts(inner: S, key: K, share: Sh, group: Arc<Group<Sh::Shared>>) -> Self {
        Self {
            inner,
            key,
            share,
            group,
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

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone, Sh: SharedForm> Clone for LocalFlight<S, K, Sh> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            share: self.share.clone(),
            group: Arc::clone(&self.group),
        }
    }
}

impl<S: fmt::Debug, K, Sh: SharedForm + fmt::Debug> fmt::Debug for LocalFlight<S, K, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFlight")
            .field("inner", &self.inner)
            .field("share", &self.share)
            .finish_non_exhaustive()
    }
}

impl<S, K, Sh, Req> Service<Req> for LocalFlight<S, K, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    K: KeyExtractor<Req>,
    Sh: Share<S::Response>,
    Req: Send + 'static,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Sh>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(key) = self.key.key(&req) else {
            return ResponseFuture::bypass(self.inner.call(req), self.share.clone());
        };
        // Only waiters and leaders have a flight to trace.
        let span = |role: &'static str| {
            tracing::debug_span!(
                "flight",
                role,
                stage = %key.stage(),
                key = %key.digest().short(),
            )
        };
        match self.group.join(&key) {
            Join::Replay(value) => {
                ResponseFuture::ready(Ok(self.share.restore(&value)), self.share.clone())
            }
            Join::Rejected(err) => ResponseFuture::ready(Err(err), self.share.clone()),
            Join::Waiter(flight, metrics, rx, since) => {
                // The waiter keeps its request and an (unready) clone of the
                // service, in case the result cannot be shared and it must
                // run alone.
                let fallback = (self.inner.clone(), req);
                ResponseFuture::wait(
                    Arc::clone(&self.group),
                    flight,
                    metrics,
                    rx,
                    since,
                    fallback,
                    span("waiter"),
                    self.share.clone(),
                )
            }
            Join::Leader(flight, metrics, expired) => {
                // Armed before calling the inner service (or dropping the
                // result it replaced): if `call` itself panics, waiters that
                // already joined get `WorkPanicked`.
                let completion = Completion::new(Arc::clone(&self.group), flight, metrics);
                completion.started();
                drop(expired);
                let fut = run(self.inner.call(req), self.share.clone());
                // A disabled span is not worth a wrapper polled every time.
                let span = span("leader");
                let work = if span.is_disabled() {
                    Work::new(completion, fut)
                } else {
                    Work::new(completion, fut.instrument(span))
                };
                ResponseFuture::lead(work, self.share.clone())
            }
        }
    }
}

/// The work of a flight: runs the inner future and shares its result.
async fn run<F, T, E, Sh>(work: F, share: Sh) -> Outcome<Sh::Shared>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    Sh: Share<T>,
{
    // Convert the error before anything else is awaited: `E` need not be
    // `Send`, `BoxError` is.
    let result = work.await.map_err(Into::into);
    match result {
        Ok(resp) => match share.share(resp).await {
            Ok(flightdeck_core::Shareable::Shared(v)) => Outcome::Value(v),
            Ok(flightdeck_core::Shareable::Unshared(o, _)) => Outcome::Unshared(Some(Box::new(o))),
            Err(e) => Outcome::Error(flightdeck_core::SharedError::new(e)),
        },
        Err(e) => Outcome::Error(flightdeck_core::SharedError::new(e)),
    }
}
