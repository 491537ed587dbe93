//! The breaker as a backend decorator: [`GuardedBackend`] puts a
//! [`Breaker`] in front of a backend, so that an open circuit is one more
//! failure before acquire ([`FailureClass::CircuitOpen`](crate::fallback::FailureClass::CircuitOpen)), decided by the
//! same [`Fallback`](crate::fallback::Fallback) as any other.
//!
//! Which calls the breaker sees, and how it judges them:
//!
//! - **A flight's first acquire** is gated and judged: refused at once while
//!   the circuit is open (nothing is sent; [`Backend::reject_early`]
//!   answers before any call is built), admitted as a probe while it
//!   is half-open, and recorded as a success as soon as the backend answers
//!   (whatever the answer, and however long the work then takes) or as a
//!   failure when it fails (unavailable, outcome unknown, protocol), or
//!   when its caller stops waiting for the answer (its call deadline
//!   passed). So the window counts flights, one judgement each.
//!   A flight the backend itself refuses before its first call (its
//!   [`Backend::reject_early`]: no connection) is judged a failure too.
//! - **Re-checks** (a follower's, or the retry of an ambiguous first
//!   acquire) are never refused: a flight already admitted is not cut off
//!   half-way. Only a protocol error among them is recorded (a failure):
//!   timeouts while following are the follower's business, and counting
//!   every poll would let a few followers open the circuit for everyone.
//! - **Heartbeats, commits, abandons, releases, subscriptions** of admitted
//!   flights pass through, neither refused nor judged: refusing them would
//!   turn a tripped breaker into lost commits and orphaned leases.
//!
//! A ramp after closing (see the breaker's `Ramp`) holds nothing back here;
//! whoever has somewhere else to send the calls it holds back applies it
//! (the facade's HYBRID stages run them locally).
//!
//! ```
//! use flightdeck_breaker::{Breaker, BreakerConfig};
//! use flightdeck_distributed::guard::GuardedBackend;
//! use flightdeck_distributed::backend::{Backend, Shard};
//! use flightdeck_testkit::MemoryBackend;
//!
//! let breaker = Breaker::new("redis", BreakerConfig::default()).unwrap();
//! let backend = GuardedBackend::new(MemoryBackend::new(), breaker.clone());
//! breaker.force_open();
//! assert!(backend.reject_early(&Shard::WHOLE).unwrap().is_rejected());
//! ```

use std::fmt;

use flightdeck_breaker::{Breaker, Outcome};

use crate::backend::{
    Acquired, Backend, BackendError, BackendErrorKind, BackendFuture, FlightId, LeaseTerms,
    OwnerToken, Shard,
};

/// A backend behind a circuit breaker; see the [module docs](self).
pub struct GuardedBackend<B> {
    inner: B,
    breaker: Breaker,
    /// The breaker's name, for refusals that allocate no string.
    name: std::sync::Arc<str>,
}

impl<B> GuardedBackend<B> {
    /// Guards `inner` with `breaker`.
    pub fn new(inner: B, breaker: Breaker) -> Self {
        let name = breaker.name().into();
        Self {
            inner,
            breaker,
            name,
        }
    }

    /// The breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The guarded backend.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for GuardedBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedBackend")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker)
            .finish()
    }
}

/// A first acquire's permit until its answer is judged: dropped unanswered
/// (its caller's call deadline passed), the call counts as failed.
struct Unanswered(Option<flightdeck_breaker::Permit>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(permit) = self.0.take() {
            permit.record(Outcome::Failure);
        }
    }
}

fn judged<T>(res: &Result<T, BackendError>) -> Outcome {
    match res {
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::Failure,
    }
}

impl<B: Backend> Backend for GuardedBackend<B> {
    fn reject_early(&self, shard: &Shard) -> Option<BackendError> {
        if self.breaker.try_reject() {
            return Some(BackendError::rejected(
                flightdeck_core::error::CircuitOpen::new(std::sync::Arc::clone(&self.name)),
            ));
        }
        let refused = self.inner.reject_early(shard)?;
        // The backend itself refused the flight before its first call
        // (no connection): judged like that call, so an outage seen this
        // way opens the circuit, and a half-open probe refused this way
        // fails.
        if let Ok(permit) = self.breaker.try_acquire_past_ramp() {
            permit.record(Outcome::Failure);
        }
        Some(refused)
    }

    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        let permit = match self.breaker.try_acquire_past_ramp() {
            Ok(permit) => permit,
            Err(open) => return Box::pin(async move { Err(BackendError::rejected(open)) }),
        };
        let call = self.inner.acquire(flight, token, terms);
        let mut pending = Unanswered(Some(permit));
        Box::pin(async move {
            let res = call.await;
            if let Some(permit) = pending.0.take() {
                permit.record(judged(&res));
            }
            res
        })
    }

    fn recheck<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        let call = self.inner.recheck(flight, token, terms);
        Box::pin(async move {
            let res = call.await;
            if let Err(e) = &res {
                if e.kind() == BackendErrorKind::Protocol {
                    if let Ok(permit) = self.breaker.try_acquire_past_ramp() {
                        permit.record(Outcome::Failure);
                    }
                }
            }
            res
        })
    }

    crate::forward_backend!(inner => heartbeat, commit, abandon, invalidate, subscribe, release, unreachable, shard, sharded);
}
