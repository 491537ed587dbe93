//! Benchmarks only: see `benches/` (`cargo bench -p flightdeck-benches`).
//! What the bench programs share: the peers' error type and our layer set
//! up the same way in each.

use std::convert::Infallible;

use flightdeck_core::{BoxError, FlightKey, KeyEncoder, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use tower::{service_fn, Layer, Service};

/// The error type the peers' services return (they need `Clone`).
#[derive(Debug, Clone)]
pub struct PeerError;

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("peer error")
    }
}

impl std::error::Error for PeerError {}

/// Keys repeat every this many calls, long after each flight finished.
pub const KEYS: usize = 4096;

/// `KEYS` distinct keys of the stage `bench`, built once.
pub fn prebuilt_keys() -> Vec<FlightKey> {
    let stage = StageName::new("bench").expect("a valid stage name");
    (0..KEYS as u64)
        .map(|n| {
            KeyEncoder::new()
                .field(&n.to_le_bytes())
                .finish_key(stage.clone(), None)
        })
        .collect()
}

/// `LocalFlight` over a service that answers at once, keyed by the key that
/// comes with the request (as when `KeyLayer` computed it upstream): the
/// coalescing machinery alone.
pub fn local_prebuilt() -> impl Service<
    (FlightKey, u64),
    Response = u64,
    Error = BoxError,
    Future = impl std::future::Future<Output = Result<u64, BoxError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    LocalFlightLayer::with_key(FlightPolicy::new(), |r: &(FlightKey, u64)| {
        Some(r.0.clone())
    })
    .layer(service_fn(|r: (FlightKey, u64)| async move {
        Ok::<_, Infallible>(r.1)
    }))
}
