//! What the backend is asked to keep, and for how long.

use std::time::Duration;

use bytes::Bytes;

#[allow(unused_imports)] // doc links
use super::{Acquired, Backend};

/// Lease parameters for [`Backend::acquire`] and [`Backend::heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    /// How long a grant or heartbeat keeps the lease.
    pub lease: Duration,
    /// The longest a grant keeps the flight's record (see
    /// [`record_ttl`](Self::record_ttl)); also how long an invalidation,
    /// or a release of a flight that had no record, is remembered.
    /// Generations do not depend on it: they never repeat, whatever
    /// expires.
    pub state_ttl: Duration,
    /// Whether an expired, uncommitted flight may be taken over.
    pub allow_takeover: bool,
}

impl LeaseTerms {
    /// How long a grant or a heartbeat keeps the flight's record: two
    /// leases, but at most [`state_ttl`](Self::state_ttl) and never less
    /// than one lease.
    ///
    /// The lease, then up to one more lease during which the owner whose
    /// lease ran out may still commit or abandon (if nobody was granted
    /// the flight since) and, without takeover, ACQUIRE answers
    /// [`Acquired::Expired`]. After that the record is gone and the next
    /// grant is a fresh one, with a larger generation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use flightdeck_distributed::backend::LeaseTerms;
    ///
    /// let terms = LeaseTerms {
    ///     lease: Duration::from_secs(30),
    ///     state_ttl: Duration::from_secs(120),
    ///     allow_takeover: false,
    /// };
    /// assert_eq!(terms.record_ttl(), Duration::from_secs(60));
    /// ```
    pub fn record_ttl(&self) -> Duration {
        self.lease
            .saturating_mul(2)
            .min(self.state_ttl)
            .max(self.lease)
    }
}

/// What [`Backend::commit`] writes.
#[derive(Clone, Debug)]
pub struct CommitArgs {
    /// The encoded result.
    pub payload: Bytes,
    /// How long the result is fresh: replayed to new acquires (the stage's
    /// replay TTL; zero: never, only the followers already waiting get
    /// it).
    pub ttl: Duration,
    /// How long the result is kept for the followers already waiting
    /// (their [`Backend::recheck`] naming this generation or an older
    /// one), fresh or not: what the protocol needs to hand it over, at
    /// least two poll intervals; never replayed to new acquires past
    /// `ttl`.
    pub retain: Duration,
    /// Payloads up to this size travel inline in the completion notice.
    pub inline_below: usize,
    /// See [`LeaseTerms::state_ttl`]. Once committed, a flight's record
    /// lives as long as its result (the longer of `ttl` and `retain`):
    /// the backends in this workspace do not need this.
    pub state_ttl: Duration,
}

/// What [`Backend::abandon`] writes.
#[derive(Clone, Debug)]
pub struct AbandonArgs {
    /// A failure to cache for `failure_ttl`, as L2 encodes it (the
    /// owner's error class and message; none: followers re-race at once).
    pub failure: Option<Bytes>,
    /// How long the failure is replayed (zero: not cached).
    pub failure_ttl: Duration,
    /// See [`LeaseTerms::state_ttl`]. An abandon keeps the record's
    /// expiry (or sets `failure_ttl` when it caches a failure): the
    /// backends in this workspace do not need this.
    pub state_ttl: Duration,
}
