//! The HTTP extractor: which HTTP requests are "the same work".
//!
//! (Over 600 lines on purpose: the extractor, its route rule and its
//! builder share one private `Config`, and the builder's documented
//! options are most of the file; the parts of a key that stand alone —
//! body, query, route patterns, scope, idempotency — are submodules.)
//!
//! [`HttpKeyExtractor`] keys an `http::Request<B>` by:
//!
//! - **stage**: the first matching route rule (method + path pattern), else
//!   the stage header (only stages from its allowed list), else the default
//!   stage; with none of these the request is not coalesced;
//! - **method**, **host** (of the URI authority or `Host`, without the
//!   port, ASCII-lowercased, as nginx's `$host`: the nodes of one service
//!   reached on different ports share, different names do not) and **path** (raw, byte for byte: `/a%41` and `/aA` may route
//!   differently, so they are different keys);
//! - **query**, normalized (see below), minus the ignored parameters;
//! - **selected headers**, by default `Accept`, `Accept-Encoding` and
//!   `Accept-Language`: every value, in order, as raw bytes (a non-UTF-8
//!   value is hashed as it is, never replaced or dropped; an absent header
//!   differs from an empty one). This is the form in which
//!   `flightdeck_core::http` compares the headers a response's `Vary`
//!   names (`push_header_values`), so the key and `Vary` never disagree;
//! - `Content-Type` and `Content-Encoding`, always (they say what the body
//!   means);
//! - **body**, when body hashing is enabled for the request: read up to the
//!   cap, hashed, re-attached byte for byte. A request with a body that is
//!   not hashed is not coalesced (two requests that differ only in unhashed
//!   bytes must not share); over the cap, it is not coalesced and the body
//!   reaches the handler intact;
//! - **tenant scope**, see [`Scope`]: by default a hash of the credential
//!   headers (`Authorization`, `Proxy-Authorization`, `Cookie`,
//!   `X-Api-Key`; [`HttpKeyExtractorBuilder::credential_header`] adds more), so
//!   different users never share. Set a
//!   [`scope_secret`](HttpKeyExtractorBuilder::scope_secret): without one the scope
//!   digests in Redis key names can be checked offline against guessed
//!   credentials (a `flightdeck` layer with a distributed stage warns at
//!   build; see [`HttpKeyExtractor::scope_digests_unkeyed`]).
//!
//! Only `GET` and `HEAD` are coalesced by default. Other methods are
//! coalesced through an explicit route rule, or when they carry an
//! `Idempotency-Key`: then the key and the whole request (body included,
//! up to [`HttpKeyExtractorBuilder::idempotency_body_cap`]) are part of the flight
//! key, and reusing the key with a different request within the window is
//! an [`IdempotencyConflict`](crate::error::IdempotencyConflict) (HTTP 422
//! through `flightdeck_core::http::ErrorResponseLayer`).
//!
//! # Query canonical form
//!
//! Parameters are split on `&` (empty pieces dropped, so no query, `?` and
//! `?&` are equal), names and values are form-urlencoded-decoded (`%41` ≡
//! `A`, `+` ≡ `%20`, `%2B` is a literal `+`; broken escapes stay literal),
//! `a` ≡ `a=`, ignored names are dropped, then parameters are sorted by
//! name, stably: repeated parameters keep their order and multiplicity
//! (`a=1&a=2` ≠ `a=2&a=1`, `a=1&a=1` ≠ `a=1`).
//!
//! # Example
//!
//! ```
//! use axum::{body::Body, routing::get, Router};
//! use flightdeck_core::{http::ErrorResponseLayer, FlightKey};
//! use flightdeck_key::{http::{HttpKeyExtractor, Route}, KeyLayer};
//! use http::Request;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let keys = HttpKeyExtractor::builder()
//!     .route(Route::get("/v1/score/{id}", "score"))
//!     .ignore_query_params(["_", "ts"])
//!     .build()?;
//!
//! let app = Router::new()
//!     .route(
//!         "/v1/score/{id}",
//!         get(|req: Request<Body>| async move {
//!             // Layers below (single-flight) read the key the same way.
//!             req.extensions().get::<FlightKey>().map(|k| k.stage().to_string()).unwrap_or_default()
//!         }),
//!     )
//!     .layer(
//!         ServiceBuilder::new()
//!             .layer(ErrorResponseLayer::new()) // 422 / 400 for key errors
//!             .layer(KeyLayer::new(keys)),
//!     );
//!
//! let req = Request::get("/v1/score/7?ts=123").body(Body::empty())?;
//! let resp = app.oneshot(req).await?;
//! let body = axum::body::to_bytes(resp.into_body(), 1024).await?;
//! assert_eq!(&body[..], b"score");
//! # Ok(())
//! # }
//! ```

pub(crate) mod body;
mod idempotency;
mod query;
mod route;
pub(crate) mod scope;
pub(crate) mod unkeyed;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::http::{push_header_values, push_values, Present};
use flightdeck_core::key::EncodedFields;
use flightdeck_core::{BoxError, KeyEncoder, StageName};
use http::header::{
    ACCEPT, ACCEPT_ENCODING, ACCEPT_LANGUAGE, CONTENT_ENCODING, CONTENT_TYPE, HOST,
};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body::Body;

pub use self::body::KeyFuture;
pub(crate) use self::scope::ScopeConfig;
pub use self::scope::{
    check_scope_secret, Scope, ScopeId, DEFAULT_CREDENTIAL_HEADERS, MIN_SCOPE_SECRET_LEN,
    SCOPE_ENCODING_VERSION, X_API_KEY,
};

use self::body::{HeadEncoder, Plan};
use self::idempotency::IdempotencyTable;
use self::route::Pattern;
use self::unkeyed::Unkeyed;
use crate::error::KeyConfigError;
use crate::extract::{Extraction, KeyExtractor, Reason};

pub use flightdeck_core::http::FlightBody;

/// Default cap on a hashed body: 64 KiB.
pub const DEFAULT_BODY_CAP: usize = 64 * 1024;

/// Default cap on the body of a request with an `Idempotency-Key`: 1 MiB.
pub const DEFAULT_IDEMPOTENCY_BODY_CAP: usize = 1024 * 1024;

/// Default time an `Idempotency-Key` is remembered: 24 hours.
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// Default number of `Idempotency-Key`s remembered (oldest evicted first).
pub const DEFAULT_IDEMPOTENCY_CAPACITY: usize = 100_000;

/// The `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The buffer of the encoder of a request's key: its head with the default
/// headers is about 300 bytes (the five headers' names and counts alone
/// are 184), so that such a key is hashed in one call, without the boxed
/// streaming hasher (an allocation, and its 1.9 KB written and copied).
pub(crate) const HEAD_KEY_BUFFER: usize = 512;

/// Headers that say how the body is to be read: always part of the key.
const BODY_HEADERS: [HeaderName; 2] = [CONTENT_TYPE, CONTENT_ENCODING];

/// Keys HTTP requests (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct HttpKeyExtractor {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    routes: Vec<RouteRule>,
    stage_header: Option<(HeaderName, Vec<StageName>)>,
    default_stage: Option<StageName>,
    ignore_query: Vec<Box<[u8]>>,
    headers: Vec<HeaderName>,
    /// The headers written into every key, in order: the body's, then
    /// `headers`; each with its field and zero count as written when the
    /// request carries none (see [`KeyHeaders`]).
    key_headers: KeyHeaders,
    body_cap: Option<usize>,
    idempotency_body_cap: usize,
    idempotency: Arc<IdempotencyTable>,
    scope: ScopeConfig,
    authority: bool,
    unkeyed: Arc<Unkeyed>,
}

/// The headers written into every key. Most requests carry few of them:
/// which ones a request has is found in one walk over its header names
/// ([`Present`]), and the field of an absent one (its name, then its count
/// of values, zero) is encoded once, when the rules are built, and written
/// in one go: the same bytes as written field by field, so the same digest.
#[derive(Clone)]
struct KeyHeaders {
    names: Vec<HeaderName>,
    /// The field of each of `names` when absent, in the same order.
    absent: Vec<EncodedFields>,
}

impl KeyHeaders {
    fn new(names: Vec<HeaderName>) -> Self {
        let absent = names
            .iter()
            .map(|name| {
                let mut absent = EncodedFields::new();
                absent.push(name.as_str().as_bytes());
                absent.push(&0u64.to_le_bytes());
                absent
            })
            .collect();
        Self { names, absent }
    }
}

#[derive(Clone)]
struct RouteRule {
    method: Method,
    pattern: Pattern,
    stage: StageName,
    body_cap: Option<usize>,
}

impl HttpKeyExtractor {
    /// Starts a configuration.
    pub fn builder() -> HttpKeyExtractorBuilder {
        HttpKeyExtractorBuilder::new()
    }

    /// These rules with the authority left out of the key (see
    /// [`HttpKeyExtractorBuilder::ignore_authority`]): for a deployment's
    /// configuration applied to rules built in code.
    pub fn without_authority(mut self) -> Self {
        Arc::make_mut(&mut self.config).authority = false;
        self
    }

    extractor_scope_methods!();
}

impl crate::NamedStages for HttpKeyExtractor {
    fn stages(&self) -> Vec<StageName> {
        let c = &*self.config;
        let mut stages: Vec<StageName> = c
            .routes
            .iter()
            .map(|r| r.stage.clone())
            .chain(
                c.stage_header
                    .iter()
                    .flat_map(|(_, allowed)| allowed.iter().cloned()),
            )
            .chain(c.default_stage.iter().cloned())
            .collect();
        stages.sort();
        stages.dedup();
        stages
    }
}

impl fmt::Debug for HttpKeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &*self.config;
        f.debug_struct("HttpKeyExtractor")
            .field("routes", &c.routes.len())
            .field("default_stage", &c.default_stage)
            .field("headers", &c.headers)
            .field("body_cap", &c.body_cap)
            .field("scope", &c.scope.scope)
            .finish_non_exhaustive()
    }
}

/// A route rule: requests with this method whose path matches the pattern
/// belong to this stage. Rules also make methods other than GET and HEAD
/// coalescable.
#[derive(Debug, Clone)]
pub struct Route {
    method: Method,
    pattern: String,
    stage: String,
    body_cap: Option<usize>,
    without_body: bool,
}

impl Route {
    /// A rule for `method` on `pattern` (`/v1/items/{id}`, `/v1/:id`,
    /// `/files/{*rest}`; matched against the raw path).
    pub fn new(method: Method, pattern: impl Into<String>, stage: impl Into<String>) -> Self {
        Self {
            method,
            pattern: pattern.into(),
            stage: stage.into(),
            body_cap: None,
            without_body: false,
        }
    }

    /// A rule for `GET` on `pattern`.
    pub fn get(pattern: impl Into<String>, stage: impl Into<String>) -> Self {
        Self::new(Method::GET, pattern, stage)
    }

    /// A rule for `POST` on `pattern`; it needs [`hash_body`](Self::hash_body)
    /// (or [`coalesce_without_body`](Self::coalesce_without_body)).
    pub fn post(pattern: impl Into<String>, stage: impl Into<String>) -> Self {
        Self::new(Method::POST, pattern, stage)
    }

    /// Hashes the body of matching requests, up to `cap` bytes.
    pub fn hash_body(mut self, cap: usize) -> Self {
        self.body_cap = Some(cap);
        self
    }

    /// Says that this route's requests carry no body, so that a rule for a
    /// method that usually has one (POST, PUT, PATCH) builds without body
    /// hashing. Requests without a body are coalesced; one that does carry
    /// a body is still not (it reaches the handler on its own), since
    /// requests that differ only in unhashed bytes must never share.
    ///
    /// Without this, or [`hash_body`](Self::hash_body), or the builder's
    /// [`hash_bodies`](HttpKeyExtractorBuilder::hash_bodies), such a rule is a build
    /// error: it would coalesce nothing, silently.
    pub fn coalesce_without_body(mut self) -> Self {
        self.without_body = true;
        self
    }
}

/// Methods whose requests usually carry a body: a route rule for one must
/// say what happens to it.
fn carries_body(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// Configuration of an [`HttpKeyExtractor`].
#[derive(Debug)]
pub struct HttpKeyExtractorBuilder {
    routes: Vec<Route>,
    stage_header: Option<(String, Vec<String>)>,
    default_stage: Option<String>,
    ignore_query: Vec<String>,
    headers: Vec<String>,
    body_cap: Option<usize>,
    idempotency_body_cap: usize,
    idempotency_window: Duration,
    idempotency_capacity: usize,
    scope: ScopeConfig,
    authority: bool,
}

impl HttpKeyExtractorBuilder {
    fn new() -> Self {
        Self {
            routes: Vec::new(),
            stage_header: None,
            default_stage: None,
            ignore_query: Vec::new(),
            headers: [ACCEPT, ACCEPT_ENCODING, ACCEPT_LANGUAGE]
                .iter()
                .map(|h| h.as_str().to_owned())
                .collect(),
            body_cap: None,
            idempotency_body_cap: DEFAULT_IDEMPOTENCY_BODY_CAP,
            idempotency_window: DEFAULT_IDEMPOTENCY_WINDOW,
            idempotency_capacity: DEFAULT_IDEMPOTENCY_CAPACITY,
            scope: ScopeConfig::default(),
            authority: true,
        }
    }

    /// Adds a route rule (`Route::get("/v1/items/{id}", "items")`, or
    /// [`Route::new`] for any method, with body hashing if it has a body).
    /// Rules are tried in the order they were added.
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Takes the stage from a header, when no route rule matched. Only the
    /// listed stages are accepted: a header naming any other stage makes
    /// the request not coalesced, so clients cannot invent stages.
    pub fn stage_header<I, S>(mut self, name: &str, allowed: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.stage_header = Some((
            name.to_owned(),
            allowed.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// The stage of GET and HEAD requests (and of requests with an
    /// `Idempotency-Key`) that no rule or header placed. Without it, such
    /// requests are not coalesced.
    pub fn default_stage(mut self, stage: &str) -> Self {
        self.default_stage = Some(stage.to_owned());
        self
    }

    /// Query parameters that never change the response (cache busters such
    /// as `_`, `ts`, `nonce`): dropped before hashing. Compared with the
    /// decoded name, case-sensitively.
    pub fn ignore_query_params<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.ignore_query.extend(names.into_iter().map(Into::into));
        self
    }

    /// Adds a header to the key (besides `Accept`, `Accept-Encoding` and
    /// `Accept-Language`): e.g. a model or API version header.
    pub fn header(mut self, name: &str) -> Self {
        self.headers.push(name.to_owned());
        self
    }

    /// Leaves the authority (URI authority or `Host`) out of the key, for a
    /// service reached under several names (`api.internal`, a node's own
    /// address, a load balancer's): requests that differ only in the name
    /// they used then share. Keep the default when one deployment serves
    /// several sites whose responses differ by host. (The port is never
    /// part of the key: nodes reached on different ports share anyway.)
    pub fn ignore_authority(mut self) -> Self {
        self.authority = false;
        self
    }

    /// Removes the selected headers from the key, the default ones
    /// included; `Content-Type` and `Content-Encoding` stay (they say what
    /// the body means).
    pub fn clear_headers(mut self) -> Self {
        self.headers.clear();
        self
    }

    /// Hashes request bodies of every coalesced request up to `cap` bytes
    /// (route rules may set their own cap). A cap of 0 hashes nothing: a
    /// build error.
    pub fn hash_bodies(mut self, cap: usize) -> Self {
        self.body_cap = Some(cap);
        self
    }

    /// The body cap for requests with an `Idempotency-Key` (default 1 MiB).
    /// A larger request is not coalesced and not checked for conflicts: it
    /// runs on its own, like a request without the header.
    pub fn idempotency_body_cap(mut self, cap: usize) -> Self {
        self.idempotency_body_cap = cap;
        self
    }

    /// How long an `Idempotency-Key` is remembered for conflict detection
    /// (default 24 h). The first request seen with a key fixes its payload
    /// for the window, whether it succeeded or not. The table is per
    /// process: a conflict split across two nodes is not detected there, but
    /// since the whole request is part of the flight key, the two requests
    /// still never share a result.
    pub fn idempotency_window(mut self, window: Duration) -> Self {
        self.idempotency_window = window;
        self
    }

    /// How many `Idempotency-Key`s are remembered (default 100 000, about
    /// 100 bytes each).
    pub fn idempotency_capacity(mut self, entries: usize) -> Self {
        self.idempotency_capacity = entries;
        self
    }

    scope_setters!();

    /// Validates the configuration.
    ///
    /// A route rule for a method that usually carries a body (POST, PUT,
    /// PATCH, ...) must hash it ([`Route::hash_body`] or
    /// [`hash_bodies`](Self::hash_bodies)) or say it has none
    /// ([`Route::coalesce_without_body`]): otherwise no request with a body
    /// would ever coalesce, and nothing would say so.
    pub fn build(self) -> Result<HttpKeyExtractor, KeyConfigError> {
        let scope = self.scope.build()?;
        if self.body_cap == Some(0) {
            return Err(KeyConfigError::new(
                "body cap",
                "0",
                "hash_bodies(0) hashes nothing; give the largest body to hash",
            ));
        }
        let body_cap = self.body_cap;
        let unkeyed = Arc::new(Unkeyed::new(
            self.routes
                .iter()
                .map(|r| format!("{} {}", r.method, r.pattern))
                .collect(),
        ));
        let routes = self
            .routes
            .into_iter()
            .map(|r| {
                if carries_body(&r.method) && r.body_cap.or(body_cap).is_none() && !r.without_body {
                    return Err(KeyConfigError::new(
                        "route",
                        &format!("{} {}", r.method, r.pattern),
                        format_args!(
                            "(stage {}) does not hash the body, so requests with one would \
                             never coalesce; add .hash_body(cap), or \
                             .coalesce_without_body() if its requests carry none",
                            r.stage
                        ),
                    ));
                }
                if r.body_cap == Some(0) {
                    return Err(KeyConfigError::new(
                        "route",
                        &format!("{} {}", r.method, r.pattern),
                        "hash_body(0) hashes nothing; give the largest body to hash",
                    ));
                }
                Ok(RouteRule {
                    pattern: Pattern::parse(&r.pattern)
                        .map_err(|e| KeyConfigError::new("route pattern", &r.pattern, e))?,
                    stage: stage(&r.stage)?,
                    method: r.method,
                    body_cap: r.body_cap,
                })
            })
            .collect::<Result<Vec<_>, KeyConfigError>>()?;
        let stage_header = match self.stage_header {
            Some((name, allowed)) => Some((
                header_name(&name)?,
                allowed.iter().map(|s| stage(s)).collect::<Result<_, _>>()?,
            )),
            None => None,
        };
        let mut headers = self
            .headers
            .iter()
            .map(|h| header_name(h))
            .collect::<Result<Vec<_>, _>>()?;
        headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        headers.dedup();
        Ok(HttpKeyExtractor {
            config: Arc::new(Config {
                routes,
                stage_header,
                default_stage: self.default_stage.as_deref().map(stage).transpose()?,
                ignore_query: self
                    .ignore_query
                    .iter()
                    .map(|s| query::decode(s).into_owned().into_boxed_slice())
                    .collect(),
                key_headers: KeyHeaders::new(
                    BODY_HEADERS.iter().chain(&headers).cloned().collect(),
                ),
                headers,
                body_cap: self.body_cap,
                authority: self.authority,
                unkeyed,
                idempotency_body_cap: self.idempotency_body_cap,
                idempotency: Arc::new(IdempotencyTable::new(
                    self.idempotency_window,
                    self.idempotency_capacity,
                )),
                scope,
            }),
        })
    }
}

fn stage(name: &str) -> Result<StageName, KeyConfigError> {
    StageName::new(name).map_err(|e| KeyConfigError::new("stage", name, e))
}

fn header_name(name: &str) -> Result<HeaderName, KeyConfigError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|e| KeyConfigError::new("header name", name, e))
}

/// Writes each selected header: name, then its values the way flightdeck
/// compares header values everywhere, `Vary` included
/// ([`push_header_values`]: count, then each value).
pub(crate) fn write_headers<const N: usize>(
    enc: &mut KeyEncoder<N>,
    headers: &HeaderMap,
    names: &[HeaderName],
) {
    for name in names {
        enc.push(name.as_str().as_bytes());
        push_header_values(enc, headers, name);
    }
}

/// [`write_headers`] of the rules' key headers: a lookup for each one the
/// request has, and an absent one written in one go.
fn write_key_headers(enc: &mut HeadEncoder, headers: &HeaderMap, keys: &KeyHeaders) {
    let seen = Present::of(headers, &keys.names);
    for (i, (name, absent)) in keys.names.iter().zip(&keys.absent).enumerate() {
        if seen.known_absent(i) {
            enc.push_encoded(absent);
            continue;
        }
        let values = headers.get_all(name);
        if values.iter().next().is_none() {
            enc.push_encoded(absent);
        } else {
            enc.push(name.as_str().as_bytes());
            push_values(enc, values);
        }
    }
}

enum Idempotency<'a> {
    None,
    Key(&'a [u8]),
    Bad,
}

fn idempotency_key(parts: &Parts) -> Idempotency<'_> {
    let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Idempotency::None;
    };
    if values.next().is_some() {
        return Idempotency::Bad;
    }
    // The draft sends the key as a structured-field string: `"abc"` and a
    // bare `abc` name the same key.
    let bytes = first.as_bytes();
    let bytes = bytes
        .strip_prefix(b"\"")
        .and_then(|b| b.strip_suffix(b"\""))
        .unwrap_or(bytes);
    if bytes.is_empty() {
        Idempotency::Bad
    } else {
        Idempotency::Key(bytes)
    }
}

impl Config {
    /// Reads the head: either a bypass reason, or the plan for the body.
    fn plan(&self, parts: &Parts, out: &mut Option<HeadEncoder>) -> Result<Plan, Reason> {
        let method = &parts.method;
        let path = parts.uri.path();
        let safe = *method == Method::GET || *method == Method::HEAD;
        let route = self
            .routes
            .iter()
            .find(|r| r.method == *method && r.pattern.matches(path));
        let idem = if safe {
            None
        } else {
            match idempotency_key(parts) {
                Idempotency::None => None,
                Idempotency::Key(k) => Some(k),
                Idempotency::Bad => return Err(Reason::BadIdempotencyKey),
            }
        };
        if route.is_none() && !safe && idem.is_none() {
            return Err(Reason::Method);
        }
        let stage = match route {
            Some(r) => r.stage.clone(),
            None => self.header_stage(parts)?.ok_or(Reason::NoStage)?,
        };
        let scope = self.scope.of(parts)?;

        let enc = out.insert(HeadEncoder::buffered(b"flightdeck-key/http/1"));
        enc.push(method.as_str().as_bytes());
        self.write_authority(enc, parts);
        enc.push(path.as_bytes());
        query::write_query(enc, parts.uri.query(), &self.ignore_query);
        // How the body is to be read is part of what it means.
        write_key_headers(enc, &parts.headers, &self.key_headers);
        let idempotency = match idem {
            Some(key) => {
                enc.push(b"idempotency-key");
                enc.push(key);
                let mut slot = KeyEncoder::with_domain(b"flightdeck-key/idempotency/1");
                slot.push(stage.as_str().as_bytes());
                slot.push(scope.as_ref().map_or(&[][..], |d| d.as_bytes()));
                slot.push(method.as_str().as_bytes());
                self.write_authority(&mut slot, parts);
                slot.push(path.as_bytes());
                slot.push(key);
                Some((Arc::clone(&self.idempotency), slot.finish()))
            }
            None => {
                enc.push(b"-");
                None
            }
        };
        let cap = route
            .and_then(|r| r.body_cap)
            .or(self.body_cap)
            .or(idem.map(|_| self.idempotency_body_cap));
        Ok(Plan {
            stage,
            scope,
            cap,
            idempotency,
        })
    }

    /// The authority, unless the builder left it out (then a fixed marker:
    /// such keys never equal keys that include one).
    fn write_authority<const N: usize>(&self, enc: &mut KeyEncoder<N>, parts: &Parts) {
        if self.authority {
            write_authority(enc, parts);
        } else {
            enc.push(b"*");
        }
    }

    fn header_stage(&self, parts: &Parts) -> Result<Option<StageName>, Reason> {
        if let Some((name, allowed)) = &self.stage_header {
            let mut values = parts.headers.get_all(name).iter();
            if let Some(value) = values.next() {
                // Given twice, it names no stage: neither value is more
                // the request's than the other.
                if values.next().is_some() {
                    return Err(Reason::UnknownStage);
                }
                return allowed
                    .iter()
                    .find(|s| s.as_str().as_bytes() == value.as_bytes())
                    .cloned()
                    .map(Some)
                    .ok_or(Reason::UnknownStage);
            }
        }
        Ok(self.default_stage.clone())
    }
}

/// The host of the authority (URI authority, else `Host`), without its
/// port or user info, ASCII-lowercased: nginx's `$host`. The nodes of one
/// service are reached on different ports (`10.0.0.7:3201`, `:3202`, a
/// load balancer's `:443`) and answer alike, so the port never splits a
/// flight; different names (virtual hosts) still do.
fn write_authority<const N: usize>(enc: &mut KeyEncoder<N>, parts: &Parts) {
    let raw: &[u8] = match parts.uri.authority() {
        Some(a) => a.as_str().as_bytes(),
        None => parts
            .headers
            .get(HOST)
            .map_or(&[][..], HeaderValue::as_bytes),
    };
    let host = host_of(raw);
    if host.iter().any(u8::is_ascii_uppercase) {
        enc.push(&host.to_ascii_lowercase());
    } else {
        enc.push(host);
    }
}

/// `host[:port]`, `user@host:port` or `[v6]:port` without the user info
/// and the port. Bytes that are not an authority are kept whole.
fn host_of(authority: &[u8]) -> &[u8] {
    let a = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    if a.first() == Some(&b'[') {
        return match a.iter().position(|&b| b == b']') {
            Some(end) => &a[..=end],
            None => a,
        };
    }
    match a.iter().rposition(|&b| b == b':') {
        Some(colon) if a[colon + 1..].iter().all(u8::is_ascii_digit) => &a[..colon],
        _ => a,
    }
}

impl<B> KeyExtractor<Request<B>> for HttpKeyExtractor
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Request = Request<FlightBody<B>>;
    type Future = KeyFuture<B>;

    fn extract(&self, req: Request<B>) -> Extraction<Self::Request, Self::Future> {
        body::extract_with(req, &self.config.unkeyed, |parts, slot| {
            self.config.plan(parts, slot)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_is_the_authority_without_port_and_user_info() {
        let cases: [(&[u8], &[u8]); 9] = [
            (b"a.example", b"a.example"),
            (b"a.example:3201", b"a.example"),
            (b"a.example:", b"a.example"),
            (b"user:pw@a.example:80", b"a.example"),
            (b"[::1]:3201", b"[::1]"),
            (b"[::1]", b"[::1]"),
            (b"127.0.0.1:3202", b"127.0.0.1"),
            // Not a port: kept whole, so it never equals a real host.
            (b"a.example:http", b"a.example:http"),
            (b"", b""),
        ];
        for (authority, host) in cases {
            assert_eq!(host_of(authority), host, "{authority:?}");
        }
    }
}
