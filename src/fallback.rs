//! The failure matrix of a stage, as the [`Fallback`] its L2 asks: one
//! small table from (mode, failure) to what the callers get. ("Fallback"
//! is this hook throughout the facade; running a request here instead of
//! coordinating it is the *local fallback path*, `Path::Fallback`.)
//!
//! | failure | HYBRID | DISTRIBUTED_ONLY |
//! |---|---|---|
//! | before acquire (unavailable, outcome unknown, protocol, circuit open) | run here, counted and logged | fail fast with the typed error |
//! | held back by a breaker's ramp after closing | run here, counted | never held back |
//! | re-check failed while following | `in-progress` / `fail`: answer now; `wait` / `local`: keep following | same |
//! | following ended (wait timed out, owner gone, garbage) | `local`: run here; otherwise the policy's answer | the policy's answer (`local` is refused by validation) |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flightdeck_core::error::{BoxError, CoordinationUnavailable, InProgress};
use flightdeck_distributed::{BackendError, FailureClass, Fallback, Verdict, WaitEnded};

use crate::mode::{Mode, OnWaitFailure};
use crate::stage::{Control, FallbackReason, WaitAction};

/// A stage's failure matrix in the mode its leader found on arrival.
pub(crate) struct ModeFallback {
    pub(crate) ctl: Arc<Control>,
    pub(crate) mode: Mode,
    /// Set when a failed wait runs the flight here: the store answered it
    /// (see [`InnerCall`](crate::inner_call::InnerCall)).
    pub(crate) store_answered: Arc<AtomicBool>,
}

impl<Req> Fallback<Req> for ModeFallback {
    fn before_acquire(&self, class: FailureClass, error: BackendError, _req: &Req) -> Verdict {
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
            Verdict::RunHere
        } else {
            ctl.count_fail_fast(class);
            Verdict::Fail(error.into_core())
        }
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
                self.store_answered.store(true, Ordering::Relaxed);
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
