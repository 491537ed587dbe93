use std::fmt;
use std::sync::Arc;

use flightdeck_core::error::BoxError;
use flightdeck_core::FlightKey;
use tower_layer::Layer;

use crate::backend::Backend;
use crate::fallback::Propagate;
use crate::flights::DistributedFlights;
use crate::policy::{DistributedPolicy, PolicyError};
use crate::service::DistributedFlight;
use crate::work::NoFence;

/// Applies distributed single-flight to a service (see the crate docs): a
/// thin `tower` shell over [`DistributedFlights`].
///
/// The backend, policy, sharer, codec, key source, fence and fallback are
/// created once, here, and shared by every service this layer builds.
pub struct DistributedFlightLayer<B, Sh, C, K, F = NoFence, P = Propagate> {
    pub(crate) flights: DistributedFlights<B, C>,
    pub(crate) share: Sh,
    pub(crate) keys: K,
    pub(crate) fence: F,
    pub(crate) fallback: Arc<P>,
}

impl<B: Backend, Sh, C: Send + Sync + 'static, K> DistributedFlightLayer<B, Sh, C, K> {
    /// Builds the layer. `share` turns responses into their shared form
    /// (`CloneShare`, `HttpShare`), `codec` stores that form in the backend
    /// (`PostcardCodec`, `HttpCodec`), `keys` reads each request's key (a
    /// closure, or `FromExtension` after a `KeyLayer`). The policy is
    /// validated. Fencing tokens are dropped ([`fence`](Self::fence) hands
    /// them to requests) and coordination failures come back as typed
    /// errors ([`fallback`](Self::fallback) decides otherwise).
    pub fn new(
        backend: B,
        policy: DistributedPolicy,
        share: Sh,
        codec: C,
        keys: K,
    ) -> Result<Self, PolicyError> {
        Ok(Self {
            flights: DistributedFlights::new(backend, policy, codec)?,
            share,
            keys,
            fence: NoFence,
            fallback: Arc::new(Propagate),
        })
    }
}

impl<B: Backend, Sh, C: Send + Sync + 'static, K, F, P> DistributedFlightLayer<B, Sh, C, K, F, P> {
    /// Hands the owner's fencing token to its request with `fence`.
    pub fn fence<F2>(self, fence: F2) -> DistributedFlightLayer<B, Sh, C, K, F2, P> {
        DistributedFlightLayer {
            flights: self.flights,
            share: self.share,
            keys: self.keys,
            fence,
            fallback: self.fallback,
        }
    }

    /// Decides on coordination failures with `fallback`.
    pub fn fallback<P2>(self, fallback: P2) -> DistributedFlightLayer<B, Sh, C, K, F, P2> {
        DistributedFlightLayer {
            flights: self.flights,
            share: self.share,
            keys: self.keys,
            fence: self.fence,
            fallback: Arc::new(fallback),
        }
    }

    /// The flights (the library under the layer).
    pub fn flights(&self) -> &DistributedFlights<B, C> {
        &self.flights
    }

    /// The validated policy.
    pub fn policy(&self) -> &DistributedPolicy {
        self.flights.policy()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        self.flights.backend()
    }

    /// Forgets `key`'s stored result and fences its running owner, if any
    /// (its commit will be rejected): the next request runs the work again.
    /// Returns the new generation.
    pub async fn invalidate(&self, key: &FlightKey) -> Result<u64, BoxError> {
        self.flights.invalidate(key).await
    }
}

impl<B, Sh: Clone, C, K: Clone, F: Clone, P> Clone for DistributedFlightLayer<B, Sh, C, K, F, P> {
    fn clone(&self) -> Self {
        Self {
            flights: self.flights.clone(),
            share: self.share.clone(),
            keys: self.keys.clone(),
            fence: self.fence.clone(),
            fallback: Arc::clone(&self.fallback),
        }
    }
}

impl<B, Sh, C, K, F, P> fmt::Debug for DistributedFlightLayer<B, Sh, C, K, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedFlightLayer")
            .field("flights", &self.flights)
            .finish_non_exhaustive()
    }
}

impl<S, B, Sh: Clone, C, K: Clone, F: Clone, P> Layer<S>
    for DistributedFlightLayer<B, Sh, C, K, F, P>
{
    type Service = DistributedFlight<S, B, Sh, C, K, F, P>;

    fn layer(&self, inner: S) -> Self::Service {
        DistributedFlight {
            inner,
            layer: self.clone(),
        }
    }
}
