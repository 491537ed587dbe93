//! The facade's services: [`SingleFlight`] (what users get) and
//! [`Coordinator`] (what runs for each L1 leader: the mode, the breaker,
//! L2, and the failure table).
//!
//! [`SingleFlight`] is always ready: it decides in `call` (bypass, coalesce,
//! reject) and drives the inner service to readiness on the path that runs
//! it, which is what axum expects.
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck::{Mode, SingleFlightBuilder, StageConfig};
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("local").unwrap();
//! let layer = SingleFlightBuilder::new(
//!     move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
//!     CloneShare::<usize>::new(),
//!     PostcardCodec::<usize>::new(),
//! )
//! .stage("local", StageConfig::new().mode(Mode::LocalOnly))
//! .build()
//! .unwrap();
//! let mut svc = layer.layer(service_fn(|q: String| async move {
//!     Ok::<_, std::convert::Infallible>(q.len())
//! }));
//! assert_eq!(svc.ready().await.unwrap().call("four".to_owned()).await.unwrap(), 4);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use flightdeck_breaker::{CircuitState, Outcome, Permit};
use flightdeck_core::error::{
    find, BoxError, CoordinationUnavailable, InProgress, LeaseLost, OutcomeUnknown, ProtocolError,
    WaitTimeout,
};
use flightdeck_core::{metric, FlightKey, Share, Shareable, SharedForm};
use flightdeck_distributed::ResultCodec;
use flightdeck_local::KeyExtractor;
use tower::util::{Either, ServiceExt};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::UnknownStage;
use crate::future::ResponseFuture;
use crate::layer::Shared;
use crate::mode::{Mode, OnWaitFailure};
use crate::share::Flown;
use crate::stage::{Count, Fallback, Stage};
use crate::ticket::{Fence, Phase, SlotRunner, Ticket, PROGRESS};

/// A request with its key, as L1 sees it (the facade extracts the key once).
#[derive(Debug)]
pub struct Keyed<Req> {
    key: FlightKey,
    req: Req,
}

/// L1's key extractor for [`Keyed`] requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyedKeys;

impl<Req> KeyExtractor<Keyed<Req>> for KeyedKeys {
    fn key(&self, req: &Keyed<Req>) -> Option<FlightKey> {
        Some(req.key.clone())
    }
}

/// The service built by [`SingleFlightLayer`](crate::SingleFlightLayer).
pub struct SingleFlight<S, K, Sh: SharedForm, C, F> {
    inner: S,
    shared: Arc<Shared<K, Sh, C, F>>,
}

impl<S, K, Sh: SharedForm, C, F> SingleFlight<S, K, Sh, C, F> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, Sh, C, F>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, Sh: SharedForm, C, F> Clone for SingleFlight<S, K, Sh, C, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, Sh: SharedForm, C, F> fmt::Debug for SingleFlight<S, K, Sh, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("inner", &self.inner)
            .field("stages", &self.shared.stages.len())
            .finish_non_exhaustive()
    }
}

impl<S, Req, K, Sh, C, F> Service<Req> for SingleFlight<S, K, Sh, C, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    K: KeyExtractor<Req>,
    Sh: Share<S::Response>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Sh, C, F>;

    /// Always ready: the decision (bypass, coalesce, reject) is made in
    /// `call`, and the inner service is driven to readiness by the path
    /// that runs it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let share = self.shared.share.clone();
        let Some(key) = self.shared.key.key(&req) else {
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), share);
        };
        let Some(stage) = self.shared.stages.get(key.stage()) else {
            return ResponseFuture::failed(Box::new(UnknownStage::new(key.stage().clone())), share);
        };
        stage.ctl.count(Count::Request);
        let mode = stage.ctl.mode();
        if mode == Mode::Bypass {
            stage.ctl.count(Count::Bypass);
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), share);
        }
        let mut l1 = stage.l1.layer(Coordinator {
            inner: self.inner.clone(),
            stage: Arc::clone(stage),
            mode,
            fence: self.shared.fence.clone(),
            share: share.clone(),
        });
        // The coordinator is always ready, and so is L1 over it.
        let mut cx = Context::from_waker(Waker::noop());
        match l1.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => ResponseFuture::flight(l1.call(Keyed { key, req }), share),
            Poll::Ready(Err(e)) => ResponseFuture::failed(e, share),
            Poll::Pending => ResponseFuture::failed(
                Box::new(ProtocolError::new("local flight layer not ready")),
                share,
            ),
        }
    }
}

/// What each L1 leader runs: the stage's mode, its breaker, L2 and the
/// failure table. Built per call by [`SingleFlight`]; always ready.
pub struct Coordinator<S, Sh: SharedForm, C, F> {
    inner: S,
    stage: Arc<Stage<Sh, C>>,
    mode: Mode,
    fence: F,
    share: Sh,
}

impl<S: Clone, Sh: SharedForm, C, F: Clone> Clone for Coordinator<S, Sh, C, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            stage: Arc::clone(&self.stage),
            mode: self.mode,
            fence: self.fence.clone(),
            share: self.share.clone(),
        }
    }
}

impl<S, Sh: SharedForm, C, F> fmt::Debug for Coordinator<S, Sh, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("stage", &self.stage.ctl.name)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// The future of one L1 leader's coordination. Boxed: it is created once
/// per flight (not per waiter) and spends its time in network round trips
/// and in the real work; naming it would mean naming L2's and the
/// bulkhead's futures inside a hand-written state machine.
pub type CoordinatorFuture<V, O> =
    Pin<Box<dyn Future<Output = Result<Flown<V, O>, BoxError>> + Send>>;

impl<S, Req, Sh, C, F> Service<Keyed<Req>> for Coordinator<S, Sh, C, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    Sh: Share<S::Response>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
{
    type Response = Flown<Sh::Shared, Sh::Output>;
    type Error = BoxError;
    type Future = CoordinatorFuture<Sh::Shared, Sh::Output>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, keyed: Keyed<Req>) -> Self::Future {
        let Keyed { key, req } = keyed;
        let stage = Arc::clone(&self.stage);
        let inner = self.inner.clone();
        let share = self.share.clone();
        let mode = self.mode;
        if stage.l2.is_none() || !mode.is_distributed() {
            return Box::pin(async move { local(&stage, inner, &share, req).await });
        }
        // Breaker first: while it is open, not a single call reaches the
        // backend. Decided here, so that the degraded path only allocates
        // the small local future.
        let ctl = &stage.ctl;
        let permit = match ctl.breaker.try_acquire() {
            Ok(permit) => Some(permit),
            // The breaker closed and its ramp holds this call back: HYBRID
            // runs it locally (the gradual return), but DISTRIBUTED_ONLY has
            // nowhere else to go and the backend is healthy, so it goes on,
            // unrecorded.
            Err(_)
                if mode == Mode::DistributedOnly && ctl.breaker.state() == CircuitState::Closed =>
            {
                None
            }
            Err(open) => {
                ctl.enter_degraded();
                if mode == Mode::Hybrid {
                    return Box::pin(async move {
                        fallback(&stage, Fallback::CircuitOpen, inner, &share, req).await
                    });
                }
                ctl.count_with(metric::FAIL_FAST_TOTAL, "reason", "circuit_open");
                return Box::pin(std::future::ready(Err(Box::new(open) as BoxError)));
            }
        };
        Box::pin(coordinate(
            stage,
            mode,
            permit,
            inner,
            self.fence.clone(),
            share,
            key,
            req,
        ))
    }
}

/// The real service of a stage: the budget (if any) around the bulkhead
/// around the inner service.
type Exec<S> = Either<
    flightdeck_budget::Budget<flightdeck_bulkhead::Bulkhead<S>, flightdeck_budget::NoInbound>,
    flightdeck_bulkhead::Bulkhead<S>,
>;

fn exec<S, Sh: SharedForm, C>(stage: &Stage<Sh, C>, inner: S) -> Exec<S> {
    let bulkheaded = stage.bulkhead.layer(inner);
    match &stage.budget {
        Some(budget) => Either::Left(budget.layer(bulkheaded)),
        None => Either::Right(bulkheaded),
    }
}

/// Runs the request here, as the L1 leader.
async fn local<S, Req, Sh, C>(
    stage: &Stage<Sh, C>,
    inner: S,
    share: &Sh,
    req: Req,
) -> Result<Flown<Sh::Shared, Sh::Output>, BoxError>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
{
    let resp = exec(stage, inner).oneshot(req).await?;
    Ok(match share.share(resp).await? {
        Shareable::Shared(v) => Flown::Shared(v),
        Shareable::Unshared(o) => Flown::Output(o),
    })
}

/// HYBRID's local fallback: counted, then run here.
async fn fallback<S, Req, Sh, C>(
    stage: &Stage<Sh, C>,
    reason: Fallback,
    inner: S,
    share: &Sh,
    req: Req,
) -> Result<Flown<Sh::Shared, Sh::Output>, BoxError>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
{
    stage.ctl.count_fallback(reason);
    local(stage, inner, share, req).await
}

/// The coordination failure class of an L2 error, if it is one.
fn coordination_kind(err: &BoxError) -> Option<&'static str> {
    let e: &(dyn std::error::Error + 'static) = &**err;
    if find::<CoordinationUnavailable>(e).is_some() {
        Some("unavailable")
    } else if find::<OutcomeUnknown>(e).is_some() {
        Some("outcome_unknown")
    } else if find::<ProtocolError>(e).is_some() {
        Some("protocol")
    } else {
        None
    }
}

/// The distributed path of one L1 leader, after the breaker let it through.
#[allow(clippy::too_many_arguments)]
async fn coordinate<S, Req, Sh, C, F>(
    stage: Arc<Stage<Sh, C>>,
    mode: Mode,
    permit: Option<Permit>,
    inner: S,
    fence: F,
    share: Sh,
    key: FlightKey,
    req: Req,
) -> Result<Flown<Sh::Shared, Sh::Output>, BoxError>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    Sh: Share<S::Response>,
    C: ResultCodec<Sh::Shared>,
    F: Fence<Req>,
{
    let Some(l2) = &stage.l2 else {
        return local(&stage, inner, &share, req).await;
    };
    let ctl = &stage.ctl;
    // `singleflight_distributed_request_total` is counted by L2 itself.
    let ticket = Ticket::new(key, req);
    let kept = ticket.share();
    // The first acquire's answer records the permit (see `Progress`).
    kept.progress().set_permit(permit);
    let runner = SlotRunner {
        exec: exec(&stage, inner.clone()),
        fence,
    };
    let res = PROGRESS
        .scope(
            Arc::clone(kept.progress()),
            l2.layer(runner).oneshot(ticket),
        )
        .await;
    let phase = kept.progress().phase();
    let record = |outcome: Outcome| {
        match kept.progress().take_permit() {
            // No acquire answered (the flight ended before one did).
            Some(permit) => permit.record(outcome),
            // A coordination failure after the first answer (e.g. while
            // following) counts too.
            None if outcome == Outcome::Failure && phase != Phase::Acquiring => {
                if let Ok(permit) = ctl.breaker.try_acquire() {
                    permit.record(Outcome::Failure);
                }
            }
            None => {}
        }
        ctl.sync_degraded();
    };
    let err = match res {
        Ok(v) => {
            record(Outcome::Success);
            if phase != Phase::Acquiring {
                ctl.count(Count::Miss);
            }
            return Ok(v);
        }
        Err(e) => e,
    };

    let Some(req) = kept.take() else {
        // The work ran here as the owner: its error is the business's (or
        // the lease was lost). Shared with the waiters, never retried,
        // never counted against the backend.
        record(if find::<LeaseLost>(&*err).is_some() {
            Outcome::Ignore
        } else {
            Outcome::Success
        });
        ctl.count(Count::OwnerFailure);
        return Err(err);
    };

    let kind = coordination_kind(&err);
    let waiting = phase == Phase::Following || find::<WaitTimeout>(&*err).is_some();
    record(match (kind, waiting) {
        (Some(_), _) => Outcome::Failure,
        (None, true) => Outcome::Ignore,
        // The backend answered (e.g. a stored failure of another node).
        (None, false) => Outcome::Success,
    });
    if let Some(kind) = kind {
        ctl.count_with(metric::DISTRIBUTED_FAILURE_TOTAL, "kind", kind);
    }

    if waiting {
        // Another node may own the lease: never run it at once.
        let policy = ctl.cfg.on_wait_failure;
        let action = match policy {
            OnWaitFailure::Local if mode == Mode::Hybrid => "local",
            OnWaitFailure::Local | OnWaitFailure::Wait => "wait",
            OnWaitFailure::InProgress => "in_progress",
            OnWaitFailure::Fail => "fail",
        };
        ctl.count_with(metric::WAIT_FAILURE_TOTAL, "action", action);
        tracing::warn!(stage = %ctl.name, %policy, error = %err, "follower wait failed");
        return match action {
            "local" => fallback(&stage, Fallback::WaitFailure, inner, &share, req).await,
            "in_progress" => Err(Box::new(InProgress::new(Some(ctl.name.clone())))),
            "fail" => Err(Box::new(CoordinationUnavailable::new(err))),
            _ => Err(err),
        };
    }

    match (kind, mode) {
        (Some(kind), Mode::Hybrid) => {
            tracing::warn!(stage = %ctl.name, kind, error = %err, "coordination failed before acquiring: running locally");
            fallback(&stage, Fallback::from_kind(kind), inner, &share, req).await
        }
        (Some(kind), _) => {
            ctl.count_with(metric::FAIL_FAST_TOTAL, "reason", kind);
            Err(err)
        }
        (None, _) => Err(err),
    }
}
