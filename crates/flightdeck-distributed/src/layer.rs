use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use flightdeck_core::error::BoxError;
use flightdeck_core::FlightKey;

use crate::backend::{Backend, BackendError, FlightId};
use crate::codec::Envelope;
use crate::error::CallTimedOut;
use crate::policy::{DistributedPolicy, PolicyError};
use crate::service::DistributedFlight;

/// Applies distributed single-flight to a service (see the crate docs).
///
/// The backend, policy, sharer, codec and key extractor are created once,
/// here, and shared by every service this layer builds.
pub struct DistributedFlightLayer<B, Sh, C, K> {
    pub(crate) state: Arc<Flights<B, Sh, C, K>>,
}

/// The state shared by every service of one layer.
pub(crate) struct Flights<B, Sh, C, K> {
    pub(crate) backend: B,
    pub(crate) policy: DistributedPolicy,
    pub(crate) share: Sh,
    pub(crate) codec: C,
    pub(crate) keys: K,
    pub(crate) envelope: Envelope,
}

impl<B: Backend, Sh, C, K> DistributedFlightLayer<B, Sh, C, K> {
    /// Builds the layer. `share` turns responses into their shared form
    /// (`CloneShare`, `HttpShare`), `codec` stores that form in the backend
    /// (`PostcardCodec`, `HttpCodec`), `keys` finds each request's key
    /// (`KeyFn`, `ExtensionKey`). The policy is validated.
    pub fn new(
        backend: B,
        policy: DistributedPolicy,
        share: Sh,
        codec: C,
        keys: K,
    ) -> Result<Self, PolicyError> {
        let policy = policy.validate()?;
        let envelope = Envelope::new(policy.compress_above_bytes(), policy.max_result_size());
        Ok(Self {
            state: Arc::new(Flights {
                backend,
                policy,
                share,
                codec,
                keys,
                envelope,
            }),
        })
    }

    /// The validated policy.
    pub fn policy(&self) -> &DistributedPolicy {
        &self.state.policy
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.state.backend
    }

    /// Forgets `key`'s stored result and fences its running owner, if any
    /// (its commit will be rejected): the next request runs the work again.
    /// Returns the new generation.
    pub async fn invalidate(&self, key: &FlightKey) -> Result<u64, BoxError> {
        let limit = self.state.policy.call_timeout_duration();
        let flight = FlightId::of(key);
        let call = self
            .state
            .backend
            .invalidate(&flight, self.state.policy.state_ttl());
        match tokio::time::timeout(limit, call).await {
            Ok(res) => res.map_err(BackendError::into_core),
            Err(_) => Err(
                BackendError::outcome_unknown(CallTimedOut::new("invalidate", limit)).into_core(),
            ),
        }
    }
}

impl<B, Sh, C, K> Clone for DistributedFlightLayer<B, Sh, C, K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
        }
    }
}

impl<B, Sh, C, K> fmt::Debug for DistributedFlightLayer<B, Sh, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedFlightLayer")
            .field("policy", &self.state.policy)
            .finish_non_exhaustive()
    }
}

impl<S, B, Sh, C, K> Layer<S> for DistributedFlightLayer<B, Sh, C, K> {
    type Service = DistributedFlight<S, B, Sh, C, K>;

    fn layer(&self, inner: S) -> Self::Service {
        DistributedFlight {
            inner,
            state: self.state.clone(),
        }
    }
}
