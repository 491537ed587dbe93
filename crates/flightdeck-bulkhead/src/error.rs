//! Rejection errors of the bulkhead.
//!
//! A plain full bulkhead is flightdeck's
//! [`BulkheadFull`]. The two other
//! rejections carry a `BulkheadFull` as their `source()`, so
//! `flightdeck_core::ErrorClass::of` maps all three to HTTP 429 / gRPC
//! `RESOURCE_EXHAUSTED`, while callers can still tell them apart.

use std::fmt;
use std::time::Duration;

use flightdeck_core::error::BulkheadFull;

/// A call waited in the bulkhead's queue for the whole queue timeout
/// without getting a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTimeout {
    waited: Duration,
    full: BulkheadFull,
}

impl QueueTimeout {
    pub(crate) fn new(waited: Duration, full: BulkheadFull) -> Self {
        Self { waited, full }
    }

    /// How long the call waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl fmt::Display for QueueTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bulkhead queue timed out after {:?}", self.waited)
    }
}

impl std::error::Error for QueueTimeout {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.full)
    }
}

/// The bulkhead's rate limit (permits per second) was exceeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    full: BulkheadFull,
}

impl RateLimited {
    pub(crate) fn new(full: BulkheadFull) -> Self {
        Self { full }
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rate limited")
    }
}

impl std::error::Error for RateLimited {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.full)
    }
}
