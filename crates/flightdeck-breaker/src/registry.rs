//! Breakers by name (per stage, per backend), with a bounded size.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::breaker::Breaker;
use crate::config::{BreakerConfig, BreakerConfigError};
use crate::state::CircuitState;

/// A bounded set of named breakers, created on first use from one config.
///
/// When full, a new name evicts the least recently used breaker that is
/// closed and not in use (no layer, handle or call holds it). Open or busy
/// breakers are never evicted: forgetting an open breaker would send
/// traffic to a dependency known to be down. If none can go, the lookup
/// fails with [`RegistryFull`] instead of growing.
///
/// ```
/// use flightdeck_breaker::{BreakerConfig, BreakerRegistry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = BreakerRegistry::new(BreakerConfig::default(), 64).unwrap();
/// let a = registry.get_or_insert("redis-main").unwrap();
/// let b = registry.get_or_insert("redis-main").unwrap();
/// a.force_open();
/// assert_eq!(b.state(), flightdeck_breaker::CircuitState::ForcedOpen);
/// # }
/// ```
#[derive(Clone)]
pub struct BreakerRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    template: BreakerConfig,
    max: usize,
    map: Mutex<Map>,
}

#[derive(Default)]
struct Map {
    tick: u64,
    entries: HashMap<Arc<str>, (Breaker, u64)>,
}

impl BreakerRegistry {
    /// A registry of at most `max_breakers` breakers built from `template`.
    pub fn new(template: BreakerConfig, max_breakers: usize) -> Result<Self, BreakerConfigError> {
        template.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                template,
                max: max_breakers,
                map: Mutex::new(Map::default()),
            }),
        })
    }

    /// The breaker named `name`, created if needed.
    pub fn get_or_insert(&self, name: &str) -> Result<Breaker, RegistryFull> {
        let mut map = self
            .inner
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.tick += 1;
        let tick = map.tick;
        if let Some((b, used)) = map.entries.get_mut(name) {
            *used = tick;
            return Ok(b.clone());
        }
        if map.entries.len() >= self.inner.max {
            let victim = map
                .entries
                .iter()
                .filter(|(_, (b, _))| b.is_unused() && b.state() == CircuitState::Closed)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    map.entries.remove(&k);
                }
                None => {
                    return Err(RegistryFull {
                        limit: self.inner.max,
                    })
                }
            }
        }
        let name: Arc<str> = name.into();
        let breaker = Breaker::new(name.clone(), self.inner.template.clone())
            .expect("template validated in BreakerRegistry::new");
        map.entries.insert(name, (breaker.clone(), tick));
        Ok(breaker)
    }

    /// The breaker named `name`, if it exists.
    pub fn get(&self, name: &str) -> Option<Breaker> {
        let map = self
            .inner
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.entries.get(name).map(|(b, _)| b.clone())
    }

    /// Every breaker's name and state, sorted by name.
    pub fn states(&self) -> Vec<(String, CircuitState)> {
        let breakers: Vec<Breaker> = {
            let map = self
                .inner
                .map
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            map.entries.values().map(|(b, _)| b.clone()).collect()
        };
        let mut out: Vec<_> = breakers
            .iter()
            .map(|b| (b.name().to_owned(), b.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Number of breakers held.
    pub fn len(&self) -> usize {
        self.inner
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }

    /// True when no breaker is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for BreakerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerRegistry")
            .field("max", &self.inner.max)
            .field("len", &self.len())
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
