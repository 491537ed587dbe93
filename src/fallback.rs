//! The failure matrix of a stage, as the [`Fallback`] its L2 asks: one
//! small table from (mode, failure) to what the callers get. ("Fallback"
//! is this hook throughout the facade; running a request here instead of
//! coordinating it is the *local fallback path*, `Path::Fallback`.)
//!
//! | failure | HYBRID | DISTRIBUTED_ONLY |
//! |---|---|---|
//! | before acquire (unavailable, outcome unknown, protocol, circuit open) | run here, counted and logged | fail fast with the typed error |
//! | held back by a breaker's ramp after closing | run here, counted (as `circuit_open`) | never held back |
//! | re-check failed while following | `in-progress` / `fail`: answer now; `wait` / `local`: keep following | same |
//! | following ended (wait timed out, owner gone, garbage) | `local`: run here; otherwise the policy's answer | the policy's answer (`local` is refused by validation) |

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use flightdeck_core::error::{BoxError, CoordinationUnavailable, InProgress};
use flightdeck_distributed::{BackendError, FailureClass, Fallback, Verdict, WaitEnded};

use crate::mode::{Mode, OnWaitFailure};
use crate::stage::{Control, FallbackReason, WaitAction};

/// Why a flight runs on the local fallback path, as its fallback decided:
/// what its run ([`InnerCall`](crate::inner_call::InnerCall)) notes for
/// the key's copy, which may answer the run's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Here {
    /// The store is failing: a call to it failed (or it knew it could
    /// not send one), or a breaker is open (or probing) for it. The copy
    /// answers the run's failure as `redis_down`.
    StoreDown,
    /// The store is not known to be down, but gave this flight nothing
    /// it can use: it was not asked (a breaker's ramp after closing held
    /// the flight back, or a local guard other than a breaker refused
    /// it), or it answered something this node cannot read (a protocol
    /// error: a stored result that does not decode, a reply it does not
    /// understand). The copy answers the run's failure as any failure
    /// (`error`).
    NotDown,
    /// The store answered the flight and a failed wait ran it here
    /// (`on-wait-failure = local`): the store judges, the copy answers
    /// nothing.
    StoreAnswered,
}

/// [`Here`], told by the flight's fallback to its run, which may already
/// be on its way (a failed wait decides late); and, told back by the run,
/// whether it ran here (for its flight's callers, see `Record`).
#[derive(Debug, Default)]
pub(crate) struct WhyHere(AtomicU8, AtomicBool);

impl WhyHere {
    #[inline]
    pub(crate) fn set(&self, why: Here) {
        let v = match why {
            Here::StoreDown => 0,
            Here::NotDown => 1,
            Here::StoreAnswered => 2,
        };
        self.0.store(v, Ordering::Relaxed);
    }

    /// Why the flight runs here (the store down, until told otherwise).
    #[inline]
    pub(crate) fn get(&self) -> Here {
        match self.0.load(Ordering::Relaxed) {
            1 => Here::NotDown,
            2 => Here::StoreAnswered,
            _ => Here::StoreDown,
        }
    }

    /// Whether the flight's work ran here, in the local fallback.
    #[inline]
    pub(crate) fn ran(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}

impl WhyHere {
    fn new(why: Here) -> Self {
        let told = Self::default();
        told.set(why);
        told
    }
}

/// Why a run on the local fallback path runs here, as its run reads it
/// when it starts: known already (a refusal at admission, or none told:
/// the store down), or told later by a launched flight's fallback (a
/// failed wait decides late), through the cell they share.
#[derive(Debug)]
pub(crate) enum Why {
    Now(Here),
    Later(Arc<WhyHere>),
}

impl Default for Why {
    fn default() -> Self {
        Self::Now(Here::StoreDown)
    }
}

impl Why {
    pub(crate) fn get(&self) -> Here {
        match self {
            Self::Now(why) => *why,
            Self::Later(told) => told.get(),
        }
    }

    /// The flight's work runs here, in the local fallback: told to a
    /// flight launched to the store (a run that began here from the
    /// start is known as such by its flight).
    #[inline]
    pub(crate) fn ran_here(&self) {
        if let Self::Later(told) = self {
            told.1.store(true, Ordering::Relaxed);
        }
    }
}

/// A stage's failure matrix in the mode its leader found on arrival.
///
/// Admission borrows the stage's control (`C` = `&Control`): a flight
/// refused there (an open breaker) runs here without ever taking a
/// reference count on it; one admitted takes it to its launch
/// ([`owned`](Self::owned)).
pub(crate) struct ModeFallback<C = Arc<Control>> {
    pub(crate) ctl: C,
    pub(crate) mode: Mode,
    /// Why the flight runs here, when it does (see [`Here`]): a refusal
    /// at admission is read at once from the fallback itself (nothing is
    /// allocated on the breaker-open path) ...
    why: WhyHere,
    /// ... and, once the flight is launched, told to its run through the
    /// cell they share ([`ModeFallback::launched`]).
    told: Option<Arc<WhyHere>>,
}

impl<C: Deref<Target = Control>> ModeFallback<C> {
    /// The fallback of a flight L2 is about to admit.
    pub(crate) fn admitting(ctl: C, mode: Mode) -> Self {
        Self {
            ctl,
            mode,
            why: WhyHere::default(),
            told: None,
        }
    }

    /// The same fallback, holding the stage's control itself (`ctl`), for
    /// a flight admitted to the store: it goes with the flight.
    pub(crate) fn owned(self, ctl: Arc<Control>) -> ModeFallback {
        ModeFallback {
            ctl,
            mode: self.mode,
            why: WhyHere::new(self.why.get()),
            told: self.told,
        }
    }

    /// Why a refusal at admission runs the flight here.
    #[inline]
    pub(crate) fn refused_as(&self) -> Here {
        self.why.get()
    }

    /// The flight was admitted: what the fallback decides from now on
    /// reaches its run through the cell returned.
    pub(crate) fn launched(&mut self) -> Why {
        let told = Arc::new(WhyHere::new(self.why.get()));
        self.told = Some(Arc::clone(&told));
        Why::Later(told)
    }

    fn tell(&self, why: Here) {
        self.why.set(why);
        if let Some(told) = &self.told {
            told.set(why);
        }
    }
}

impl<C: Deref<Target = Control>> ModeFallback<C> {
    /// Coordination failed (or was refused) before acquiring: HYBRID runs
    /// the flight here, for `why`; DISTRIBUTED_ONLY fails fast.
    fn refused(&self, class: FailureClass, error: BackendError, why: Here) -> Verdict {
        let ctl = &self.ctl;
        if class == FailureClass::CircuitOpen {
            // A refusal may be the first news of a breaker that opened:
            // the stage shows it before the request runs here.
            ctl.sync();
        } else {
            ctl.count_distributed_failure(class);
        }
        if self.mode == Mode::Hybrid {
            ctl.count_fallback(FallbackReason::Coordination(class));
            if class != FailureClass::CircuitOpen {
                tracing::warn!(stage = %ctl.name, kind = class.as_str(), error = %error, "coordination failed before acquiring: running locally");
            }
            self.tell(why);
            Verdict::RunHere
        } else {
            ctl.count_fail_fast(class);
            Verdict::Fail(error.into_core())
        }
    }
}

impl<Req, C: Deref<Target = Control> + Send + Sync> Fallback<Req> for ModeFallback<C> {
    fn before_acquire(&self, class: FailureClass, error: BackendError, _req: &Req) -> Verdict {
        // A call that failed, or an open breaker: the store is failing. A
        // refusal by another local guard says nothing of the store, and an
        // answer this node cannot read (a protocol error, such as a stored
        // result that does not decode) says it is up.
        let down =
            class != FailureClass::Protocol && (!error.is_rejected() || error.is_circuit_open());
        let why = if down { Here::StoreDown } else { Here::NotDown };
        self.refused(class, error, why)
    }

    /// Counted as a refusal by an open breaker (`circuit_open`), but the
    /// store is up: its copy answers the run's failure as any failure.
    fn held_back(&self, error: BackendError, _req: &Req) -> Verdict {
        self.refused(FailureClass::CircuitOpen, error, Here::NotDown)
    }

    fn while_following(
        &self,
        _class: FailureClass,
        error: BoxError,
        _req: &Req,
    ) -> Option<BoxError> {
        let ctl = &self.ctl;
        let answer: BoxError = match ctl.cfg.on_wait_failure {
            OnWaitFailure::InProgress => {
                ctl.count_wait_failure(WaitAction::InProgress);
                Box::new(InProgress::new(Some(ctl.name.clone())))
            }
            OnWaitFailure::Fail => {
                ctl.count_wait_failure(WaitAction::Fail);
                tracing::warn!(stage = %ctl.name, policy = "fail", %error, "follower wait failed");
                return Some(Box::new(CoordinationUnavailable::new(error)));
            }
            // Another node may own the lease: never run it at once.
            OnWaitFailure::Wait | OnWaitFailure::Local => return None,
        };
        tracing::warn!(stage = %ctl.name, policy = %ctl.cfg.on_wait_failure, %error, "follower wait failed");
        Some(answer)
    }

    fn wait_ended(&self, end: WaitEnded, error: BoxError, _req: &Req) -> Verdict {
        let ctl = &self.ctl;
        let policy = ctl.cfg.on_wait_failure;
        let action = match policy {
            OnWaitFailure::Local if self.mode == Mode::Hybrid => WaitAction::Local,
            OnWaitFailure::Local | OnWaitFailure::Wait => WaitAction::Wait,
            OnWaitFailure::InProgress => WaitAction::InProgress,
            OnWaitFailure::Fail => WaitAction::Fail,
        };
        ctl.count_wait_failure(action);
        tracing::warn!(stage = %ctl.name, %policy, ?end, %error, "follower wait failed");
        match action {
            WaitAction::Local => {
                ctl.count_fallback(FallbackReason::WaitFailure);
                self.tell(Here::StoreAnswered);
                Verdict::RunHere
            }
            WaitAction::InProgress => {
                Verdict::Fail(Box::new(InProgress::new(Some(ctl.name.clone()))))
            }
            WaitAction::Fail => Verdict::Fail(Box::new(CoordinationUnavailable::new(error))),
            WaitAction::Wait => Verdict::Fail(error),
        }
    }

    /// HYBRID has somewhere else to run a flight a ramp holds back: here.
    fn ramped(&self) -> bool {
        self.mode == Mode::Hybrid
    }
}
