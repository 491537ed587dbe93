//! Response future of [`LocalFlight`](crate::LocalFlight), and of
//! [`LocalFlights::run`](crate::LocalFlights::run).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use flightdeck_core::{BoxError, Serves, Share};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::run::Answer;
pub use crate::run::Run;
use crate::service::ServiceWork;

pin_project! {
    /// Response future of [`LocalFlight`](crate::LocalFlight): a bypassed
    /// call (no key) polls the inner future in place; a coalesced one is a
    /// [`Run`], whose shared result is restored for this caller.
    pub struct ResponseFuture<S, Req, Sh>
    where
        S: Service<Req>,
        S: Clone,
        S: Send,
        S: 'static,
        S::Future: Send,
        S::Future: 'static,
        S::Error: Into<BoxError>,
        S::Response: Send,
        S::Response: 'static,
        Sh: Share<S::Response>,
        Sh: Serves<Req>,
        Req: Send,
        Req: 'static,
    {
        #[pin]
        kind: Kind<S, Req, Sh>,
        share: Sh,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, Req, Sh>
    where
        S: Service<Req>,
        S: Clone,
        S: Send,
        S: 'static,
        S::Future: Send,
        S::Future: 'static,
        S::Error: Into<BoxError>,
        S::Response: Send,
        S::Response: 'static,
        Sh: Share<S::Response>,
        Sh: Serves<Req>,
        Req: Send,
        Req: 'static,
    {
        Bypass { #[pin] fut: S::Future },
        Flight { #[pin] run: Run<Sh::Shared, ServiceWork<S, Req, Sh>> },
    }
}

impl<S, Req, Sh> ResponseFuture<S, Req, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    pub(crate) fn bypass(fut: S::Future, share: Sh) -> Self {
        Self {
            kind: Kind::Bypass { fut },
            share,
        }
    }

    pub(crate) fn flight(run: Run<Sh::Shared, ServiceWork<S, Req, Sh>>, share: Sh) -> Self {
        Self {
            kind: Kind::Flight { run },
            share,
        }
    }
}

impl<S, Req, Sh> fmt::Debug for ResponseFuture<S, Req, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Bypass { .. } => "bypass",
            Kind::Flight { .. } => "flight",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<S, Req, Sh> Future for ResponseFuture<S, Req, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    type Output = Result<Sh::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Bypass { fut } => fut
                .poll(cx)
                .map(|r| r.map(|v| this.share.passthrough(v)).map_err(Into::into)),
            KindProj::Flight { run } => run.poll(cx).map(|r| {
                r.map(|answer| match answer {
                    Answer::Led(v) => this.share.restore_leader_owned(v),
                    Answer::Shared(v) => this.share.restore(&v),
                    Answer::Own(out) => out,
                })
            }),
        }
    }
}
