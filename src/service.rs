//! The service a [`GenericSingleFlightLayer`](crate::GenericSingleFlightLayer)
//! builds: [`GenericSingleFlight`].
//!
//! It is always ready: it decides in `call` (bypass, coalesce, reject) and
//! drives the inner service to readiness on the path that runs it, which is
//! what axum expects.
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("local").unwrap();
//! let layer = GenericSingleFlightLayer::builder(
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
use std::sync::Arc;
use std::task::{Context, Poll};

use flightdeck_budget::{Phase, Slices};
use flightdeck_core::error::BoxError;
use flightdeck_core::{Serves, Share, SharedForm};
use flightdeck_local::future::Run;
use flightdeck_local::{Caller, OnAbandon};
use tokio::time::Instant;
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use crate::error::UnknownStage;
use crate::future::ResponseFuture;
use crate::layer::Shared;
use crate::leader::Leader;
use crate::mode::Mode;
use crate::readers::RequestReaders;
use crate::stage::Path;

/// The service built by
/// [`GenericSingleFlightLayer`](crate::GenericSingleFlightLayer) around
/// `S`: `R` reads its requests, `Sh` shares its responses.
pub struct GenericSingleFlight<S, R, Sh: SharedForm> {
    inner: S,
    shared: Arc<Shared<R, Sh>>,
}

impl<S, R, Sh: SharedForm> GenericSingleFlight<S, R, Sh> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<R, Sh>>) -> Self {
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

impl<S: Clone, R, Sh: SharedForm> Clone for GenericSingleFlight<S, R, Sh> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, R, Sh: SharedForm> fmt::Debug for GenericSingleFlight<S, R, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenericSingleFlight")
            .field("inner", &self.inner)
            .field("stages", &self.shared.stages.len())
            .finish_non_exhaustive()
    }
}

impl<S, Req, R, Sh> Service<Req> for GenericSingleFlight<S, R, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    R: RequestReaders<Req>,
    Sh: Share<S::Response> + Serves<Req>,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<Oneshot<S, Req>, Run<Sh::Shared, Leader<S, Req, R, Sh>>, Sh>;

    /// Always ready: the decision (bypass, coalesce, reject) is made in
    /// `call`, and the inner service is driven to readiness by the path
    /// that runs it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &*self.shared;
        let share = shared.share.clone();
        let Some(key) = shared.readers.key(&req) else {
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), None, share);
        };
        let Some(stage) = shared.stages.get(key.stage()) else {
            return ResponseFuture::failed(Box::new(UnknownStage::new(key.stage().clone())), share);
        };
        let share = stage.share.clone();
        let ctl = &stage.ctl;
        ctl.count_request();
        let mode = ctl.mode();
        if mode == Mode::Bypass {
            ctl.count_bypass();
            ctl.count_execution(Path::Bypass);
            let timed = Some(Arc::clone(ctl));
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), timed, share);
        }
        let (at, slices) = match deadline_of(&shared.readers, &req) {
            Ok(d) => d,
            Err(e) => return ResponseFuture::failed(e, share),
        };
        // An outer budget's slices bound each backend call and the work,
        // as the stage's own settings do.
        let coordination = slices.map(|s| s.coordination);
        let bound = match (
            ctl.cfg.execution_timeout,
            slices.and_then(|s| s.of(Phase::Execution)),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The flight's abandon rule comes from the mode in force: other
        // nodes may wait on a distributed flight, so it finishes when its
        // callers leave; a local one is cancelled.
        let on_abandon = if mode.is_distributed() {
            OnAbandon::Finish
        } else {
            OnAbandon::Cancel
        };
        let leader = Leader {
            stage: Arc::clone(stage),
            mode,
            key: key.clone(),
            req,
            inner: self.inner.clone(),
            share: share.clone(),
            coordination,
            bound,
        };
        let caller = Caller::new().deadline(at).on_abandon(on_abandon);
        ResponseFuture::flight(stage.local.run(&key, caller, leader), share)
    }
}

/// The caller's own deadline (the earlier of an outer budget's `Deadline`
/// and the request's inbound timeout), and the outer budget's slices, if
/// there is one. A malformed inbound timeout is an error: the request is
/// rejected, never guessed at.
fn deadline_of<Req, R: RequestReaders<Req>>(
    x: &R,
    req: &Req,
) -> Result<(Option<Instant>, Option<Slices>), BoxError> {
    let outer = x.existing(req);
    let inbound = x.inbound(req)?.map(|d| Instant::now().checked_add(d));
    let at = match (outer.map(|d| d.at()), inbound) {
        (outer, None) => outer,
        // A timeout too long to add to the clock is no deadline.
        (outer, Some(None)) => outer,
        (None, Some(Some(at))) => Some(at),
        (Some(a), Some(Some(b))) => Some(a.min(b)),
    };
    Ok((at, outer.map(|d| *d.slices())))
}
