use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_core::BoxError;
use tower_service::Service;

use crate::extract::{Extraction, KeyExtractor, KeySlot};
use crate::future::ResponseFuture;
use crate::layer::KeyLayer;

/// The service made by [`KeyLayer`]: computes each request's key, stores it
/// on the request, then calls the inner service.
pub struct Key<S, E> {
    inner: S,
    extractor: Arc<E>,
}

impl<S, E> Key<S, E> {
    /// Wraps `inner`, keying requests with `extractor`.
    pub fn new(inner: S, extractor: E) -> Self {
        Self::from_arc(inner, Arc::new(extractor))
    }

    pub(crate) fn from_arc(inner: S, extractor: Arc<E>) -> Self {
        Self { inner, extractor }
    }

    /// A [`KeyLayer`] with this extractor.
    pub fn layer(extractor: E) -> KeyLayer<E> {
        KeyLayer::new(extractor)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, E> Clone for Key<S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            extractor: Arc::clone(&self.extractor),
        }
    }
}

impl<S: fmt::Debug, E: fmt::Debug> fmt::Debug for Key<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("inner", &self.inner)
            .field("extractor", &self.extractor)
            .finish()
    }
}

impl<S, E, Req> Service<Req> for Key<S, E>
where
    E: KeyExtractor<Req>,
    S: Service<E::Request> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<E::Future, S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.extractor.extract(req) {
            Extraction::Ready(Ok(extracted)) => {
                let mut request = extracted.request;
                request.set_decision(extracted.decision);
                ResponseFuture::calling(self.inner.call(request))
            }
            Extraction::Ready(Err(err)) => ResponseFuture::failed(err),
            Extraction::Pending(fut) => {
                // The inner call happens later, after the body was read. Take
                // the instance that was polled ready and leave a clone behind
                // (tower-service: "be careful when cloning inner services").
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::extracting(fut, ready)
            }
        }
    }
}
