//! The response future of [`Key`](crate::Key).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::BoxError;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::extract::{Extracted, KeySlot};

pin_project! {
    /// Response future of [`Key`](crate::Key): first the pending extraction
    /// (if any), then the inner call.
    pub struct ResponseFuture<X, S, F> {
        #[pin]
        state: State<X, S, F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<X, S, F> {
        Extracting {
            #[pin]
            extraction: X,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            call: F,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<X, S, F> ResponseFuture<X, S, F> {
    pub(crate) fn extracting(extraction: X, inner: S) -> Self {
        Self {
            state: State::Extracting {
                extraction,
                inner: Some(inner),
            },
        }
    }

    pub(crate) fn calling(call: F) -> Self {
        Self {
            state: State::Calling { call },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<X, S, F> fmt::Debug for ResponseFuture<X, S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Extracting { .. } => "extracting",
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<X, S, F, R, T, E> Future for ResponseFuture<X, S, F>
where
    X: Future<Output = Result<Extracted<R>, BoxError>>,
    R: KeySlot,
    S: Service<R, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Extracting { extraction, inner } => {
                    let extracted = match ready!(extraction.poll(cx)) {
                        Ok(extracted) => extracted,
                        Err(err) => {
                            this.state.set(State::Failed { error: None });
                            return Poll::Ready(Err(err));
                        }
                    };
                    let Some(mut svc) = inner.take() else {
                        // Only reachable if polled after completion.
                        this.state.set(State::Failed { error: None });
                        continue;
                    };
                    let mut request = extracted.request;
                    request.set_decision(extracted.decision);
                    let call = svc.call(request);
                    this.state.set(State::Calling { call });
                }
                StateProj::Calling { call } => {
                    return call.poll(cx).map_err(Into::into);
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "key response future polled after completion".into())));
                }
            }
        }
    }
}
