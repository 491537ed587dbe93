//! The public handle on a stage: its mode switch, its degraded state,
//! its breakers and bulkhead, and the wait for its background
//! coordination.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use flightdeck_breaker::Breaker;
use flightdeck_core::{BoxError, FlightKey};

use super::*;

/// A handle on one stage of a [`SingleFlightLayer`](crate::SingleFlightLayer):
/// switch its mode at run time (the kill switch), read whether it is
/// degraded and for how long, reach its breaker and bulkhead. Cheap to
/// clone.
///
/// Switching the mode never touches requests already in flight: each
/// request follows the mode it found when it arrived.
#[derive(Clone)]
pub struct StageHandle {
    pub(crate) ctl: Arc<Control>,
    pub(crate) idle: Option<Arc<dyn Idle>>,
    pub(crate) purge: Arc<dyn Purge>,
}

/// Forgets a key's results in a stage (see [`StageHandle::invalidate`]).
pub(crate) trait Purge: Send + Sync {
    fn purge<'a>(
        &'a self,
        key: &'a FlightKey,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>> + Send + 'a>>;
}

/// What a purge reaches in a stage: its kept copies, its L1 flights and
/// its store.
pub(crate) struct Purger<V> {
    pub(crate) stale: Option<crate::stale::StaleSetup<V>>,
    pub(crate) local: LocalFlights<V>,
    pub(crate) distributed: Option<Coordination<DynCodec<V>>>,
}

impl<V: Clone + Send + Sync + 'static> Purge for Purger<V> {
    fn purge<'a>(
        &'a self,
        key: &'a FlightKey,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>> + Send + 'a>>
    {
        // This node's copies go first, and the flights running now are
        // passed by: nothing started before the purge brings its result
        // back, whatever the backend answers.
        if let Some(stale) = &self.stale {
            stale.kept.purge(key);
        }
        self.local.forget(key);
        Box::pin(async move {
            if let Some(l2) = &self.distributed {
                l2.invalidate(key).await?;
                // Until the store applied it, a flight here could still
                // read the old result there and keep it: once more, now
                // that nothing started from here on can.
                if let Some(stale) = &self.stale {
                    stale.kept.purge(key);
                }
                self.local.forget(key);
            }
            Ok(())
        })
    }
}

/// Waits for a stage's background coordination.
pub(crate) trait Idle: Send + Sync {
    fn idle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

impl<C: Send + Sync + 'static> Idle for Coordination<C> {
    fn idle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(DistributedFlights::idle(self))
    }
}

impl StageHandle {
    /// The stage's name.
    pub fn name(&self) -> &StageName {
        &self.ctl.name
    }

    /// The stage's configuration, as built.
    pub fn config(&self) -> &StageConfig {
        &self.ctl.cfg
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.ctl.mode()
    }

    /// Switches the mode for new requests and returns the previous one.
    /// HYBRID and DISTRIBUTED_ONLY need a backend for the stage.
    pub fn set_mode(&self, mode: Mode) -> Result<Mode, ModeError> {
        if mode.is_distributed() && self.ctl.backend.is_none() {
            return Err(ModeError::new(self.ctl.name.clone(), mode));
        }
        let prev = Mode::from_u8(self.ctl.mode.swap(mode.to_u8(), Ordering::AcqRel));
        self.ctl.metrics(|m| m.mode.set(f64::from(mode.to_u8())));
        if prev != mode {
            tracing::warn!(stage = %self.ctl.name, from = %prev, to = %mode, "stage mode switched");
        }
        Ok(prev)
    }

    /// True while the stage is degraded, wholly or on any shard of its
    /// backend (a coordination breaker is open or probing). See
    /// [`degraded_shards`](Self::degraded_shards) for which.
    pub fn is_degraded(&self) -> bool {
        !self.ctl.degraded_shards().is_empty()
    }

    /// How long the current degraded period has lasted, if the stage is
    /// degraded (the longest, when several shards are).
    pub fn degraded_for(&self) -> Option<Duration> {
        self.ctl
            .degraded_shards()
            .into_iter()
            .map(|(_, since)| since.elapsed())
            .max()
    }

    /// The shards of the stage's backend that are degraded now, each with
    /// how long it has been: [`Shard::WHOLE`] when the whole store is (a
    /// backend that is not sharded, or the whole-store breaker forced or
    /// tripped), and each named shard of a sharded backend (a Redis
    /// Cluster primary) whose breaker is open or probing: only its flights
    /// fall back or fail fast, and only they are held to the bulkhead's
    /// degraded limit.
    pub fn degraded_shards(&self) -> Vec<(Shard, Duration)> {
        self.ctl
            .degraded_shards()
            .into_iter()
            .map(|(shard, since)| (shard, since.elapsed()))
            .collect()
    }

    /// Whether `shard` is degraded now ([`Shard::WHOLE`]: the whole store).
    pub fn is_shard_degraded(&self, shard: &Shard) -> bool {
        self.ctl.degraded_shards().iter().any(|(s, _)| s == shard)
    }

    /// The whole-store breaker guarding the stage's backend (read, force,
    /// reset): the breaker of a backend that is not sharded; forced open,
    /// it refuses every flight of a sharded one too.
    pub fn breaker(&self) -> &Breaker {
        self.ctl.breakers.whole()
    }

    /// Every breaker of the stage: the whole store's, and each named
    /// shard's (created when the shard's first flight is judged), with the
    /// degraded set they publish.
    pub fn breakers(&self) -> &BackendBreakers {
        &self.ctl.breakers
    }

    /// The stage's bulkhead.
    pub fn bulkhead(&self) -> &BulkheadHandle {
        &self.ctl.bulkhead
    }

    /// Purges `key`: this node's copies of its result (the replayed one,
    /// the stale one) go at once, a flight of it running now finishes for
    /// its own callers but its result is neither replayed nor kept, the
    /// key's hit-for-pass ends (a response of work that started before
    /// the purge starts none), and,
    /// on a stage with a backend, the stored result goes across the
    /// deployment (`Backend::invalidate`: a new generation fences a
    /// running owner's commit). The error is the backend's; this node's
    /// copies are gone either way.
    ///
    /// `key` must be made the way the stage's requests make theirs: the
    /// HTTP and gRPC extractors make keys of fields, which equal no key
    /// made from a digest (`FlightKey::new`, `KeyEncoder::finish_key`),
    /// so for their stages build it from a request with the layer's
    /// `invalidate_request`. (Across nodes the store purges by digest
    /// either way; this node's copies are found by key.)
    ///
    /// A key of another stage is refused
    /// ([`WrongStage`](crate::error::WrongStage)): this handle reaches none
    /// of its copies.
    pub async fn invalidate(&self, key: &FlightKey) -> Result<(), BoxError> {
        if key.stage() != self.name() {
            return Err(Box::new(crate::error::WrongStage::new(
                self.name().clone(),
                key.stage().clone(),
            )));
        }
        self.purge.purge(key).await
    }

    /// Resolves once the stage has no background coordination left:
    /// owners' commits and abandons (with their heartbeats), releases of
    /// leases this node gave up on. For graceful shutdown, and tests.
    pub async fn idle(&self) {
        if let Some(idle) = &self.idle {
            idle.idle().await;
        }
    }
}

impl fmt::Debug for StageHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageHandle")
            .field("stage", &self.ctl.name)
            .field("mode", &self.ctl.mode())
            .field("degraded", &self.ctl.whole_degraded())
            .field("degraded_shards", &self.ctl.breakers.any_degraded())
            .finish()
    }
}
