//! Response future of [`GenericSingleFlight`](crate::GenericSingleFlight).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use flightdeck_core::{BoxError, Share};
use flightdeck_local::Answer;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::stage::Control;

pin_project! {
    /// Response future of [`GenericSingleFlight`](crate::GenericSingleFlight):
    /// a bypassed call (`B`, the inner service's call), a coalesced one
    /// (`F`, the flight), or an error known at `call` time; `Sh` restores
    /// each caller's response.
    pub struct ResponseFuture<B, F, Sh> {
        #[pin]
        kind: Kind<B, F>,
        share: Sh,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, F> {
        // BYPASS (timed: a real execution), or no key (not ours to count).
        Bypass { #[pin] fut: B, timed: Option<(Arc<Control>, Instant)> },
        Flight { #[pin] run: F },
        Failed { err: Option<BoxError> },
    }
}

impl<B, F, Sh> ResponseFuture<B, F, Sh> {
    pub(crate) fn bypass(fut: B, timed: Option<Arc<Control>>, share: Sh) -> Self {
        Self {
            kind: Kind::Bypass {
                fut,
                timed: timed.map(|ctl| (ctl, Instant::now())),
            },
            share,
        }
    }

    pub(crate) fn flight(run: F, share: Sh) -> Self {
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

impl<B, F, Sh> fmt::Debug for ResponseFuture<B, F, Sh> {
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

impl<B, F, Sh, T, E> Future for ResponseFuture<B, F, Sh>
where
    B: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    Sh: Share<T>,
    F: Future<Output = Result<Answer<Sh::Shared, Sh::Output>, BoxError>>,
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
