//! [`Start`]: what [`DistributedFlights::start`] decided for one request,
//! before anything else was built.
//!
//! [`DistributedFlights::start`]: crate::DistributedFlights::start

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use flightdeck_core::error::BoxError;
use flightdeck_core::Shareable;

use crate::fallback::Verdict;
use crate::stale::Answered;

/// A coordinated flight's future: boxed, it owns everything it needs. It
/// says how the caller was answered (a stale answer, a hit's age).
pub type FlightFuture<T, O> =
    Pin<Box<dyn Future<Output = Result<(Shareable<T, O>, Answered), BoxError>> + Send>>;

/// What [`DistributedFlights::start`](crate::DistributedFlights::start)
/// decided for one request.
pub enum Start<Req, E, T, O> {
    /// The backend's breaker refused the flight before any call, and the
    /// fallback decided: on [`Verdict::RunHere`] the caller runs `req`
    /// with `exec` itself (as [`Role::Fallback`](crate::Role::Fallback):
    /// the local fallback path), on [`Verdict::Fail`] it fails. The
    /// request and its work come back so that the caller builds that
    /// future in place.
    Decided {
        /// The fallback's verdict.
        verdict: Verdict,
        /// The request.
        req: Req,
        /// Its work.
        exec: E,
    },
    /// The flight goes to the backend.
    Flight(FlightFuture<T, O>),
}

impl<Req, E, T, O> fmt::Debug for Start<Req, E, T, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Start::Decided { verdict, .. } => f
                .debug_struct("Start::Decided")
                .field("verdict", verdict)
                .finish_non_exhaustive(),
            Start::Flight(_) => f.write_str("Start::Flight"),
        }
    }
}
