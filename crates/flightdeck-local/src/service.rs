use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use flightdeck_core::{
    BoxError, FlightKey, KeySource, Serves, Share, Shareable, SharedForm, Unshareable,
};
use pin_project_lite::pin_project;
use tower::util::ServiceExt;
use tower_service::Service;
use tracing::Instrument;

use crate::flights::{Caller, FlightWork, LocalFlights};
use crate::future::ResponseFuture;
use crate::group::completion::Completion;
use crate::group::detach::Work;
use crate::group::slot::Join;
use crate::run::{leader_span, outcome, Run};

/// The service built by [`LocalFlightLayer`](crate::LocalFlightLayer).
///
/// Readiness is passed through: `poll_ready` polls the inner service, and
/// the ready service runs the flight a call leads. A call that joins
/// another flight waits without holding a reservation (it keeps an unready
/// clone, in case it must run its own request).
pub struct LocalFlight<S, K, Sh: SharedForm> {
    inner: S,
    keys: K,
    share: Sh,
    flights: LocalFlights<Sh::Shared>,
}

impl<S, K, Sh: SharedForm> LocalFlight<S, K, Sh> {
    pub(crate) fn from_parts(
        inner: S,
        keys: K,
        share: Sh,
        flights: LocalFlights<Sh::Shared>,
    ) -> Self {
        Self {
            inner,
            keys,
            share,
            flights,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone, Sh: SharedForm> Clone for LocalFlight<S, K, Sh> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
            share: self.share.clone(),
            flights: self.flights.clone(),
        }
    }
}

impl<S: fmt::Debug, K, Sh: SharedForm + fmt::Debug> fmt::Debug for LocalFlight<S, K, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFlight")
            .field("inner", &self.inner)
            .field("share", &self.share)
            .finish_non_exhaustive()
    }
}

impl<S, K, Sh, Req> Service<Req> for LocalFlight<S, K, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    K: KeySource<Req>,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Sh>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(key) = self.keys.key(&req) else {
            return ResponseFuture::bypass(self.inner.call(req), self.share.clone());
        };
        // The ready service goes with the request; an unready clone takes
        // its place (tower-service's "be careful when cloning inner
        // services").
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        let share = self.share.clone();
        // `LocalFlights::run`, with the leader's work built here once the
        // lookup made this call the leader: the request moves once, into
        // the inner service's call, instead of into a `ServiceWork`, the
        // closure that leads it and the call (a request with drop glue,
        // such as a key's, is copied whole at each move).
        let caller = Caller::new();
        let group = &self.flights.group;
        // The completion is built where the lookup made this call the
        // leader, as its answer: the leader's name, handles and generation,
        // carried through the answer into a completion and then into the
        // work's allocation, were stored and loaded once more each way.
        let joined = group.join_with(&key, caller, |leader| {
            let replays = !group.policy.replay_ttl.is_zero();
            Completion::new(Arc::clone(group), leader, replays)
        });
        let run = match joined {
            Join::Leader((completion, expired)) => {
                // The rest of `arm_leader`: counted once armed, then the
                // result it replaced dropped.
                completion.started();
                drop(expired);
                // Built once its allocation is made, to be written there
                // (see `Work::fill`).
                let work = match leader_span(&key) {
                    None => {
                        let cell = Work::cell();
                        let fut = outcome(lead(svc, req, share));
                        Work::fill(cell, completion, fut, caller.deadline)
                    }
                    Some(span) => {
                        let cell = Work::cell();
                        let fut = outcome(lead(svc, req, share)).instrument(span);
                        Work::fill(cell, completion, fut, caller.deadline)
                    }
                };
                Run::led(work)
            }
            joined => Run::joined(group, &key, caller, joined, ServiceWork { svc, req, share }),
        };
        ResponseFuture::flight(run, self.share.clone())
    }
}

/// A call of the inner service as a flight's work.
pub struct ServiceWork<S, Req, Sh> {
    svc: S,
    req: Req,
    share: Sh,
}

impl<S, Req, Sh> FlightWork<Sh::Shared> for ServiceWork<S, Req, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Sh: Share<S::Response> + Serves<Req>,
    Req: Send + 'static,
{
    type Output = Sh::Output;

    fn lead(
        self,
        _key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let Self { svc, req, share } = self;
        lead(svc, req, share)
    }

    fn alone(
        self,
        _key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let Self { svc, req, share } = self;
        let fut = svc.oneshot(req);
        async move {
            let resp = fut.await.map_err(Into::into)?;
            Ok(Shareable::Unshared(
                share.passthrough(resp),
                Unshareable::Other("alone"),
            ))
        }
    }

    fn waiting(&mut self) {
        // The ready service's reservation is not held while waiting.
        self.svc = self.svc.clone();
    }

    fn serves(&self, shared: &Sh::Shared) -> bool {
        self.share.serves(shared, &self.req)
    }
}

/// The leader's run of the inner service: `svc`, polled ready, is called
/// at once, as tower expects.
#[inline(always)]
fn lead<S, Req, Sh>(mut svc: S, req: Req, share: Sh) -> Lead<S::Future, Sh, Req, S::Response>
where
    S: Service<Req>,
    Sh: Share<S::Response> + Serves<Req>,
{
    let leader = share.leader(&req);
    let fut = svc.call(req);
    Lead {
        step: Step::Call { fut },
        share,
        leader: Some(leader),
        _req: PhantomData,
    }
}

pin_project! {
    /// The leader's run of the inner service: its call, then the sharing
    /// step. A plain future rather than an `async` block, so that its poll
    /// inlines into the flight's instead of costing every flight a call
    /// of its own.
    struct Lead<Fut, Sh, Req, T>
    where
        Sh: Share<T>,
        Sh: Serves<Req>,
    {
        #[pin]
        step: Step<Fut, <Sh as Share<T>>::Future>,
        share: Sh,
        leader: Option<<Sh as Serves<Req>>::Leader>,
        _req: PhantomData<fn() -> (Req, T)>,
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<Fut, ShFut> {
        Call { #[pin] fut: Fut },
        Share { #[pin] fut: ShFut },
        Done,
    }
}

impl<Fut, E, Sh, Req, T> Future for Lead<Fut, Sh, Req, T>
where
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    Sh: Share<T> + Serves<Req>,
{
    type Output = Result<Shareable<Sh::Shared, <Sh as Share<T>>::Output>, BoxError>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.step.as_mut().project() {
                StepProj::Call { fut } => {
                    // Converted at once: `S::Error` need not be `Send`,
                    // `BoxError` is.
                    let resp = match ready!(fut.poll(cx)) {
                        Ok(resp) => resp,
                        Err(e) => {
                            this.step.set(Step::Done);
                            return Poll::Ready(Err(e.into()));
                        }
                    };
                    let fut = this.share.share(resp);
                    this.step.set(Step::Share { fut });
                }
                StepProj::Share { fut } => {
                    let shared = ready!(fut.poll(cx));
                    this.step.set(Step::Done);
                    return Poll::Ready(shared.map(|shared| match shared {
                        Shareable::Shared(v) => match this.leader.take() {
                            Some(leader) => Shareable::Shared(this.share.record(v, leader)),
                            None => Shareable::Shared(v),
                        },
                        unshared => unshared,
                    }));
                }
                StepProj::Done => panic!("the leader's work was polled after it completed"),
            }
        }
    }
}

impl<S, Req, Sh> fmt::Debug for ServiceWork<S, Req, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServiceWork")
    }
}
