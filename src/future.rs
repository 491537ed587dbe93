//! Response future of [`SingleFlight`](crate::SingleFlight).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::{BoxError, Serves, Share};
use flightdeck_distributed::{Fence, ResultCodec};
use flightdeck_local::future::Run;
use flightdeck_local::Answer;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::util::Oneshot;
use tower_service::Service;

use crate::leader::Leader;
use crate::stage::Control;

pin_project! {
    /// Response future of [`SingleFlight`](crate::SingleFlight): a bypassed
    /// call, a coalesced one, or an error known at `call` time.
    pub struct ResponseFuture<S, Req, Sh, C, F>
    where
        S: Service<Req>,
        S: Clone,
        S: Send,
        S: 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
        Req: Send,
        Req: 'static,
        Sh: Share<S::Response>,
        Sh: Serves<Req>,
        C: ResultCodec<Sh::Shared>,
        F: Fence<Req>,
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
        S: Clone,
        S: Send,
        S: 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
        Req: Send,
        Req: 'static,
        Sh: Share<S::Response>,
        Sh: Serves<Req>,
        C: ResultCodec<Sh::Shared>,
        F: Fence<Req>,
    {
        // BYPASS (timed: a real execution), or no key (not ours to count).
        Bypass { #[pin] fut: Oneshot<S, Req>, timed: Option<(std::sync::Arc<Control>, Instant)> },
        Flight { #[pin] run: Run<Sh::Shared, Leader<S, Req, Sh, C, F>> },
        Failed { err: Option<BoxError> },
    }
}

impl<S, Req, Sh, C, F> ResponseFuture<S, Req, Sh, C, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    Req: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
{
    pub(crate) fn bypass(
        fut: Oneshot<S, Req>,
        timed: Option<std::sync::Arc<Control>>,
        share: Sh,
    ) -> Self {
        Self {
            kind: Kind::Bypass {
                fut,
                timed: timed.map(|ctl| (ctl, Instant::now())),
            },
            share,
        }
    }

    pub(crate) fn flight(run: Run<Sh::Shared, Leader<S, Req, Sh, C, F>>, share: Sh) -> Self {
        Self {
            kind: Kind::Flight { run },
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
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    Req: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
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
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    Req: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
{
    type Output = Result<Sh::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Bypass { fut, timed } => {
                let res = ready!(fut.poll(cx));
                if let Some((ctl, started)) = timed.take() {
                    ctl.record_execution(started.elapsed());
                }
                Poll::Ready(res.map(|v| this.share.passthrough(v)).map_err(Into::into))
            }
            KindProj::Flight { run } => {
                Poll::Ready(ready!(run.poll(cx)).map(|answer| match answer {
                    // The leader's own copy (its own cookies, say); everybody
                    // else gets what strangers may get.
                    Answer::Led(v) => this.share.restore_leader_owned(v),
                    Answer::Shared(v) => this.share.restore(&v),
                    Answer::Own(out) => out,
                }))
            }
            KindProj::Failed { err } => Poll::Ready(Err(err
                .take()
                .unwrap_or_else(|| "polled after completion".into()))),
        }
    }
}
