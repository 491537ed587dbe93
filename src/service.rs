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
use std::time::Duration;

use flightdeck_breaker::{CircuitState, Outcome, Permit};
use flightdeck_core::error::{
    find, BoxError, CircuitOpen, CoordinationUnavailable, DeadlineExceeded, InProgress, LeaseLost,
    OutcomeUnknown, ProtocolError, WaitTimeout,
};
use flightdeck_core::{metric, FlightKey, Share, Shareable, SharedForm};
use flightdeck_distributed::ResultCodec;
use flightdeck_local::KeyExtractor;
use tokio::time::Instant;
use tower::util::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::UnknownStage;
use crate::future::ResponseFuture;
use crate::layer::Shared;
use crate::mode::{Mode, OnWaitFailure};
use crate::share::Flown;
use crate::stage::{Count, Fallback, Stage};
use crate::ticket::{Fence, Phase, Progress, SlotRunner, Ticket, PROGRESS};

/// A request with its key and deadline, as L1 sees it (the facade extracts
/// them once).
#[derive(Debug)]
pub struct Keyed<Req> {
    key: FlightKey,
    req: Req,
    deadline: Option<Instant>,
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
        let deadline = match self.shared.fence.deadline(&req) {
            Ok(None) => None,
            Ok(Some(at)) if at <= Instant::now() => {
                return ResponseFuture::failed(Box::new(DeadlineExceeded::new("request")), share)
            }
            Ok(Some(at)) => Some(at),
            Err(e) => return ResponseFuture::failed(e, share),
        };
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
            Poll::Ready(Ok(())) => {
                ResponseFuture::flight(l1.call(Keyed { key, req, deadline }), share, deadline)
            }
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
        let Keyed { key, req, deadline } = keyed;
        let stage = Arc::clone(&self.stage);
        let inner = self.inner.clone();
        let share = self.share.clone();
        let mode = self.mode;
        // LOCAL_ONLY, a stage without backend, and HYBRID while its breaker
        // is open all run the same local future: the degraded path is the
        // local one plus the breaker's one-load check (and its counters).
        let run_here = stage.l2.is_none() || !mode.is_distributed() || {
            let ctl = &stage.ctl;
            if ctl.breaker.try_reject() {
                ctl.enter_degraded();
                if mode != Mode::Hybrid {
                    ctl.count_with(metric::FAIL_FAST_TOTAL, "reason", "circuit_open");
                    let open = CircuitOpen::new(ctl.breaker.name());
                    return Box::pin(std::future::ready(Err(Box::new(open) as BoxError)));
                }
                ctl.count_fallback(Fallback::CircuitOpen);
                true
            } else {
                false
            }
        };
        if run_here {
            return Box::pin(async move { local(&stage, inner, &share, req, deadline).await });
        }
        // Breaker first: while it is open, not a single call reaches the
        // backend. (An open breaker whose wait no timer watches, e.g. one
        // opened outside a runtime, is rejected here.)
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
                        fallback(&stage, Fallback::CircuitOpen, inner, &share, req, deadline).await
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
            deadline,
        ))
    }
}

/// The real service of a stage: the bulkhead around the inner service.
type Exec<S> = flightdeck_bulkhead::Bulkhead<S>;

fn exec<S, Sh: SharedForm, C>(stage: &Stage<Sh, C>, inner: S) -> Exec<S> {
    stage.bulkhead.layer(inner)
}

/// The execution slice of one request: the stage's execution timeout,
/// capped by what remains of the request's deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExecSlice {
    slice: Option<Duration>,
    deadline: Option<Instant>,
}

impl ExecSlice {
    pub(crate) fn new(slice: Option<Duration>, deadline: Option<Instant>) -> Self {
        Self { slice, deadline }
    }

    /// When the execution must be over, if ever (reads the clock only when
    /// there is a slice).
    #[inline]
    pub(crate) fn end(&self) -> Option<Instant> {
        match (self.slice, self.deadline) {
            (None, deadline) => deadline,
            (Some(slice), deadline) => Some(earliest(after(slice), deadline)),
        }
    }
}

/// `d` from now, saturating far in the future (never overflows the clock).
pub(crate) fn after(d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);
    let now = Instant::now();
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

/// The earlier of `at` and an optional other instant.
pub(crate) fn earliest(at: Instant, other: Option<Instant>) -> Instant {
    other.map_or(at, |o| o.min(at))
}

/// Runs the request here, as the L1 leader, within the execution slice.
async fn local<S, Req, Sh, C>(
    stage: &Stage<Sh, C>,
    inner: S,
    share: &Sh,
    req: Req,
    deadline: Option<Instant>,
) -> Result<Flown<Sh::Shared, Sh::Output>, BoxError>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
{
    let resp = match ExecSlice::new(stage.ctl.cfg.execution_timeout, deadline).end() {
        None => exec(stage, inner).oneshot(req).await?,
        // No time left: the work is not started at all.
        Some(end) if end <= Instant::now() => {
            return Err(Box::new(DeadlineExceeded::new("execution")))
        }
        Some(end) => tokio::time::timeout_at(end, exec(stage, inner).oneshot(req))
            .await
            .map_err(|_| DeadlineExceeded::new("execution"))??,
    };
    Ok(match share.share(resp).await? {
        Shareable::Shared(v) => Flown::Shared(v),
        Shareable::Unshared(o, _) => Flown::Output(o),
    })
}

/// HYBRID's local fallback: counted, then run here.
async fn fallback<S, Req, Sh, C>(
    stage: &Stage<Sh, C>,
    reason: Fallback,
    inner: S,
    share: &Sh,
    req: Req,
    deadline: Option<Instant>,
) -> Result<Flown<Sh::Shared, Sh::Output>, BoxError>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Sh: Share<S::Response>,
{
    stage.ctl.count_fallback(reason);
    local(stage, inner, share, req, deadline).await
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
    deadline: Option<Instant>,
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
        return local(&stage, inner, &share, req, deadline).await;
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
        slice: ExecSlice::new(ctl.cfg.execution_timeout, deadline),
    };
    let flight = PROGRESS.scope(
        Arc::clone(kept.progress()),
        l2.layer(runner).oneshot(ticket),
    );
    let res = match deadline {
        None => flight.await,
        Some(at) => match (FollowUntil {
            flight,
            sleep: tokio::time::sleep_until(at),
            progress: kept.progress(),
        })
        .await
        {
            Some(res) => res,
            None => {
                // The request's time is up while following another node:
                // not the backend's failure, not a reason to run it here.
                if let Some(permit) = kept.progress().take_permit() {
                    permit.record(Outcome::Ignore);
                }
                ctl.sync_degraded();
                tracing::debug!(stage = %ctl.name, "request deadline passed while following");
                return Err(Box::new(DeadlineExceeded::new("coordination")));
            }
        },
    };
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
            "local" => fallback(&stage, Fallback::WaitFailure, inner, &share, req, deadline).await,
            "in_progress" => Err(Box::new(InProgress::new(Some(ctl.name.clone())))),
            "fail" => Err(Box::new(CoordinationUnavailable::new(err))),
            _ => Err(err),
        };
    }

    match (kind, mode) {
        (Some(kind), Mode::Hybrid) => {
            tracing::warn!(stage = %ctl.name, kind, error = %err, "coordination failed before acquiring: running locally");
            fallback(
                &stage,
                Fallback::from_kind(kind),
                inner,
                &share,
                req,
                deadline,
            )
            .await
        }
        (Some(kind), _) => {
            ctl.count_with(metric::FAIL_FAST_TOTAL, "reason", kind);
            Err(err)
        }
        (None, _) => Err(err),
    }
}

pin_project_lite::pin_project! {
    /// L2's flight, given up when the request's deadline passes while it
    /// follows another node's flight (`None`). An acquire in flight is let
    /// finish (bounded by the coordination slice), so no lease is left
    /// behind unanswered: as owner, the work then gets what remains of the
    /// deadline (nothing) and the flight is abandoned cleanly; as follower,
    /// it is given up at once.
    struct FollowUntil<'a, Fut> {
        #[pin]
        flight: Fut,
        #[pin]
        sleep: tokio::time::Sleep,
        progress: &'a Progress,
    }
}

impl<Fut: Future> Future for FollowUntil<'_, Fut> {
    type Output = Option<Fut::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.flight.poll(cx) {
            return Poll::Ready(Some(out));
        }
        if this.sleep.poll(cx).is_ready() && this.progress.phase() == Phase::Following {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
