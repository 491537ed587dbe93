//! [`Admitted`]: a flight the backend's breaker let through
//! ([`DistributedFlights::admit`]), and the boxed future it becomes
//! ([`DistributedFlights::launch`]).
//!
//! [`DistributedFlights::admit`]: crate::DistributedFlights::admit
//! [`DistributedFlights::launch`]: crate::DistributedFlights::launch

use std::future::Future;
use std::pin::Pin;

use flightdeck_core::error::BoxError;
use flightdeck_core::Shareable;

use crate::backend::FlightId;
use crate::stale::Answered;

/// A coordinated flight's future: boxed, it owns everything it needs. It
/// says how the caller was answered (a stale answer, a hit's age).
pub type FlightFuture<T, O> =
    Pin<Box<dyn Future<Output = Result<(Shareable<T, O>, Answered), BoxError>> + Send>>;

/// The breaker's yes for one key's flight, from
/// [`DistributedFlights::admit`](crate::DistributedFlights::admit):
/// hand it to [`launch`](crate::DistributedFlights::launch) with the same
/// key. Only `admit` makes one, so a launched flight was asked about once.
#[derive(Debug)]
#[must_use = "an admitted flight is launched, or the request is dropped"]
pub struct Admitted {
    /// The flight's id, when the backend is sharded (computed to find its
    /// shard's breaker, not again).
    pub(crate) flight: Option<FlightId>,
}
