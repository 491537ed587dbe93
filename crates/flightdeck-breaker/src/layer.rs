//! The tower layer.

use tower_layer::Layer;

use crate::breaker::Breaker;
use crate::classify::ErrIsFailure;
use crate::service::CircuitBreaker;

/// Guards services with a [`Breaker`]: calls are rejected with
/// `CircuitOpen` while it is open, and every admitted call's result is
/// classified and recorded.
///
/// The breaker's state lives in the [`Breaker`] (behind an `Arc`), created
/// before the layer: every service this layer builds, and every clone of
/// those services, shares it. That is what makes it work under axum, which
/// rebuilds the service stack for each request.
///
/// ```
/// use flightdeck_breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, CircuitState};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let breaker = Breaker::new("db", BreakerConfig::default().consecutive_failures(1)).unwrap();
/// let svc = ServiceBuilder::new()
///     .layer(CircuitBreakerLayer::new(breaker.clone()))
///     .service(service_fn(|ok: bool| async move {
///         if ok { Ok("ok") } else { Err("db down") }
///     }));
/// assert!(svc.oneshot(false).await.is_err());
/// assert_eq!(breaker.state(), CircuitState::Open);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CircuitBreakerLayer<C = ErrIsFailure> {
    breaker: Breaker,
    classifier: C,
}

impl CircuitBreakerLayer {
    /// A layer for `breaker` with the default classifier (every `Err` is a
    /// failure).
    pub fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: ErrIsFailure,
        }
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// Uses another classifier (see [`Classify`](crate::Classify)).
    pub fn classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The shared breaker (a handle to read, force or watch it).
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C: Clone> Layer<S> for CircuitBreakerLayer<C> {
    type Service = CircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::new(inner, self.breaker.clone(), self.classifier.clone())
    }
}
