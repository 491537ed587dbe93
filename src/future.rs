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
use crate::stale::{Answered, MarkAnswer, Served};

/// How the store answered a caller's flight, if it answered it itself
/// (asked once the flight has ended), told whether this caller joined
/// another's flight (L2 counted the flight's own answer; a joiner's is
/// counted here).
pub(crate) type Marks = Box<dyn FnOnce(bool) -> Option<Served> + Send + Sync>;

/// A caller's output from its answer: the leader's own copy (its own
/// cookies, say); everybody else gets what strangers may get.
fn restore<T, Sh: Share<T>>(share: &Sh, answer: Answer<Sh::Shared, Sh::Output>) -> Sh::Output {
    match answer {
        Answer::Led(v) => share.restore_leader_owned(v),
        Answer::Shared(v) => share.restore(&v),
        Answer::Own(out) => out,
    }
}

pin_project! {
    /// Response future of [`GenericSingleFlight`](crate::GenericSingleFlight):
    /// a bypassed call (`B`, the inner service's call), a coalesced one
    /// (`F`, the flight), or an error known at `call` time; `Sh` restores
    /// each caller's response.
    ///
    /// `P` is the boxed future of the stale paths (a stage's kept copy,
    /// hit-for-pass, a flight raced against its soft timeout).
    pub struct ResponseFuture<B, F, P, Sh> {
        #[pin]
        kind: Kind<B, F, P>,
        share: Sh,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, F, P> {
        // BYPASS (timed: a real execution), or no key (not ours to count).
        Bypass { #[pin] fut: B, timed: Option<(Arc<Control>, Instant)> },
        // `headers`: the stage's `cache-status`; `marks`: how the store
        // answered the flight, when it answered it itself.
        Flight { #[pin] run: F, headers: bool, marks: Option<Marks> },
        // The stale paths: their answers say how they were served.
        Stale { #[pin] fut: P, headers: bool },
        Failed { err: Option<BoxError> },
    }
}

impl<B, F, P, Sh> ResponseFuture<B, F, P, Sh> {
    pub(crate) fn bypass(fut: B, timed: Option<Arc<Control>>, share: Sh) -> Self {
        Self {
            kind: Kind::Bypass {
                fut,
                timed: timed.map(|ctl| (ctl, Instant::now())),
            },
            share,
        }
    }

    pub(crate) fn flight(run: F, headers: bool, share: Sh) -> Self {
        Self {
            kind: Kind::Flight {
                run,
                headers,
                marks: None,
            },
            share,
        }
    }

    /// A flight whose answer the store may have given itself (a stale
    /// result, a hit): `marks` says so once it has ended.
    pub(crate) fn flight_marked(run: F, headers: bool, share: Sh, marks: Marks) -> Self {
        Self {
            kind: Kind::Flight {
                run,
                headers,
                marks: Some(marks),
            },
            share,
        }
    }

    pub(crate) fn stale(fut: P, headers: bool, share: Sh) -> Self {
        Self {
            kind: Kind::Stale { fut, headers },
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

impl<B, F, P, Sh> fmt::Debug for ResponseFuture<B, F, P, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Bypass { .. } => "bypass",
            Kind::Flight { .. } => "flight",
            Kind::Stale { .. } => "stale",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<B, F, P, Sh, T, E> Future for ResponseFuture<B, F, P, Sh>
where
    B: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    Sh: Share<T> + MarkAnswer<Sh::Output>,
    F: Future<Output = Result<Answer<Sh::Shared, Sh::Output>, BoxError>>,
    P: Future<Output = Result<Answered<Sh::Shared, Sh::Output>, BoxError>>,
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
            KindProj::Flight {
                run,
                headers,
                marks,
            } => {
                let headers = *headers;
                Poll::Ready(ready!(run.poll(cx)).map(|answer| {
                    let joined = matches!(answer, Answer::Shared(_));
                    // Taken (what it holds goes now), only when there is one.
                    let stored = if marks.is_some() {
                        marks.take().and_then(|m| m(joined))
                    } else {
                        None
                    };
                    let served = stored.unwrap_or(match &answer {
                        Answer::Shared(_) => Served::Collapsed,
                        _ => Served::Miss,
                    });
                    let mut out = restore(this.share, answer);
                    if headers || served.stale().is_some() {
                        this.share.mark(&mut out, served, headers);
                    }
                    out
                }))
            }
            KindProj::Stale { fut, headers } => {
                let headers = *headers;
                Poll::Ready(ready!(fut.poll(cx)).map(|(answer, served)| {
                    let mut out = restore(this.share, answer);
                    this.share.mark(&mut out, served, headers);
                    out
                }))
            }
            KindProj::Failed { err } => Poll::Ready(Err(err
                .take()
                .unwrap_or_else(|| "polled after completion".into()))),
        }
    }
}
