//! [`HttpShare`]: buffering responses into their shared form, under HTTP's
//! rules for what may be shared.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, SET_COOKIE, VARY};
use http::response::Parts;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body::{Body, SizeHint};
use http_body_util::BodyExt;

use crate::error::BoxError;
use crate::share::{Serves, Share, Shareable, SharedForm, Unshareable};

use super::response::{LeaderCookies, Vary};
use super::*;

/// Default cap on a shared response body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The response headers sharing reads from the head, found in one walk
/// over its names ([`Present`]) before any is looked up: the usual head
/// has few of them. Indexed by the `AT_*` constants.
const HEAD_NAMES: [HeaderName; 5] = [
    SET_COOKIE,
    CACHE_CONTROL,
    VARY,
    CONTENT_TYPE,
    CONTENT_LENGTH,
];
const AT_SET_COOKIE: usize = 0;
const AT_CACHE_CONTROL: usize = 1;
const AT_VARY: usize = 2;
const AT_CONTENT_TYPE: usize = 3;
const AT_CONTENT_LENGTH: usize = 4;

/// Shares `http::Response`s by buffering them, following HTTP's rules on
/// what may be handed to another caller (see the module docs).
#[derive(Debug, Clone)]
pub struct HttpShare {
    max_body: usize,
    buffer_unknown_length: bool,
    set_cookie: SetCookie,
    cache_control: CacheControl,
}

impl HttpShare {
    /// Buffers bodies up to [`DEFAULT_MAX_BODY`]; bodies of unknown length
    /// (other than gRPC) are treated as streams and not shared. Responses
    /// with `Set-Cookie`, a `Cache-Control` that forbids sharing, or
    /// `Vary: *` are not shared.
    pub const fn new() -> Self {
        Self {
            max_body: DEFAULT_MAX_BODY,
            buffer_unknown_length: false,
            set_cookie: SetCookie::Refuse,
            cache_control: CacheControl::Respect,
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

    /// What to do with responses that set cookies (default
    /// [`SetCookie::Refuse`]; read the risks on each variant).
    pub const fn set_cookie(mut self, policy: SetCookie) -> Self {
        self.set_cookie = policy;
        self
    }

    /// Whether `Cache-Control` decides what is shared (default
    /// [`CacheControl::Respect`]; read the risk of
    /// [`CacheControl::Ignore`]).
    pub const fn cache_control(mut self, policy: CacheControl) -> Self {
        self.cache_control = policy;
        self
    }

    /// Judges a response head: the `Vary` names to record, or why it is
    /// not shared.
    pub(crate) fn judge(&self, head: &Parts, seen: &Present) -> Result<Vary, Unshareable> {
        let h = &head.headers;
        if !(seen.known_absent(AT_SET_COOKIE) && seen.known_absent(AT_CACHE_CONTROL)) {
            if let Some(reason) = policy::refusal(h, self.set_cookie, self.cache_control) {
                return Err(reason);
            }
        }
        if seen.known_absent(AT_VARY) {
            return Ok(Vary::Nothing);
        }
        match Vary::of(h) {
            Vary::Everything => Err(Unshareable::VaryStar),
            vary => Ok(vary),
        }
    }

    /// Whether a shared response may be handed out under this policy at
    /// all. Results made here always may; this guards results made
    /// elsewhere (another node, an older version, another configuration)
    /// and replayed from the backend.
    pub(crate) fn admits(&self, shared: &SharedResponse) -> bool {
        let cookies = shared.headers().contains_key(SET_COOKIE)
            || shared
                .trailers()
                .is_some_and(|t| t.contains_key(SET_COOKIE));
        (self.set_cookie == SetCookie::Share || !cookies)
            && (self.cache_control == CacheControl::Ignore
                || !policy::forbids_sharing(shared.headers()))
    }

    pub(crate) fn looks_streaming(&self, head: &Parts, seen: &Present, hint: &SizeHint) -> bool {
        let h = &head.headers;
        // A prefix of the raw value first: the whole value is checked for
        // text (as `to_str` would, first, on every response) only when the
        // prefix matched.
        let ctype = seen.get(AT_CONTENT_TYPE, &CONTENT_TYPE, h);
        let is = |prefix: &str| {
            ctype.is_some_and(|v| v.as_bytes().starts_with(prefix.as_bytes()) && v.to_str().is_ok())
        };
        if head.status == StatusCode::PARTIAL_CONTENT || is("text/event-stream") {
            return true;
        }
        // gRPC unary replies have no declared length; the key layer only
        // coalesces allow-listed unary methods, so buffer them (with the cap).
        if is("application/grpc") {
            return false;
        }
        let known = hint.exact().is_some() || seen.has(AT_CONTENT_LENGTH, &CONTENT_LENGTH, h);
        !known && !self.buffer_unknown_length
    }

    pub(crate) fn over_cap(&self, head: &Parts, seen: &Present, hint: &SizeHint) -> bool {
        let h = &head.headers;
        let declared = seen
            .get(AT_CONTENT_LENGTH, &CONTENT_LENGTH, h)
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

pub(crate) type ShareFuture<B> = Pin<
    Box<
        dyn Future<Output = Result<Shareable<SharedResponse, Response<FlightBody<B>>>, BoxError>>
            + Send,
    >,
>;

impl SharedForm for HttpShare {
    type Shared = SharedResponse;
}

/// The leader's response, handed back untouched, and why (traced: the
/// counter by reason is the coalescing layer's).
pub(crate) fn unshared<B>(
    resp: Response<FlightBody<B>>,
    reason: Unshareable,
) -> Shareable<SharedResponse, Response<FlightBody<B>>> {
    tracing::debug!(
        reason = reason.as_str(),
        status = resp.status().as_u16(),
        "response not shared: its caller gets it, other callers run their own request"
    );
    Shareable::Unshared(resp, reason)
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
            let (mut head, mut body) = value.into_parts();
            // The head alone decides first: nothing of an unshareable
            // response is buffered, handed out or stored.
            let seen = Present::of(&head.headers, &HEAD_NAMES);
            let vary = match this.judge(&head, &seen) {
                Ok(vary) => vary,
                Err(reason) => {
                    return Ok(unshared(
                        Response::from_parts(head, FlightBody::inner(body)),
                        reason,
                    ))
                }
            };
            let hint = body.size_hint();
            let unshareable = if this.looks_streaming(&head, &seen, &hint) {
                Some(Unshareable::Stream)
            } else if this.over_cap(&head, &seen, &hint) {
                Some(Unshareable::Oversize)
            } else {
                None
            };
            if let Some(reason) = unshareable {
                return Ok(unshared(
                    Response::from_parts(head, FlightBody::inner(body)),
                    reason,
                ));
            }
            let mut buf = Buffer::default();
            let mut trailers: Option<HeaderMap> = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(Into::into)?;
                match frame.into_data() {
                    Ok(data) => {
                        buf.push(data);
                        if buf.len() > this.max_body {
                            let prefix = buf.freeze();
                            return Ok(unshared(
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
            // HTTP does not allow Set-Cookie in trailers, but a cookie that
            // does arrive there is treated as one in the head.
            let late_cookie = trailers
                .as_ref()
                .is_some_and(|t| t.contains_key(SET_COOKIE));
            if late_cookie && this.set_cookie == SetCookie::Refuse {
                return Ok(unshared(
                    Response::from_parts(head, FlightBody::replay(buf.freeze(), trailers)),
                    Unshareable::SetCookie,
                ));
            }
            let leader_cookies = match this.set_cookie {
                SetCookie::Strip => LeaderCookies::take(&mut head.headers, trailers.as_mut()),
                _ => None,
            };
            // Taking the cookies out leaves `Vary` as it was judged.
            Ok(Shareable::Shared(SharedResponse::from_head(
                head,
                vary,
                buf.freeze(),
                trailers,
                leader_cookies,
            )))
        })
    }

    fn restore(&self, shared: &SharedResponse) -> Self::Output {
        shared.to_response()
    }

    fn restore_leader(&self, shared: &SharedResponse) -> Self::Output {
        shared.to_leader_response()
    }

    fn restore_leader_owned(&self, shared: SharedResponse) -> Self::Output {
        shared.into_leader_response()
    }

    fn passthrough(&self, value: Response<B>) -> Self::Output {
        value.map(FlightBody::inner)
    }
}

/// A body gathered frame by frame: the first frame kept as it came (a
/// body of one frame, the usual case, is neither copied nor
/// reallocated), later ones appended to a copy.
#[derive(Default)]
struct Buffer {
    first: Option<Bytes>,
    rest: BytesMut,
}

impl Buffer {
    fn len(&self) -> usize {
        self.first.as_ref().map_or(0, Bytes::len) + self.rest.len()
    }

    fn push(&mut self, data: Bytes) {
        match self.first.take() {
            None if self.rest.is_empty() => self.first = Some(data),
            first => {
                if let Some(first) = first {
                    self.rest.extend_from_slice(&first);
                }
                self.rest.extend_from_slice(&data);
            }
        }
    }

    fn freeze(self) -> Bytes {
        match self.first {
            Some(first) => first,
            None => self.rest.freeze(),
        }
    }
}

/// `Vary`, and a guard against results made under another policy.
///
/// The leader's snapshot is its header map ([`LeaderHeaders`]);
/// [`record`](Serves::record) keeps the leader's values of the headers the
/// response varies on; [`serves`](Serves::serves) hands the result to a
/// request only when its values are the same, and only when this policy
/// would have shared the result at all (a result replayed from the backend
/// may have been made by a node configured to share cookies, or by an older
/// version).
impl<B> Serves<Request<B>> for HttpShare {
    type Leader = LeaderHeaders;

    fn leader(&self, req: &Request<B>) -> LeaderHeaders {
        LeaderHeaders::new(req.headers())
    }

    fn record(&self, shared: SharedResponse, leader: LeaderHeaders) -> SharedResponse {
        shared.recorded(&leader)
    }

    fn serves(&self, shared: &SharedResponse, req: &Request<B>) -> bool {
        self.admits(shared) && shared.serves(req.headers())
    }
}
