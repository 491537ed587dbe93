use std::fmt;
use std::future::Future;
use std::task::{Context, Poll};

use flightdeck_core::{BoxError, KeySource, Serves, Share, Shareable, SharedForm, Unshareable};
use tower::util::ServiceExt;
use tower_service::Service;

use crate::flights::{Caller, FlightWork, LocalFlights};
use crate::future::ResponseFuture;

/// The service built by [`LocalFlightLayer`](crate::LocalFlightLayer).
///
/// Readiness is passed through: `poll_ready` polls the inner service, and
/// the ready service runs the flight a call leads. A call that joins
/// another flight waits without holding a reservation (it keeps an unready
/// clone, in case it must run its own request).
pub struct LocalFlight<S, K, Sh: SharedForm> {
    inner: S,
    keys: K,
    share: Sh,
    flights: LocalFlights<Sh::Shared>,
}

impl<S, K, Sh: SharedForm> LocalFlight<S, K, Sh> {
    pub(crate) fn from_parts(
        inner: S,
        keys: K,
        share: Sh,
        flights: LocalFlights<Sh::Shared>,
    ) -> Self {
        Self {
            inner,
            keys,
            share,
            flights,
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
            keys: self.keys.clone(),
            share: self.share.clone(),
            flights: self.flights.clone(),
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
    K: KeySource<Req>,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Sh>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(key) = self.keys.key(&req) else {
            return ResponseFuture::bypass(self.inner.call(req), self.share.clone());
        };
        // The ready service goes with the request; an unready clone takes
        // its place (tower-service's "be careful when cloning inner
        // services").
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        let work = ServiceWork {
            svc,
            req,
            share: self.share.clone(),
        };
        ResponseFuture::flight(
            self.flights.run(&key, Caller::new(), work),
            self.share.clone(),
        )
    }
}

/// A call of the inner service as a flight's work.
pub struct ServiceWork<S, Req, Sh> {
    svc: S,
    req: Req,
    share: Sh,
}

impl<S, Req, Sh> FlightWork<Sh::Shared> for ServiceWork<S, Req, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    type Output = Sh::Output;

    fn lead(
        self,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let Self {
            mut svc,
            req,
            share,
        } = self;
        let leader = share.leader(&req);
        // Called at once, as tower expects of a service polled ready.
        let fut = svc.call(req);
        async move {
            // Converted before anything else is awaited: `S::Error` need not
            // be `Send`, `BoxError` is.
            let resp = fut.await.map_err(Into::into)?;
            Ok(match share.share(resp).await? {
                Shareable::Shared(v) => Shareable::Shared(share.record(v, leader)),
                unshared => unshared,
            })
        }
    }

    fn alone(
        self,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let Self { svc, req, share } = self;
        let fut = svc.oneshot(req);
        async move {
            let resp = fut.await.map_err(Into::into)?;
            Ok(Shareable::Unshared(
                share.passthrough(resp),
                Unshareable::Other("alone"),
            ))
        }
    }

    fn waiting(&mut self) {
        // The ready service's reservation is not held while waiting.
        self.svc = self.svc.clone();
    }

    fn serves(&self, shared: &Sh::Shared) -> bool {
        self.share.serves(shared, &self.req)
    }
}

impl<S, Req, Sh> fmt::Debug for ServiceWork<S, Req, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServiceWork")
    }
}
