//! Where a request's [`FlightKey`] comes from.

use flightdeck_core::FlightKey;

/// Extracts the key of a request. `None` means "not coalescable": the
/// request goes straight to the inner service.
///
/// Implemented for closures `Fn(&Req) -> Option<FlightKey>` and, with the
/// `http` feature, by [`FromExtension`] for `http::Request`s.
pub trait KeyExtractor<Req>: Clone + Send + Sync + 'static {
    /// The key of `req`, if it may be coalesced.
    fn key(&self, req: &Req) -> Option<FlightKey>;
}

impl<F, Req> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<FlightKey> + Clone + Send + Sync + 'static,
{
    fn key(&self, req: &Req) -> Option<FlightKey> {
        self(req)
    }
}

/// Reads the [`FlightKey`] that an outer layer (e.g. `KeyLayer`) put into
/// the request's extensions. Requests without one pass straight through.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromExtension;

#[cfg(feature = "http")]
impl<B> KeyExtractor<http::Request<B>> for FromExtension {
    fn key(&self, req: &http::Request<B>) -> Option<FlightKey> {
        req.extensions().get::<FlightKey>().cloned()
    }
}
