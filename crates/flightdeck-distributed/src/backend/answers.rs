//! What the backend answers.

use std::time::Duration;

use bytes::Bytes;

#[allow(unused_imports)] // doc links
use super::{Backend, LeaseTerms};

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
}

/// The answer to [`Backend::acquire`].
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
    },
    /// Another token owns the flight.
    Follower {
        /// The owner's generation.
        generation: u64,
        /// The owner's remaining lease, by the backend's clock.
        lease_remaining: Duration,
    },
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
