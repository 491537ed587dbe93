//! A map whose entries expire, bounded in size, for the memories that
//! flightdeck's crates keep (the `Idempotency-Key` table, L2's memory of
//! the commits it saw). Not an API: public only because those are other
//! crates, hidden from the docs, and it may change in any release.
//!
//! Ours, not moka's: moka reads a clock of its own, not tokio's, so its
//! expiry does not follow paused time, on which the tests of both memories
//! run; and past its capacity moka admits an entry by how often its key
//! was seen (TinyLFU), where both memories need the oldest entry to go
//! first, so that the newest is always kept. A `HashMap` and a queue in
//! insertion order, under one lock, do all of that. Hashed with foldhash,
//! seeded per map: the keys are digests (or made of them), and a lookup
//! sits on the path of a caller answered without a flight.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

/// A map whose entries expire at an instant of their own (on tokio's
/// clock) and which holds at most `capacity` of them: past it, the entry
/// inserted first goes first. Expired entries are dropped as they are
/// met (a lookup, or the oldest at an insert).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use flightdeck_core::expiring::ExpiringMap;
/// use tokio::time::Instant;
///
/// let map = ExpiringMap::new(2);
/// let soon = Instant::now() + Duration::from_secs(1);
/// map.insert("a", 1, soon);
/// assert_eq!(map.get(&"a"), Some(1));
/// tokio::time::advance(Duration::from_secs(1)).await;
/// assert_eq!(map.get(&"a"), None, "expired");
/// # }
/// ```
pub struct ExpiringMap<K, V> {
    capacity: usize,
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    map: HashMap<K, Entry<V>, foldhash::fast::RandomState>,
    /// Keys in insertion order, with the insert's number: an entry
    /// replaced or removed since leaves its old place stale.
    order: VecDeque<(K, u64)>,
    inserts: u64,
}

struct Entry<V> {
    value: V,
    until: Instant,
    insert: u64,
}

impl<K: Hash + Eq + Clone, V> ExpiringMap<K, V> {
    /// An empty map holding at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                order: VecDeque::new(),
                inserts: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        // No user code runs under the lock, and every step leaves the map
        // consistent: a poisoned lock is used as is.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts (or replaces) `key`'s entry, expiring at `until`. First
    /// drops the oldest entries that expired or went stale, then, while
    /// the map is full, the oldest ones.
    pub fn insert(&self, key: K, value: V, until: Instant) {
        let mut inner = self.lock();
        inner.insert(key, value, until, self.capacity, Instant::now());
    }

    /// The value of `key`'s live entry, or, when there is none, `value`
    /// inserted for it, expiring at `until` (as [`insert`](Self::insert)):
    /// what the map holds for `key` afterwards, in one step.
    pub fn get_or_insert(&self, key: K, value: V, until: Instant) -> V
    where
        V: Clone,
    {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(v) = inner.live(&key, now) {
            return v.clone();
        }
        inner.insert(key, value.clone(), until, self.capacity, now);
        value
    }

    /// The value of `key`'s entry if it has not expired (an expired one is
    /// dropped).
    pub fn get(&self, key: &K) -> Option<V>
    where
        V: Clone,
    {
        self.get_at(key, Instant::now())
    }

    /// [`get`](Self::get), `now` read already.
    pub fn get_at(&self, key: &K, now: Instant) -> Option<V>
    where
        V: Clone,
    {
        self.lock().live(key, now).cloned()
    }

    /// Removes `key`'s entry; its value if it had not expired.
    pub fn remove(&self, key: &K) -> Option<V> {
        let e = self.lock().map.remove(key)?;
        (e.until > Instant::now()).then_some(e.value)
    }

    /// Removes `key`'s entry if `pred` holds for its value.
    pub fn remove_if(&self, key: &K, pred: impl FnOnce(&V) -> bool) {
        let mut inner = self.lock();
        if inner.map.get(key).is_some_and(|e| pred(&e.value)) {
            inner.map.remove(key);
        }
    }

    /// Replaces `key`'s entry with `value` (expiring at `until`) if `pred`
    /// holds for its value, in one step; whether it did.
    pub fn replace_if(
        &self,
        key: &K,
        pred: impl FnOnce(&V) -> bool,
        value: V,
        until: Instant,
    ) -> bool {
        let mut inner = self.lock();
        if !inner.map.get(key).is_some_and(|e| pred(&e.value)) {
            return false;
        }
        inner.insert(key.clone(), value, until, self.capacity, Instant::now());
        true
    }

    /// Entries held (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an entry for `key` is held (expired or not).
    pub fn contains_key(&self, key: &K) -> bool {
        self.lock().map.contains_key(key)
    }
}

impl<K: Hash + Eq + Clone, V> Inner<K, V> {
    fn live(&mut self, key: &K, now: Instant) -> Option<&V> {
        if self.map.get(key)?.until <= now {
            self.map.remove(key);
            return None;
        }
        self.map.get(key).map(|e| &e.value)
    }

    fn insert(&mut self, key: K, value: V, until: Instant, capacity: usize, now: Instant) {
        while let Some((front, insert)) = self.order.front() {
            let held = self.map.get(front).filter(|e| e.insert == *insert);
            if held.is_some_and(|e| e.until > now) && self.order.len() < capacity {
                break;
            }
            if held.is_some() {
                self.map.remove(front);
            }
            self.order.pop_front();
        }
        self.inserts += 1;
        let insert = self.inserts;
        self.order.push_back((key.clone(), insert));
        self.map.insert(
            key,
            Entry {
                value,
                until,
                insert,
            },
        );
    }
}

impl<K, V> fmt::Debug for ExpiringMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .inner
            .lock()
            .map_or_else(|e| e.into_inner().map.len(), |i| i.map.len());
        f.debug_struct("ExpiringMap")
            .field("capacity", &self.capacity)
            .field("held", &held)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_on_tokio_time_and_the_oldest_go_first() {
        let map = ExpiringMap::new(3);
        let at = |s| Instant::now() + Duration::from_secs(s);
        map.insert(1, "a", at(10));
        map.insert(2, "b", at(1));
        map.insert(3, "c", at(10));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(map.get(&2), None, "expired on paused time");
        assert_eq!(map.get_or_insert(1, "x", at(10)), "a", "live: kept");
        map.insert(4, "d", at(10));
        map.insert(5, "e", at(10));
        assert!(!map.contains_key(&1), "full: the oldest went first");
        assert_eq!((map.get(&3), map.get(&5)), (Some("c"), Some("e")));
        assert!(map.inner.lock().unwrap().order.len() <= 3, "bounded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_or_removed_entry_leaves_no_stale_eviction() {
        let map = ExpiringMap::new(2);
        let later = Instant::now() + Duration::from_secs(10);
        map.insert(1, 1, later);
        map.insert(1, 2, later);
        map.insert(2, 3, later);
        assert_eq!(
            map.get(&1),
            Some(2),
            "the replacement survives its old place"
        );
        map.remove_if(&2, |v| *v == 3);
        assert_eq!(map.remove(&2), None);
        assert_eq!(map.remove(&1), Some(2));
        assert!(map.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn replace_if_replaces_only_the_value_it_was_told_of() {
        let map = ExpiringMap::new(2);
        let at = |s| Instant::now() + Duration::from_secs(s);
        assert!(!map.replace_if(&1, |_| true, "a", at(10)), "nothing held");
        assert_eq!(map.get(&1), None);
        map.insert(1, "a", at(1));
        assert!(!map.replace_if(&1, |v| *v == "b", "c", at(10)));
        assert!(map.replace_if(&1, |v| *v == "a", "c", at(10)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(map.get(&1), Some("c"), "with its own expiry");
    }
}
