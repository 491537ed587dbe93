//! Where a request's [`FlightKey`] comes from, for the layers that read it.
//!
//! Keys are computed once, at the top of the stack (`flightdeck-key`'s
//! `KeyLayer`, or your own code), and read by every coalescing layer below
//! through one trait, [`KeySource`]: a closure `Fn(&Req) -> Option<FlightKey>`
//! for any request type, or [`FromExtension`] for `http::Request`s whose
//! key an outer layer put into the extensions.
//!
//! ```
//! use flightdeck_core::{FlightKey, KeySource, StageName};
//!
//! let stage = StageName::new("score").unwrap();
//! let keys = move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q));
//! assert!(keys.key(&"question".to_owned()).is_some());
//! ```

use crate::key::FlightKey;

/// Reads the key of a request. `None` means "not coalescable": the request
/// goes straight to the inner service.
///
/// Implemented for closures `Fn(&Req) -> Option<FlightKey>` and, with the
/// `http` feature, by [`FromExtension`] for `http::Request`s.
pub trait KeySource<Req>: Clone + Send + Sync + 'static {
    /// The key of `req`, if it may be coalesced.
    fn key(&self, req: &Req) -> Option<FlightKey>;
}

impl<F, Req> KeySource<Req> for F
where
    F: Fn(&Req) -> Option<FlightKey> + Clone + Send + Sync + 'static,
{
    #[inline]
    fn key(&self, req: &Req) -> Option<FlightKey> {
        self(req)
    }
}

/// Reads the [`FlightKey`] that an outer layer (`KeyLayer`) put into an
/// `http::Request`'s extensions. Requests without one pass straight through.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromExtension;

#[cfg(feature = "http")]
impl<B> KeySource<http::Request<B>> for FromExtension {
    #[inline]
    fn key(&self, req: &http::Request<B>) -> Option<FlightKey> {
        req.extensions().get::<FlightKey>().cloned()
    }
}
