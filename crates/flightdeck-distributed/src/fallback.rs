//! The failure matrix's hook: at each point where coordination fails, L2,
//! which still holds the request, asks a [`Fallback`] what to do.
//!
//! The decision points, each with a typed failure:
//!
//! - [`before_acquire`](Fallback::before_acquire): no answer yet from the
//!   backend (or a breaker refused the call): nobody else is known to run
//!   the work, so it may run here ([`Verdict::RunHere`], HYBRID's local
//!   fallback) or fail ([`Verdict::Fail`], DISTRIBUTED_ONLY's fail fast).
//! - [`held_back`](Fallback::held_back): a breaker's ramp after closing
//!   held the flight back (only for a fallback that is
//!   [`ramped`](Fallback::ramped)): the backend is not known to fail. By
//!   default decided as a refusal by an open breaker.
//! - [`while_following`](Fallback::while_following): a re-check failed
//!   while another node owns the flight. L2 never runs the work while
//!   another node may hold the lease: the hook can only answer the caller
//!   now (`Some(error)`: "in progress", "unavailable") or let it keep
//!   following (`None`).
//! - [`wait_ended`](Fallback::wait_ended): following ended without a
//!   result: the wait timed out, the owner's lease ran out where takeover
//!   is not allowed, or a re-check answered garbage. Run here, or fail.
//!
//! An owner's business error, a result stored by another node (success or
//! cached failure), a commit that failed after the work ran: these are
//! answers, never failures for the hook, by construction.
//!
//! [`Propagate`] (the default) answers every failure with its typed error.
//!
//! ```
//! use flightdeck_core::error::{BoxError, InProgress};
//! use flightdeck_distributed::fallback::{Verdict, Fallback, FailureClass, WaitEnded};
//! use flightdeck_distributed::BackendError;
//!
//! /// Run here when Redis is down; tell followers to come back later.
//! struct Lenient;
//!
//! impl<Req> Fallback<Req> for Lenient {
//!     fn before_acquire(&self, _class: FailureClass, _error: BackendError, _req: &Req) -> Verdict {
//!         Verdict::RunHere
//!     }
//!     fn while_following(&self, _class: FailureClass, _error: BoxError, _req: &Req) -> Option<BoxError> {
//!         Some(Box::new(InProgress::new(None)))
//!     }
//!     fn wait_ended(&self, _end: WaitEnded, error: BoxError, _req: &Req) -> Verdict {
//!         Verdict::Fail(error)
//!     }
//! }
//! ```

use std::fmt;

use flightdeck_core::error::BoxError;

use crate::backend::{BackendError, BackendErrorKind};

/// The class of a coordination failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureClass {
    /// A local guard (a circuit breaker) refused the call: nothing was
    /// sent.
    CircuitOpen,
    /// The backend could not be reached: the call did not run.
    Unavailable,
    /// The call may or may not have run (a timeout, a connection lost after
    /// sending).
    OutcomeUnknown,
    /// The backend answered something this node does not understand
    /// (version skew, a foreign format).
    Protocol,
}

impl FailureClass {
    /// The label value (`circuit_open`, `unavailable`, `outcome_unknown`,
    /// `protocol`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpen => "circuit_open",
            Self::Unavailable => "unavailable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Protocol => "protocol",
        }
    }

    pub(crate) fn of(kind: BackendErrorKind, rejected: bool) -> Self {
        match kind {
            _ if rejected => Self::CircuitOpen,
            BackendErrorKind::Unavailable => Self::Unavailable,
            BackendErrorKind::OutcomeUnknown => Self::OutcomeUnknown,
            BackendErrorKind::Protocol => Self::Protocol,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How following another node's flight ended without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitEnded {
    /// The policy's wait timeout passed (the owner's lease must have
    /// expired by then, or been renewed by a live owner).
    TimedOut,
    /// The owner's lease expired without a result and the stage does not
    /// allow takeover.
    OwnerGone,
    /// A re-check failed in a way waiting cannot fix (a protocol error).
    Failed(FailureClass),
}

/// What to do at a decision point.
#[derive(Debug)]
pub enum Verdict {
    /// Run the work here, without coordination (its result is not stored).
    RunHere,
    /// Answer the caller (and the flight's other callers) with this error.
    Fail(BoxError),
}

/// The hook L2 asks when coordination fails; see the [module docs](self).
///
/// A reference to a fallback is a fallback too.
pub trait Fallback<Req>: Send + Sync {
    /// The backend failed (or its guard refused) before this node acquired
    /// the flight. The error is the backend's as it is, so that a verdict
    /// that drops it (a HYBRID stage running the request here) costs no
    /// conversion; [`BackendError::into_core`] makes the caller's error of
    /// it (`CoordinationUnavailable`, `OutcomeUnknown`, `ProtocolError`,
    /// or the breaker's `CircuitOpen` as it is).
    fn before_acquire(&self, class: FailureClass, error: BackendError, req: &Req) -> Verdict;

    /// A re-check failed while following: `Some(error)` answers now, `None`
    /// keeps following (L2 polls on until the wait timeout, and takes the
    /// flight over if the owner's lease expires).
    fn while_following(&self, class: FailureClass, error: BoxError, req: &Req) -> Option<BoxError>;

    /// Following ended without a result.
    fn wait_ended(&self, end: WaitEnded, error: BoxError, req: &Req) -> Verdict;

    /// Whether a breaker's ramp after closing (it lets only a share of the
    /// flights back to the backend for a while) may hold this caller's
    /// flight back: `true` for a caller with somewhere else to run it (the
    /// flight held back then comes to [`held_back`](Self::held_back)).
    /// `false` by default: a caller whose only other answer is an error is
    /// never held back while the backend is healthy.
    fn ramped(&self) -> bool {
        false
    }

    /// A breaker's ramp after closing held this flight back (asked only
    /// when [`ramped`](Self::ramped) says so): the backend is not known to
    /// fail, the breaker just lets a share of the flights back at first.
    /// `error` is the breaker's refusal ([`FailureClass::CircuitOpen`]).
    /// By default, decided as [`before_acquire`](Self::before_acquire)
    /// decides a refusal by an open breaker.
    fn held_back(&self, error: BackendError, req: &Req) -> Verdict {
        self.before_acquire(FailureClass::CircuitOpen, error, req)
    }
}

impl<Req, P: Fallback<Req> + ?Sized> Fallback<Req> for &P {
    fn before_acquire(&self, class: FailureClass, error: BackendError, req: &Req) -> Verdict {
        (**self).before_acquire(class, error, req)
    }

    fn while_following(&self, class: FailureClass, error: BoxError, req: &Req) -> Option<BoxError> {
        (**self).while_following(class, error, req)
    }

    fn wait_ended(&self, end: WaitEnded, error: BoxError, req: &Req) -> Verdict {
        (**self).wait_ended(end, error, req)
    }

    fn ramped(&self) -> bool {
        (**self).ramped()
    }

    fn held_back(&self, error: BackendError, req: &Req) -> Verdict {
        (**self).held_back(error, req)
    }
}

/// Answers every failure with its typed error (`CoordinationUnavailable`,
/// `OutcomeUnknown`, `ProtocolError`, `CircuitOpen`, `WaitTimeout`), and
/// keeps following through failed re-checks: L2's behaviour on its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Propagate;

impl<Req> Fallback<Req> for Propagate {
    fn before_acquire(&self, _class: FailureClass, error: BackendError, _req: &Req) -> Verdict {
        Verdict::Fail(error.into_core())
    }

    fn while_following(
        &self,
        _class: FailureClass,
        _error: BoxError,
        _req: &Req,
    ) -> Option<BoxError> {
        None
    }

    fn wait_ended(&self, _end: WaitEnded, error: BoxError, _req: &Req) -> Verdict {
        Verdict::Fail(error)
    }
}
