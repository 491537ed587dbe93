//! [`BackendBreakers`]: the whole-store breaker and one per shard, kept
//! in one [`BreakerRegistry`] that publishes which shards are degraded.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flightdeck_breaker::{Breaker, BreakerRegistry, CircuitState, OpenSince};
use tokio::sync::watch;

use crate::backend::Shard;

/// At most this many named shards get a breaker of their own (see
/// [`BackendBreakers`]).
pub const MAX_SHARD_BREAKERS: usize = 128;

/// The breakers of one guarded backend, one per [`Shard`]: what
/// [`GuardedBackend`](super::GuardedBackend) judges each flight by, and
/// the degraded set it publishes. Cheap to clone (the clones share the
/// breakers).
///
/// - The breaker it is built with serves [`Shard::WHOLE`] and is the
///   template: a named shard's breaker is created the first time a flight
///   of that shard is judged, with the same settings, and named
///   `{whole}@{shard}` (`report@10.0.0.1:7000`): its metrics
///   (`singleflight_circuit_state{breaker}`, …) and its `CircuitOpen`
///   errors name the shard.
/// - The whole-store breaker also stands for the store as a whole: while
///   it is not closed (forced open or closed by hand, or opened because the
///   backend could not be reached at all), it judges every flight,
///   whatever its shard. So forcing it open degrades every shard, as it
///   does with a backend that is not sharded.
/// - Shards come from the backend's own small set (the Redis Cluster
///   backend names its primaries). At most [`MAX_SHARD_BREAKERS`] named
///   shards get a breaker: past that, a new shard takes the place of the
///   least recently used one that is closed and idle, and when none is,
///   its flights are judged by the whole-store breaker (a warning is
///   logged once). The breaker of a shard that went away (a primary
///   replaced in a failover) is dropped by [`retire`](Self::retire);
///   created again, if the shard comes back, closed.
/// - [`watch`](Self::watch) publishes every shard with a breaker, and
///   since when it is degraded (its breaker open, probing or forced open;
///   [`Shard::WHOLE`] for the whole store).
///
/// ```
/// use flightdeck_breaker::{Breaker, BreakerConfig, CircuitState};
/// use flightdeck_distributed::backend::Shard;
/// use flightdeck_distributed::breaker::BackendBreakers;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let breakers = BackendBreakers::new(Breaker::new("report", BreakerConfig::default()).unwrap());
/// let a = breakers.for_shard(&Shard::new("10.0.0.1:7000"));
/// assert_eq!(a.name(), "report@10.0.0.1:7000");
/// a.force_open();
/// let b = breakers.for_shard(&Shard::new("10.0.0.2:7000"));
/// assert_eq!(b.state(), CircuitState::Closed, "another shard's breaker");
/// assert_eq!(breakers.named().len(), 2);
/// assert!(breakers.is_degraded(&Shard::new("10.0.0.1:7000")));
/// # }
/// ```
#[derive(Clone)]
pub struct BackendBreakers {
    whole: Breaker,
    registry: BreakerRegistry<Shard>,
    overflow_warned: Arc<AtomicBool>,
}

impl BackendBreakers {
    /// The breakers of a backend whose [`Shard::WHOLE`] breaker (and
    /// template) is `whole`.
    pub fn new(whole: Breaker) -> Self {
        let name: Arc<str> = Arc::from(whole.name());
        let registry = BreakerRegistry::with_naming(
            whole.config().clone(),
            MAX_SHARD_BREAKERS + 1,
            move |shard: &Shard| match shard.name() {
                Some(shard) => format!("{name}@{shard}"),
                None => name.to_string(),
            },
        )
        // The template's settings were validated when `whole` was built.
        .expect("a built breaker's settings are valid");
        // Held here for good: never evicted, so it always has room.
        let _room = registry.insert(Shard::WHOLE, whole.clone());
        Self {
            whole,
            registry,
            overflow_warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The whole-store breaker: [`Shard::WHOLE`]'s, and every flight's
    /// while it is not closed.
    pub fn whole(&self) -> &Breaker {
        &self.whole
    }

    /// The breaker of `shard` if it exists ([`Shard::WHOLE`]'s always
    /// does).
    pub fn get(&self, shard: &Shard) -> Option<Breaker> {
        if shard.is_whole() {
            return Some(self.whole.clone());
        }
        self.registry.get(shard)
    }

    /// The breaker of `shard`, created with the template's settings if
    /// needed; the whole-store breaker for [`Shard::WHOLE`], and for a
    /// shard that finds no room.
    pub fn for_shard(&self, shard: &Shard) -> Breaker {
        self.of(shard).into_owned()
    }

    /// The breaker that judges the flights of `shard` now: the whole-store
    /// breaker while it is not closed, otherwise the shard's own.
    #[inline]
    pub(crate) fn judging(&self, shard: &Shard) -> Cow<'_, Breaker> {
        if shard.is_whole() || self.whole.state() != CircuitState::Closed {
            return Cow::Borrowed(&self.whole);
        }
        self.of(shard)
    }

    fn of(&self, shard: &Shard) -> Cow<'_, Breaker> {
        if shard.is_whole() {
            return Cow::Borrowed(&self.whole);
        }
        match self.registry.get_or_insert(shard) {
            Ok(b) => Cow::Owned(b),
            Err(full) => {
                if !self.overflow_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        breaker = self.whole.name(),
                        %shard,
                        limit = full.limit() - 1,
                        "too many shards for one breaker each: further shards are judged by the whole-store breaker"
                    );
                }
                Cow::Borrowed(&self.whole)
            }
        }
    }

    /// Every named shard's breaker, sorted by shard.
    pub fn named(&self) -> Vec<(Shard, Breaker)> {
        let mut all = self.registry.breakers();
        all.retain(|(shard, _)| !shard.is_whole());
        all
    }

    /// Drops the breakers of the named shards not in `serving` (the shards
    /// the backend serves flights from now, see
    /// [`Backend::shards`](crate::Backend::shards)); returns the shards
    /// dropped. A degraded one stops being degraded: nothing would ever
    /// probe its breaker again.
    pub fn retire(&self, serving: &[Shard]) -> Vec<Shard> {
        self.registry
            .retain(|shard| shard.is_whole() || serving.contains(shard))
    }

    /// Every shard with a breaker ([`Shard::WHOLE`] first), and since when
    /// it is degraded, now and at every change (see
    /// [`BreakerRegistry::watch`]).
    pub fn watch(&self) -> watch::Receiver<OpenSince<Shard>> {
        self.registry.watch()
    }

    /// What [`watch`](Self::watch) publishes now.
    pub fn degraded(&self) -> OpenSince<Shard> {
        self.registry.open_since()
    }

    /// A count that changes with every change of what
    /// [`watch`](Self::watch) publishes (see [`BreakerRegistry::version`]).
    #[inline]
    pub fn version(&self) -> u64 {
        self.registry.version()
    }

    /// Whether `shard` is degraded now (one atomic load while no breaker
    /// is open).
    #[inline]
    pub fn is_degraded(&self, shard: &Shard) -> bool {
        self.registry.any_open() && self.registry.is_open(shard)
    }

    /// Whether any shard, or the whole store, is degraded now (one
    /// atomic load).
    #[inline]
    pub fn any_degraded(&self) -> bool {
        self.registry.any_open()
    }

    /// The registry that holds them all, [`Shard::WHOLE`]'s included.
    pub fn registry(&self) -> &BreakerRegistry<Shard> {
        &self.registry
    }
}

impl fmt::Debug for BackendBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendBreakers")
            .field("whole", &self.whole)
            .field("named", &self.named())
            .finish()
    }
}
