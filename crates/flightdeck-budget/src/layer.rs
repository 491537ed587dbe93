//! The tower layer.

use std::time::Duration;

use tower_layer::Layer;

use crate::deadline::Slices;
use crate::inbound::NoInbound;
use crate::service::Budget;

/// Gives every request one deadline, the smaller of its inbound one and the
/// stage total, and runs the inner service within the execution slice.
///
/// It holds only settings (no shared state), so it is cheap to clone.
#[derive(Debug, Clone)]
pub struct BudgetLayer<X> {
    pub(crate) total: Duration,
    pub(crate) slices: Slices,
    pub(crate) inbound: X,
}

#[cfg(feature = "http")]
impl BudgetLayer<crate::inbound::FromHeaders> {
    /// A budget of `total` per request for `http::Request`s, honouring
    /// `grpc-timeout` and `x-request-timeout` when they ask for less.
    pub fn new(total: Duration) -> Self {
        Self {
            total,
            slices: Slices::default(),
            inbound: crate::inbound::FromHeaders::new(),
        }
    }
}

impl BudgetLayer<NoInbound> {
    /// A budget of `total` per request for any request type (no inbound
    /// deadline, no extensions).
    pub fn plain(total: Duration) -> Self {
        Self {
            total,
            slices: Slices::default(),
            inbound: NoInbound,
        }
    }
}

impl<X> BudgetLayer<X> {
    /// Reads inbound deadlines (and attaches ours) with `inbound`.
    pub fn inbound<X2>(self, inbound: X2) -> BudgetLayer<X2> {
        BudgetLayer {
            total: self.total,
            slices: self.slices,
            inbound,
        }
    }

    /// Sets all phase slices.
    pub fn slices(mut self, slices: Slices) -> Self {
        self.slices = slices;
        self
    }

    /// The coordination slice (default 200 ms).
    pub fn coordination(mut self, slice: Duration) -> Self {
        self.slices.coordination = slice;
        self
    }

    /// The execution slice (default: all that remains). The inner service
    /// runs within it.
    pub fn execution(mut self, slice: Duration) -> Self {
        self.slices.execution = Some(slice);
        self
    }

    /// The result-handling slice (default 100 ms).
    pub fn result(mut self, slice: Duration) -> Self {
        self.slices.result = slice;
        self
    }
}

impl<S, X: Clone> Layer<S> for BudgetLayer<X> {
    type Service = Budget<S, X>;

    fn layer(&self, inner: S) -> Self::Service {
        Budget::new(inner, self.clone())
    }
}
