//! Response future of [`DistributedFlight`](crate::DistributedFlight): a
//! bypassed call is polled in place; a coordinated flight is one boxed
//! future (it spends its time in network round trips).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::error::BoxError;
use flightdeck_core::share::Share;
use pin_project_lite::pin_project;

pub(crate) type FlightFuture<O> = Pin<Box<dyn Future<Output = Result<O, BoxError>> + Send>>;

pin_project! {
    /// Either a bypassed call (no key) or one flight's coordination.
    pub struct ResponseFuture<F, Sh, O> {
        #[pin]
        kind: Kind<F, Sh, O>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, Sh, O> {
        Bypass {
            #[pin]
            fut: F,
            share: Sh,
        },
        // Coordination involves network round trips; one allocation per
        // flight is noise next to them.
        Flight {
            fut: FlightFuture<O>,
        },
    }
}

impl<F, Sh, O> ResponseFuture<F, Sh, O> {
    pub(crate) fn bypass(fut: F, share: Sh) -> Self {
        Self {
            kind: Kind::Bypass { fut, share },
        }
    }

    pub(crate) fn flight(fut: FlightFuture<O>) -> Self {
        Self {
            kind: Kind::Flight { fut },
        }
    }
}

impl<F, Sh, O> fmt::Debug for ResponseFuture<F, Sh, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Bypass { .. } => "bypass",
            Kind::Flight { .. } => "flight",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, T, E, Sh> Future for ResponseFuture<F, Sh, Sh::Output>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    Sh: Share<T>,
{
    type Output = Result<Sh::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Bypass { fut, share } => {
                let res = ready!(fut.poll(cx));
                Poll::Ready(res.map(|v| share.passthrough(v)).map_err(Into::into))
            }
            KindProj::Flight { fut } => fut.as_mut().poll(cx),
        }
    }
}
