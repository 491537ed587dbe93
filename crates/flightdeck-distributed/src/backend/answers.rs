//! What the backend answers.

use std::time::Duration;

use bytes::Bytes;

#[allow(unused_imports)] // doc links
use super::{AbandonArgs, Ask, Backend, CommitArgs, LeaseTerms};

/// How a stored result ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultStatus {
    /// The owner's work succeeded; the payload is the encoded result.
    Ok,
    /// The owner's work failed and the stage caches failures; the payload is
    /// the failure as L2 encodes it (the owner's error class and message),
    /// stored and returned as it is.
    Failed,
}

impl ResultStatus {
    /// The wire name (`ok` | `err`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "err",
        }
    }
}

/// A result stored by a committed owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResult {
    /// The generation that committed it.
    pub generation: u64,
    /// Success or cached failure.
    pub status: ResultStatus,
    /// The encoded result, or the encoded failure.
    pub payload: Bytes,
    /// How long ago it was committed, by the backend's clock (what an
    /// `Age` header says: the store's age, not this node's).
    pub age: Duration,
    /// How long it was fresh ([`CommitArgs::ttl`] of its commit; a cached
    /// failure: its `failure_ttl`): past it, the result is stale.
    pub ttl: Duration,
    /// How long its owner's work took ([`CommitArgs::work_time`]; zero
    /// for a cached failure): what an early refresh weighs.
    pub work_time: Duration,
}

impl StoredResult {
    /// How long it stays fresh from now (zero: stale already).
    pub fn fresh_for(&self) -> Duration {
        self.ttl.saturating_sub(self.age)
    }

    /// How long it has been stale (zero: still fresh).
    pub fn stale_for(&self) -> Duration {
        self.age.saturating_sub(self.ttl)
    }
}

/// The answer to [`Backend::acquire_with`] (and so to
/// [`Backend::acquire`] and [`Backend::recheck`]).
///
/// A result kept past its freshness (see [`CommitArgs::stale_for`]) is
/// answered only when the caller asks for it ([`Ask::stale`],
/// [`Ask::early`]); otherwise every `stale` here is `None` and there is no
/// [`Acquired::Stale`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A result is stored and fresh (to a [`Backend::recheck`]: or kept
    /// for the followers already waiting): replay it.
    Hit(StoredResult),
    /// This token owns the flight with this generation.
    Owner {
        /// The fencing generation.
        generation: u64,
        /// True when the grant took over a dead owner's flight.
        takeover: bool,
        /// The result this grant refreshes: with [`Ask::stale`], the
        /// result kept past its freshness (answer it, and run the
        /// refresh); with [`Ask::early`], the still-fresh result (the
        /// early refresh was granted).
        stale: Option<StoredResult>,
    },
    /// Another token owns the flight.
    Follower {
        /// The owner's generation.
        generation: u64,
        /// The owner's remaining lease, by the backend's clock.
        lease_remaining: Duration,
        /// With [`Ask::stale`]: the result kept past its freshness,
        /// while the owner refreshes it.
        stale: Option<StoredResult>,
    },
    /// With [`Ask::stale`] only: the store grants no refresh now (the last
    /// refresh failed and the store throttles the next one,
    /// [`AbandonArgs::retry_after`]; or the store refuses writes, e.g.
    /// Redis's `NOREPLICAS`), and the result is kept past its freshness
    /// within its stale window: answer this kept result and run nothing.
    Stale(StoredResult),
    /// The owner's lease expired without a commit and takeover was not
    /// allowed (for at most [`LeaseTerms::record_ttl`] after the dead
    /// owner's grant or last heartbeat). Also the answer to a token whose
    /// own attempt already ended (it committed, released or abandoned the
    /// flight, and no result is stored): such a token is never granted the
    /// flight again.
    Expired {
        /// The dead owner's generation (or the ended attempt's; 0 when the
        /// flight has none).
        generation: u64,
    },
}

/// The answer to [`Backend::heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The lease is gone or belongs to someone else; it was not re-created.
    Lost,
}

/// The answer to [`Backend::commit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// The result is stored (now, or by an earlier try of the same commit).
    Committed,
    /// A newer owner holds the flight; nothing was written.
    Fenced,
}

/// The answer to [`Backend::abandon`] and [`Backend::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lease was released and followers were woken.
    Released,
    /// The lease was not held by this (token, generation) (by this token,
    /// for [`Backend::release`]); nothing changed.
    NotOwner,
}
