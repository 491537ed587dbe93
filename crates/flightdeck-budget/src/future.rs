//! The response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::BoxError;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};

pin_project! {
    /// Response future of [`Budget`](crate::Budget): the inner call bounded
    /// by the execution slice, or an immediate error (budget already spent,
    /// malformed inbound timeout).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F> {
        Running {
            #[pin]
            fut: F,
            #[pin]
            sleep: Sleep,
        },
        Failed {
            err: Option<BoxError>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn running(fut: F, end: Instant) -> Self {
        Self {
            kind: Kind::Running {
                fut,
                sleep: sleep_until(end),
            },
        }
    }

    pub(crate) fn failed(err: BoxError) -> Self {
        Self {
            kind: Kind::Failed { err: Some(err) },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Running { fut, sleep } => {
                if let Poll::Ready(out) = fut.poll(cx) {
                    return Poll::Ready(out.map_err(Into::into));
                }
                match sleep.poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(DeadlineExceeded::new("execution").into())),
                    Poll::Pending => Poll::Pending,
                }
            }
            KindProj::Failed { err } => {
                Poll::Ready(Err(err.take().expect("polled after completion")))
            }
        }
    }
}
