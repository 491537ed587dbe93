use std::fmt;

use flightdeck_core::{CloneShare, FromExtension, SharedForm};
use tower_layer::Layer;

use crate::flights::LocalFlights;
use crate::group::Group;
use crate::policy::FlightPolicy;
use crate::service::LocalFlight;

/// Coalesces concurrent requests with equal keys into one execution of the
/// inner service. See the [crate docs](crate).
///
/// The in-flight map lives in the layer, behind an `Arc`: every service
/// built from this layer (and every clone of those services) shares it, so
/// coalescing works when axum rebuilds or clones the stack per request.
///
/// ```
/// use flightdeck_core::{FlightKey, StageName};
/// use flightdeck_local::{FlightPolicy, LocalFlightLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let stage = StageName::new("len").unwrap();
/// let layer = LocalFlightLayer::with_key(FlightPolicy::new(), move |q: &String| {
///     Some(FlightKey::from_bytes(stage.clone(), q))
/// });
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|q: String| async move {
///         Ok::<_, std::convert::Infallible>(q.len())
///     }));
/// assert_eq!(svc.oneshot("four".to_owned()).await.unwrap(), 4);
/// # }
/// ```
pub struct LocalFlightLayer<K, Sh: SharedForm> {
    key: K,
    share: Sh,
    flights: LocalFlights<Sh::Shared>,
}

impl<K, Sh: SharedForm> LocalFlightLayer<K, Sh> {
    /// A layer with a key extractor and a [`Share`](flightdeck_core::Share)
    /// adapter.
    pub fn new(policy: FlightPolicy, key: K, share: Sh) -> Self {
        Self {
            key,
            share,
            // The shell times its executions: its work is the inner
            // service's call.
            flights: LocalFlights {
                group: Group::new(policy, true),
            },
        }
    }

    /// The policy this layer was built with.
    pub fn policy(&self) -> &FlightPolicy {
        &self.flights.group.policy
    }

    /// Flights running right now (for tests and health checks): a sum over
    /// the map's shards, each read under its own lock, so while flights
    /// start and end it is approximate (it may even pass `max_flights`
    /// for a moment).
    pub fn running_flights(&self) -> usize {
        self.flights.running()
    }

    /// Entries in the in-flight map: running flights plus results kept for
    /// replay. Returns to 0 when the layer is idle and replay windows ended.
    pub fn map_entries(&self) -> usize {
        self.flights.entries()
    }
}

impl<K, T> LocalFlightLayer<K, CloneShare<T>>
where
    T: Clone + Send + Sync + 'static,
{
    /// A layer for services whose responses are `Clone`, keyed by a
    /// closure `Fn(&Req) -> Option<FlightKey>`.
    pub fn with_key(policy: FlightPolicy, key: K) -> Self {
        Self::new(policy, key, CloneShare::new())
    }
}

#[cfg(feature = "http")]
impl LocalFlightLayer<FromExtension, flightdeck_core::http::HttpShare> {
    /// A layer for HTTP services: the key comes from the request's
    /// [`FlightKey`](flightdeck_core::FlightKey) extension (set by
    /// `KeyLayer`), responses are buffered and replayed by
    /// [`HttpShare`](flightdeck_core::http::HttpShare) with its defaults.
    pub fn http(policy: FlightPolicy) -> Self {
        Self::new(
            policy,
            FromExtension,
            flightdeck_core::http::HttpShare::new(),
        )
    }
}

impl<T> LocalFlightLayer<FromExtension, CloneShare<T>>
where
    T: Clone + Send + Sync + 'static,
{
    /// A layer that reads the key from the request's extensions and shares
    /// `Clone` responses.
    pub fn from_extension(policy: FlightPolicy) -> Self {
        Self::new(policy, FromExtension, CloneShare::new())
    }
}

impl<K: Clone, Sh: SharedForm> Clone for LocalFlightLayer<K, Sh> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            share: self.share.clone(),
            flights: self.flights.clone(),
        }
    }
}

impl<K, Sh: SharedForm + fmt::Debug> fmt::Debug for LocalFlightLayer<K, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFlightLayer")
            .field("policy", &self.flights.group.policy)
            .field("share", &self.share)
            .field("running", &self.flights.running())
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone, Sh: SharedForm> Layer<S> for LocalFlightLayer<K, Sh> {
    type Service = LocalFlight<S, K, Sh>;

    fn layer(&self, inner: S) -> Self::Service {
        LocalFlight::from_parts(
            inner,
            self.key.clone(),
            self.share.clone(),
            self.flights.clone(),
        )
    }
}
