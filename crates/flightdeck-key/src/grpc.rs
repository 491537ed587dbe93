//! The gRPC extractor: coalesces allowlisted unary methods.
//!
//! A tower layer in front of a tonic server sees plain `http::Request`s:
//! the method is the path (`/pkg.Service/Method`), the metadata are the
//! headers, the message is the body (length-prefixed frames). Unary and
//! streaming calls look the same on the wire, so **only the methods on the
//! allowlist are coalesced**; list only unary ones. Everything else passes
//! through with its body untouched (not even read).
//!
//! The key of an allowlisted call covers the method path, the
//! `grpc-encoding` (absent ≡ `identity`; compressed frames differ byte for
//! byte), the `content-type` (the codec) and `grpc-accept-encoding` (a
//! shared response must be decodable by every caller), the selected metadata (raw bytes, `-bin` values as sent) and the
//! message bytes, read up to the cap and re-attached byte for byte. Protobuf
//! encodings are not canonical, so two equal messages encoded differently
//! get different keys (a missed merge, never a wrong one). `grpc-timeout`
//! is never part of the key. The tenant scope works as for HTTP
//! ([`Scope`](crate::http::Scope)): by default, calls with different `authorization` metadata
//! never share.
//!
//! No tonic dependency: put the [`KeyLayer`](crate::KeyLayer) on
//! `Server::builder().layer(..)`, and map errors with
//! `flightdeck_core::http::ErrorResponseLayer` (it answers gRPC requests with
//! a trailers-only status).
//!
//! ```
//! use bytes::Bytes;
//! use flightdeck_core::FlightKey;
//! use flightdeck_key::{grpc::GrpcKeyExtractor, KeyLayer};
//! use http_body_util::Full;
//! use tower::{service_fn, ServiceExt, Layer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let keys = GrpcKeyExtractor::builder()
//!     .method("/grpc.health.v1.Health/Check", "health")
//!     .build()?;
//! let svc = KeyLayer::new(keys).layer(service_fn(|req: http::Request<_>| async move {
//!     Ok::<_, std::convert::Infallible>(req.extensions().get::<FlightKey>().is_some())
//! }));
//! let req = http::Request::post("/grpc.health.v1.Health/Check")
//!     .header("content-type", "application/grpc")
//!     .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))?;
//! assert!(svc.oneshot(req).await?);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use flightdeck_core::http::FlightBody;
use flightdeck_core::{BoxError, StageName};
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderName, Method, Request};
use http_body::Body;

use crate::error::KeyConfigError;
use crate::extract::{Extraction, KeyExtractor, Reason};
use crate::http::body::HeadEncoder;
use crate::http::unkeyed::Unkeyed;
use crate::http::{write_headers, KeyFuture, ScopeConfig};

/// Default cap on a hashed gRPC message: 1 MiB.
pub const DEFAULT_MESSAGE_CAP: usize = 1024 * 1024;

/// Every gRPC message is at least its frame header (a flag byte and a
/// 4-byte length).
const FRAME_HEADER: usize = 5;

const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// Keys allowlisted unary gRPC calls (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct GrpcKeyExtractor {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    methods: HashMap<Box<str>, StageName>,
    metadata: Vec<HeaderName>,
    cap: usize,
    scope: ScopeConfig,
    unkeyed: Arc<Unkeyed>,
}

impl GrpcKeyExtractor {
    /// Starts a configuration.
    pub fn builder() -> GrpcKeyExtractorBuilder {
        GrpcKeyExtractorBuilder {
            methods: Vec::new(),
            metadata: Vec::new(),
            cap: DEFAULT_MESSAGE_CAP,
            scope: ScopeConfig::default(),
        }
    }

    extractor_scope_methods!();
}

impl crate::NamedStages for GrpcKeyExtractor {
    fn stages(&self) -> Vec<StageName> {
        let mut stages: Vec<StageName> = self.config.methods.values().cloned().collect();
        stages.sort();
        stages.dedup();
        stages
    }
}

impl fmt::Debug for GrpcKeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcKeyExtractor")
            .field("methods", &self.config.methods.len())
            .field("metadata", &self.config.metadata)
            .field("cap", &self.config.cap)
            .field("scope", &self.config.scope.scope)
            .finish_non_exhaustive()
    }
}

/// Configuration of a [`GrpcKeyExtractor`].
#[derive(Debug)]
pub struct GrpcKeyExtractorBuilder {
    methods: Vec<(String, String)>,
    metadata: Vec<String>,
    cap: usize,
    scope: ScopeConfig,
}

impl GrpcKeyExtractorBuilder {
    /// Allowlists a **unary** method (`/pkg.Service/Method`) in `stage`
    /// (a method listed in two stages fails the build).
    pub fn method(mut self, path: &str, stage: &str) -> Self {
        self.methods.push((path.to_owned(), stage.to_owned()));
        self
    }

    /// Adds a metadata key (e.g. `x-model-version`) to the key.
    pub fn metadata(mut self, name: &str) -> Self {
        self.metadata.push(name.to_owned());
        self
    }

    /// The largest message body hashed (default 1 MiB); larger calls are
    /// not coalesced and reach the service intact. At least 5 bytes (a
    /// frame header), or the build fails.
    pub fn message_cap(mut self, cap: usize) -> Self {
        self.cap = cap;
        self
    }

    scope_setters!();

    /// Validates the configuration.
    pub fn build(self) -> Result<GrpcKeyExtractor, KeyConfigError> {
        let scope = self.scope.build()?;
        if self.cap < FRAME_HEADER {
            return Err(KeyConfigError::new(
                "message cap",
                &self.cap.to_string(),
                "is smaller than a gRPC frame header (5 bytes), so no call would coalesce",
            ));
        }
        let mut methods: HashMap<Box<str>, StageName> = HashMap::new();
        for (path, stage) in self.methods {
            let valid = path.len() > 3
                && path.starts_with('/')
                && path[1..].split('/').count() == 2
                && !path[1..].split('/').any(str::is_empty);
            if !valid {
                return Err(KeyConfigError::new(
                    "gRPC method",
                    &path,
                    "expected \"/package.Service/Method\"",
                ));
            }
            let stage =
                StageName::new(&stage).map_err(|e| KeyConfigError::new("stage", &stage, e))?;
            if let Some(before) = methods.get(path.as_str()).filter(|s| **s != stage) {
                return Err(KeyConfigError::new(
                    "gRPC method",
                    &path,
                    format_args!("is listed in two stages, {before} and {stage}"),
                ));
            }
            methods.insert(path.into_boxed_str(), stage);
        }
        let mut metadata = self
            .metadata
            .iter()
            .map(|m| {
                HeaderName::from_bytes(m.as_bytes())
                    .map_err(|e| KeyConfigError::new("metadata key", m, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        metadata.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        metadata.dedup();
        let unkeyed = Arc::new(Unkeyed::new(
            methods.keys().map(|m| m.to_string()).collect(),
        ));
        Ok(GrpcKeyExtractor {
            config: Arc::new(Config {
                unkeyed,
                methods,
                metadata,
                cap: self.cap,
                scope,
            }),
        })
    }
}

fn is_grpc(parts: &Parts) -> bool {
    parts.method == Method::POST
        && parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl Config {
    fn plan(
        &self,
        parts: &Parts,
        out: &mut Option<HeadEncoder>,
    ) -> Result<crate::http::body::Plan, Reason> {
        if !is_grpc(parts) {
            return Err(Reason::NotGrpc);
        }
        let path = parts.uri.path();
        let stage = self
            .methods
            .get(path)
            .ok_or(Reason::NotAllowlisted)?
            .clone();
        let scope = self.scope.of(parts)?;
        let enc = out.insert(HeadEncoder::buffered(b"flightdeck-key/grpc/1"));
        enc.push(path.as_bytes());
        let encoding = parts
            .headers
            .get(GRPC_ENCODING)
            .map_or(&b"identity"[..], |v| v.as_bytes());
        enc.push(encoding);
        // The codec (`application/grpc+proto`, `+json`) and the encodings the
        // caller can decode shape the response that will be shared.
        write_headers(enc, &parts.headers, &[CONTENT_TYPE, GRPC_ACCEPT_ENCODING]);
        write_headers(enc, &parts.headers, &self.metadata);
        Ok(crate::http::body::Plan {
            stage,
            scope,
            cap: Some(self.cap),
            idempotency: None,
        })
    }
}

impl<B> KeyExtractor<Request<B>> for GrpcKeyExtractor
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Request = Request<FlightBody<B>>;
    type Future = KeyFuture<B>;

    fn extract(&self, req: Request<B>) -> Extraction<Self::Request, Self::Future> {
        crate::http::body::extract_with(req, &self.config.unkeyed, |parts, slot| {
            self.config.plan(parts, slot)
        })
    }
}
