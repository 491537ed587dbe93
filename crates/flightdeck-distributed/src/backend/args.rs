//! What the backend is asked to keep, and for how long.

use std::time::Duration;

use bytes::Bytes;

#[allow(unused_imports)] // doc links
use super::{Acquired, Backend, StoredResult};

/// The longest duration a backend keeps anything for: a longer one in
/// [`LeaseTerms`], [`CommitArgs`] or [`AbandonArgs`] is taken as this
/// (10^13 ms, about 317 years), so that no backend's clock arithmetic
/// overflows (the Redis scripts count server milliseconds in Lua's
/// doubles, exact below 2^53, and Redis refuses larger expiries).
pub const MAX_DURATION: Duration = Duration::from_millis(10_000_000_000_000);

/// What an acquire asks, besides the flight and the lease terms (see
/// [`Backend::acquire_with`]). The default is a flight's first acquire
/// that takes no stale result: exactly [`Backend::acquire`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ask {
    /// The generation a follower first followed: a result committed by
    /// it or a later one is a [`Acquired::Hit`] while the store keeps it
    /// (the later of [`CommitArgs::retain`] and `ttl + stale_for`), fresh
    /// or not (see [`Backend::recheck`]).
    pub follows: Option<u64>,
    /// A re-check (a follower's poll, or the retry of an ambiguous first
    /// acquire), not a flight's first acquire: answered the same, but a
    /// decorator may judge them apart (a breaker judges the backend by
    /// flights, not by polls).
    pub recheck: bool,
    /// The stage answers stale results: also answer a result kept past
    /// its freshness (within [`CommitArgs::stale_for`]), beside
    /// [`Acquired::Owner`] (this caller refreshes it) or
    /// [`Acquired::Follower`] (another refreshes it), or alone as
    /// [`Acquired::Stale`] while a failed refresh's
    /// [`AbandonArgs::retry_after`] runs.
    pub stale: bool,
    /// An early refresh of a result that is still fresh: grant the flight
    /// although the result is fresh ([`Acquired::Owner`] with the fresh
    /// result beside), unless a lease runs already ([`Acquired::Hit`]:
    /// someone refreshes it).
    pub early: bool,
    /// When the caller gives the call up (its call timeout, in tokio
    /// time): an acquire that reaches the store after it grants nothing
    /// and answers *unavailable* (a late acquire, queued on a frozen
    /// server or resent after its caller walked away, would otherwise
    /// grant a lease nobody works on); the token that holds the live
    /// lease is still answered [`Acquired::Owner`] (an earlier attempt
    /// granted it). The layer sets it on every
    /// acquire it sends, to the time it gives that call up. `None` (a
    /// backend called directly): no deadline of the caller's; a backend
    /// may still bound the call by its own timeout (the Redis backend
    /// does).
    pub not_after: Option<tokio::time::Instant>,
}

impl Ask {
    /// A flight's first acquire that also takes a result kept past its
    /// freshness (a stage with stale windows).
    pub const STALE: Self = Self {
        follows: None,
        recheck: false,
        stale: true,
        early: false,
        not_after: None,
    };

    /// The acquire of an early refresh of a result still fresh.
    pub const EARLY: Self = Self {
        follows: None,
        recheck: false,
        stale: false,
        early: true,
        not_after: None,
    };

    /// A re-check naming the generation followed (`None`: the retry of a
    /// first acquire), asking nothing else.
    pub const fn rechecking(follows: Option<u64>) -> Self {
        Self {
            follows,
            recheck: true,
            stale: false,
            early: false,
            not_after: None,
        }
    }
}

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
    /// `ttl`. A result kept longer to answer stale (`ttl + stale_for`)
    /// is replayed to those re-checks as long.
    pub retain: Duration,
    /// How long past `ttl` the result is kept to answer stale (an acquire
    /// with [`Ask::stale`]): the stage's longest stale window; zero: not
    /// at all. The record lives until the later of `ttl + stale_for` and
    /// `retain`.
    pub stale_for: Duration,
    /// How long the owner's work took (kept as
    /// [`StoredResult::work_time`], for early refreshes).
    pub work_time: Duration,
    /// What the result is dated from, by the owner's tokio clock, `ttl`
    /// counting from then: the owner gives its work's end, whichever
    /// attempt lands. The store dates the result from it as well as it can
    /// tell (its age, its freshness and stale windows; never later than
    /// its arrival), so that a commit retried or held up on its way (a
    /// frozen store) is no younger for it, and the start of its work (its
    /// age plus its work time), by which every node orders results, is
    /// where it was. `None`: from its arrival.
    pub sent: Option<tokio::time::Instant>,
    /// Payloads up to this size travel inline in the completion notice.
    pub inline_below: usize,
    /// See [`LeaseTerms::state_ttl`]. Once committed, a flight's record
    /// lives as long as its result (the longer of `ttl + stale_for` and
    /// `retain`):
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
    /// When a result is kept to answer stale (within its
    /// [`CommitArgs::stale_for`]): how long the store throttles the next
    /// refresh, by its clock. Until then an acquire with [`Ask::stale`]
    /// answers [`Acquired::Stale`] and grants nothing; after it the next
    /// acquire is granted. Zero, or no kept result: nothing changes. An
    /// abandon never drops a kept result.
    pub retry_after: Duration,
    /// See [`LeaseTerms::state_ttl`]. An abandon keeps the record's
    /// expiry (or sets `failure_ttl` when it caches a failure): the
    /// backends in this workspace do not need this.
    pub state_ttl: Duration,
}
