//! Runtime plumbing that flightdeck's crates share (the local layer's
//! timers and the breaker). Not an API: public only because those are
//! other crates, hidden from the docs, and it may change in any release.

/// The id of the tokio runtime behind `rt` as a number (never 0), so
/// that it can be kept in an atomic and compared with one load: the local
/// layer's timers and the breaker ask "is this the runtime that runs my
/// timer?" on every call. tokio's `runtime::Id` shows its number only
/// through `Hash` (and `Display`, which allocates), so the number is what
/// it writes to a hasher that keeps it.
#[inline]
pub fn runtime_id(rt: &tokio::runtime::Handle) -> u64 {
    use std::hash::{Hash, Hasher};
    /// Keeps what the id writes.
    struct Keep(u64);
    impl Hasher for Keep {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0 = bytes
                .iter()
                .fold(self.0, |n, &b| n.rotate_left(8) ^ u64::from(b));
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }
    let mut keep = Keep(0);
    rt.id().hash(&mut keep);
    keep.0.max(1)
}

#[cfg(test)]
mod tests {
    use super::runtime_id;

    #[test]
    fn runtimes_have_distinct_nonzero_ids() {
        let a = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (a, a2, b) = (
            runtime_id(a.handle()),
            runtime_id(a.handle()),
            runtime_id(b.handle()),
        );
        assert!(a != 0 && b != 0);
        assert_eq!(a, a2, "one runtime, one number");
        assert_ne!(a, b);
    }
}
