//! The response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::error::CircuitOpen;
use flightdeck_core::BoxError;
use pin_project_lite::pin_project;

use crate::breaker::Permit;
use crate::classify::Classify;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker): the
    /// inner call, whose result is recorded when it finishes, or an
    /// immediate `CircuitOpen` error. Dropping it before it finishes
    /// records nothing (and frees a half-open probe slot).
    #[derive(Debug)]
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F, C> {
        Running {
            #[pin]
            fut: F,
            permit: Option<Permit>,
            classifier: C,
        },
        Rejected {
            err: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn running(fut: F, permit: Permit, classifier: C) -> Self {
        Self {
            kind: Kind::Running {
                fut,
                permit: Some(permit),
                classifier,
            },
        }
    }

    pub(crate) fn rejected(err: CircuitOpen) -> Self {
        Self {
            kind: Kind::Rejected { err: Some(err) },
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: Classify<T>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Running {
                fut,
                permit,
                classifier,
            } => {
                let result = ready!(fut.poll(cx)).map_err(Into::into);
                if let Some(permit) = permit.take() {
                    permit.record(classifier.classify(result.as_ref()));
                }
                Poll::Ready(result)
            }
            KindProj::Rejected { err } => Poll::Ready(Err(err
                .take()
                .expect("ResponseFuture polled after completion")
                .into())),
        }
    }
}
