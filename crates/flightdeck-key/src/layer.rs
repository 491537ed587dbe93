use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::service::Key;

/// Puts a [`FlightKey`](flightdeck_core::FlightKey) into each request, or
/// marks it [`NotCoalescable`](crate::NotCoalescable) (see the crate docs).
///
/// Cheap to clone: the extractor, with all its configuration and state (the
/// `Idempotency-Key` table of the HTTP extractor), lives behind one `Arc`
/// created here, so every service built from this layer shares it.
pub struct KeyLayer<E> {
    extractor: Arc<E>,
}

impl<E> KeyLayer<E> {
    /// A layer that keys requests with `extractor`.
    pub fn new(extractor: E) -> Self {
        Self {
            extractor: Arc::new(extractor),
        }
    }

    /// The extractor.
    pub fn extractor(&self) -> &E {
        &self.extractor
    }
}

impl<E> Clone for KeyLayer<E> {
    fn clone(&self) -> Self {
        Self {
            extractor: Arc::clone(&self.extractor),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for KeyLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLayer")
            .field("extractor", &self.extractor)
            .finish()
    }
}

impl<S, E> Layer<S> for KeyLayer<E> {
    type Service = Key<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        Key::from_arc(inner, Arc::clone(&self.extractor))
    }
}
