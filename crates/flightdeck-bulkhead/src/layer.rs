//! The tower layer.

use std::sync::Arc;

use tower_layer::Layer;

use crate::service::Bulkhead;
use crate::shared::{BulkheadConfig, BulkheadHandle, Shared, Slot};

/// Limits concurrent calls through the services it builds. The counters,
/// queue and rate limiter are created here, behind an `Arc`, and shared by
/// every service and clone (axum rebuilds the stack per request).
#[derive(Debug, Clone)]
pub struct BulkheadLayer {
    handle: BulkheadHandle,
}

impl BulkheadLayer {
    /// At most `limit` concurrent calls; the rest are rejected at once.
    pub fn new(limit: usize) -> Self {
        Self::from_config(BulkheadConfig::new(limit))
    }

    /// A bulkhead with a queue, degraded limit, rate limit or stage name.
    pub fn from_config(cfg: BulkheadConfig) -> Self {
        Self {
            handle: BulkheadHandle {
                shared: Shared::new(cfg),
            },
        }
    }

    pub(crate) fn from_handle(handle: BulkheadHandle) -> Self {
        Self { handle }
    }

    /// The shared handle (switch the degraded limit, read the load).
    pub fn handle(&self) -> BulkheadHandle {
        self.handle.clone()
    }

    /// A slot now, lent for as long as the returned guard lives, on the
    /// bulkhead's fast path only: `None` when no slot is free, when calls
    /// queue for one, or when a rate limit applies. Then call through the
    /// service ([`Bulkhead`]), which queues, rate-limits or rejects, and
    /// counts the rejection; `None` here counts nothing.
    ///
    /// For code that holds the layer while its call runs (as tokio's
    /// `Semaphore::try_acquire` lends a permit): a service's slot holds a
    /// count on the bulkhead's shared state, this one borrows it.
    ///
    /// ```
    /// use flightdeck_bulkhead::BulkheadLayer;
    ///
    /// let bulkhead = BulkheadLayer::new(1);
    /// let slot = bulkhead.try_slot().expect("one slot free");
    /// assert!(bulkhead.try_slot().is_none());
    /// assert_eq!(bulkhead.handle().active(), 1);
    /// drop(slot);
    /// assert_eq!(bulkhead.handle().active(), 0);
    /// ```
    #[inline]
    pub fn try_slot(&self) -> Option<Slot<'_>> {
        Slot::try_take(self.shared())
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::new(inner, self.shared().clone())
    }
}
