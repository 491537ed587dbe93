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
///
/// ```
/// use flightdeck_core::{KeyEncoder, StageName};
/// use flightdeck_key::{key_fn, KeyLayer, Keyed};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), flightdeck_core::BoxError> {
/// let stage = StageName::new("lookup").unwrap();
/// let layer = KeyLayer::new(key_fn(move |req: &Keyed<u64>| {
///     let id = req.get_ref().to_le_bytes();
///     Some(KeyEncoder::new().field(&id).finish_key(stage.clone(), None))
/// }));
/// let svc = layer.layer(service_fn(|req: Keyed<u64>| async move {
///     Ok::<_, std::convert::Infallible>(req.key().map(|k| k.stage().as_str()))
/// }));
/// assert_eq!(svc.oneshot(Keyed::new(7)).await?, Some("lookup"));
/// # Ok(())
/// # }
/// ```
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
