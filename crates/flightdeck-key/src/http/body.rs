//! Reading a request body into the key, and putting it back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use flightdeck_core::error::{IdempotencyConflict, RequestBodyError};
use flightdeck_core::http::FlightBody;
use flightdeck_core::{BoxError, Digest, KeyEncoder, Received, StageName};
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{HeaderMap, Request};
use http_body::Body;

use super::idempotency::IdempotencyTable;
use super::unkeyed::Unkeyed;
use crate::extract::{Decision, Extracted, Extraction, NotCoalescable, Reason};

/// The encoder of a request's key, with every head field written.
pub(crate) type HeadEncoder = KeyEncoder<{ super::HEAD_KEY_BUFFER }>;

/// What is known once the head was read: the stage and scope, the body cap
/// and the idempotency check (the head's fields are in the encoder the plan
/// filled, which stays where it was made unless a body must be read).
pub(crate) struct Plan {
    pub(crate) stage: StageName,
    pub(crate) scope: Option<Digest>,
    /// `None`: bodies are not hashed for this request.
    pub(crate) cap: Option<usize>,
    pub(crate) idempotency: Option<(Arc<IdempotencyTable>, Digest)>,
}

impl Plan {
    /// Writes the body as the last field of `encoder` and decides.
    fn finish(self, encoder: &mut HeadEncoder, body: &[u8]) -> Result<Decision, BoxError> {
        encoder.push(body);
        // Hashed only if the digest is needed: by the idempotency check
        // here, or later by a flight that leaves the process.
        let key = encoder.finish_key_lazy(self.stage, self.scope);
        if let Some((table, slot)) = &self.idempotency {
            if !table.check(*slot, *key.digest()) {
                return Err(IdempotencyConflict::new(Some(key.stage().clone())).into());
            }
        }
        Ok(Decision::Key(key))
    }
}

pub(crate) type Output<B> = Extraction<Request<FlightBody<B>>, KeyFuture<B>>;

/// Plans from the head, then finishes or reads the body. Every request
/// that gets no key is recorded in `unkeyed`.
///
/// `plan` writes the head's fields into the encoder it puts in the slot it
/// is given: the encoder (over 512 bytes) is made in this frame and only
/// moves when a body must be read.
pub(crate) fn extract_with<B>(
    req: Request<B>,
    unkeyed: &Arc<Unkeyed>,
    plan: impl FnOnce(&Parts, &mut Option<HeadEncoder>) -> Result<Plan, Reason>,
) -> Output<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let mut slot = None;
    let plan = match plan(&parts, &mut slot) {
        Ok(plan) => plan,
        Err(reason) => return bypass(parts, body, reason, unkeyed),
    };
    let Some(encoder) = slot.as_mut() else {
        return Extraction::Ready(Err("a key plan wrote no encoder".into()));
    };
    if body.is_end_stream() || body.size_hint().exact() == Some(0) {
        // The usual case: finished in place.
        let decision = plan.finish(encoder, &[]);
        let req = Request::from_parts(parts, FlightBody::inner(body));
        return Extraction::Ready(decision.map(|d| Extracted::new(req, d)));
    }
    match slot {
        Some(encoder) => read_body(parts, body, plan, encoder, unkeyed),
        None => Extraction::Ready(Err("a key plan wrote no encoder".into())),
    }
}

/// Passes the request through untouched, marked with `reason`.
fn bypass<B>(parts: Parts, body: B, reason: Reason, unkeyed: &Unkeyed) -> Output<B> {
    unkeyed.record(&parts, reason);
    let req = Request::from_parts(parts, FlightBody::inner(body));
    Extraction::Ready(Ok(Extracted::new(req, NotCoalescable::new(reason))))
}

/// A body that may not be empty: refuses bodies that cannot be hashed or
/// declare more than the cap, and otherwise reads the body in a
/// [`KeyFuture`].
fn read_body<B>(
    parts: Parts,
    body: B,
    plan: Plan,
    encoder: HeadEncoder,
    unkeyed: &Arc<Unkeyed>,
) -> Output<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let Some(cap) = plan.cap else {
        return bypass(parts, body, Reason::UnhashedBody, unkeyed);
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) || body.size_hint().lower() > cap as u64 {
        return bypass(parts, body, Reason::BodyTooLarge, unkeyed);
    }
    Extraction::Pending(KeyFuture {
        state: Some(Box::new(Reading {
            parts,
            body,
            plan,
            encoder,
            cap,
            unkeyed: Arc::clone(unkeyed),
            received: Received::now(),
            first: None,
            buf: BytesMut::new(),
            trailers: None,
        })),
    })
}

/// Future of an extraction that reads the body: collects it up to the cap,
/// hashes it, and re-attaches it byte for byte (as one data frame, plus the
/// trailers if any). Over the cap, the bytes read so far are put back in
/// front of the rest of the stream and the request is not coalesced.
///
/// A hand-written state machine rather than an `async` block, so it can be
/// named without boxing. It requires `B: Unpin` (axum's, tonic's and hyper's
/// bodies are) to move the body back into the request when done.
pub struct KeyFuture<B> {
    // Boxed: the reading holds the request's head and the key's encoder
    // (a kilobyte), and the key layer's response future is as large as
    // its largest state, which every request moves and its server boxes,
    // whether or not its body is read.
    state: Option<Box<Reading<B>>>,
}

struct Reading<B> {
    parts: Parts,
    body: B,
    plan: Plan,
    encoder: HeadEncoder,
    cap: usize,
    unkeyed: Arc<Unkeyed>,
    /// When the head was read: the request carries it on, so that its
    /// own timeout counts from then, not from the body's end.
    received: Received,
    // The first data frame, kept without copying in the common case of a
    // body that arrives in one frame.
    first: Option<Bytes>,
    buf: BytesMut,
    trailers: Option<HeaderMap>,
}

impl<B> Reading<B> {
    fn len(&self) -> usize {
        self.first.as_ref().map_or(0, Bytes::len) + self.buf.len()
    }

    fn push(&mut self, data: Bytes) {
        if self.first.is_none() && self.buf.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.buf.extend_from_slice(&first);
        }
        self.buf.extend_from_slice(&data);
    }

    fn take_bytes(&mut self) -> Bytes {
        match self.first.take() {
            Some(first) => first,
            None => std::mem::take(&mut self.buf).freeze(),
        }
    }
}

impl<B> std::fmt::Debug for KeyFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFuture")
            .field("read", &self.state.as_ref().map(|r| r.len()))
            .finish()
    }
}

impl<B> Future for KeyFuture<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Extracted<Request<FlightBody<B>>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(reading) = self.state.as_mut() else {
            return Poll::Ready(Err("key future polled after completion".into()));
        };
        loop {
            match Pin::new(&mut reading.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    self.state = None;
                    return Poll::Ready(Err(RequestBodyError::new(e).into()));
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        reading.push(data);
                        if reading.len() > reading.cap {
                            break;
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            match &mut reading.trailers {
                                Some(all) => all.extend(t),
                                None => reading.trailers = Some(t),
                            }
                        }
                    }
                },
                Poll::Ready(None) => break,
            }
        }
        let Some(r) = self.state.take() else {
            return Poll::Ready(Err("key future polled after completion".into()));
        };
        let mut r = *r;
        r.parts.extensions.insert(r.received);
        let data = r.take_bytes();
        if r.len() + data.len() > r.cap {
            r.unkeyed.record(&r.parts, Reason::BodyTooLarge);
            let req = Request::from_parts(r.parts, FlightBody::resumed(data, r.body));
            return Poll::Ready(Ok(Extracted::new(
                req,
                NotCoalescable::new(Reason::BodyTooLarge),
            )));
        }
        if r.trailers.is_some() {
            r.unkeyed.record(&r.parts, Reason::Trailers);
            let req = Request::from_parts(r.parts, FlightBody::replay(data, r.trailers));
            return Poll::Ready(Ok(Extracted::new(
                req,
                NotCoalescable::new(Reason::Trailers),
            )));
        }
        let decision = r.plan.finish(&mut r.encoder, &data);
        let req = Request::from_parts(r.parts, FlightBody::replay(data, None));
        Poll::Ready(decision.map(|d| Extracted::new(req, d)))
    }
}
