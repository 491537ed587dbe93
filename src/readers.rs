//! What the layer reads of each request, and the codec of its results,
//! held once in the layer's shared state.
//!
//! The key source, the request's own deadline and the owner's fencing
//! token are read (or written) once per request; the codec runs on L2's
//! paths only. Keeping them out of the service's type leaves
//! [`GenericSingleFlight`](crate::GenericSingleFlight) with the inner
//! service, one reader and the response form: for a request type of your
//! own they sit behind `Arc<dyn …>` ([`DynReaders`]), for `http::Request`s
//! they are [`HttpReaders`] (no dynamic call).
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck::readers::DynReaders;
//! use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
//!
//! let stage = StageName::new("local").unwrap();
//! // The layer's type names the readers and the response form only.
//! let layer: GenericSingleFlightLayer<DynReaders<String>, CloneShare<usize>> =
//!     GenericSingleFlightLayer::builder(
//!         move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
//!         CloneShare::<usize>::new(),
//!         PostcardCodec::<usize>::new(),
//!     )
//!     .stage("local", StageConfig::new().mode(Mode::LocalOnly))
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_budget::{Deadline, Inbound, InvalidTimeout};
use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, KeySource};
use flightdeck_distributed::{Fence, FencingToken, NoFence, ResultCodec};

/// Reads a request of type `Req` for the layer: its key, its own deadline
/// (and one an outer layer attached), and hands it the owner's fencing
/// token. Implemented by [`DynReaders`] and [`HttpReaders`]; sealed.
pub trait RequestReaders<Req>: sealed::Sealed + Send + Sync + 'static {
    /// The key of `req`; `None`: not coalesced.
    fn key(&self, req: &Req) -> Option<FlightKey>;

    /// The timeout the caller asked for, if any.
    fn inbound(&self, req: &Req) -> Result<Option<Duration>, InvalidTimeout>;

    /// A deadline an outer layer attached, if any.
    fn existing(&self, req: &Req) -> Option<Deadline>;

    /// Hands the owner's fencing token to `req`.
    fn fence(&self, req: &mut Req, token: FencingToken);
}

mod sealed {
    pub trait Sealed {}
    impl<Req> Sealed for super::DynReaders<Req> {}
    #[cfg(feature = "http")]
    impl Sealed for super::HttpReaders {}
}

/// The readers of a request type of your own, each behind an
/// `Arc<dyn …>`: a [`KeySource`], a [`Fence`] (by default [`NoFence`])
/// and an [`Inbound`] (by default [`NoInbound`](flightdeck_budget::NoInbound)). Built by
/// [`GenericSingleFlightLayer::builder`](crate::GenericSingleFlightLayer::builder).
pub struct DynReaders<Req> {
    keys: Arc<dyn ErasedKeys<Req>>,
    fence: Arc<dyn ErasedFence<Req>>,
    /// `None`: no deadline of their own ([`NoInbound`](flightdeck_budget::NoInbound)), read without a
    /// call.
    deadlines: Option<Arc<dyn Inbound<Req> + Send + Sync>>,
}

impl<Req: 'static> DynReaders<Req> {
    pub(crate) fn new(keys: impl KeySource<Req>) -> Self {
        Self {
            keys: Arc::new(keys),
            fence: Arc::new(NoFence),
            deadlines: None,
        }
    }

    pub(crate) fn set_fence(&mut self, fence: impl Fence<Req>) {
        self.fence = Arc::new(fence);
    }

    pub(crate) fn set_deadlines(&mut self, deadlines: impl Inbound<Req> + Send + Sync + 'static) {
        self.deadlines = Some(Arc::new(deadlines));
    }
}

impl<Req> Clone for DynReaders<Req> {
    fn clone(&self) -> Self {
        Self {
            keys: Arc::clone(&self.keys),
            fence: Arc::clone(&self.fence),
            deadlines: self.deadlines.clone(),
        }
    }
}

impl<Req> fmt::Debug for DynReaders<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynReaders").finish_non_exhaustive()
    }
}

impl<Req: 'static> RequestReaders<Req> for DynReaders<Req> {
    #[inline]
    fn key(&self, req: &Req) -> Option<FlightKey> {
        self.keys.key(req)
    }

    #[inline]
    fn inbound(&self, req: &Req) -> Result<Option<Duration>, InvalidTimeout> {
        match &self.deadlines {
            Some(deadlines) => deadlines.inbound(req),
            None => Ok(None),
        }
    }

    #[inline]
    fn existing(&self, req: &Req) -> Option<Deadline> {
        self.deadlines.as_ref()?.existing(req)
    }

    fn fence(&self, req: &mut Req, token: FencingToken) {
        self.fence.fence(req, token);
    }
}

/// [`KeySource`] without its `Clone` bound, so it can be a `dyn`.
trait ErasedKeys<Req>: Send + Sync {
    fn key(&self, req: &Req) -> Option<FlightKey>;
}

impl<Req, K: KeySource<Req>> ErasedKeys<Req> for K {
    #[inline]
    fn key(&self, req: &Req) -> Option<FlightKey> {
        KeySource::key(self, req)
    }
}

/// [`Fence`] without its `Clone` bound, so it can be a `dyn`.
trait ErasedFence<Req>: Send + Sync {
    fn fence(&self, req: &mut Req, token: FencingToken);
}

impl<Req, F: Fence<Req>> ErasedFence<Req> for F {
    fn fence(&self, req: &mut Req, token: FencingToken) {
        Fence::fence(self, req, token);
    }
}

/// The readers of an `http::Request`: its key from the `FlightKey`
/// extension (set by `KeyLayer`), its own deadline from `grpc-timeout`,
/// `x-request-timeout` and an outer `BudgetLayer`'s `Deadline`, and the
/// owner's `FencingToken` into its extensions. No dynamic call.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[derive(Debug, Clone, Default)]
pub struct HttpReaders {
    deadlines: flightdeck_budget::FromHeaders,
}

#[cfg(feature = "http")]
impl<B: 'static> RequestReaders<http::Request<B>> for HttpReaders {
    #[inline]
    fn key(&self, req: &http::Request<B>) -> Option<FlightKey> {
        KeySource::key(&flightdeck_core::FromExtension, req)
    }

    #[inline]
    fn inbound(&self, req: &http::Request<B>) -> Result<Option<Duration>, InvalidTimeout> {
        self.deadlines.inbound(req)
    }

    #[inline]
    fn existing(&self, req: &http::Request<B>) -> Option<Deadline> {
        self.deadlines.existing(req)
    }

    fn fence(&self, req: &mut http::Request<B>, token: FencingToken) {
        Fence::fence(&flightdeck_distributed::ExtensionFence, req, token);
    }
}

/// A stage's codec, behind an `Arc<dyn …>`: it runs on L2's paths only
/// (storing and reading results), and leaves the layer's type.
pub(crate) struct DynCodec<T>(Arc<dyn ErasedCodec<T>>);

impl<T: 'static> DynCodec<T> {
    pub(crate) fn new(codec: impl ResultCodec<T>) -> Self {
        Self(Arc::new(codec))
    }
}

impl<T> Clone for DynCodec<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T: 'static> ResultCodec<T> for DynCodec<T> {
    fn codec_id(&self) -> u8 {
        self.0.codec_id()
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        self.0.encode(value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        self.0.decode(bytes)
    }
}

/// [`ResultCodec`] without its `Clone` bound, so it can be a `dyn`.
trait ErasedCodec<T>: Send + Sync {
    fn codec_id(&self) -> u8;
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

impl<T, C: ResultCodec<T>> ErasedCodec<T> for C {
    fn codec_id(&self) -> u8 {
        ResultCodec::codec_id(self)
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        ResultCodec::encode(self, value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        ResultCodec::decode(self, bytes)
    }
}
