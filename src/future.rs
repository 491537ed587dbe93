//! Response future of [`SingleFlight`](crate::SingleFlight): named, so the
//! facade adds no allocation of its own on the bypass and waiter paths (the
//! one boxed future per flight is the L1 leader's coordination, see
//! [`CoordinatorFuture`](crate::service::CoordinatorFuture)).
//!
//! ```
//! use flightdeck::future::ResponseFuture;
//! use flightdeck::service::{Coordinator, Keyed};
//! use flightdeck::share::Flown;
//!
//! // It is the `Future` of `SingleFlight`'s `Service` impl.
//! fn named<S, Req, Sh, C, F>(_: &ResponseFuture<S, Req, Sh, C, F>)
//! where
//!     S: tower::Service<Req>,
//!     Sh: flightdeck::core::Share<S::Response>,
//!     Coordinator<S, Sh, C, F>: tower::Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
//! {
//! }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::{BoxError, Share};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::util::Oneshot;
use tower_service::Service;

use crate::service::{Coordinator, Keyed};
use crate::share::{Flown, FlownShare};

/// L1's future over the coordinator.
type LocalFuture<S, Req, Sh, C, F> = flightdeck_local::future::ResponseFuture<
    Coordinator<S, Sh, C, F>,
    Keyed<Req>,
    FlownShare<<Sh as flightdeck_core::SharedForm>::Shared>,
>;

pin_project! {
    /// Response future of [`SingleFlight`](crate::SingleFlight): a bypassed
    /// call, a coalesced one (L1, whose leader coordinates), or an error
    /// known at `call` time.
    pub struct ResponseFuture<S, Req, Sh, C, F>
    where
        S: Service<Req>,
        Sh: Share<S::Response>,
        Coordinator<S, Sh, C, F>: Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
    {
        #[pin]
        kind: Kind<S, Req, Sh, C, F>,
        share: Sh,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, Req, Sh, C, F>
    where
        S: Service<Req>,
        Sh: Share<S::Response>,
        Coordinator<S, Sh, C, F>: Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
    {
        Bypass { #[pin] fut: Oneshot<S, Req> },
        // `until`: the caller's own deadline (boxed: most requests have
        // none, and the future stays small for them).
        Flight { #[pin] fut: LocalFuture<S, Req, Sh, C, F>, until: Option<Pin<Box<Sleep>>> },
        Failed { err: Option<BoxError> },
    }
}

impl<S, Req, Sh, C, F> ResponseFuture<S, Req, Sh, C, F>
where
    S: Service<Req>,
    Sh: Share<S::Response>,
    Coordinator<S, Sh, C, F>: Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
{
    pub(crate) fn bypass(fut: Oneshot<S, Req>, share: Sh) -> Self {
        Self {
            kind: Kind::Bypass { fut },
            share,
        }
    }

    pub(crate) fn flight(
        fut: LocalFuture<S, Req, Sh, C, F>,
        share: Sh,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            kind: Kind::Flight {
                fut,
                until: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            },
            share,
        }
    }

    pub(crate) fn failed(err: BoxError, share: Sh) -> Self {
        Self {
            kind: Kind::Failed { err: Some(err) },
            share,
        }
    }
}

impl<S, Req, Sh, C, F> fmt::Debug for ResponseFuture<S, Req, Sh, C, F>
where
    S: Service<Req>,
    Sh: Share<S::Response>,
    Coordinator<S, Sh, C, F>: Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Bypass { .. } => "bypass",
            Kind::Flight { .. } => "flight",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<S, Req, Sh, C, F> Future for ResponseFuture<S, Req, Sh, C, F>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
    Coordinator<S, Sh, C, F>: Service<Keyed<Req>, Response = Flown<Sh::Shared, Sh::Output>>,
    <Coordinator<S, Sh, C, F> as Service<Keyed<Req>>>::Error: Into<BoxError>,
{
    type Output = Result<Sh::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Bypass { fut } => {
                let res = ready!(fut.poll(cx));
                Poll::Ready(res.map(|v| this.share.passthrough(v)).map_err(Into::into))
            }
            KindProj::Flight { fut, until } => {
                let res = match fut.poll(cx) {
                    Poll::Ready(res) => res,
                    Poll::Pending => {
                        // The caller leaves at its deadline; the flight goes
                        // on for the others (a waiter leaving never ends it).
                        if let Some(until) = until {
                            ready!(until.as_mut().poll(cx));
                            return Poll::Ready(Err(Box::new(DeadlineExceeded::new("request"))));
                        }
                        return Poll::Pending;
                    }
                };
                Poll::Ready(res.map(|flown| match flown {
                    Flown::Shared(v) => this.share.restore(&v),
                    Flown::Output(o) => o,
                }))
            }
            KindProj::Failed { err } => Poll::Ready(Err(err
                .take()
                .unwrap_or_else(|| "polled after completion".into()))),
        }
    }
}
