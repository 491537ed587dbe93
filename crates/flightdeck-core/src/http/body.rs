//! [`FlightBody`]: the body of a replayed, resumed or passed-through
//! response.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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
            // Boxed: trailers are rare (gRPC), and a header map inline
            // would make every request and response that carries this
            // body (the inner body's requests too) 80 bytes larger, each
            // of their moves copying them.
            trailers: Option<Box<HeaderMap>>,
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
                trailers: trailers.map(Box::new),
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
                    Poll::Ready(Some(Ok(Frame::trailers(*t))))
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
