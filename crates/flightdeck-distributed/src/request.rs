//! Where the layer finds a request's [`FlightKey`] and puts the owner's
//! [`FencingToken`].
//!
//! [`KeyFn`] takes the key from a closure (any request type) and can hand
//! the fencing token to a second closure; `ExtensionKey` (feature `http`)
//! reads the `FlightKey` request extension set by `KeyLayer` and inserts the
//! `FencingToken` extension, like the L1 layer.
//!
//! ```
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_distributed::{FlightRequest, KeyFn};
//!
//! let keys = KeyFn::new(|req: &String| {
//!     Some(FlightKey::from_bytes(StageName::new("score").unwrap(), req))
//! });
//! assert!(keys.key(&"a".to_owned()).is_some());
//! ```

use std::fmt;

use flightdeck_core::FlightKey;

use crate::backend::FencingToken;

/// Reads a request's flight key and stores the owner's fencing token in it.
pub trait FlightRequest<Req>: Clone + Send + Sync + 'static {
    /// The request's key; `None` bypasses the layer.
    fn key(&self, req: &Req) -> Option<FlightKey>;

    /// Hands the owner's fencing token to the request before it runs.
    fn fence(&self, req: &mut Req, token: FencingToken) {
        let _ = (req, token);
    }
}

/// Keys from a closure; fencing tokens to an optional second closure.
#[derive(Clone)]
pub struct KeyFn<F, G = NoFence> {
    key: F,
    fence: G,
}

/// Drops fencing tokens (the default of [`KeyFn`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFence;

impl<F> KeyFn<F, NoFence> {
    /// Keys from `key`.
    pub const fn new(key: F) -> Self {
        Self {
            key,
            fence: NoFence,
        }
    }

    /// Also calls `fence(&mut req, token)` before the owner runs a request.
    pub fn with_fence<G>(self, fence: G) -> KeyFn<F, G> {
        KeyFn {
            key: self.key,
            fence,
        }
    }
}

impl<F, G> fmt::Debug for KeyFn<F, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn").finish_non_exhaustive()
    }
}

impl<Req, F> FlightRequest<Req> for KeyFn<F, NoFence>
where
    F: Fn(&Req) -> Option<FlightKey> + Clone + Send + Sync + 'static,
{
    fn key(&self, req: &Req) -> Option<FlightKey> {
        (self.key)(req)
    }
}

impl<Req, F, G> FlightRequest<Req> for KeyFn<F, G>
where
    F: Fn(&Req) -> Option<FlightKey> + Clone + Send + Sync + 'static,
    G: Fn(&mut Req, FencingToken) + Clone + Send + Sync + 'static,
{
    fn key(&self, req: &Req) -> Option<FlightKey> {
        (self.key)(req)
    }

    fn fence(&self, req: &mut Req, token: FencingToken) {
        (self.fence)(req, token);
    }
}

#[cfg(feature = "http")]
pub use self::ext::ExtensionKey;

#[cfg(feature = "http")]
mod ext {
    use super::*;

    /// Reads the [`FlightKey`] extension of an `http::Request` and inserts
    /// the [`FencingToken`] extension for the owner.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ExtensionKey {
        _priv: (),
    }

    impl ExtensionKey {
        /// Creates the extractor.
        pub const fn new() -> Self {
            Self { _priv: () }
        }
    }

    impl<B> FlightRequest<http::Request<B>> for ExtensionKey {
        fn key(&self, req: &http::Request<B>) -> Option<FlightKey> {
            req.extensions().get::<FlightKey>().cloned()
        }

        fn fence(&self, req: &mut http::Request<B>, token: FencingToken) {
            req.extensions_mut().insert(token);
        }
    }
}
