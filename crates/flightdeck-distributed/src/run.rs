//! [`Run`]: one request's coordination as [`DistributedFlights::start`]
//! hands it out, as small as the path it takes.
//!
//! [`DistributedFlights::start`]: crate::DistributedFlights::start

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use flightdeck_core::error::BoxError;
use flightdeck_core::Shareable;
use pin_project_lite::pin_project;

/// A coordinated flight's future: boxed, it owns everything it needs.
pub(crate) type FlightFuture<T, O> =
    Pin<Box<dyn Future<Output = Result<Shareable<T, O>, BoxError>> + Send>>;

pin_project! {
    /// One request's coordination (see
    /// [`DistributedFlights::start`](crate::DistributedFlights::start)):
    /// decided before any call, when the backend's breaker refused the
    /// flight (the fallback's verdict: the request's own execution here,
    /// not boxed, or its error), or the flight itself, boxed.
    pub struct Run<H, T, O> {
        #[pin]
        path: Path<H, T, O>,
    }
}

pin_project! {
    #[project = PathProj]
    enum Path<H, T, O> {
        // Refused before any call; the fallback said run it here.
        Here { #[pin] fut: H },
        // Refused before any call; the fallback's error (taken when polled).
        Failed { error: Option<BoxError> },
        // Coordinated through the backend.
        Flight { fut: FlightFuture<T, O> },
    }
}

impl<H, T, O> Run<H, T, O> {
    pub(crate) fn here(fut: H) -> Self {
        Self {
            path: Path::Here { fut },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            path: Path::Failed { error: Some(error) },
        }
    }

    pub(crate) fn flight(fut: FlightFuture<T, O>) -> Self {
        Self {
            path: Path::Flight { fut },
        }
    }

    /// Whether the flight went to the backend (not refused before any
    /// call).
    pub fn is_flight(&self) -> bool {
        matches!(self.path, Path::Flight { .. })
    }
}

impl<H, T, O> Future for Run<H, T, O>
where
    H: Future<Output = Result<Shareable<T, O>, BoxError>>,
{
    type Output = H::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().path.project() {
            PathProj::Here { fut } => fut.poll(cx),
            PathProj::Failed { error } => Poll::Ready(Err(error
                .take()
                .expect("a refused flight is polled once"))),
            PathProj::Flight { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl<H, T, O> std::fmt::Debug for Run<H, T, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = match self.path {
            Path::Here { .. } => "here",
            Path::Failed { .. } => "failed",
            Path::Flight { .. } => "flight",
        };
        f.debug_struct("Run").field("path", &path).finish()
    }
}
