//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use flightdeck_core::{BoxError, FlightKey};
use flightdeck_key::{Decision, Extracted, Extraction, KeyExtractor};
use http_body::{Body, Frame, SizeHint};

/// Runs an extraction to the end.
pub async fn extract<E, R>(ex: &E, req: R) -> Result<Extracted<E::Request>, BoxError>
where
    E: KeyExtractor<R>,
{
    match ex.extract(req) {
        Extraction::Ready(r) => r,
        Extraction::Pending(f) => f.await,
    }
}

/// Runs an extraction whose body is already in memory, without a runtime.
pub fn extract_now<E, R>(ex: &E, req: R) -> Result<Extracted<E::Request>, BoxError>
where
    E: KeyExtractor<R>,
{
    let mut fut = pin!(extract(ex, req));
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            return r;
        }
    }
}

/// The key decided for `req`, `None` if not coalescable.
pub fn key_now<E, R>(ex: &E, req: R) -> Option<FlightKey>
where
    E: KeyExtractor<R>,
{
    match extract_now(ex, req).expect("extraction failed").decision {
        Decision::Key(k) => Some(k),
        Decision::Bypass(_) => None,
    }
}

/// A body of given frames with no declared length, like a stream; can end
/// with an error.
pub struct FrameBody {
    frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
}

impl FrameBody {
    pub fn data<I: IntoIterator<Item = &'static [u8]>>(chunks: I) -> Self {
        Self {
            frames: chunks
                .into_iter()
                .map(|c| Ok(Frame::data(Bytes::from_static(c))))
                .collect(),
        }
    }

    pub fn chunks(chunks: Vec<Vec<u8>>) -> Self {
        Self {
            frames: chunks
                .into_iter()
                .map(|c| Ok(Frame::data(Bytes::from(c))))
                .collect(),
        }
    }

    pub fn then_error(mut self) -> Self {
        self.frames
            .push_back(Err("connection reset by peer".into()));
        self
    }
}

impl Body for FrameBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.frames.pop_front())
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::new()
    }
}

/// A unary call of the health-check method with these metadata.
pub fn grpc_call(metadata: &[(&str, &str)]) -> http::Request<http_body_util::Full<Bytes>> {
    let mut b = http::Request::post("/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc");
    for (k, v) in metadata {
        b = b.header(*k, *v);
    }
    b.body(http_body_util::Full::new(Bytes::from_static(
        b"\0\0\0\0\x02\x0a\x00",
    )))
    .unwrap()
}

/// Never fails; for `service_fn` error types.
pub type Never = Infallible;
