//! [`GenericSingleFlightLayer`] and its builder: the single-flight part
//! of the facade for any request type (the HTTP layer,
//! [`SingleFlightLayer`](crate::SingleFlightLayer), is built on it).

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use flightdeck_breaker::Breaker;
use flightdeck_budget::Inbound;
use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
use flightdeck_core::stale::{ErrorFailures, Failures};
use flightdeck_core::{BoxError, KeySource, SharedForm, StageName};
use flightdeck_distributed::{
    Backend, BackendBreakers, DistributedFlights, Fence, GuardedBackend, ResultCodec,
};
use flightdeck_local::LocalFlights;
use tower_layer::Layer;

use crate::config::{ConfigError, SharingSettings, SingleFlightConfig, StageConfig};
use crate::kept::Kept;
use crate::readers::RequestReaders;
use crate::readers::{DynCodec, DynReaders};
use crate::service::GenericSingleFlight;
use crate::stage::{Control, Idle, Purge, Purger, Stage, StageHandle};
use crate::stale::StaleSetup;

/// The stages by name: looked up on every request, by the name's identity
/// (stage names are interned), with a fast hasher.
pub(crate) type StageMap<V> = HashMap<StageName, V, foldhash::fast::RandomState>;

/// State shared by every service of one layer: the request readers,
/// the share adapter and the stages.
pub(crate) struct Shared<R, Sh: SharedForm> {
    pub(crate) readers: R,
    pub(crate) share: Sh,
    pub(crate) stages: StageMap<Arc<Stage<R, Sh>>>,
}

/// The single-flight layer for any request type: per stage, local
/// single-flight (L1), distributed single-flight (L2) over the stage's
/// backend behind the stage's breaker, the bulkhead and the execution
/// budget, in the stage's [`Mode`](crate::Mode). See the [crate
/// docs](crate). HTTP and gRPC services use
/// [`SingleFlightLayer`](crate::SingleFlightLayer), which puts the key
/// rules and the error responses around this.
///
/// Built by [`GenericSingleFlightLayer::builder`]. All state (in-flight
/// maps, breakers, bulkheads, backends) is created here and shared, behind
/// an `Arc`, by every service the layer builds and every clone of them.
///
/// `R` reads requests (their key, deadline and fencing token:
/// [`DynReaders`] for a request type of your own), `Sh` shares responses
/// (`CloneShare`, `HttpShare`).
///
/// ```
/// use flightdeck::core::{CloneShare, FlightKey, StageName};
/// use flightdeck::distributed::PostcardCodec;
/// use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let stage = StageName::new("len").unwrap();
/// let layer = GenericSingleFlightLayer::builder(
///     move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
///     CloneShare::<usize>::new(),
///     PostcardCodec::<usize>::new(),
/// )
/// .stage("len", StageConfig::new().mode(Mode::LocalOnly))
/// .build()
/// .unwrap();
/// let svc = layer.layer(service_fn(|q: String| async move {
///     Ok::<_, std::convert::Infallible>(q.len())
/// }));
/// assert_eq!(svc.oneshot("four".to_owned()).await.unwrap(), 4);
/// # }
/// ```
pub struct GenericSingleFlightLayer<R, Sh: SharedForm> {
    shared: Arc<Shared<R, Sh>>,
}

impl<Req: 'static, Sh: SharedForm> GenericSingleFlightLayer<DynReaders<Req>, Sh> {
    /// Starts a builder. `keys` finds each request's
    /// [`FlightKey`](flightdeck_core::FlightKey) (a closure, or
    /// `FromExtension` after a `KeyLayer`); `share` turns responses into
    /// their shared form (`CloneShare`, `HttpShare`); `codec` stores that
    /// form in the backends (`PostcardCodec`, `HttpCodec`). Fencing tokens
    /// are dropped and requests carry no deadline of their own until
    /// [`fence`](GenericSingleFlightLayerBuilder::fence) and
    /// [`deadlines`](GenericSingleFlightLayerBuilder::deadlines) say
    /// otherwise.
    pub fn builder(
        keys: impl KeySource<Req>,
        share: Sh,
        codec: impl ResultCodec<Sh::Shared>,
    ) -> GenericSingleFlightLayerBuilder<DynReaders<Req>, Sh> {
        GenericSingleFlightLayerBuilder::new(DynReaders::new(keys), share, DynCodec::new(codec))
    }
}

impl<R, Sh: SharedForm> GenericSingleFlightLayer<R, Sh> {
    /// Purges the result of the key `req` has (see
    /// [`StageHandle::invalidate`]): `Ok(false)` when the request has no
    /// key, or a key of no stage of this layer.
    pub async fn invalidate_request<Req>(&self, req: &Req) -> Result<bool, BoxError>
    where
        R: RequestReaders<Req>,
    {
        let Some(key) = self.shared.readers.key(req) else {
            return Ok(false);
        };
        let Some(stage) = self.shared.stages.get(key.stage()) else {
            return Ok(false);
        };
        handle(stage).invalidate(&key).await?;
        Ok(true)
    }

    /// The runtime handle of a stage (mode switch, degraded state, breaker,
    /// bulkhead).
    pub fn stage(&self, name: &str) -> Option<StageHandle> {
        self.find(name).map(handle)
    }

    /// Handles of every stage.
    pub fn stages(&self) -> Vec<StageHandle> {
        self.shared.stages.values().map(handle).collect()
    }

    /// Local flights running right now in a stage (for tests and health
    /// checks).
    pub fn running_flights(&self, stage: &str) -> Option<usize> {
        self.find(stage).map(|s| s.local.running())
    }

    /// The stage of that name. Compared by string, not made a
    /// `StageName`: a lookup of a name from outside (a health check's
    /// path) must not intern it, since a process keeps a bounded number.
    fn find(&self, name: &str) -> Option<&Arc<Stage<R, Sh>>> {
        self.shared
            .stages
            .iter()
            .find(|(stage, _)| stage.as_str() == name)
            .map(|(_, s)| s)
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

fn handle<R, Sh: SharedForm>(s: &Arc<Stage<R, Sh>>) -> StageHandle {
    let purger = Purger {
        stale: s.stale.clone(),
        local: s.local.clone(),
        distributed: s.distributed.clone(),
    };
    StageHandle {
        purge: Arc::new(purger) as Arc<dyn Purge>,
        ctl: Arc::clone(&s.ctl),
        idle: s
            .distributed
            .clone()
            .map(|l2| Arc::new(l2) as Arc<dyn Idle>),
    }
}

impl<R, Sh: SharedForm> Clone for GenericSingleFlightLayer<R, Sh> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R, Sh: SharedForm> fmt::Debug for GenericSingleFlightLayer<R, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut stages: Vec<_> = self
            .shared
            .stages
            .values()
            .map(|s| (s.ctl.name.as_str().to_owned(), s.ctl.mode().as_str()))
            .collect();
        stages.sort();
        f.debug_struct("GenericSingleFlightLayer")
            .field("stages", &stages)
            .finish_non_exhaustive()
    }
}

impl<S, R, Sh: SharedForm> Layer<S> for GenericSingleFlightLayer<R, Sh> {
    type Service = GenericSingleFlight<S, R, Sh>;

    fn layer(&self, inner: S) -> Self::Service {
        GenericSingleFlight::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`GenericSingleFlightLayer`]: what reads a request (its key,
/// where the fencing token goes, its deadline), how results are shared
/// and stored, the named backends, and the stages. Started by
/// [`GenericSingleFlightLayer::builder`].
pub struct GenericSingleFlightLayerBuilder<R, Sh: SharedForm> {
    readers: R,
    share: Sh,
    codec: DynCodec<Sh::Shared>,
    backends: HashMap<String, Arc<dyn Backend>>,
    config: SingleFlightConfig,
    local_only: bool,
    failures: Option<Arc<dyn Failures<Sh::Shared>>>,
    weigh: Option<crate::stale::Weigher<Sh::Shared>>,
}

impl<R, Sh: SharedForm> GenericSingleFlightLayerBuilder<R, Sh> {
    pub(crate) fn new(readers: R, share: Sh, codec: DynCodec<Sh::Shared>) -> Self {
        Self {
            readers,
            share,
            codec,
            backends: HashMap::new(),
            config: SingleFlightConfig::default(),
            local_only: false,
            failures: None,
            weigh: None,
        }
    }

    /// Which outcomes of the work a stale copy answers for, in every
    /// stage with `stale-if-error` (instead of the share adapter's rule:
    /// `HttpFailures` for HTTP and gRPC, `ErrorFailures` otherwise). Any
    /// `Fn(Result<&Shared, &BoxError>) -> bool` will do.
    pub fn stale_failures(mut self, failures: impl Failures<Sh::Shared>) -> Self {
        self.failures = Some(Arc::new(failures));
        self
    }

    /// How many bytes a kept copy counts for against `stale-max-bytes`
    /// (instead of the share adapter's measure: HTTP counts the status
    /// line, headers, body and trailers; other values only their own
    /// size, not what they own on the heap). Give one for values that
    /// own their bytes (`|s: &String| s.len()`), or `stale-max-bytes`
    /// bounds only what `size_of` sees and `stale-max-entries` is the
    /// bound that bites.
    pub fn stale_weigher(
        mut self,
        weigh: impl Fn(&Sh::Shared) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.weigh = Some(Arc::new(weigh));
        self
    }
}

#[cfg(feature = "http")]
impl GenericSingleFlightLayer<crate::readers::HttpReaders, flightdeck_core::http::HttpShare> {
    /// A builder of the single-flight part of an HTTP stack, for those who
    /// compose the key and error layers themselves (the one layer,
    /// [`SingleFlightLayer`](crate::SingleFlightLayer), does): keys from
    /// the request's `FlightKey` extension (set by `KeyLayer`), responses
    /// buffered by `HttpShare`, stored by `HttpCodec`, the owner's
    /// `FencingToken` inserted into the request's extensions, and each
    /// request's own deadline read from `grpc-timeout`, `x-request-timeout`
    /// and an outer `BudgetLayer`'s `Deadline` (whose slices are
    /// honoured).
    pub fn http() -> GenericSingleFlightLayerBuilder<
        crate::readers::HttpReaders,
        flightdeck_core::http::HttpShare,
    > {
        GenericSingleFlightLayerBuilder::new(
            crate::readers::HttpReaders::default(),
            flightdeck_core::http::HttpShare::new(),
            DynCodec::new(flightdeck_distributed::HttpCodec::new()),
        )
    }
}

impl<Req: 'static, Sh: SharedForm> GenericSingleFlightLayerBuilder<DynReaders<Req>, Sh> {
    /// Hands the owner's fencing token to requests with `fence` (so the
    /// handler can fence its own writes downstream).
    pub fn fence(mut self, fence: impl Fence<Req>) -> Self {
        self.readers.set_fence(fence);
        self
    }

    /// Reads each request's own deadline with `deadlines` (an
    /// [`Inbound`] of the budget crate): a
    /// caller never waits past it, and a request whose time is up reaches
    /// neither the work nor the backend.
    pub fn deadlines(mut self, deadlines: impl Inbound<Req> + Send + Sync + 'static) -> Self {
        self.readers.set_deadlines(deadlines);
        self
    }
}

impl<R, Sh: SharedForm> GenericSingleFlightLayerBuilder<R, Sh> {
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
    /// it (give the configuration to `SingleFlightLayer::builder()`
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
    pub fn build(self) -> Result<GenericSingleFlightLayer<R, Sh>, ConfigError>
    where
        R: Clone,
        Sh: StageShare,
    {
        // Nothing of the configuration is dropped: settings this builder
        // cannot apply are refused, by name.
        if let Some(field) = self.config.keys.fields_set().first() {
            return Err(ConfigError::invalid(
                None,
                *field,
                "applies to key rules, and this builder holds none: give the configuration \
                 to SingleFlightLayer::builder().config(..), or apply it to the key builder \
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
            let stale = cfg.keeps_results().then(|| StaleSetup {
                kept: Arc::new(Kept::new(
                    cfg.stale_max_entries,
                    cfg.stale_max_bytes,
                    cfg.replay_ttl
                        .saturating_add(cfg.stale_windows().keep_stale()),
                    cfg.settle_bound(),
                )),
                failures: self.failures.clone().unwrap_or_else(Sh::failures),
                weigh: self.weigh.clone(),
            });
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
                    readers: self.readers.clone(),
                    share,
                    local,
                    distributed,
                    bulkhead,
                    lane,
                    stale,
                }),
            );
        }
        Ok(GenericSingleFlightLayer {
            shared: Arc::new(Shared {
                readers: self.readers,
                share: self.share,
                stages,
            }),
        })
    }
}

impl<R, Sh: SharedForm> fmt::Debug for GenericSingleFlightLayerBuilder<R, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut backends: Vec<_> = self.backends.keys().collect();
        backends.sort();
        f.debug_struct("GenericSingleFlightLayerBuilder")
            .field("backends", &backends)
            .field("stages", &self.config.stages.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// How a share adapter takes a stage's [`SharingSettings`] (HTTP's
/// Set-Cookie and Cache-Control opt-ins): each stage shares responses with
/// its own copy of the layer's adapter, configured here. Adapters with
/// nothing to configure keep themselves.
pub trait StageShare: SharedForm + Sized {
    /// Whether the layer's `call` inlines L1's lookup of the flight
    /// ([`LocalFlights::run_inlined`](flightdeck_local::LocalFlights::run_inlined)):
    /// code layout only, no behaviour depends on it. On for
    /// [`CloneShare`](flightdeck_core::CloneShare), whose path is short
    /// (one call less per request); off by default and for HTTP, whose
    /// longer path it made slower.
    // Hidden: a code-layout knob of our own shared forms, not a setting
    // an implementor should have to weigh.
    #[doc(hidden)]
    const INLINE_LOOKUP: bool = false;

    /// The adapter of a stage with these settings.
    fn for_stage(&self, sharing: &SharingSettings) -> Self;

    /// Bytes a kept copy of `shared` counts for against the stage's
    /// `stale-max-bytes` (by default, the size of the value itself, not
    /// what it owns on the heap: see
    /// [`stale_weigher`](GenericSingleFlightLayerBuilder::stale_weigher)).
    fn kept_size(&self, shared: &Self::Shared) -> usize {
        std::mem::size_of_val(shared)
    }

    /// The form of `shared` a stage keeps as its key's copy (by default,
    /// a clone). The copy answers callers other than the leader whose work
    /// produced it, some as leaders of later flights (L2 may answer a
    /// flight with this node's copy): it holds nothing only that leader
    /// may get.
    fn kept_form(&self, shared: &Self::Shared) -> Self::Shared {
        shared.clone()
    }

    /// Which outcomes a stage's stale copy answers for (`stale-if-error`)
    /// unless the builder was given a rule
    /// ([`stale_failures`](GenericSingleFlightLayerBuilder::stale_failures)):
    /// [`ErrorFailures`].
    fn failures() -> Arc<dyn Failures<Self::Shared>> {
        Arc::new(ErrorFailures)
    }

    /// Whether the adapter reads [`SharingSettings`] at all (HTTP's
    /// does). A stage that sets one for an adapter that does not fails
    /// the build, rather than seeing its setting dropped in silence.
    fn reads_sharing_settings() -> bool {
        true
    }
}

/// Values have no cookies or cache headers: the settings mean nothing.
impl<T: Clone + Send + Sync + 'static> StageShare for flightdeck_core::CloneShare<T> {
    const INLINE_LOOKUP: bool = true;

    fn for_stage(&self, _sharing: &SharingSettings) -> Self {
        *self
    }

    fn reads_sharing_settings() -> bool {
        false
    }
}

#[cfg(feature = "http")]
impl StageShare for flightdeck_core::http::HttpShare {
    /// Status line, headers, body and trailers.
    fn kept_size(&self, shared: &Self::Shared) -> usize {
        let headers = |h: &http::HeaderMap| {
            h.iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 4)
                .sum::<usize>()
        };
        64 + shared.body().len() + headers(shared.headers()) + shared.trailers().map_or(0, headers)
    }

    /// Without the leader's own cookies (`set-cookie = "strip"`).
    fn kept_form(&self, shared: &Self::Shared) -> Self::Shared {
        shared.without_leader_cookies()
    }

    /// HTTP 5xx and 429, gRPC `UNAVAILABLE`, `DEADLINE_EXCEEDED` and
    /// `RESOURCE_EXHAUSTED`, and the errors of `ErrorFailures`.
    fn failures() -> Arc<dyn Failures<Self::Shared>> {
        Arc::new(flightdeck_core::http::HttpFailures)
    }

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
