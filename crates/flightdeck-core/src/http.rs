//! HTTP adapters: share buffered responses, and turn flightdeck errors into
//! HTTP or gRPC responses.
//!
//! [`HttpShare`] buffers a response's status, headers, body bytes **and
//! trailers** (gRPC puts `grpc-status` in trailers) up to a cap, so it can be
//! replayed to every waiter. Responses that look like streams
//! (`text/event-stream`, no known length) or grow over the cap are not
//! shared: the leader gets its response intact (the bytes already read are
//! put back in front of the rest of the stream), waiters run the service
//! themselves.
//!
//! [`ErrorResponseLayer`] maps the `BoxError`s of flightdeck's layers to
//! responses (503, 429, 504, …, or a trailers-only gRPC response with the
//! matching `grpc-status`), so a stack can be mounted where the error type
//! must be `Infallible` (axum's `Router::layer`), and tonic clients see real
//! statuses instead of stream resets.
//!
//! ```
//! use flightdeck_core::http::{ErrorResponseLayer, FlightBody};
//! use flightdeck_core::error::{BoxError, CircuitOpen};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # #[derive(Clone)] struct AlwaysOpen;
//! # impl Service<http::Request<()>> for AlwaysOpen {
//! #     type Response = http::Response<Full<Bytes>>;
//! #     type Error = BoxError;
//! #     type Future = std::future::Ready<Result<Self::Response, BoxError>>;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, _: http::Request<()>) -> Self::Future { std::future::ready(Err(CircuitOpen::new("redis").into())) }
//! # }
//! let mut svc = ErrorResponseLayer::new().layer(AlwaysOpen);
//! let resp = svc.call(http::Request::new(())).await.unwrap();
//! assert_eq!(resp.status(), 503);
//! # }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

use crate::error::{BoxError, ErrorClass};
use crate::share::{Share, Shareable, SharedForm, Unshareable};

/// Default cap on a shared response body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// Shares `http::Response`s by buffering them (see the module docs).
#[derive(Debug, Clone)]
pub struct HttpShare {
    max_body: usize,
    buffer_unknown_length: bool,
}

impl HttpShare {
    /// Buffers bodies up to [`DEFAULT_MAX_BODY`]; bodies of unknown length
    /// (other than gRPC) are treated as streams and not shared.
    pub const fn new() -> Self {
        Self {
            max_body: DEFAULT_MAX_BODY,
            buffer_unknown_length: false,
        }
    }

    /// Sets the largest body that is shared.
    pub const fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Also tries to buffer bodies without a known length (still up to the
    /// cap). Off by default: such bodies are usually streams.
    pub const fn buffer_unknown_length(mut self, yes: bool) -> Self {
        self.buffer_unknown_length = yes;
        self
    }

    fn looks_streaming(&self, head: &http::response::Parts, hint: &SizeHint) -> bool {
        let ctype = head
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ctype.starts_with("text/event-stream") || head.status == StatusCode::PARTIAL_CONTENT {
            return true;
        }
        // gRPC unary replies have no declared length; the key layer only
        // coalesces allow-listed unary methods, so buffer them (with the cap).
        if ctype.starts_with("application/grpc") {
            return false;
        }
        let known = hint.exact().is_some() || head.headers.contains_key(CONTENT_LENGTH);
        !known && !self.buffer_unknown_length
    }

    fn over_cap(&self, head: &http::response::Parts, hint: &SizeHint) -> bool {
        let declared = head
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let cap = self.max_body as u64;
        declared.is_some_and(|n| n > cap) || hint.lower() > cap
    }
}

impl Default for HttpShare {
    fn default() -> Self {
        Self::new()
    }
}

/// A response in shared form: head, body bytes and trailers.
#[derive(Clone)]
pub struct SharedResponse {
    head: Arc<http::response::Parts>,
    body: Bytes,
    trailers: Option<Arc<HeaderMap>>,
}

impl SharedResponse {
    /// Builds a shared response from its pieces (used by result codecs).
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
    ) -> Self {
        let (mut head, ()) = Response::new(()).into_parts();
        head.status = status;
        head.headers = headers;
        Self {
            head: Arc::new(head),
            body,
            trailers: trailers.map(Arc::new),
        }
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.head.status
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.head.headers
    }

    /// The body bytes.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The trailers, if the response had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }

    /// Rebuilds a response for one receiver.
    pub fn to_response<B>(&self) -> Response<FlightBody<B>> {
        let mut resp = Response::new(FlightBody::replay(
            self.body.clone(),
            self.trailers.as_deref().cloned(),
        ));
        *resp.status_mut() = self.head.status;
        *resp.version_mut() = self.head.version;
        *resp.headers_mut() = self.head.headers.clone();
        *resp.extensions_mut() = self.head.extensions.clone();
        resp
    }
}

impl fmt::Debug for SharedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedResponse")
            .field("status", &self.head.status)
            .field("body_len", &self.body.len())
            .field("trailers", &self.trailers.is_some())
            .finish()
    }
}

type ShareFuture<B> = Pin<
    Box<
        dyn Future<Output = Result<Shareable<SharedResponse, Response<FlightBody<B>>>, BoxError>>
            + Send,
    >,
>;

impl SharedForm for HttpShare {
    type Shared = SharedResponse;
}

impl<B> Share<Response<B>> for HttpShare
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Response<FlightBody<B>>;
    // One allocation per execution (not per waiter): buffering needs an
    // async block, and the execution it follows is the expensive part.
    type Future = ShareFuture<B>;

    fn share(&self, value: Response<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (head, mut body) = value.into_parts();
            let hint = body.size_hint();
            let unshareable = if this.looks_streaming(&head, &hint) {
                Some(Unshareable::Stream)
            } else if this.over_cap(&head, &hint) {
                Some(Unshareable::Oversize)
            } else {
                None
            };
            if let Some(reason) = unshareable {
                return Ok(Shareable::Unshared(
                    Response::from_parts(head, FlightBody::inner(body)),
                    reason,
                ));
            }
            let mut buf = BytesMut::new();
            let mut trailers: Option<HeaderMap> = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(Into::into)?;
                match frame.into_data() {
                    Ok(data) => {
                        buf.extend_from_slice(&data);
                        if buf.len() > this.max_body {
                            let prefix = buf.freeze();
                            return Ok(Shareable::Unshared(
                                Response::from_parts(head, FlightBody::resumed(prefix, body)),
                                Unshareable::Oversize,
                            ));
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            match &mut trailers {
                                Some(all) => all.extend(t),
                                None => trailers = Some(t),
                            }
                        }
                    }
                }
            }
            Ok(Shareable::Shared(SharedResponse {
                head: Arc::new(head),
                body: buf.freeze(),
                trailers: trailers.map(Arc::new),
            }))
        })
    }

    fn restore(&self, shared: &SharedResponse) -> Self::Output {
        shared.to_response()
    }

    fn passthrough(&self, value: Response<B>) -> Self::Output {
        value.map(FlightBody::inner)
    }
}

pin_project! {
    /// The body of responses returned by flightdeck's HTTP layers: either a
    /// replayed buffer (data + trailers) or the inner body, possibly with
    /// bytes already read put back in front.
    pub struct FlightBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Replay {
            data: Option<Bytes>,
            trailers: Option<HeaderMap>,
        },
        Inner {
            // Bytes read while trying to buffer, sent first.
            prefix: Option<Bytes>,
            #[pin]
            body: B,
        },
    }
}

impl<B> FlightBody<B> {
    /// A replayed body.
    pub fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Replay {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    /// The inner body, untouched.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { prefix: None, body },
        }
    }

    /// The inner body with bytes already read put back in front.
    pub fn resumed(prefix: Bytes, body: B) -> Self {
        Self {
            kind: Kind::Inner {
                prefix: (!prefix.is_empty()).then_some(prefix),
                body,
            },
        }
    }

    /// True when this body is a replayed buffer.
    pub fn is_replay(&self) -> bool {
        matches!(self.kind, Kind::Replay { .. })
    }
}

impl<B> fmt::Debug for FlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Replay { data, trailers } => f
                .debug_struct("FlightBody::Replay")
                .field("data_len", &data.as_ref().map(Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            Kind::Inner { prefix, .. } => f
                .debug_struct("FlightBody::Inner")
                .field("prefix_len", &prefix.as_ref().map(Bytes::len))
                .finish_non_exhaustive(),
        }
    }
}

impl<B> Body for FlightBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Replay { data, trailers } => {
                if let Some(d) = data.take() {
                    Poll::Ready(Some(Ok(Frame::data(d))))
                } else if let Some(t) = trailers.take() {
                    Poll::Ready(Some(Ok(Frame::trailers(t))))
                } else {
                    Poll::Ready(None)
                }
            }
            KindProj::Inner { prefix, body } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => body.poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Replay { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Replay { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { prefix, body } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(u) = inner.upper() {
                    hint.set_upper(u + extra);
                }
                hint
            }
        }
    }
}

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
fn percent_encode_grpc(msg: &str) -> String {
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

fn is_grpc<B>(req: &Request<B>) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BulkheadFull, WaitTimeout};
    use http_body_util::Full;
    use std::time::Duration;

    async fn collect<B: Body<Data = Bytes> + Unpin>(b: B) -> (Bytes, Option<HeaderMap>)
    where
        B::Error: fmt::Debug,
    {
        let c = b.collect().await.unwrap();
        let t = c.trailers().cloned();
        (c.to_bytes(), t)
    }

    /// A body of given frames with no declared length, like a stream.
    struct TestBody(std::collections::VecDeque<Frame<Bytes>>);

    impl Body for TestBody {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn body_with_trailers(data: &'static [&'static str], trailers: HeaderMap) -> TestBody {
        let mut frames: std::collections::VecDeque<Frame<Bytes>> = data
            .iter()
            .map(|d| Frame::data(Bytes::from_static(d.as_bytes())))
            .collect();
        frames.push_back(Frame::trailers(trailers));
        TestBody(frames)
    }

    #[tokio::test]
    async fn replays_status_headers_body_and_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut resp = Response::new(body_with_trailers(&["hel", "lo"], trailers));
        *resp.status_mut() = StatusCode::CREATED;
        resp.headers_mut().insert(
            "x-bin",
            HeaderValue::from_bytes(&[0xff, 0xfe, b'a']).unwrap(),
        );
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let share = HttpShare::new();
        let Shareable::Shared(shared) = share.share(resp).await.unwrap() else {
            panic!("expected shared");
        };
        for _ in 0..2 {
            let r: Response<FlightBody<Full<Bytes>>> = share.restore(&shared);
            assert_eq!(r.status(), StatusCode::CREATED);
            assert_eq!(r.headers()["x-bin"].as_bytes(), &[0xff, 0xfe, b'a']);
            let (body, t) = collect(r.into_body()).await;
            assert_eq!(body, "hello");
            assert_eq!(t.unwrap()["grpc-status"], "0");
        }
    }

    #[tokio::test]
    async fn oversize_goes_back_to_the_leader_intact() {
        let mut resp = Response::new(body_with_trailers(
            &["aaaa", "bbbb", "cccc"],
            HeaderMap::new(),
        ));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let share = HttpShare::new().max_body(6);
        match share.share(resp).await.unwrap() {
            Shareable::Unshared(r, _) => {
                let (body, _) = collect(r.into_body()).await;
                assert_eq!(body, "aaaabbbbcccc");
            }
            Shareable::Shared(_) => panic!("must not share an oversize body"),
        }
    }

    #[tokio::test]
    async fn streams_and_declared_oversize_are_not_shared() {
        let share = HttpShare::new().max_body(4);
        let mut sse = Response::new(Full::new(Bytes::from_static(b"data: x\n\n")));
        sse.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        assert!(matches!(
            share.share(sse).await.unwrap(),
            Shareable::Unshared(..)
        ));
        let big = Response::new(Full::new(Bytes::from_static(b"0123456789")));
        assert!(matches!(
            share.share(big).await.unwrap(),
            Shareable::Unshared(..)
        ));
        let unknown = Response::new(body_with_trailers(&["ab"], HeaderMap::new()));
        assert!(matches!(
            share.share(unknown).await.unwrap(),
            Shareable::Unshared(..)
        ));
        let small = Response::new(Full::new(Bytes::from_static(b"ok")));
        assert!(matches!(
            share.share(small).await.unwrap(),
            Shareable::Shared(_)
        ));
    }

    #[tokio::test]
    async fn errors_map_to_http_and_grpc() {
        let r: Response<FlightBody<Full<Bytes>>> = error_response(&BulkheadFull::new(None), false);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let (body, _) = collect(r.into_body()).await;
        assert_eq!(body, "bulkhead full\n");

        let t = WaitTimeout::new(None, Duration::from_millis(5));
        let r: Response<FlightBody<Full<Bytes>>> = error_response(&t, true);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["grpc-status"], "4");
        assert!(r.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("wait timed out"));

        let other = std::io::Error::other("secret db password wrong");
        let r: Response<FlightBody<Full<Bytes>>> = error_response(&other, false);
        assert_eq!(r.status(), 500);
        let (body, _) = collect(r.into_body()).await;
        assert_eq!(body, "internal error\n");
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode_grpc("a b%\n"), "a b%25%0A");
        assert_eq!(percent_encode_grpc("é"), "%C3%A9");
    }
}
