//! The one layer of an HTTP or gRPC service: keys, single-flight and the
//! error responses together.
//!
//! [`SingleFlightLayer::builder`] takes the key rules
//! ([`keys`](SingleFlightLayerBuilder::keys)), the stages and the backends,
//! and builds a [`SingleFlightLayer`], which is the whole integration:
//!
//! ```text
//! request ─ ErrorResponse ─ Key (the rules) ─ single-flight (the stages) ─ your handler
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
//! (unless [`default_policy`](SingleFlightLayerBuilder::default_policy)
//! gives such stages one on purpose, or
//! [`local_only`](SingleFlightLayerBuilder::local_only) runs every stage
//! here). A configuration file is applied whole: its stages, and its key
//! settings (`[single-flight.keys]`) on the rules.
//!
//! ```
//! use axum::{routing::post, Router};
//! use flightdeck::{HttpKeyExtractor, Mode, Route, SingleFlightLayer, StageConfig};
//!
//! # fn main() -> Result<(), flightdeck::BoxError> {
//! let keys = HttpKeyExtractor::builder()
//!     .route(Route::post("/v1/score", "score").hash_body(64 * 1024))
//!     .build()?;
//! let flights = SingleFlightLayer::builder()
//!     .keys(keys)
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
//! A gRPC service gives a `GrpcKeyExtractor` to
//! [`keys`](SingleFlightLayerBuilder::keys) (feature `grpc`): the layer is
//! then a `SingleFlightLayer<GrpcKeyExtractor>`. Those who compose their
//! own stack use the parts directly: `ErrorResponseLayer`, `KeyLayer` and
//! [`GenericSingleFlightLayer::http`].

use std::fmt;
use std::task::{Context, Poll};

use flightdeck_core::http::{ErrorResponse, HttpShare};
use flightdeck_distributed::Backend;
use flightdeck_key::http::HttpKeyExtractor;
use flightdeck_key::{Key, KeyLayer};
use tower_layer::Layer;
use tower_service::Service;

use crate::config::{ConfigError, KeySettings, SingleFlightConfig, StageConfig, SCOPE_SECRET_ENV};
use crate::layer::{GenericSingleFlightLayer, GenericSingleFlightLayerBuilder};
use crate::readers::HttpReaders;
use crate::service::GenericSingleFlight;
use crate::stage::StageHandle;

/// The single-flight part of the layer.
type Flights = GenericSingleFlightLayer<HttpReaders, HttpShare>;

/// The service the single-flight part wraps around `S`.
type Inner<S, E> = ErrorResponse<Key<GenericSingleFlight<S, HttpReaders, HttpShare>, E>>;

/// The one layer of an HTTP service (axum, hyper), or of a gRPC service
/// (tonic) with `E` = `GrpcKeyExtractor`: error responses, keys and
/// single-flight (see the [module docs](crate::http)). Cheap to clone:
/// every clone and every service it builds share the same flights. Built
/// by [`SingleFlightLayer::builder`].
///
/// A function that builds the app can name it:
///
/// ```
/// use axum::{routing::get, Router};
/// use flightdeck::{HttpKeyExtractor, Route, SingleFlightLayer};
///
/// fn app(flights: SingleFlightLayer) -> Router {
///     Router::new()
///         .route("/report", get(|| async { "the report" }))
///         .layer(flights)
/// }
///
/// # fn main() -> Result<(), flightdeck::BoxError> {
/// let keys = HttpKeyExtractor::builder()
///     .route(Route::get("/report", "report"))
///     .build()?;
/// let app = app(SingleFlightLayer::builder().keys(keys).local_only().build()?);
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
pub struct SingleFlightLayer<E = HttpKeyExtractor> {
    keys: KeyLayer<E>,
    flights: Flights,
}

impl SingleFlightLayer {
    /// Starts the layer: give it key rules
    /// ([`keys`](SingleFlightLayerBuilder::keys)), the stages (or a
    /// configuration) and the backends.
    pub fn builder() -> SingleFlightLayerBuilder {
        SingleFlightLayerBuilder {
            keys: None,
            inner: GenericSingleFlightLayer::http(),
            default_policy: None,
            key_settings: KeySettings::default(),
            local_only: false,
        }
    }
}

impl<E> SingleFlightLayer<E> {
    /// The single-flight part (for those who compose it themselves).
    pub fn flights(&self) -> &GenericSingleFlightLayer<HttpReaders, HttpShare> {
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

    /// Purges the result of the request's key, built by the layer's key
    /// rules as for a request it serves (see
    /// [`StageHandle::invalidate`]): `Ok(false)` when the rules give the
    /// request no key, or a key of no stage of this layer. A rule that
    /// hashes the body reads it.
    pub async fn invalidate_request<Req>(&self, req: Req) -> Result<bool, crate::BoxError>
    where
        E: flightdeck_key::KeyExtractor<Req>,
    {
        let extracted = match self.keys.extractor().extract(req) {
            flightdeck_key::Extraction::Ready(r) => r?,
            flightdeck_key::Extraction::Pending(f) => f.await?,
        };
        let Some(key) = extracted.decision.key() else {
            return Ok(false);
        };
        match self.flights.stage(key.stage().as_str()) {
            Some(stage) => stage.invalidate(key).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Local flights running right now in a stage (for tests and health
    /// checks).
    pub fn running_flights(&self, stage: &str) -> Option<usize> {
        self.flights.running_flights(stage)
    }

    /// Resolves once no stage has background coordination left (owners'
    /// commits and abandons, releases of leases this node gave up on): for
    /// graceful shutdown, and tests.
    pub async fn idle(&self) {
        self.flights.idle().await;
    }
}

impl<E> Clone for SingleFlightLayer<E> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            flights: self.flights.clone(),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for SingleFlightLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightLayer")
            .field("keys", self.keys.extractor())
            .field("flights", &self.flights)
            .finish()
    }
}

impl<S, E> Layer<S> for SingleFlightLayer<E> {
    type Service = SingleFlight<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        SingleFlight {
            inner: ErrorResponse::new(self.keys.layer(self.flights.layer(inner))),
        }
    }
}

/// The service a [`SingleFlightLayer`] wraps around `S`: error responses,
/// keys, single-flight, then `S`.
pub struct SingleFlight<S, E = HttpKeyExtractor> {
    inner: Inner<S, E>,
}

impl<S, E> SingleFlight<S, E> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref().get_ref().get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut().get_mut().get_mut()
    }

    /// Consumes the wrapper, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner().into_inner()
    }
}

impl<S: Clone, E> Clone for SingleFlight<S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: fmt::Debug, E: fmt::Debug> fmt::Debug for SingleFlight<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("inner", self.get_ref())
            .finish_non_exhaustive()
    }
}

impl<S, E, Req> Service<Req> for SingleFlight<S, E>
where
    Inner<S, E>: Service<Req>,
{
    type Response = <Inner<S, E> as Service<Req>>::Response;
    type Error = <Inner<S, E> as Service<Req>>::Error;
    type Future = <Inner<S, E> as Service<Req>>::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call(req)
    }
}

/// Builds a [`SingleFlightLayer`]: the key rules, the stages and the
/// backends. Started by [`SingleFlightLayer::builder`].
pub struct SingleFlightLayerBuilder<E = HttpKeyExtractor> {
    keys: Option<E>,
    inner: GenericSingleFlightLayerBuilder<HttpReaders, HttpShare>,
    default_policy: Option<StageConfig>,
    key_settings: KeySettings,
    local_only: bool,
}

impl<E> SingleFlightLayerBuilder<E> {
    /// The key rules: an [`HttpKeyExtractor`], or a `GrpcKeyExtractor` for
    /// a tonic service (feature `grpc`), which makes the layer a
    /// `SingleFlightLayer<GrpcKeyExtractor>`.
    pub fn keys<E2: KeyRules>(self, keys: E2) -> SingleFlightLayerBuilder<E2> {
        SingleFlightLayerBuilder {
            keys: Some(keys),
            inner: self.inner,
            default_policy: self.default_policy,
            key_settings: self.key_settings,
            local_only: self.local_only,
        }
    }

    /// Registers a coordination backend under `name`; stages pick it with
    /// [`StageConfig::backend`](crate::StageConfig::backend).
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

    /// Which responses (and errors) a stale copy answers for in the stages
    /// with `stale-if-error`, instead of `HttpFailures` (5xx, 429, the
    /// gRPC statuses `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
    /// `RESOURCE_EXHAUSTED`, and the errors of `ErrorFailures`).
    pub fn stale_failures(
        mut self,
        failures: impl flightdeck_core::stale::Failures<flightdeck_core::http::SharedResponse>,
    ) -> Self {
        self.inner = self.inner.stale_failures(failures);
        self
    }

    /// Runs every stage in this process only: HYBRID and DISTRIBUTED_ONLY
    /// stages are built LOCAL_ONLY, without their backend (none needs to
    /// be registered; a later switch to a distributed mode is refused),
    /// for running a service without Redis with the configuration it has
    /// in production. The stages the key rules name need no declaration
    /// then: those without one run LOCAL_ONLY with the defaults (or the
    /// [`default_policy`](Self::default_policy)).
    pub fn local_only(mut self) -> Self {
        self.inner = self.inner.local_only();
        self.local_only = true;
        self
    }

    /// Gives `cfg` to every stage the key rules name and the configuration
    /// does not. Without it, such a stage is a build error: a typo in a
    /// config file would otherwise fail every request of the route. With
    /// it, a configured stage that no rule names and that is spelled like
    /// one given the default is still refused, as the typo it is.
    pub fn default_policy(mut self, cfg: StageConfig) -> Self {
        self.default_policy = Some(cfg);
        self
    }

    /// Shares responses with `share` instead of the default [`HttpShare`]
    /// (e.g. a larger body cap, or other `Set-Cookie` and `Cache-Control`
    /// rules).
    pub fn share(mut self, share: HttpShare) -> Self {
        self.inner = self.inner.share(share);
        self
    }

    /// Applies the configuration's key settings to the key rules,
    /// validates the rules against the stages, and every stage; builds the
    /// layer. Errors name the stage and the field (`keys.…` for a key
    /// setting; `keys` when no rules were given).
    ///
    /// When a stage can store results in a shared backend and the tenant
    /// scope digests are unkeyed (no scope secret), a warning says so:
    /// whoever reads the backend's key names could check guessed
    /// credentials against them.
    pub fn build(mut self) -> Result<SingleFlightLayer<E>, ConfigError>
    where
        E: KeyRules,
    {
        let Some(keys) = self.keys else {
            return Err(ConfigError::invalid(
                None,
                "keys",
                "the layer has no key rules: give the builder .keys(..) (an \
                 HttpKeyExtractor, or a GrpcKeyExtractor for a tonic service)",
            ));
        };
        let keys = keys.apply_settings(&self.key_settings)?;
        let named = keys.stages();
        for stage in &named {
            if self.inner.has_stage(stage.as_str()) {
                continue;
            }
            let defaults = match &self.default_policy {
                Some(cfg) => Some(cfg.clone()),
                // Every stage runs here anyway: a declaration would say
                // nothing the defaults do not.
                None if self.local_only => Some(StageConfig::new()),
                None => None,
            };
            // A configured stage that no rule names, close to this one, is
            // a typo: the defaults would leave its policy unused in silence.
            let unnamed = || {
                self.inner
                    .stage_names()
                    .filter(|c| !named.iter().any(|n| n.as_str() == *c))
            };
            let cfg = match defaults {
                Some(cfg) => match crate::config::closest(stage.as_str(), unnamed()) {
                    None => cfg,
                    Some(c) => {
                        return Err(ConfigError::invalid(
                            Some(stage.as_str()),
                            "stage",
                            format!(
                                "is named by the key rules but has no policy, and the \
                                 configuration has {c:?}, which no rule names: a typo? (the \
                                 defaults would run {:?} and leave {c:?} unused)",
                                stage.as_str()
                            ),
                        ));
                    }
                },
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
        Ok(SingleFlightLayer {
            keys: KeyLayer::new(keys),
            flights,
        })
    }
}

impl<E: fmt::Debug> fmt::Debug for SingleFlightLayerBuilder<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightLayerBuilder")
            .field("keys", &self.keys)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pub use self::rules::KeyRules;

mod rules {
    use flightdeck_key::NamedStages;

    use crate::config::{ConfigError, KeySettings};

    /// The key rules a
    /// [`SingleFlightLayerBuilder`](super::SingleFlightLayerBuilder) builds
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
