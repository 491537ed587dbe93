//! The breaker as a backend decorator: [`GuardedBackend`] puts a
//! [`Breaker`] per shard in front of a backend, so that an open circuit is
//! one more failure before acquire
//! ([`FailureClass::CircuitOpen`](crate::fallback::FailureClass::CircuitOpen)),
//! decided by the same [`Fallback`](crate::fallback::Fallback) as any other.
//! It is the breakers' one owner: it opens them, probes them, ramps them
//! and publishes which shards are degraded ([`BackendBreakers::watch`]);
//! whoever shows that state (the facade's gauges, logs and bulkhead)
//! follows that one channel.
//!
//! **Per shard.** Each flight is judged by the breaker of the shard that
//! serves it ([`Backend::shard`]; see [`BackendBreakers`]): when one Redis
//! Cluster primary fails, only the flights it serves are refused, and the
//! others keep coordinating. A backend that is not sharded puts every
//! flight on [`Shard::WHOLE`](crate::backend::Shard::WHOLE), judged by the
//! breaker given to [`GuardedBackend::new`]. That breaker also stands for
//! the whole store: while it is not closed (forced by hand, or tripped
//! because the backend could not be reached at all), it judges every
//! flight.
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
//! **The ramp** after closing (see the breaker's `Ramp`) holds back only
//! the flights of callers that have somewhere else to send them
//! ([`Backend::held_back`], asked when their
//! [`Fallback::ramped`](crate::fallback::Fallback::ramped) says so: the
//! facade's HYBRID stages run them locally); the others are all let
//! through.
//!
//! **A backend that is not connected yet** ([`Backend::connection`]) can
//! open the whole-store breaker from the start
//! ([`GuardedBackend::trip_until_connected`]) and close it when the
//! connection is made, even while no request comes.
//!
//! ```
//! use flightdeck_breaker::{Breaker, BreakerConfig};
//! use flightdeck_distributed::breaker::GuardedBackend;
//! use flightdeck_distributed::backend::{Backend, Shard};
//! use flightdeck_test::MemoryBackend;
//!
//! let breaker = Breaker::new("redis", BreakerConfig::default()).unwrap();
//! let backend = GuardedBackend::new(MemoryBackend::new(), breaker.clone());
//! breaker.force_open();
//! assert!(backend.reject_early(&Shard::WHOLE).unwrap().is_rejected());
//! assert!(backend.breakers().is_degraded(&Shard::WHOLE));
//! ```

mod shards;

use std::borrow::Cow;
use std::fmt;

use flightdeck_breaker::{Breaker, Outcome};

use crate::backend::{
    Acquired, Ask, Backend, BackendError, BackendErrorKind, BackendFuture, FlightId, LeaseTerms,
    OwnerToken, Shard,
};

pub use shards::{BackendBreakers, MAX_SHARD_BREAKERS};

/// A backend behind a circuit breaker per shard; see the
/// [module docs](self).
pub struct GuardedBackend<B> {
    inner: B,
    breakers: BackendBreakers,
}

impl<B> GuardedBackend<B> {
    /// Guards `inner` with `breaker` for [`Shard::WHOLE`](crate::backend::Shard::WHOLE),
    /// the template of every named shard's breaker (see [`BackendBreakers`]).
    pub fn new(inner: B, breaker: Breaker) -> Self {
        Self::with_breakers(inner, BackendBreakers::new(breaker))
    }

    /// Guards `inner` with `breakers` (shared with whoever watches them).
    pub fn with_breakers(inner: B, breakers: BackendBreakers) -> Self {
        Self { inner, breakers }
    }

    /// The whole-store breaker ([`Shard::WHOLE`](crate::backend::Shard::WHOLE)'s).
    pub fn breaker(&self) -> &Breaker {
        self.breakers.whole()
    }

    /// Every shard's breaker, and the degraded set they publish.
    pub fn breakers(&self) -> &BackendBreakers {
        &self.breakers
    }

    /// The guarded backend.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: Backend> GuardedBackend<B> {
    /// The breaker that judges `flight` now: its shard's (created if
    /// needed), or the whole-store breaker while that one is not closed.
    pub fn breaker_for(&self, flight: &FlightId) -> Breaker {
        self.judge(flight).into_owned()
    }

    #[inline]
    fn judge(&self, flight: &FlightId) -> Cow<'_, Breaker> {
        if self.inner.sharded() {
            self.breakers.judging(&self.inner.shard(flight))
        } else {
            Cow::Borrowed(self.breakers.whole())
        }
    }

    /// When the backend is not connected now ([`Backend::connection`], or
    /// [`Backend::unreachable`]): opens the whole-store breaker (the
    /// backend's flights are refused before any call: a HYBRID stage runs
    /// them here, a DISTRIBUTED_ONLY one fails fast) and returns why. The
    /// circuit closes as soon as the connection is made (followed from a
    /// task, so an idle node goes distributed too; outside a runtime, its
    /// half-open probes find out). `None` when connected.
    pub fn trip_until_connected(&self) -> Option<String> {
        let mut connection = self.inner.connection();
        let why = match &*connection.borrow_and_update() {
            crate::backend::Connection::NotConnected(why) => why.to_string(),
            crate::backend::Connection::Connected => self
                .inner
                .unreachable()
                .filter(|e| !e.is_rejected())?
                .to_string(),
        };
        let whole = self.breakers.whole().clone();
        whole.trip();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                while !connection.borrow_and_update().is_connected() {
                    if connection.changed().await.is_err() {
                        return;
                    }
                }
                if whole.recover() {
                    tracing::warn!(
                        breaker = whole.name(),
                        "backend connected: closing the circuit it started open, going distributed"
                    );
                }
            }));
        }
        Some(why)
    }
}

impl<B: fmt::Debug> fmt::Debug for GuardedBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedBackend")
            .field("inner", &self.inner)
            .field("breakers", &self.breakers)
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

/// A refusal by `breaker`.
fn refusal(breaker: &Breaker) -> BackendError {
    BackendError::circuit_open(breaker.circuit_open())
}

impl<B: Backend> Backend for GuardedBackend<B> {
    fn reject_early(&self, shard: &Shard) -> Option<BackendError> {
        let breaker = self.breakers.judging(shard);
        if breaker.try_reject() {
            return Some(refusal(&breaker));
        }
        let refused = self.inner.reject_early(shard)?;
        // The backend itself refused the flight before its first call
        // (no connection): judged like that call, so an outage seen this
        // way opens the circuit, and a half-open probe refused this way
        // fails.
        if let Ok(permit) = breaker.try_acquire_past_ramp() {
            permit.record(Outcome::Failure);
        }
        Some(refused)
    }

    /// While a ramp runs after a breaker closed: the whole store's ramp
    /// holds back any flight, a shard's the flights of that shard (each
    /// admits exactly its share, and counts the others as rejections).
    fn held_back(&self, shard: &Shard) -> Option<BackendError> {
        let whole = self.breakers.whole();
        if whole.ramp_holds_back() {
            return Some(refusal(whole));
        }
        if shard.is_whole() {
            return None;
        }
        let breaker = self.breakers.judging(shard);
        breaker.ramp_holds_back().then(|| refusal(&breaker))
    }

    /// A first acquire is gated and judged, a re-check ([`Ask::recheck`])
    /// only judged by its protocol errors (see the module docs).
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        if ask.recheck {
            let call = self.inner.acquire_with(flight, token, ask, terms);
            return Box::pin(async move {
                let res = call.await;
                if let Err(e) = &res {
                    if e.kind() == BackendErrorKind::Protocol {
                        if let Ok(permit) = self.judge(flight).try_acquire_past_ramp() {
                            permit.record(Outcome::Failure);
                        }
                    }
                }
                res
            });
        }
        let permit = match self.judge(flight).try_acquire_past_ramp() {
            Ok(permit) => permit,
            Err(open) => return Box::pin(async move { Err(BackendError::circuit_open(open)) }),
        };
        let call = self.inner.acquire_with(flight, token, ask, terms);
        let mut pending = Unanswered(Some(permit));
        Box::pin(async move {
            let res = call.await;
            if let Some(permit) = pending.0.take() {
                permit.record(judged(&res));
            }
            res
        })
    }

    crate::forward_backend!(inner => heartbeat, commit, abandon, invalidate, subscribe, join_subscription, release, unreachable, connection, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}
