//! Flightdeck's errors as HTTP or gRPC responses.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;

use crate::error::{BoxError, ErrorClass};

use super::*;

/// Builds the response for a flightdeck error: an HTTP status with a short
/// plain-text body, or, when `grpc` is true, a trailers-only gRPC response
/// (`grpc-status` and `grpc-message` in the headers).
pub fn error_response<B>(
    err: &(dyn std::error::Error + 'static),
    grpc: bool,
) -> Response<FlightBody<B>> {
    let class = ErrorClass::of(err);
    // Never echo an unknown error's text to clients: it may carry internals.
    let message = if class == ErrorClass::Internal {
        "internal error".to_owned()
    } else {
        err.to_string()
    };
    let mut resp = if grpc {
        let mut r = Response::new(FlightBody::replay(Bytes::new(), None));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(
            "grpc-status",
            HeaderValue::from(u16::from(class.grpc_code())),
        );
        if let Ok(v) = HeaderValue::from_str(&percent_encode_grpc(&message)) {
            h.insert("grpc-message", v);
        }
        r
    } else {
        let mut r = Response::new(FlightBody::replay(Bytes::from(message + "\n"), None));
        *r.status_mut() =
            StatusCode::from_u16(class.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if matches!(
        class,
        ErrorClass::Unavailable
            | ErrorClass::Overloaded
            | ErrorClass::TooManyRequests
            | ErrorClass::InProgress
    ) {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 spec asks.
pub(crate) fn percent_encode_grpc(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Turns the errors of the wrapped service into responses (see the module
/// docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorResponseLayer {
    _priv: (),
}

impl ErrorResponseLayer {
    /// Creates the layer.
    pub const fn new() -> Self {
        Self { _priv: () }
    }
}

impl<S> tower_layer::Layer<S> for ErrorResponseLayer {
    type Service = ErrorResponse<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ErrorResponse { inner }
    }
}

/// Service produced by [`ErrorResponseLayer`].
#[derive(Debug, Clone)]
pub struct ErrorResponse<S> {
    inner: S,
}

impl<S> ErrorResponse<S> {
    /// Wraps a service.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
    /// Consumes the wrapper.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqB, ResB> tower_service::Service<Request<ReqB>> for ErrorResponse<S>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<FlightBody<ResB>>;
    type Error = Infallible;
    type Future = ErrorResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // A failing readiness is reported on the next call instead.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let grpc = is_grpc(&req);
        ErrorResponseFuture {
            inner: self.inner.call(req),
            grpc,
        }
    }
}

pin_project! {
    /// Response future of [`ErrorResponse`].
    #[derive(Debug)]
    pub struct ErrorResponseFuture<F> {
        #[pin]
        inner: F,
        grpc: bool,
    }
}

impl<F, B, E> Future for ErrorResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<FlightBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Poll::Ready(Ok(match ready!(this.inner.poll(cx)) {
            Ok(resp) => resp.map(FlightBody::inner),
            Err(e) => {
                let e: BoxError = e.into();
                error_response(&*e, *this.grpc)
            }
        }))
    }
}
