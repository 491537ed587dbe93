//! [`ShardBreakers`]: one breaker per shard of a backend.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use flightdeck_breaker::{Breaker, CircuitState};

use crate::backend::Shard;

/// At most this many named shards get a breaker of their own (see
/// [`ShardBreakers`]).
pub const MAX_SHARD_BREAKERS: usize = 128;

type OnShard = Arc<dyn Fn(&Shard, &Breaker) + Send + Sync>;

/// The breakers of one guarded backend, one per [`Shard`]: what
/// [`GuardedBackend`](super::GuardedBackend) judges each flight by. Cheap
/// to clone (the clones share the breakers).
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
///   shards get a breaker; the flights of any further shard are judged by
///   the whole-store breaker (a warning is logged once), which is how a
///   backend that is not sharded is judged. The breaker of a shard that
///   went away (a primary replaced in a failover) is dropped by
///   [`retire`](Self::retire); created again, if the shard comes back,
///   closed.
///
/// ```
/// use flightdeck_breaker::{Breaker, BreakerConfig, CircuitState};
/// use flightdeck_distributed::backend::Shard;
/// use flightdeck_distributed::guard::ShardBreakers;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let breakers = ShardBreakers::new(Breaker::new("report", BreakerConfig::default()).unwrap());
/// let a = breakers.for_shard(&Shard::new("10.0.0.1:7000"));
/// assert_eq!(a.name(), "report@10.0.0.1:7000");
/// a.force_open();
/// let b = breakers.for_shard(&Shard::new("10.0.0.2:7000"));
/// assert_eq!(b.state(), CircuitState::Closed, "another shard's breaker");
/// assert_eq!(breakers.named().len(), 2);
/// # }
/// ```
#[derive(Clone)]
pub struct ShardBreakers {
    inner: Arc<Inner>,
}

struct Inner {
    whole: Breaker,
    named: RwLock<HashMap<Shard, Breaker>>,
    /// Named breakers held: a backend without shards never takes the lock.
    count: AtomicUsize,
    on_shard: Mutex<Vec<OnShard>>,
    overflow_warned: AtomicBool,
}

impl ShardBreakers {
    /// The breakers of a backend whose [`Shard::WHOLE`] breaker (and
    /// template) is `whole`.
    pub fn new(whole: Breaker) -> Self {
        Self {
            inner: Arc::new(Inner {
                whole,
                named: RwLock::new(HashMap::new()),
                count: AtomicUsize::new(0),
                on_shard: Mutex::new(Vec::new()),
                overflow_warned: AtomicBool::new(false),
            }),
        }
    }

    /// The whole-store breaker: [`Shard::WHOLE`]'s, and every flight's
    /// while it is not closed.
    pub fn whole(&self) -> &Breaker {
        &self.inner.whole
    }

    /// Whether any named shard has a breaker yet (false for a backend
    /// that is not sharded).
    #[inline]
    pub fn has_named(&self) -> bool {
        self.inner.count.load(Ordering::Acquire) > 0
    }

    /// The breaker of `shard` if it exists ([`Shard::WHOLE`]'s always
    /// does).
    pub fn get(&self, shard: &Shard) -> Option<Breaker> {
        if shard.is_whole() {
            return Some(self.inner.whole.clone());
        }
        self.read().get(shard).cloned()
    }

    /// The breaker of `shard`, created with the template's settings if
    /// needed; the whole-store breaker for [`Shard::WHOLE`], and for a
    /// shard beyond [`MAX_SHARD_BREAKERS`].
    pub fn for_shard(&self, shard: &Shard) -> Breaker {
        self.of(shard).into_owned()
    }

    /// The breaker that judges the flights of `shard` now: the whole-store
    /// breaker while it is not closed, otherwise the shard's own.
    pub fn judging(&self, shard: &Shard) -> Cow<'_, Breaker> {
        if shard.is_whole() || self.inner.whole.state() != CircuitState::Closed {
            return Cow::Borrowed(&self.inner.whole);
        }
        self.of(shard)
    }

    /// Every named shard's breaker, sorted by shard.
    pub fn named(&self) -> Vec<(Shard, Breaker)> {
        let mut all: Vec<_> = self
            .read()
            .iter()
            .map(|(s, b)| (s.clone(), b.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Calls `f` with every named shard's breaker: those that exist now,
    /// and each one created from now on, when it is created (from the
    /// call that first judges a flight of the shard: `f` must be quick,
    /// and must not judge flights itself). `f` may see a shard twice.
    pub fn on_shard(&self, f: impl Fn(&Shard, &Breaker) + Send + Sync + 'static) {
        let mut hooks = self.hooks();
        for (shard, breaker) in self.named() {
            f(&shard, &breaker);
        }
        hooks.push(Arc::new(f));
    }

    /// Drops the breakers of the named shards not in `serving` (the shards
    /// the backend serves flights from now, see
    /// [`Backend::shards`](crate::Backend::shards)); returns the shards
    /// dropped.
    pub fn retire(&self, serving: &[Shard]) -> Vec<Shard> {
        if !self.has_named() {
            return Vec::new();
        }
        let mut named = self
            .inner
            .named
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<Shard> = named
            .keys()
            .filter(|s| !serving.contains(s))
            .cloned()
            .collect();
        for shard in &gone {
            named.remove(shard);
        }
        self.inner.count.store(named.len(), Ordering::Release);
        gone
    }

    fn of(&self, shard: &Shard) -> Cow<'_, Breaker> {
        if shard.is_whole() {
            return Cow::Borrowed(&self.inner.whole);
        }
        if let Some(b) = self.read().get(shard) {
            return Cow::Owned(b.clone());
        }
        self.create(shard)
    }

    #[cold]
    fn create(&self, shard: &Shard) -> Cow<'_, Breaker> {
        let created = {
            let mut named = self
                .inner
                .named
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(b) = named.get(shard) {
                return Cow::Owned(b.clone());
            }
            if named.len() >= MAX_SHARD_BREAKERS {
                drop(named);
                if !self.inner.overflow_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        breaker = self.inner.whole.name(),
                        %shard,
                        limit = MAX_SHARD_BREAKERS,
                        "too many shards for one breaker each: further shards are judged by the whole-store breaker"
                    );
                }
                return Cow::Borrowed(&self.inner.whole);
            }
            let whole = &self.inner.whole;
            let name = format!("{}@{}", whole.name(), shard);
            // The template's settings were validated when it was built.
            let Ok(breaker) = Breaker::new(name, whole.config().clone()) else {
                return Cow::Borrowed(whole);
            };
            named.insert(shard.clone(), breaker.clone());
            self.inner.count.store(named.len(), Ordering::Release);
            breaker
        };
        for hook in self.hooks().iter() {
            hook(shard, &created);
        }
        Cow::Owned(created)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Shard, Breaker>> {
        self.inner
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Vec<OnShard>> {
        self.inner
            .on_shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ShardBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardBreakers")
            .field("whole", &self.inner.whole)
            .field("named", &self.named())
            .finish()
    }
}
