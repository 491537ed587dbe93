//! [`Shard`]: the part of a store that serves a flight.

use std::fmt;
use std::sync::Arc;

/// The part of a backend that serves a flight: one Redis Cluster primary,
/// say. Coordination failures are judged per shard, so that one shard's
/// outage degrades only the flights it serves. A backend that is one store
/// puts every flight on [`Shard::WHOLE`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Shard(Option<Arc<str>>);

impl Shard {
    /// The whole store: a backend that is not sharded.
    pub const WHOLE: Shard = Shard(None);

    /// A named shard (a metric label: a node's address, a slot range).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(Some(name.into()))
    }

    /// The shard's name; `None` for [`Shard::WHOLE`].
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Whether this is [`Shard::WHOLE`].
    pub fn is_whole(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("Shard::WHOLE"),
            Some(name) => write!(f, "Shard({name:?})"),
        }
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("whole"))
    }
}

#[cfg(test)]
mod tests {
    use super::Shard;

    #[test]
    fn names() {
        assert!(Shard::WHOLE.is_whole());
        assert_eq!(Shard::WHOLE.to_string(), "whole");
        let s = Shard::new("10.0.0.1:7000");
        assert_eq!(s.name(), Some("10.0.0.1:7000"));
        assert_eq!(s.to_string(), "10.0.0.1:7000");
        assert_ne!(s, Shard::WHOLE);
    }
}
