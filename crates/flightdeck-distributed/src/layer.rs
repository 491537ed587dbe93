use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::backend::Backend;
use crate::codec::Envelope;
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
