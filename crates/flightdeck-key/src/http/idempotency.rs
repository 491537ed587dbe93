//! Remembers which request each `Idempotency-Key` was first used with, so a
//! reuse with another payload is answered 422 instead of sharing a result.
//!
//! Only digests are stored (32 bytes each), in a table bounded both by
//! entries and by time. The table is per process: two nodes that each see
//! one of two conflicting requests cannot tell. Keys already include the
//! whole request, so even then the two never share a result; they simply
//! both run.

use std::time::Duration;

use flightdeck_core::expiring::ExpiringMap;
use flightdeck_core::time::later;
use flightdeck_core::Digest;
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct IdempotencyTable {
    window: Duration,
    // slot (scope, stage, method, target, idempotency key) → request digest
    slots: ExpiringMap<Digest, Digest>,
}

impl IdempotencyTable {
    pub(crate) fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            slots: ExpiringMap::new(capacity),
        }
    }

    /// Records `request` as the payload of `slot` unless another payload was
    /// recorded there within the window. Returns `false` on a conflict.
    pub(crate) fn check(&self, slot: Digest, request: Digest) -> bool {
        let until = later(Instant::now(), self.window);
        self.slots.get_or_insert(slot, request, until) == request
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightdeck_core::KeyEncoder;

    fn d(s: &str) -> Digest {
        KeyEncoder::new().field(s.as_bytes()).finish()
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_expire_and_capacity_is_bounded() {
        let t = IdempotencyTable::new(Duration::from_secs(60), 2);
        assert!(t.check(d("k1"), d("a")));
        assert!(t.check(d("k1"), d("a")), "same payload is not a conflict");
        assert!(!t.check(d("k1"), d("b")), "other payload is a conflict");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(t.check(d("k1"), d("b")), "the window has passed");
        assert!(t.check(d("k2"), d("x")));
        assert!(t.check(d("k3"), d("y")));
        assert_eq!(t.len(), 2, "the oldest entry was evicted");
        assert!(t.check(d("k1"), d("c")), "k1 was evicted first");
    }
}
