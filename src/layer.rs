//! [`SingleFlightLayer`] and its builder.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use flightdeck_breaker::Breaker;
use flightdeck_budget::NoInbound;
use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
use flightdeck_core::{SharedForm, StageName};
use flightdeck_distributed::{
    Backend, BackendBreakers, DistributedFlights, GuardedBackend, NoFence,
};
use flightdeck_local::LocalFlights;
use tower_layer::Layer;

use crate::config::{ConfigError, SharingSettings, SingleFlightConfig, StageConfig};
use crate::service::SingleFlight;
use crate::stage::{Control, Idle, Stage, StageHandle};

/// The stages by name: looked up on every request, by the name's identity
/// (stage names are interned), with a fast hasher.
pub(crate) type StageMap<V> = HashMap<StageName, V, foldhash::fast::RandomState>;

/// State shared by every service of one layer.
pub(crate) struct Shared<K, Sh: SharedForm, C, F, X> {
    pub(crate) keys: K,
    pub(crate) share: Sh,
    pub(crate) fence: F,
    pub(crate) deadlines: X,
    pub(crate) stages: StageMap<Arc<Stage<Sh, C>>>,
}

/// The facade: per stage, local single-flight (L1), distributed
/// single-flight (L2) over the stage's backend behind the stage's breaker,
/// the bulkhead and the execution budget, in the stage's
/// [`Mode`](crate::Mode). See the [crate docs](crate).
///
/// Built by [`SingleFlightBuilder`]. All state (in-flight maps, breakers,
/// bulkheads, backends) is created here and shared, behind an `Arc`, by
/// every service the layer builds and every clone of them.
///
/// The type parameters are what reads a request (`K` its key, `F` where the
/// owner's fencing token goes, `X` its deadline) and what a result is
/// (`Sh` shares responses, `C` stores them).
pub struct SingleFlightLayer<K, Sh: SharedForm, C, F = NoFence, X = NoInbound> {
    shared: Arc<Shared<K, Sh, C, F, X>>,
}

impl<K, Sh: SharedForm, C: Send + Sync + 'static, F, X> SingleFlightLayer<K, Sh, C, F, X> {
    /// The runtime handle of a stage (mode switch, degraded state, breaker,
    /// bulkhead).
    pub fn stage(&self, name: &str) -> Option<StageHandle> {
        let name = StageName::new(name).ok()?;
        self.shared.stages.get(&name).map(|s| handle(s))
    }

    /// Handles of every stage.
    pub fn stages(&self) -> Vec<StageHandle> {
        self.shared.stages.values().map(handle).collect()
    }

    /// Local flights running right now in a stage (for tests and health
    /// checks).
    pub fn running_flights(&self, stage: &str) -> Option<usize> {
        let name = StageName::new(stage).ok()?;
        self.shared.stages.get(&name).map(|s| s.local.running())
    }

    /// The stages that can store results in a shared backend (those built
    /// with one), sorted.
    #[cfg(feature = "http")]
    pub(crate) fn shared_store_stages(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .shared
            .stages
            .values()
            .filter(|s| s.distributed.is_some())
            .map(|s| s.ctl.name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// Resolves once no stage has background coordination left (owners'
    /// commits and abandons, releases of leases this node gave up on): for
    /// graceful shutdown, and tests.
    pub async fn idle(&self) {
        for stage in self.shared.stages.values() {
            if let Some(l2) = &stage.distributed {
                l2.idle().await;
            }
        }
    }
}

fn handle<Sh: SharedForm, C: Send + Sync + 'static>(s: &Arc<Stage<Sh, C>>) -> StageHandle {
    StageHandle {
        ctl: Arc::clone(&s.ctl),
        idle: s
            .distributed
            .clone()
            .map(|l2| Arc::new(l2) as Arc<dyn Idle>),
    }
}

impl<K, Sh: SharedForm, C, F, X> Clone for SingleFlightLayer<K, Sh, C, F, X> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, Sh: SharedForm, C, F, X> fmt::Debug for SingleFlightLayer<K, Sh, C, F, X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut stages: Vec<_> = self
            .shared
            .stages
            .values()
            .map(|s| (s.ctl.name.as_str().to_owned(), s.ctl.mode().as_str()))
            .collect();
        stages.sort();
        f.debug_struct("SingleFlightLayer")
            .field("stages", &stages)
            .finish_non_exhaustive()
    }
}

impl<S, K, Sh: SharedForm, C, F, X> Layer<S> for SingleFlightLayer<K, Sh, C, F, X> {
    type Service = SingleFlight<S, K, Sh, C, F, X>;

    fn layer(&self, inner: S) -> Self::Service {
        SingleFlight::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`SingleFlightLayer`]: what reads a request (its key, where the
/// fencing token goes, its deadline), how results are shared and stored,
/// the named backends, and the stages.
pub struct SingleFlightBuilder<K, Sh, C, F = NoFence, X = NoInbound> {
    keys: K,
    share: Sh,
    codec: C,
    fence: F,
    deadlines: X,
    backends: HashMap<String, Arc<dyn Backend>>,
    config: SingleFlightConfig,
    local_only: bool,
}

impl<K, Sh, C> SingleFlightBuilder<K, Sh, C> {
    /// Starts a builder. `keys` finds each request's
    /// [`FlightKey`](flightdeck_core::FlightKey) (a closure, or
    /// `FromExtension` after a `KeyLayer`); `share` turns responses into
    /// their shared form (`CloneShare`, `HttpShare`); `codec` stores that
    /// form in the backends (`PostcardCodec`, `HttpCodec`). Fencing tokens
    /// are dropped and requests carry no deadline of their own until
    /// [`fence`](Self::fence) and [`deadlines`](Self::deadlines) say
    /// otherwise.
    pub fn new(keys: K, share: Sh, codec: C) -> Self {
        Self {
            keys,
            share,
            codec,
            fence: NoFence,
            deadlines: NoInbound,
            backends: HashMap::new(),
            config: SingleFlightConfig::default(),
            local_only: false,
        }
    }
}

#[cfg(feature = "http")]
impl
    SingleFlightBuilder<
        flightdeck_core::FromExtension,
        flightdeck_core::http::HttpShare,
        flightdeck_distributed::HttpCodec,
        flightdeck_distributed::ExtensionFence,
        flightdeck_budget::FromHeaders,
    >
{
    /// A builder for HTTP services: keys from the request's `FlightKey`
    /// extension (set by `KeyLayer`), responses buffered by `HttpShare`,
    /// stored by `HttpCodec`, the owner's `FencingToken` inserted into the
    /// request's extensions, and each request's own deadline read from
    /// `grpc-timeout`, `x-request-timeout` and an outer `BudgetLayer`'s
    /// `Deadline` (whose slices are honoured).
    pub fn http() -> Self {
        SingleFlightBuilder::new(
            flightdeck_core::FromExtension,
            flightdeck_core::http::HttpShare::new(),
            flightdeck_distributed::HttpCodec::new(),
        )
        .fence(flightdeck_distributed::ExtensionFence)
        .deadlines(flightdeck_budget::FromHeaders::new())
    }
}

impl<K, Sh, C, F, X> SingleFlightBuilder<K, Sh, C, F, X> {
    /// Hands the owner's fencing token to requests with `fence` (so the
    /// handler can fence its own writes downstream).
    pub fn fence<F2>(self, fence: F2) -> SingleFlightBuilder<K, Sh, C, F2, X> {
        SingleFlightBuilder {
            keys: self.keys,
            share: self.share,
            codec: self.codec,
            fence,
            deadlines: self.deadlines,
            backends: self.backends,
            config: self.config,
            local_only: self.local_only,
        }
    }

    /// Reads each request's own deadline with `deadlines` (an
    /// [`Inbound`](flightdeck_budget::Inbound) of the budget crate): a
    /// caller never waits past it, and a request whose time is up reaches
    /// neither the work nor the backend.
    pub fn deadlines<X2>(self, deadlines: X2) -> SingleFlightBuilder<K, Sh, C, F, X2> {
        SingleFlightBuilder {
            keys: self.keys,
            share: self.share,
            codec: self.codec,
            fence: self.fence,
            deadlines,
            backends: self.backends,
            config: self.config,
            local_only: self.local_only,
        }
    }

    /// Registers a coordination backend under `name`; stages pick it with
    /// [`StageConfig::backend`](crate::StageConfig::backend). Stages may use
    /// different backends (two Redis deployments, or Redis for one stage
    /// and none for another).
    pub fn backend(mut self, name: impl Into<String>, backend: impl Backend) -> Self {
        self.backends.insert(name.into(), Arc::new(backend));
        self
    }

    /// Adds (or replaces) a stage.
    pub fn stage(mut self, name: impl Into<String>, cfg: StageConfig) -> Self {
        self.config.stages.insert(name.into(), cfg);
        self
    }

    /// Adds every stage of a loaded configuration. Its key settings
    /// (`[single-flight.keys]`) apply to key rules, which this builder
    /// does not hold: if any is set, [`build`](Self::build) fails naming
    /// it (give the configuration to `SingleFlightLayer::http(keys)`
    /// instead, or apply them to the key builder with
    /// [`KeySettings::apply`](crate::KeySettings::apply) and leave them
    /// out of the configuration given here).
    pub fn config(mut self, cfg: SingleFlightConfig) -> Self {
        self.config.stages.extend(cfg.stages);
        if cfg.keys.is_set() {
            self.config.keys = cfg.keys;
        }
        self
    }

    /// Runs every stage in this process only: HYBRID and DISTRIBUTED_ONLY
    /// stages are built LOCAL_ONLY, without their backend (none needs to
    /// be registered; a later switch to a distributed mode is refused).
    /// BYPASS stays BYPASS. For running a service without Redis, as in
    /// development, with the configuration it has in production.
    pub fn local_only(mut self) -> Self {
        self.local_only = true;
        self
    }

    /// Shares responses with `share` instead of the adapter the builder
    /// started with.
    pub fn share(mut self, share: Sh) -> Self {
        self.share = share;
        self
    }

    /// Whether a stage of that name was added.
    #[cfg(feature = "http")]
    pub(crate) fn has_stage(&self, name: &str) -> bool {
        self.config.stages.contains_key(name)
    }

    /// The names of the stages added.
    #[cfg(feature = "http")]
    pub(crate) fn stage_names(&self) -> impl Iterator<Item = &str> {
        self.config.stages.keys().map(String::as_str)
    }

    /// Validates every stage and builds the layer. The error names the
    /// stage and the field.
    pub fn build(self) -> Result<SingleFlightLayer<K, Sh, C, F, X>, ConfigError>
    where
        Sh: SharedForm + StageShare,
        C: Clone + Send + Sync + 'static,
    {
        // Nothing of the configuration is dropped: settings this builder
        // cannot apply are refused, by name.
        if let Some(field) = self.config.keys.fields_set().first() {
            return Err(ConfigError::invalid(
                None,
                *field,
                "applies to key rules, and this builder holds none: give the configuration \
                 to SingleFlightLayer::http(keys).config(..), or apply it to the key builder \
                 (KeySettings::apply) and leave it out of the configuration given here",
            ));
        }
        let mut stages = StageMap::default();
        for (name, mut cfg) in self.config.stages {
            let stage = StageName::new(&name)
                .map_err(|e| ConfigError::invalid(Some(&name), "stage", e.to_string()))?;
            if self.local_only {
                if cfg.mode.is_distributed() {
                    cfg.mode = crate::Mode::LocalOnly;
                }
                cfg.backend = None;
            } else if cfg.local_for_want_of_a_backend() {
                tracing::info!(
                    stage = %name,
                    "stage names no backend: it coalesces in this process only (local-only); \
                     name a backend for hybrid coalescing across nodes"
                );
                cfg.mode = crate::Mode::LocalOnly;
            }
            cfg.validate(&name)?;
            if cfg.sharing != SharingSettings::default() && !Sh::reads_sharing_settings() {
                return Err(ConfigError::invalid(
                    Some(&name),
                    "sharing",
                    "applies to HTTP responses (cookies, Cache-Control), and this layer \
                     shares values with an adapter that has no such rules",
                ));
            }
            // LOCAL_ONLY and BYPASS stages run without their backend when it
            // is not registered (a switch to a distributed mode is then
            // refused); distributed ones cannot.
            let backend = match &cfg.backend {
                Some(b) => match self.backends.get(b) {
                    Some(found) => Some(Arc::clone(found)),
                    None if cfg.mode.is_distributed() => {
                        return Err(ConfigError::invalid(
                            Some(&name),
                            "backend",
                            format!(
                                "no backend named {b:?} was registered with the builder{}",
                                crate::config::did_you_mean(
                                    b,
                                    self.backends.keys().map(String::as_str)
                                )
                            ),
                        ))
                    }
                    None => None,
                },
                None => None,
            };
            // Validated above, so this cannot fail; should it, the error
            // still names the section.
            let breaker = Breaker::new(name.clone(), cfg.breaker.to_breaker_config())
                .map_err(|e| ConfigError::invalid(Some(&name), "breaker", e.to_string()))?;
            // One breaker per shard of the backend, `breaker` the whole
            // store's: owned by the guard, followed by the stage's control.
            let breakers = BackendBreakers::new(breaker);
            let guarded = backend
                .as_ref()
                .map(|b| GuardedBackend::with_breakers(Arc::clone(b), breakers.clone()));
            // A backend that is not connected yet (Redis down at start, or
            // still connecting) opens the breaker at once: the stage starts
            // degraded, and goes distributed when the connection is made.
            let starting = guarded
                .as_ref()
                .filter(|_| cfg.mode.is_distributed())
                .and_then(GuardedBackend::trip_until_connected);
            let distributed = match guarded {
                Some(guarded) => Some(
                    DistributedFlights::new(guarded, cfg.distributed_policy(), self.codec.clone())
                        .map_err(|e| {
                            ConfigError::invalid(Some(&name), "single-flight", e.to_string())
                        })?,
                ),
                None => None,
            };
            let mut bulkhead_cfg = BulkheadConfig::new(cfg.bulkhead.limit)
                .degraded_limit(cfg.bulkhead.effective_degraded_limit())
                .stage(stage.clone());
            if let Some(rate) = cfg.bulkhead.degraded_rate_limit.and_then(NonZeroU32::new) {
                bulkhead_cfg = bulkhead_cfg.degraded_rate_limit(rate, rate);
            }
            if cfg.bulkhead.queue > 0 {
                bulkhead_cfg = bulkhead_cfg.queue(cfg.bulkhead.queue, cfg.bulkhead.queue_timeout);
            }
            let bulkhead = BulkheadLayer::from_config(bulkhead_cfg);
            let lane = bulkhead.handle().degraded_lane();
            let local = LocalFlights::new(cfg.local_policy());
            let share = self.share.for_stage(&cfg.sharing);
            let peers: crate::stage::Peers = {
                let (local, distributed, stage) =
                    (local.clone(), distributed.clone(), stage.clone());
                Box::new(move || {
                    local.publish_metrics(&stage);
                    if let Some(d) = &distributed {
                        d.publish_metrics(&stage);
                    }
                })
            };
            let ctl = Control::new(
                stage.clone(),
                cfg,
                backend,
                breakers,
                bulkhead.handle(),
                peers,
                starting,
            );
            let ctl = Arc::new(ctl);
            ctl.watch();
            stages.insert(
                stage,
                Arc::new(Stage {
                    ctl,
                    share,
                    local,
                    distributed,
                    bulkhead,
                    lane,
                }),
            );
        }
        Ok(SingleFlightLayer {
            shared: Arc::new(Shared {
                keys: self.keys,
                share: self.share,
                fence: self.fence,
                deadlines: self.deadlines,
                stages,
            }),
        })
    }
}

impl<K, Sh, C, F, X> fmt::Debug for SingleFlightBuilder<K, Sh, C, F, X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut backends: Vec<_> = self.backends.keys().collect();
        backends.sort();
        f.debug_struct("SingleFlightBuilder")
            .field("backends", &backends)
            .field("stages", &self.config.stages.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// How a share adapter takes a stage's [`SharingSettings`] (HTTP's
/// Set-Cookie and Cache-Control opt-ins): each stage shares responses with
/// its own copy of the layer's adapter, configured here. Adapters with
/// nothing to configure keep themselves.
pub trait StageShare: Sized {
    /// The adapter of a stage with these settings.
    fn for_stage(&self, sharing: &SharingSettings) -> Self;

    /// Whether the adapter reads [`SharingSettings`] at all (HTTP's
    /// does). A stage that sets one for an adapter that does not fails
    /// the build, rather than seeing its setting dropped in silence.
    fn reads_sharing_settings() -> bool {
        true
    }
}

/// Values have no cookies or cache headers: the settings mean nothing.
impl<T> StageShare for flightdeck_core::CloneShare<T> {
    fn for_stage(&self, _sharing: &SharingSettings) -> Self {
        *self
    }

    fn reads_sharing_settings() -> bool {
        false
    }
}

#[cfg(feature = "http")]
impl StageShare for flightdeck_core::http::HttpShare {
    fn for_stage(&self, sharing: &SharingSettings) -> Self {
        let mut share = self.clone();
        if let Some(policy) = sharing.set_cookie {
            share = share.set_cookie(policy);
        }
        if let Some(policy) = sharing.cache_control {
            share = share.cache_control(policy);
        }
        share
    }
}
