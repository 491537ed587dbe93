//! The real execution of a stage's inner service: behind the stage's
//! bulkhead (and its degraded lane too, for a flight whose shard is
//! degraded), within its execution slice, counted and timed once per
//! execution the bulkhead admitted (`singleflight_execution_total{path}`,
//! `singleflight_execution_duration`).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck_core::error::{BoxError, DeadlineExceeded};
use flightdeck_core::stale::{ErrorFailures, Failures};
use flightdeck_core::{FlightKey, Serves, Share, Shareable};
use flightdeck_distributed::{Execute, FlightId, KeptEnd, KeptHere, RefreshMark, Role};
use pin_project_lite::pin_project;
use tokio::time::timeout;
use tokio::time::Instant;
use tower::util::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::fallback::{Here, Why};
use crate::kept::Kept;
use crate::layer::StageShare;
use crate::leader::{Lead, Record};
use crate::readers::RequestReaders;
use crate::stage::{Control, Path, Stage};

/// A request's execution: the stage (whose readers hand the owner's token
/// to the request), the inner service, how responses are shared, and the
/// bound of the execution slice.
pub(crate) struct InnerCall<S, R, Sh: flightdeck_core::SharedForm> {
    pub(crate) stage: Arc<Stage<R, Sh>>,
    pub(crate) inner: S,
    pub(crate) share: Sh,
    /// The stage's `execution-timeout`, or an outer budget's execution
    /// slice, whichever is shorter.
    pub(crate) bound: Option<Duration>,
    /// The flight, when it is coordinated over a sharded backend: while
    /// its shard is degraded, it runs through the bulkhead's degraded lane.
    pub(crate) flight: Option<FlightId>,
    /// The key of a coordinated flight of a stage that keeps its results:
    /// what it runs as the owner becomes this node's copy, also when L2
    /// runs it in the background (a refresh, the work past a soft
    /// timeout) while its caller was answered a stale result.
    pub(crate) key: Option<FlightKey>,
    /// Why a run on the local fallback path runs here, as the flight's
    /// fallback decided: the store down (the copy may answer its failure
    /// as `redis_down`), up but of no use (a ramp held it back, or its
    /// answer could not be read: as any failure), or the store answered
    /// the flight and a failed wait sent it here
    /// (`on-wait-failure = local`): no note for the copy (the store
    /// judges).
    /// (Not told: the store down. Shared with the fallback only for a
    /// launched flight: LOCAL_ONLY and a refused flight allocate nothing.)
    pub(crate) why: Why,
}

impl<S, R, Sh: flightdeck_core::SharedForm> InnerCall<S, R, Sh> {
    /// Runs `req` here, on `path`: behind the bulkhead, within the bound,
    /// its response shared (and what a shared result needs of the request
    /// recorded, for the callers it will be handed to).
    // Not an `async fn`: one moves its arguments from the future's upvars
    // into locals of their own when first polled, so the future holds the
    // call and the request twice (552 bytes more for an HTTP request) and
    // copies them once more. The block uses its captures in place.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run<Req>(
        self,
        req: Req,
        path: Path,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>>
    where
        S: Service<Req> + Clone + Send,
        S::Error: Into<BoxError>,
        S::Future: Send,
        Sh: Share<S::Response> + Serves<Req>,
        Req: Send,
    {
        async move {
            let leader = self.share.leader(&req);
            // A stage that keeps its results notes a fallback run's end, and
            // whether the store was down: its callers' copy may answer its
            // failure, as while the store is degraded.
            let fell_back = match (&self.key, &self.stage.stale, path) {
                (Some(key), Some(setup), Path::Fallback) => match self.why.get() {
                    Here::StoreAnswered => None,
                    why => Some((key.clone(), setup.kept.clone(), why == Here::StoreDown)),
                },
                _ => None,
            };
            let _noted = fell_back.map(|(key, kept, down)| {
                kept.begin_fallback(&key, down);
                NoteFallback { key, kept, down }
            });
            // The stage's control lent, not shared: this future holds the
            // stage, and a count on it would be one more atomic write to a
            // line every request's core takes in turn.
            let mut timed = Timed {
                inner: self.inner,
                ctl: &self.stage.ctl,
                path,
            };
            let degraded = self
                .flight
                .is_some_and(|f| self.stage.ctl.in_degraded_shard(&f));
            let resp = if degraded {
                // The degraded lane's call is boxed: the common path's future
                // does not grow by it.
                let call = Box::pin(
                    self.stage
                        .lane
                        .layer(self.stage.bulkhead.layer(timed))
                        .oneshot(req),
                );
                match self.bound {
                    None => call.await?,
                    Some(bound) => timeout(bound, call).await.map_err(|_| out_of_time())??,
                }
            } else {
                let call = async {
                    poll_fn(|cx| timed.poll_ready(cx))
                        .await
                        .map_err(Into::into)?;
                    // The slot lent by the stage's bulkhead, which this future
                    // holds, as the control above: a service of the bulkhead
                    // and its permit would each take a count on its state.
                    // The service is built only when the fast path says no
                    // (full, a queue, a rate limit), to queue, limit or reject.
                    match self.stage.bulkhead.try_slot() {
                        Some(_slot) => timed.call(req).await.map_err(Into::into),
                        None => Box::pin(self.stage.bulkhead.layer(timed).oneshot(req)).await,
                    }
                };
                match self.bound {
                    None => call.await?,
                    Some(bound) => timeout(bound, call).await.map_err(|_| out_of_time())??,
                }
            };
            let out = match self.share.share(resp).await? {
                Shareable::Shared(v) => Shareable::Shared(self.share.record(v, leader)),
                unshared => unshared,
            };
            if path == Path::Fallback {
                // Its callers are told it was coordinated here alone.
                self.why.ran_here();
            }
            Ok(out)
        }
    }
}

/// Notes a fallback run's end (see [`Kept::end_fallback`]) when dropped:
/// done, failed or cancelled.
struct NoteFallback<V: Clone> {
    key: FlightKey,
    kept: Arc<Kept<V>>,
    /// The store was down (not only unasked).
    down: bool,
}

impl<V: Clone> Drop for NoteFallback<V> {
    fn drop(&mut self) {
        self.kept.end_fallback(&self.key, self.down);
    }
}

/// The execution slice ran out.
fn out_of_time() -> DeadlineExceeded {
    DeadlineExceeded::new("execution")
}

impl<S, Req, R, Sh> Execute<Req> for InnerCall<S, R, Sh>
where
    S: Service<Req> + Clone + Send,
    S::Error: Into<BoxError>,
    S::Future: Send,
    Sh: Share<S::Response> + Serves<Req> + StageShare,
    R: RequestReaders<Req>,
    Req: Send,
{
    type Shared = Sh::Shared;
    type Output = Sh::Output;

    fn execute(
        self,
        mut req: Req,
        role: Role,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send {
        let path = match role {
            Role::Owner(token) => {
                self.stage.readers.fence(&mut req, token);
                Path::Owner
            }
            Role::Fallback => Path::Fallback,
            _ => Path::Local,
        };
        // What it runs is kept from its work's start (the copy orders
        // results so), not from its flight's: a follower's run in the
        // local fallback may start after the owner's on this node.
        let record = match (&self.key, path) {
            (Some(key), Path::Owner | Path::Fallback) => Record::start(&self.stage, key, 0),
            _ => None,
        };
        Lead::Here {
            fut: self.run(req, path),
            record,
        }
    }

    fn serves(&self, shared: &Sh::Shared, req: &Req) -> bool {
        self.share.serves(shared, req)
    }

    /// The stage's judge of failures (`stale-if-error`), when it keeps
    /// results.
    fn failures(&self) -> Arc<dyn Failures<Sh::Shared>> {
        match &self.stage.stale {
            Some(setup) => Arc::clone(&setup.failures),
            None => Arc::new(ErrorFailures),
        }
    }

    /// This node's copy of the key, when the stage keeps results: a stale
    /// answer from the store never goes back past it.
    fn kept_here(&self) -> Option<KeptHere<Sh::Shared>> {
        let (key, setup) = (self.key.as_ref()?, self.stage.stale.as_ref()?);
        setup.kept.here(key)
    }

    /// When this node's copy of the key ended, asked again while a kept
    /// result stands by.
    fn kept_end(&self) -> Option<KeptEnd> {
        let (key, setup) = (self.key.clone()?, self.stage.stale.as_ref()?);
        let kept = Arc::clone(&setup.kept);
        Some(KeptEnd::new(move || kept.ended(&key)))
    }

    /// A refresh the store granted marks this node's copy while it runs:
    /// the node starts none of its own meanwhile, whatever its mode now.
    fn refresh_mark(&self) -> Option<RefreshMark> {
        let (key, setup) = (self.key.as_ref()?, self.stage.stale.as_ref()?);
        Some(RefreshMark::new(setup.kept.mark_refresh(key)))
    }
}

/// The inner service, counted and timed when the bulkhead lets a call
/// through (a rejected call is not an execution).
#[derive(Clone)]
pub(crate) struct Timed<'a, S> {
    pub(crate) inner: S,
    pub(crate) ctl: &'a Control,
    pub(crate) path: Path,
}

impl<'a, S, Req> Service<Req> for Timed<'a, S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TimedFuture<'a, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    // Inline: out of line, it costs every request ~36 instructions
    // (callgrind, `mode_overhead`), which codegen chose by a change
    // elsewhere in this module.
    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        // Timed only when a recorder records executions' durations: under
        // none (the no-op recorder), no clock read and no handle held.
        let timed = self.ctl.count_execution(self.path);
        TimedFuture {
            fut: self.inner.call(req),
            timed: timed.then(|| (self.ctl, Instant::now())),
        }
    }
}

pin_project! {
    /// Records the execution's duration when it ends (when its start was
    /// read: a recorder records durations).
    pub(crate) struct TimedFuture<'a, F> {
        #[pin]
        fut: F,
        timed: Option<(&'a Control, Instant)>,
    }
}

impl<F: Future> Future for TimedFuture<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.fut.poll(cx));
        if let Some((ctl, started)) = this.timed.take() {
            ctl.record_execution(started.elapsed());
        }
        Poll::Ready(out)
    }
}
