//! [`SingleFlightLayer`] and its builder.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use flightdeck_breaker::Breaker;
use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
use flightdeck_core::{SharedForm, StageName};
use flightdeck_distributed::{Backend, DistributedFlightLayer};
use flightdeck_local::LocalFlightLayer;
use tower_layer::Layer;

use crate::config::{ConfigError, SingleFlightConfig, StageConfig};
use crate::service::{KeyedKeys, SingleFlight};
use crate::share::{FlownShare, KeepShared};
use crate::stage::{Control, Stage, StageHandle};
use crate::ticket::{NoFence, SharedBackend, TicketKeys};

/// State shared by every service of one layer.
pub(crate) struct Shared<K, Sh: SharedForm, C, F> {
    pub(crate) key: K,
    pub(crate) share: Sh,
    pub(crate) fence: F,
    pub(crate) stages: HashMap<StageName, Arc<Stage<Sh, C>>>,
}

/// The facade: per stage, local single-flight (L1), distributed
/// single-flight (L2) over the stage's backend, the breaker guarding that
/// backend, the bulkhead and the execution budget, in the stage's
/// [`Mode`](crate::Mode). See the [crate docs](crate).
///
/// Built by [`SingleFlightBuilder`]. All state (in-flight maps, breakers,
/// bulkheads, backends) is created here and shared, behind an `Arc`, by
/// every service the layer builds and every clone of them.
pub struct SingleFlightLayer<K, Sh: SharedForm, C, F = NoFence> {
    shared: Arc<Shared<K, Sh, C, F>>,
}

impl<K, Sh: SharedForm, C, F> SingleFlightLayer<K, Sh, C, F> {
    /// The runtime handle of a stage (mode switch, degraded state, breaker,
    /// bulkhead).
    pub fn stage(&self, name: &str) -> Option<StageHandle> {
        let name = StageName::new(name).ok()?;
        self.shared.stages.get(&name).map(|s| StageHandle {
            ctl: Arc::clone(&s.ctl),
        })
    }

    /// Handles of every stage.
    pub fn stages(&self) -> Vec<StageHandle> {
        self.shared
            .stages
            .values()
            .map(|s| StageHandle {
                ctl: Arc::clone(&s.ctl),
            })
            .collect()
    }

    /// Local flights running right now in a stage (for tests and health
    /// checks).
    pub fn running_flights(&self, stage: &str) -> Option<usize> {
        let name = StageName::new(stage).ok()?;
        self.shared
            .stages
            .get(&name)
            .map(|s| s.l1.running_flights())
    }
}

impl<K, Sh: SharedForm, C, F> Clone for SingleFlightLayer<K, Sh, C, F> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, Sh: SharedForm, C, F> fmt::Debug for SingleFlightLayer<K, Sh, C, F> {
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

impl<S, K, Sh: SharedForm, C, F> Layer<S> for SingleFlightLayer<K, Sh, C, F> {
    type Service = SingleFlight<S, K, Sh, C, F>;

    fn layer(&self, inner: S) -> Self::Service {
        SingleFlight::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`SingleFlightLayer`]: the key extractor, the share adapter and
/// result codec, the named backends, and the stages.
pub struct SingleFlightBuilder<K, Sh, C, F = NoFence> {
    key: K,
    share: Sh,
    codec: C,
    fence: F,
    backends: HashMap<String, SharedBackend>,
    config: SingleFlightConfig,
}

impl<K, Sh, C> SingleFlightBuilder<K, Sh, C, NoFence> {
    /// Starts a builder. `key` finds each request's
    /// [`FlightKey`](flightdeck_core::FlightKey) (a closure, or
    /// `FromExtension` after a `KeyLayer`); `share` turns responses into
    /// their shared form (`CloneShare`, `HttpShare`); `codec` stores that
    /// form in the backends (`PostcardCodec`, `HttpCodec`).
    pub fn new(key: K, share: Sh, codec: C) -> Self {
        Self {
            key,
            share,
            codec,
            fence: NoFence,
            backends: HashMap::new(),
            config: SingleFlightConfig::default(),
        }
    }
}

#[cfg(feature = "http")]
impl
    SingleFlightBuilder<
        flightdeck_local::FromExtension,
        flightdeck_core::http::HttpShare,
        flightdeck_distributed::HttpCodec,
        crate::ticket::ExtensionFence,
    >
{
    /// A builder for HTTP services: keys from the request's `FlightKey`
    /// extension (set by `KeyLayer`), responses buffered by `HttpShare`,
    /// stored by `HttpCodec`, and the owner's `FencingToken` inserted into
    /// the request's extensions.
    pub fn http() -> Self {
        SingleFlightBuilder::new(
            flightdeck_local::FromExtension,
            flightdeck_core::http::HttpShare::new(),
            flightdeck_distributed::HttpCodec::new(),
        )
        .fence(crate::ticket::ExtensionFence)
    }
}

impl<K, Sh, C, F> SingleFlightBuilder<K, Sh, C, F> {
    /// Hands the owner's fencing token to requests with `fence`.
    pub fn fence<F2>(self, fence: F2) -> SingleFlightBuilder<K, Sh, C, F2> {
        SingleFlightBuilder {
            key: self.key,
            share: self.share,
            codec: self.codec,
            fence,
            backends: self.backends,
            config: self.config,
        }
    }

    /// Registers a coordination backend under `name`; stages pick it with
    /// [`StageConfig::backend`](crate::StageConfig::backend). Stages may use
    /// different backends (two Redis deployments, or Redis for one stage
    /// and none for another).
    pub fn backend(mut self, name: impl Into<String>, backend: impl Backend) -> Self {
        self.backends
            .insert(name.into(), SharedBackend::new(backend));
        self
    }

    /// Adds (or replaces) a stage.
    pub fn stage(mut self, name: impl Into<String>, cfg: StageConfig) -> Self {
        self.config.stages.insert(name.into(), cfg);
        self
    }

    /// Adds every stage of a loaded configuration.
    pub fn config(mut self, cfg: SingleFlightConfig) -> Self {
        self.config.stages.extend(cfg.stages);
        self
    }

    /// Validates every stage and builds the layer. The error names the
    /// stage and the field.
    pub fn build(self) -> Result<SingleFlightLayer<K, Sh, C, F>, ConfigError>
    where
        Sh: SharedForm,
        C: Clone,
    {
        let mut stages = HashMap::new();
        for (name, cfg) in self.config.stages {
            let stage = StageName::new(&name)
                .map_err(|e| ConfigError::invalid(Some(&name), "stage", e.to_string()))?;
            cfg.validate(&name)?;
            let backend = match &cfg.backend {
                Some(b) => Some(self.backends.get(b).cloned().ok_or_else(|| {
                    ConfigError::invalid(
                        Some(&name),
                        "backend",
                        format!("no backend named {b:?} was registered with the builder"),
                    )
                })?),
                None => None,
            };
            let l2 = match backend {
                Some(b) => Some(
                    DistributedFlightLayer::new(
                        b,
                        cfg.distributed_policy(),
                        KeepShared(self.share.clone()),
                        self.codec.clone(),
                        TicketKeys,
                    )
                    .map_err(|e| ConfigError::invalid(Some(&name), "policy", e.to_string()))?,
                ),
                None => None,
            };
            let breaker = Breaker::new(name.clone(), cfg.breaker.to_breaker_config())
                .map_err(|e| ConfigError::invalid(Some(&name), "breaker", e.to_string()))?;
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
            let l1 = LocalFlightLayer::new(cfg.local_policy(), KeyedKeys, FlownShare::new());
            let ctl = Control::new(stage.clone(), cfg, l2.is_some(), breaker, bulkhead.handle());
            let ctl = Arc::new(ctl);
            ctl.watch();
            stages.insert(
                stage,
                Arc::new(Stage {
                    ctl,
                    l1,
                    l2,
                    bulkhead,
                }),
            );
        }
        Ok(SingleFlightLayer {
            shared: Arc::new(Shared {
                key: self.key,
                share: self.share,
                fence: self.fence,
                stages,
            }),
        })
    }
}

impl<K, Sh, C, F> fmt::Debug for SingleFlightBuilder<K, Sh, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut backends: Vec<_> = self.backends.keys().collect();
        backends.sort();
        f.debug_struct("SingleFlightBuilder")
            .field("backends", &backends)
            .field("stages", &self.config.stages.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}
