//! Breakers by key (a backend's shards, a service's dependencies): made on
//! first use from one template, bounded in number, and watched: which of
//! them hold calls back is published on one channel.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::breaker::Breaker;
use crate::config::{BreakerConfig, BreakerConfigError};
use crate::state::{CircuitState, Transition};

/// What a [`BreakerRegistry`] publishes: every key it holds a breaker
/// for, with when that breaker opened if it holds calls back now (open,
/// half-open or forced open), `None` while it lets them through.
pub type OpenSince<K> = BTreeMap<K, Option<Instant>>;

type Naming<K> = Box<dyn Fn(&K) -> String + Send + Sync>;

/// A bounded set of breakers by key, created on first use from one
/// template and named by a naming function (the key's `Display` by
/// default).
///
/// When full, a new key evicts the least recently used breaker that is
/// closed and not in use (no layer, handle or call holds it). Open or busy
/// breakers are never evicted: forgetting an open breaker would send
/// traffic to a dependency known to be down. If none can go, the lookup
/// fails with [`RegistryFull`] instead of growing.
///
/// Which breakers hold calls back is published on a watch channel
/// ([`watch`](Self::watch)): every transition that opens or closes one, a
/// breaker added or dropped. So whoever shows the state (gauges, logs, a
/// degraded mode) follows one channel, whatever the number of breakers.
///
/// ```
/// use flightdeck_breaker::{BreakerConfig, BreakerRegistry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = BreakerRegistry::new(BreakerConfig::default(), 64).unwrap();
/// let mut open = registry.watch();
/// let a = registry.get_or_insert("redis-main").unwrap();
/// let b = registry.get_or_insert("redis-main").unwrap();
/// a.force_open();
/// assert_eq!(b.state(), flightdeck_breaker::CircuitState::ForcedOpen);
/// assert!(open.borrow_and_update()["redis-main"].is_some(), "published");
/// # }
/// ```
pub struct BreakerRegistry<K = String> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    template: BreakerConfig,
    max: usize,
    naming: Naming<K>,
    map: RwLock<HashMap<K, Entry>>,
    /// Uses so far: an entry's last use is this count then.
    tick: AtomicU64,
    shared: Arc<Published<K>>,
}

struct Entry {
    breaker: Breaker,
    used: AtomicU64,
    /// Cleared when the entry is dropped: a transition of its breaker
    /// after that publishes nothing.
    live: Arc<AtomicBool>,
}

/// The published set, and what tells a copy of it from the current one
/// without reading it.
struct Published<K> {
    tx: watch::Sender<OpenSince<K>>,
    /// Breakers holding calls back now.
    open: AtomicUsize,
    /// Changes so far (see [`BreakerRegistry::version`]).
    version: AtomicU64,
}

impl<K: Ord> Published<K> {
    /// Runs `change` on the published set (under the channel's lock), and
    /// counts it as a change when it says so.
    fn change(&self, change: impl FnOnce(&mut OpenSince<K>) -> bool) {
        self.tx.send_if_modified(|set| {
            let changed = change(set);
            if changed {
                self.open.store(
                    set.values().filter(|v| v.is_some()).count(),
                    Ordering::Release,
                );
                self.version.fetch_add(1, Ordering::AcqRel);
            }
            changed
        });
    }

    /// `key`'s breaker went through `t`.
    fn follow(&self, key: &K, live: &AtomicBool, t: &Transition) {
        let holds_back = matches!(
            t.to,
            CircuitState::Open | CircuitState::HalfOpen | CircuitState::ForcedOpen
        );
        self.change(|set| {
            if !live.load(Ordering::Acquire) {
                return false;
            }
            match set.get_mut(key) {
                Some(since @ None) if holds_back => *since = Some(t.at),
                Some(since @ Some(_)) if !holds_back => *since = None,
                _ => return false,
            }
            true
        });
    }
}

impl<K> BreakerRegistry<K>
where
    K: fmt::Display + Clone + Eq + Hash + Ord + Send + Sync + 'static,
{
    /// A registry of at most `max_breakers` breakers built from
    /// `template`, each named by its key.
    pub fn new(template: BreakerConfig, max_breakers: usize) -> Result<Self, BreakerConfigError> {
        Self::with_naming(template, max_breakers, |key: &K| key.to_string())
    }
}

impl<K> BreakerRegistry<K>
where
    K: Clone + Eq + Hash + Ord + Send + Sync + 'static,
{
    /// A registry of at most `max_breakers` breakers built from
    /// `template`, the breaker of `key` named `naming(key)` (the name its
    /// metrics, logs and `CircuitOpen` errors carry).
    pub fn with_naming(
        template: BreakerConfig,
        max_breakers: usize,
        naming: impl Fn(&K) -> String + Send + Sync + 'static,
    ) -> Result<Self, BreakerConfigError> {
        template.validate()?;
        let (tx, _) = watch::channel(OpenSince::new());
        Ok(Self {
            inner: Arc::new(Inner {
                template,
                max: max_breakers,
                naming: Box::new(naming),
                map: RwLock::new(HashMap::new()),
                tick: AtomicU64::new(0),
                shared: Arc::new(Published {
                    tx,
                    open: AtomicUsize::new(0),
                    version: AtomicU64::new(0),
                }),
            }),
        })
    }

    /// The settings every breaker is created with.
    pub fn template(&self) -> &BreakerConfig {
        &self.inner.template
    }

    /// The breaker of `key`, created if needed.
    pub fn get_or_insert<Q>(&self, key: &Q) -> Result<Breaker, RegistryFull>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(entry) = self.read().get(key) {
            entry.used.store(self.tick(), Ordering::Relaxed);
            return Ok(entry.breaker.clone());
        }
        self.create(key.to_owned())
    }

    #[cold]
    fn create(&self, key: K) -> Result<Breaker, RegistryFull> {
        let mut map = self.write();
        if let Some(entry) = map.get(&key) {
            entry.used.store(self.tick(), Ordering::Relaxed);
            return Ok(entry.breaker.clone());
        }
        let name = (self.inner.naming)(&key);
        let breaker = Breaker::new(name, self.inner.template.clone())
            .expect("template validated in BreakerRegistry::with_naming");
        self.add(&mut map, key, breaker.clone())?;
        Ok(breaker)
    }

    /// Adds a breaker built elsewhere under `key` (the registry then
    /// publishes its state and may evict it like its own), replacing the
    /// one there.
    pub fn insert(&self, key: K, breaker: Breaker) -> Result<(), RegistryFull> {
        let mut map = self.write();
        if let Some(old) = map.remove(&key) {
            self.dropped(&key, &old);
        }
        self.add(&mut map, key, breaker)
    }

    fn add(
        &self,
        map: &mut HashMap<K, Entry>,
        key: K,
        breaker: Breaker,
    ) -> Result<(), RegistryFull> {
        if map.len() >= self.inner.max {
            self.evict(map)?;
        }
        let live = Arc::new(AtomicBool::new(true));
        let (shared, hook_key, hook_live) = (
            Arc::clone(&self.inner.shared),
            key.clone(),
            Arc::clone(&live),
        );
        breaker.on_transition(Box::new(move |t| shared.follow(&hook_key, &hook_live, t)));
        // Published after the hook is in place, read under the channel's
        // lock: a transition in between is not missed.
        self.inner.shared.change(|set| {
            let since = breaker.is_open().then(Instant::now);
            set.insert(key.clone(), since);
            true
        });
        map.insert(
            key,
            Entry {
                breaker,
                used: AtomicU64::new(self.tick()),
                live,
            },
        );
        Ok(())
    }

    /// Drops the least recently used breaker that is closed and unused.
    fn evict(&self, map: &mut HashMap<K, Entry>) -> Result<(), RegistryFull> {
        let victim = map
            .iter()
            .filter(|(_, e)| e.breaker.is_unused() && e.breaker.state() == CircuitState::Closed)
            .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
            .map(|(k, _)| k.clone());
        let Some(key) = victim else {
            return Err(RegistryFull {
                limit: self.inner.max,
            });
        };
        if let Some(entry) = map.remove(&key) {
            self.dropped(&key, &entry);
        }
        Ok(())
    }

    fn dropped(&self, key: &K, entry: &Entry) {
        self.inner.shared.change(|set| {
            entry.live.store(false, Ordering::Release);
            set.remove(key).is_some()
        });
    }

    /// The breaker of `key`, if it exists.
    pub fn get<Q>(&self, key: &Q) -> Option<Breaker>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read().get(key).map(|e| e.breaker.clone())
    }

    /// Drops the breakers whose key `keep` refuses; returns their keys.
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut map = self.write();
        let gone: Vec<K> = map.keys().filter(|k| !keep(k)).cloned().collect();
        for key in &gone {
            if let Some(entry) = map.remove(key) {
                self.dropped(key, &entry);
            }
        }
        gone
    }

    /// Every breaker with its key, sorted by key.
    pub fn breakers(&self) -> Vec<(K, Breaker)> {
        let mut all: Vec<_> = self
            .read()
            .iter()
            .map(|(k, e)| (k.clone(), e.breaker.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every breaker's name and state, sorted by name.
    pub fn states(&self) -> Vec<(String, CircuitState)> {
        let breakers: Vec<Breaker> = self.read().values().map(|e| e.breaker.clone()).collect();
        let mut out: Vec<_> = breakers
            .iter()
            .map(|b| (b.name().to_owned(), b.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Number of breakers held.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when no breaker is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys held, and which of their breakers hold calls back, now
    /// and at every change (see [`OpenSince`]). Do not call the breakers
    /// while borrowing the value: their transitions write it.
    pub fn watch(&self) -> watch::Receiver<OpenSince<K>> {
        self.inner.shared.tx.subscribe()
    }

    /// What [`watch`](Self::watch) publishes now (a copy).
    pub fn open_since(&self) -> OpenSince<K> {
        self.inner.shared.tx.borrow().clone()
    }

    /// A count that grows with every change of what [`watch`](Self::watch)
    /// publishes: a copy taken when it was `v` is current while it is
    /// still `v` (two atomic loads to find out, no lock).
    #[inline]
    pub fn version(&self) -> u64 {
        self.inner.shared.version.load(Ordering::Acquire)
    }

    /// Whether any breaker holds calls back now (one atomic load).
    #[inline]
    pub fn any_open(&self) -> bool {
        self.inner.shared.open.load(Ordering::Acquire) > 0
    }

    /// Whether the breaker of `key` holds calls back now.
    pub fn is_open<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.any_open()
            && self
                .inner
                .shared
                .tx
                .borrow()
                .get(key)
                .is_some_and(Option::is_some)
    }

    fn tick(&self) -> u64 {
        self.inner.tick.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<K, Entry>> {
        self.inner
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<K, Entry>> {
        self.inner
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K> Clone for BreakerRegistry<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for BreakerRegistry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self
            .inner
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("BreakerRegistry")
            .field("max", &self.inner.max)
            .field("len", &len)
            .finish()
    }
}

/// The registry is full and no breaker can be evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryFull {
    limit: usize,
}

impl RegistryFull {
    /// The registry's size limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl fmt::Display for RegistryFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "breaker registry full (limit {})", self.limit)
    }
}

impl std::error::Error for RegistryFull {}
