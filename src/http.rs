//! One layer for an HTTP or gRPC service: keys, single-flight and the
//! error responses together.
//!
//! [`SingleFlightLayer::http`] (and [`SingleFlightLayer::grpc`]) take the
//! key rules and give a builder for the stages and backends; what it builds
//! is a [`FlightsLayer`], which is the whole integration:
//!
//! ```text
//! request ─ ErrorResponse ─ Key (the rules) ─ SingleFlight (the stages) ─ your handler
//! ```
//!
//! - the key rules put a [`FlightKey`](flightdeck_core::FlightKey) (or a
//!   reason not to coalesce) on each request;
//! - the stages coalesce by that key, locally and across nodes;
//! - flightdeck's errors become responses: 503 (coordination down in
//!   DISTRIBUTED_ONLY), 429 (bulkhead full), 504 (deadlines), 422
//!   (idempotency conflict), 400 (unreadable body); for gRPC requests,
//!   trailers-only responses with the matching `grpc-status`.
//!
//! Building checks the two halves against each other: a stage the rules
//! name but the configuration does not is a build error naming the stage
//! (unless [`default_policy`](FlightsBuilder::default_policy) gives such
//! stages one on purpose, or [`local_only`](FlightsBuilder::local_only)
//! runs every stage here). A configuration file is applied whole: its
//! stages, and its key settings (`[single-flight.keys]`) on the rules.
//!
//! ```
//! use axum::{routing::post, Router};
//! use flightdeck::key::http::{HttpKeyExtractor, Route};
//! use flightdeck::{Mode, SingleFlightLayer, StageConfig};
//! use http::Method;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let keys = HttpKeyExtractor::builder()
//!     .add_route(Route::new(Method::POST, "/v1/score", "score").hash_body(64 * 1024))
//!     .build()?;
//! let flights = SingleFlightLayer::http(keys)
//!     .stage("score", StageConfig::new().mode(Mode::LocalOnly))
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/v1/score", post(|| async { "scored" }))
//!     .layer(flights);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! Those who compose their own stack use the parts directly:
//! `ErrorResponseLayer`, `KeyLayer` and [`SingleFlightBuilder::http`].

use std::fmt;

use flightdeck_budget::FromHeaders;
use flightdeck_core::http::{ErrorResponse, HttpShare};
use flightdeck_core::FromExtension;
use flightdeck_distributed::{Backend, ExtensionFence, HttpCodec};
use flightdeck_key::http::HttpKeyExtractor;
use flightdeck_key::{Key, KeyLayer};
use tower_layer::Layer;

use crate::config::{ConfigError, KeySettings, SingleFlightConfig, StageConfig, SCOPE_SECRET_ENV};
use crate::layer::{SingleFlightBuilder, SingleFlightLayer};
use crate::service::SingleFlight;
use crate::stage::StageHandle;

/// The single-flight part of an HTTP stack: what
/// [`SingleFlightBuilder::http`] builds, for those who compose the key and
/// error layers themselves.
pub type HttpSingleFlightLayer =
    SingleFlightLayer<FromExtension, HttpShare, HttpCodec, ExtensionFence, FromHeaders>;

/// The service an [`HttpSingleFlightLayer`] wraps around `S`.
pub type HttpSingleFlight<S> =
    SingleFlight<S, FromExtension, HttpShare, HttpCodec, ExtensionFence, FromHeaders>;

/// The service a [`FlightsLayer`] wraps around `S`: error responses, keys,
/// single-flight, then `S`.
pub type Flights<S, E = HttpKeyExtractor> = ErrorResponse<Key<HttpSingleFlight<S>, E>>;

/// The layer for gRPC services (tonic's `Server::builder().layer(..)`).
#[cfg(feature = "grpc")]
pub type GrpcFlightsLayer = FlightsLayer<flightdeck_key::grpc::GrpcKeyExtractor>;

impl HttpSingleFlightLayer {
    /// Starts the one layer of an HTTP service, keyed by `keys` (see the
    /// [module docs](crate::http)).
    pub fn http(keys: HttpKeyExtractor) -> FlightsBuilder<HttpKeyExtractor> {
        FlightsBuilder::new(keys)
    }

    /// Starts the one layer of a gRPC service, keyed by `keys` (only its
    /// allowlisted unary methods coalesce).
    #[cfg(feature = "grpc")]
    pub fn grpc(
        keys: flightdeck_key::grpc::GrpcKeyExtractor,
    ) -> FlightsBuilder<flightdeck_key::grpc::GrpcKeyExtractor> {
        FlightsBuilder::new(keys)
    }
}

/// Builds a [`FlightsLayer`]: the key rules (given), the stages and the
/// backends. Started by [`SingleFlightLayer::http`] or
/// [`SingleFlightLayer::grpc`].
pub struct FlightsBuilder<E> {
    keys: E,
    inner: SingleFlightBuilder<FromExtension, HttpShare, HttpCodec, ExtensionFence, FromHeaders>,
    default_policy: Option<StageConfig>,
    key_settings: KeySettings,
    local_only: bool,
}

impl<E> FlightsBuilder<E> {
    fn new(keys: E) -> Self {
        Self {
            keys,
            inner: SingleFlightBuilder::http(),
            default_policy: None,
            key_settings: KeySettings::default(),
            local_only: false,
        }
    }

    /// Registers a coordination backend under `name` (see
    /// [`SingleFlightBuilder::backend`]).
    pub fn backend(mut self, name: impl Into<String>, backend: impl Backend) -> Self {
        self.inner = self.inner.backend(name, backend);
        self
    }

    /// Adds (or replaces) a stage.
    pub fn stage(mut self, name: impl Into<String>, cfg: StageConfig) -> Self {
        self.inner = self.inner.stage(name, cfg);
        self
    }

    /// Adds every stage of a loaded configuration, and applies its key
    /// settings (`[single-flight.keys]`: `ignore-authority`,
    /// `scope-secret-env`) to the key rules when building. A setting that
    /// cannot be applied fails [`build`](Self::build), naming it.
    pub fn config(mut self, mut cfg: SingleFlightConfig) -> Self {
        let keys = std::mem::take(&mut cfg.keys);
        if keys.is_set() {
            self.key_settings = keys;
        }
        self.inner = self.inner.config(cfg);
        self
    }

    /// Runs every stage in this process only (see
    /// [`SingleFlightBuilder::local_only`]). The stages the key rules name
    /// need no declaration then: those without one run LOCAL_ONLY with the
    /// defaults (or the [`default_policy`](Self::default_policy)).
    pub fn local_only(mut self) -> Self {
        self.inner = self.inner.local_only();
        self.local_only = true;
        self
    }

    /// Gives `cfg` to every stage the key rules name and the configuration
    /// does not. Without it, such a stage is a build error: a typo in a
    /// config file would otherwise fail every request of the route.
    pub fn default_policy(mut self, cfg: StageConfig) -> Self {
        self.default_policy = Some(cfg);
        self
    }

    /// Shares responses with `share` instead of the default [`HttpShare`]
    /// (e.g. a larger body cap, or other credential headers).
    pub fn share(mut self, share: HttpShare) -> Self {
        self.inner = self.inner.share(share);
        self
    }

    /// Applies the configuration's key settings to the key rules,
    /// validates the rules against the stages, and every stage; builds the
    /// layer. Errors name the stage and the field (`keys.…` for a key
    /// setting).
    ///
    /// When a stage can store results in a shared backend and the tenant
    /// scope digests are unkeyed (no scope secret), a warning says so:
    /// whoever reads the backend's key names could check guessed
    /// credentials against them.
    pub fn build(mut self) -> Result<FlightsLayer<E>, ConfigError>
    where
        E: KeyRules,
    {
        let keys = self.keys.apply_settings(&self.key_settings)?;
        for stage in keys.stages() {
            if self.inner.has_stage(stage.as_str()) {
                continue;
            }
            let cfg = match &self.default_policy {
                Some(cfg) => cfg.clone(),
                // Every stage runs here anyway: a declaration would say
                // nothing the defaults do not.
                None if self.local_only => StageConfig::new(),
                None => {
                    return Err(ConfigError::invalid(
                        Some(stage.as_str()),
                        "stage",
                        format!(
                            "is named by the key rules but has no policy: add it to the \
                             configuration ([single-flight.stages.<name>]), or give the \
                             builder a default_policy(..){}",
                            crate::config::closest(stage.as_str(), self.inner.stage_names())
                                .map_or_else(String::new, |c| format!(
                                    "; the configuration has {c:?}: a typo?"
                                ))
                        ),
                    ))
                }
            };
            self.inner = self.inner.stage(stage.as_str(), cfg);
        }
        let flights = self.inner.build()?;
        let stored = flights.shared_store_stages();
        if keys.scope_digests_unkeyed() && !stored.is_empty() {
            tracing::warn!(
                stages = ?stored,
                "tenant scope digests are unkeyed, and these stages store results in a shared \
                 backend whose key names carry them: whoever can read those names can check \
                 guessed credentials against them offline. Set [single-flight.keys] \
                 scope-secret-env (or scope_secret(..) on the key builder) to the same random \
                 secret on every node"
            );
        }
        Ok(FlightsLayer {
            keys: KeyLayer::new(keys),
            flights,
        })
    }
}

pub use self::rules::KeyRules;

mod rules {
    use flightdeck_key::NamedStages;

    use crate::config::{ConfigError, KeySettings};

    /// The key rules a [`FlightsBuilder`](super::FlightsBuilder) builds
    /// with (implemented by the HTTP and the gRPC extractor): what the
    /// configuration's [`KeySettings`] change on rules built in code, and
    /// what the layer needs to know of them.
    pub trait KeyRules: NamedStages + Sized {
        /// These rules with `settings` applied; an error names the
        /// setting that could not be.
        fn apply_settings(self, settings: &KeySettings) -> Result<Self, ConfigError>;

        /// Whether requests get tenant scope digests no secret keys.
        fn scope_digests_unkeyed(&self) -> bool;
    }
}

/// A scope secret from the configuration given to built rules.
fn with_secret<E>(
    keys: E,
    settings: &KeySettings,
    set: impl FnOnce(E, String) -> Result<E, flightdeck_key::error::KeyConfigError>,
) -> Result<E, ConfigError> {
    match settings.scope_secret()? {
        Some(secret) => set(keys, secret)
            .map_err(|e| ConfigError::invalid(None, SCOPE_SECRET_ENV, e.to_string())),
        None => Ok(keys),
    }
}

impl KeyRules for HttpKeyExtractor {
    fn apply_settings(mut self, settings: &KeySettings) -> Result<Self, ConfigError> {
        if settings.ignore_authority {
            self = self.without_authority();
        }
        with_secret(self, settings, |k, s| k.with_scope_secret(s))
    }

    fn scope_digests_unkeyed(&self) -> bool {
        HttpKeyExtractor::scope_digests_unkeyed(self)
    }
}

/// gRPC keys never hold the authority, so `ignore-authority` holds as it
/// is.
#[cfg(feature = "grpc")]
impl KeyRules for flightdeck_key::grpc::GrpcKeyExtractor {
    fn apply_settings(self, settings: &KeySettings) -> Result<Self, ConfigError> {
        with_secret(self, settings, |k, s| k.with_scope_secret(s))
    }

    fn scope_digests_unkeyed(&self) -> bool {
        flightdeck_key::grpc::GrpcKeyExtractor::scope_digests_unkeyed(self)
    }
}

impl<E: fmt::Debug> fmt::Debug for FlightsBuilder<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightsBuilder")
            .field("keys", &self.keys)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The one layer of an HTTP or gRPC service: error responses, keys and
/// single-flight (see the [module docs](crate::http)). Cheap to clone: every
/// clone and every service it builds share the same flights.
pub struct FlightsLayer<E = HttpKeyExtractor> {
    keys: KeyLayer<E>,
    flights: HttpSingleFlightLayer,
}

impl<E> FlightsLayer<E> {
    /// The single-flight part (stage handles, idle, running flights).
    pub fn flights(&self) -> &HttpSingleFlightLayer {
        &self.flights
    }

    /// The key rules.
    pub fn keys(&self) -> &E {
        self.keys.extractor()
    }

    /// The runtime handle of a stage (mode switch, degraded state, breaker,
    /// bulkhead).
    pub fn stage(&self, name: &str) -> Option<StageHandle> {
        self.flights.stage(name)
    }

    /// Handles of every stage.
    pub fn stages(&self) -> Vec<StageHandle> {
        self.flights.stages()
    }

    /// Resolves once no stage has background coordination left (see
    /// [`SingleFlightLayer::idle`]).
    pub async fn idle(&self) {
        self.flights.idle().await;
    }
}

impl<E> Clone for FlightsLayer<E> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            flights: self.flights.clone(),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for FlightsLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightsLayer")
            .field("keys", self.keys.extractor())
            .field("flights", &self.flights)
            .finish()
    }
}

impl<S, E> Layer<S> for FlightsLayer<E> {
    type Service = Flights<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        ErrorResponse::new(self.keys.layer(self.flights.layer(inner)))
    }
}
