//! [`SharedResponse`]: a response in shared form, and what it may serve.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, SET_COOKIE};
use http::{HeaderMap, HeaderName, Response, StatusCode};

use super::policy::VaryOn;
use super::*;

/// What a shared response's `Vary` allows, and the leader's values once
/// recorded.
#[derive(Clone)]
pub(crate) enum Vary {
    /// No `Vary`: it serves every request of its key.
    Nothing,
    /// `Vary: *` or unreadable: it serves no other request. [`HttpShare`]
    /// never shares such a response; this comes only from
    /// [`SharedResponse::new`] (a codec reading a foreign value).
    Everything,
    /// It serves requests whose values of `names` equal `leader`'s; none
    /// before they are recorded.
    On {
        names: Arc<[HeaderName]>,
        leader: Option<Arc<VaryValues>>,
    },
}

impl Vary {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        match policy::vary_on(headers) {
            VaryOn::Nothing => Self::Nothing,
            VaryOn::Everything => Self::Everything,
            VaryOn::Names(names) => Self::On {
                names: names.into(),
                leader: None,
            },
        }
    }
}

/// The leader's own `Set-Cookie` values under [`SetCookie::Strip`].
pub(crate) struct LeaderCookies {
    head: Vec<HeaderValue>,
    trailers: Vec<HeaderValue>,
}

impl LeaderCookies {
    /// Moves every `Set-Cookie` out of the head and the trailers.
    pub(crate) fn take(headers: &mut HeaderMap, trailers: Option<&mut HeaderMap>) -> Option<Self> {
        fn drain(map: &mut HeaderMap) -> Vec<HeaderValue> {
            match map.entry(SET_COOKIE) {
                http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
                http::header::Entry::Vacant(_) => Vec::new(),
            }
        }
        let head = drain(headers);
        let trailers = trailers.map(drain).unwrap_or_default();
        (!head.is_empty() || !trailers.is_empty()).then_some(Self { head, trailers })
    }

    /// Puts the values back into the headers and trailers of the
    /// response that goes to the leader.
    fn put_back(&self, headers: &mut HeaderMap, trailers: &mut Option<HeaderMap>) {
        for v in &self.head {
            headers.append(SET_COOKIE, v.clone());
        }
        if !self.trailers.is_empty() {
            let t = trailers.get_or_insert_with(HeaderMap::new);
            for v in &self.trailers {
                t.append(SET_COOKIE, v.clone());
            }
        }
    }
}

/// A response in shared form: head, body bytes, trailers, and what it
/// needs to decide whom it may serve (`Vary`).
///
/// Under [`SetCookie::Strip`] it also holds its leader's `Set-Cookie`
/// values, apart from its headers: only
/// [`to_leader_response`](Self::to_leader_response) returns them; [`headers`](Self::headers),
/// [`to_response`](Self::to_response) and result codecs never see them,
/// and [`without_leader_cookies`](Self::without_leader_cookies) is the
/// copy without them that a stage keeps for later callers.
#[derive(Clone)]
pub struct SharedResponse {
    head: Arc<http::response::Parts>,
    body: Bytes,
    trailers: Option<Arc<HeaderMap>>,
    vary: Vary,
    leader_cookies: Option<Arc<LeaderCookies>>,
}

/// Recorded `Vary` values that do not fit the response they were attached
/// to (a stored result that is corrupt or was written by another version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaryMismatch {
    message: String,
}

impl fmt::Display for VaryMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for VaryMismatch {}

impl SharedResponse {
    /// Builds a shared response from its pieces (used by result codecs).
    ///
    /// Its `Vary` is read from `headers`. A response that varies on
    /// headers serves no request until the leader's values are attached
    /// ([`with_vary_values`](Self::with_vary_values), or
    /// [`Serves::record`](crate::Serves::record)); one with `Vary: *` serves none.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
    ) -> Self {
        let (mut head, ()) = Response::new(()).into_parts();
        head.status = status;
        head.headers = headers;
        let vary = Vary::of(&head.headers);
        Self::from_head(head, vary, body, trailers, None)
    }

    /// `vary` is `Vary::of(&head.headers)`, which the caller judged already.
    pub(crate) fn from_head(
        head: http::response::Parts,
        vary: Vary,
        body: Bytes,
        trailers: Option<HeaderMap>,
        leader_cookies: Option<LeaderCookies>,
    ) -> Self {
        Self {
            vary,
            head: Arc::new(head),
            body,
            trailers: trailers.map(Arc::new),
            leader_cookies: leader_cookies.map(Arc::new),
        }
    }

    /// Attaches the leader's values of the headers this response varies on
    /// (a codec reading a stored result back). They must name exactly the
    /// headers of the response's `Vary`.
    pub fn with_vary_values(mut self, values: VaryValues) -> Result<Self, VaryMismatch> {
        match &mut self.vary {
            Vary::On { names, leader } if values.names().eq(names.iter()) => {
                *leader = Some(Arc::new(values));
                Ok(self)
            }
            Vary::Nothing if values.is_empty() => Ok(self),
            _ => Err(VaryMismatch {
                message: format!(
                    "recorded Vary values name {values:?}, the response varies on {}",
                    self.vary_names()
                ),
            }),
        }
    }

    pub(crate) fn vary_names(&self) -> String {
        match &self.vary {
            Vary::Nothing => "nothing".to_owned(),
            Vary::Everything => "*".to_owned(),
            Vary::On { names, .. } => format!("{names:?}"),
        }
    }

    /// The leader's values of the headers this response varies on, once
    /// recorded (`None` without `Vary`, or before they are recorded).
    pub fn vary_values(&self) -> Option<&VaryValues> {
        match &self.vary {
            Vary::On {
                leader: Some(v), ..
            } => Some(v),
            _ => None,
        }
    }

    /// Whether this response may be handed to a request with these
    /// headers, as far as `Vary` is concerned: always without `Vary`;
    /// with `Vary: h1, h2`, when the request's values of `h1` and `h2`
    /// equal the recorded leader's (a header absent from both matches;
    /// absent from one does not); never before the values are recorded,
    /// and never with `Vary: *`.
    pub fn serves(&self, request_headers: &HeaderMap) -> bool {
        match &self.vary {
            Vary::Nothing => true,
            Vary::Everything | Vary::On { leader: None, .. } => false,
            Vary::On {
                names,
                leader: Some(values),
            } => values.match_all(names, request_headers),
        }
    }

    /// This response with its leader's `Vary` values recorded. A response
    /// that already has them keeps them: it was produced for that leader
    /// (perhaps on another node), not for this one.
    pub(crate) fn recorded(mut self, leader: &LeaderHeaders) -> Self {
        if let Vary::On {
            names,
            leader: slot @ None,
        } = &mut self.vary
        {
            *slot = Some(Arc::new(VaryValues::of(names.iter(), &leader.0)));
        }
        self
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.head.status
    }

    /// The response headers (never the leader's own cookies under
    /// [`SetCookie::Strip`]).
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

    /// This response without its leader's own cookies: the form to keep
    /// for later callers (a stage's copy of its key), which may reach one
    /// as the leader of another flight and must not restore them. Shares
    /// the head, body and trailers.
    pub fn without_leader_cookies(&self) -> Self {
        Self {
            leader_cookies: None,
            ..self.clone()
        }
    }

    /// Rebuilds a response for one receiver other than the leader: a
    /// waiter, a replay. Never carries the leader's own cookies.
    pub fn to_response<B>(&self) -> Response<FlightBody<B>> {
        self.build(None)
    }

    /// Rebuilds the response for the leader, the one caller whose own
    /// request produced it: with its `Set-Cookie` values, if
    /// [`SetCookie::Strip`] took them out of the shared copy. Hand it to
    /// no one else.
    pub fn to_leader_response<B>(&self) -> Response<FlightBody<B>> {
        self.build(self.leader_cookies.as_deref())
    }

    /// [`to_leader_response`](Self::to_leader_response), moving the head
    /// and the trailers out when no other copy of this response holds
    /// them (no waiter joined, no replay or store kept it) instead of
    /// copying them.
    pub(crate) fn into_leader_response<B>(self) -> Response<FlightBody<B>> {
        let Self {
            head,
            body,
            trailers,
            leader_cookies,
            vary,
        } = self;
        let mut head = match Arc::try_unwrap(head) {
            Ok(head) => head,
            Err(head) => {
                return Self {
                    head,
                    body,
                    trailers,
                    leader_cookies,
                    vary,
                }
                .to_leader_response()
            }
        };
        let mut trailers = trailers.map(|t| Arc::try_unwrap(t).unwrap_or_else(|t| (*t).clone()));
        if let Some(cookies) = leader_cookies.as_deref() {
            cookies.put_back(&mut head.headers, &mut trailers);
        }
        Response::from_parts(head, FlightBody::replay(body, trailers))
    }

    pub(crate) fn build<B>(&self, cookies: Option<&LeaderCookies>) -> Response<FlightBody<B>> {
        let mut headers = self.head.headers.clone();
        let mut trailers = self.trailers.as_deref().cloned();
        if let Some(cookies) = cookies {
            cookies.put_back(&mut headers, &mut trailers);
        }
        let mut resp = Response::new(FlightBody::replay(self.body.clone(), trailers));
        *resp.status_mut() = self.head.status;
        *resp.version_mut() = self.head.version;
        *resp.headers_mut() = headers;
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
            .field("vary", &self.vary_names())
            .field("leader_cookies", &self.leader_cookies.is_some())
            .finish()
    }
}
