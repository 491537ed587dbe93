//! The tower layer.

use std::sync::Arc;

use tower_layer::Layer;

use crate::service::Bulkhead;
use crate::shared::{BulkheadConfig, BulkheadHandle, Shared};

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
