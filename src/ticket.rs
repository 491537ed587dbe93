//! The ticket that L2 carries instead of the request.
//!
//! L2 consumes the request it is given; the failure table needs it back
//! when L2 fails before running it (HYBRID runs it locally). So L2 gets a
//! [`Ticket`]: the key, and a slot holding the real request. The inner
//! service L2 calls ([`SlotRunner`]) takes the request out of the slot,
//! inserts the owner's fencing token through a [`Fence`], and runs it. When
//! L2 returns an error and the slot still holds the request, the work never
//! ran here.
//!
//! The ticket also records how far L2 got (acquiring, following, owning),
//! through the [`SharedBackend`] wrapper the facade puts around each
//! backend, so a protocol error while *following* another node's flight is
//! treated as a follower-wait failure (never executed at once) and not as a
//! before-acquire failure.
//!
//! A [`Fence`] hands the owner's token to your request type (here a
//! closure; `ExtensionFence` does it for `http::Request`s):
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::{FencingToken, PostcardCodec};
//! use flightdeck::SingleFlightBuilder;
//!
//! struct Job {
//!     id: u64,
//!     generation: Option<u64>,
//! }
//!
//! let stage = StageName::new("jobs").unwrap();
//! let builder = SingleFlightBuilder::new(
//!     move |job: &Job| Some(FlightKey::from_bytes(stage.clone(), job.id.to_le_bytes())),
//!     CloneShare::<String>::new(),
//!     PostcardCodec::<String>::new(),
//! )
//! // The owner's writes downstream carry its generation, so a stale owner's
//! // late write can be refused.
//! .fence(|job: &mut Job, token: FencingToken| job.generation = Some(token.generation));
//! # let _ = builder;
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use flightdeck_breaker::{Outcome, Permit};
use flightdeck_core::error::{BoxError, DeadlineExceeded, ProtocolError};
use flightdeck_core::FlightKey;
use flightdeck_distributed::backend::{
    Acquired, Backend, BackendError, BackendFuture, FencingToken, FlightId, LeaseTerms, OwnerToken,
};
use flightdeck_distributed::FlightRequest;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

/// How the facade reaches into your request type: it puts the owner's
/// [`FencingToken`] into a request before it runs (so the handler can fence
/// its own writes downstream), and reads the request's own deadline.
///
/// Implemented by [`NoFence`] (drops the token, no deadline), by closures
/// `Fn(&mut Req, FencingToken)` (no deadline), and with the `http` feature
/// by [`ExtensionFence`] (inserts the token into `http::Request`
/// extensions; the deadline comes from `grpc-timeout`, `x-request-timeout`
/// and an outer [`Deadline`](flightdeck_budget::Deadline) extension).
/// Implement it for your own type to carry deadlines through a non-HTTP
/// stack.
pub trait Fence<Req>: Clone + Send + Sync + 'static {
    /// Hands `token` to `req`.
    fn fence(&self, req: &mut Req, token: FencingToken);

    /// The instant the caller stops waiting, if it said (`None` by
    /// default). The facade never makes a caller wait past it, never
    /// follows another node's flight past it, and runs the work within what
    /// remains of it (see the [crate docs](crate)). A malformed inbound
    /// timeout is an error (the request is rejected, never guessed at).
    #[inline]
    fn deadline(&self, req: &Req) -> Result<Option<Instant>, BoxError> {
        let _ = req;
        Ok(None)
    }
}

/// Drops fencing tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFence;

impl<Req> Fence<Req> for NoFence {
    fn fence(&self, _req: &mut Req, _token: FencingToken) {}
}

impl<Req, F> Fence<Req> for F
where
    F: Fn(&mut Req, FencingToken) + Clone + Send + Sync + 'static,
{
    fn fence(&self, req: &mut Req, token: FencingToken) {
        self(req, token);
    }
}

/// Inserts the [`FencingToken`] into an `http::Request`'s extensions.
#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtensionFence;

#[cfg(feature = "http")]
impl<B> Fence<http::Request<B>> for ExtensionFence {
    fn fence(&self, req: &mut http::Request<B>, token: FencingToken) {
        req.extensions_mut().insert(token);
    }

    /// The smaller of `grpc-timeout` and `x-request-timeout` (from now),
    /// and an outer [`Deadline`](flightdeck_budget::Deadline) extension
    /// (set by a `BudgetLayer` around the facade).
    fn deadline(&self, req: &http::Request<B>) -> Result<Option<Instant>, BoxError> {
        use flightdeck_budget::{Deadline, FromHeaders, Inbound};

        let outer = req.extensions().get::<Deadline>().map(Deadline::at);
        let inbound = FromHeaders::new().inbound(req)?;
        Ok(match inbound {
            None => outer,
            Some(d) => Some(crate::service::earliest(crate::service::after(d), outer)),
        })
    }
}

const ACQUIRING: u8 = 0;
const FOLLOWING: u8 = 1;
const OWNING: u8 = 2;

/// How far L2 got with one ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No acquire has answered yet (or the answer was a hit).
    Acquiring,
    /// An acquire answered "another node owns it".
    Following,
    /// This node owns the flight (the fencing token was handed out).
    Owning,
}

/// The part of a ticket the backend wrapper can see (not generic over the
/// request type, so it can live in a task-local).
#[derive(Default)]
pub(crate) struct Progress {
    phase: AtomicU8,
    fence: Mutex<Option<FencingToken>>,
    // The breaker's permit, recorded by the first acquire's answer: the
    // breaker judges the backend by that round trip, not by how long the
    // work takes (a half-open probe must not outlive its probe timeout
    // because the work is slow).
    permit: Mutex<Option<Permit>>,
}

impl Progress {
    pub(crate) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            FOLLOWING => Phase::Following,
            OWNING => Phase::Owning,
            _ => Phase::Acquiring,
        }
    }

    pub(crate) fn set_permit(&self, permit: Option<Permit>) {
        *self.permit.lock().unwrap_or_else(PoisonError::into_inner) = permit;
    }

    /// The permit, if no acquire has answered yet.
    pub(crate) fn take_permit(&self) -> Option<Permit> {
        self.permit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Records the first acquire's answer with the breaker.
    fn answered<T>(&self, res: &Result<T, BackendError>) {
        if let Some(permit) = self.take_permit() {
            permit.record(match res {
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Failure,
            });
        }
    }

    fn following(&self) {
        let _ =
            self.phase
                .compare_exchange(ACQUIRING, FOLLOWING, Ordering::AcqRel, Ordering::Acquire);
    }
}

tokio::task_local! {
    /// The progress of the flight being coordinated by the current task.
    pub(crate) static PROGRESS: Arc<Progress>;
}

/// The request L2 sees: the key, and a slot with the real request.
pub struct Ticket<Req> {
    key: FlightKey,
    slot: Arc<Mutex<Option<Req>>>,
    progress: Arc<Progress>,
}

impl<Req> Ticket<Req> {
    pub(crate) fn new(key: FlightKey, req: Req) -> Self {
        Self {
            key,
            slot: Arc::new(Mutex::new(Some(req))),
            progress: Arc::new(Progress::default()),
        }
    }

    /// The flight key.
    pub fn key(&self) -> &FlightKey {
        &self.key
    }

    /// A second handle on the same slot (kept by the facade to get the
    /// request back).
    pub(crate) fn share(&self) -> Self {
        Self {
            key: self.key.clone(),
            slot: Arc::clone(&self.slot),
            progress: Arc::clone(&self.progress),
        }
    }

    pub(crate) fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Takes the request back, if L2 did not run it.
    pub(crate) fn take(&self) -> Option<Req> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl<Req> fmt::Debug for Ticket<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.key)
            .field("phase", &self.progress.phase())
            .finish_non_exhaustive()
    }
}

/// L2's key extractor for tickets: the key is the ticket's; the fencing
/// token is kept in the ticket until the request is taken out.
#[derive(Debug, Clone, Copy, Default)]
pub struct TicketKeys;

impl<Req: Send + 'static> FlightRequest<Ticket<Req>> for TicketKeys {
    fn key(&self, req: &Ticket<Req>) -> Option<FlightKey> {
        Some(req.key.clone())
    }

    fn fence(&self, req: &mut Ticket<Req>, token: FencingToken) {
        req.progress.phase.store(OWNING, Ordering::Release);
        *req.progress
            .fence
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(token);
    }
}

/// The inner service handed to L2: takes the request out of the ticket,
/// fences it, and runs it on the real (bulkheaded) service within the
/// execution slice.
#[derive(Clone, Debug)]
pub struct SlotRunner<E, F> {
    pub(crate) exec: E,
    pub(crate) fence: F,
    pub(crate) slice: crate::service::ExecSlice,
}

impl<E, F, Req> Service<Ticket<Req>> for SlotRunner<E, F>
where
    E: Service<Req>,
    E::Error: Into<BoxError>,
    F: Fence<Req>,
{
    type Response = E::Response;
    type Error = BoxError;
    type Future = SlotFuture<E::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.exec.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, ticket: Ticket<Req>) -> Self::Future {
        let Some(mut req) = ticket.take() else {
            return SlotFuture::gone(Box::new(ProtocolError::new(
                "the request of this flight was already taken",
            )));
        };
        let token = ticket
            .progress
            .fence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(token) = token {
            self.fence.fence(&mut req, token);
        }
        match self.slice.end() {
            // No time left: the work is not started (the owner abandons).
            Some(end) if end <= Instant::now() => {
                SlotFuture::gone(Box::new(DeadlineExceeded::new("execution")))
            }
            Some(end) => SlotFuture::bounded(self.exec.call(req), end),
            None => SlotFuture::running(self.exec.call(req)),
        }
    }
}

pin_project! {
    /// Future of [`SlotRunner`].
    pub struct SlotFuture<F> {
        #[pin]
        state: SlotState<F>,
    }
}

pin_project! {
    #[project = SlotProj]
    enum SlotState<F> {
        Running { #[pin] fut: F },
        // Within the execution slice.
        Bounded { #[pin] fut: F, #[pin] sleep: Sleep },
        // The request was gone (L2 called its inner service twice).
        Gone { err: Option<BoxError> },
    }
}

impl<F> SlotFuture<F> {
    fn running(fut: F) -> Self {
        Self {
            state: SlotState::Running { fut },
        }
    }

    fn bounded(fut: F, end: Instant) -> Self {
        Self {
            state: SlotState::Bounded {
                fut,
                sleep: tokio::time::sleep_until(end),
            },
        }
    }

    fn gone(err: BoxError) -> Self {
        Self {
            state: SlotState::Gone { err: Some(err) },
        }
    }
}

impl<F> fmt::Debug for SlotFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SlotFuture")
    }
}

impl<F, T, E> Future for SlotFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            SlotProj::Running { fut } => fut.poll(cx).map_err(Into::into),
            SlotProj::Bounded { fut, sleep } => {
                if let Poll::Ready(out) = fut.poll(cx) {
                    return Poll::Ready(out.map_err(Into::into));
                }
                match sleep.poll(cx) {
                    Poll::Ready(()) => {
                        Poll::Ready(Err(Box::new(DeadlineExceeded::new("execution"))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            SlotProj::Gone { err } => Poll::Ready(Err(err
                .take()
                .unwrap_or_else(|| Box::new(ProtocolError::new("polled after completion"))))),
        }
    }
}

/// A stage's coordination backend, type-erased so that stages of one layer
/// can use different backends (two Redis deployments, or Redis and an
/// in-memory one). It also notes, for the flight being coordinated, when an
/// acquire answered "follower".
#[derive(Clone)]
pub struct SharedBackend {
    inner: Arc<dyn Backend>,
}

impl SharedBackend {
    /// Wraps a backend.
    pub fn new(backend: impl Backend) -> Self {
        Self {
            inner: Arc::new(backend),
        }
    }
}

impl fmt::Debug for SharedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedBackend")
    }
}

impl Backend for SharedBackend {
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        let fut = self.inner.acquire(flight, token, terms);
        Box::pin(async move {
            let res = fut.await;
            let _outside_a_flight = PROGRESS.try_with(|p| {
                p.answered(&res);
                if let Ok(Acquired::Follower { .. } | Acquired::Expired { .. }) = &res {
                    p.following();
                }
            });
            res
        })
    }

    flightdeck_distributed::forward_backend!(inner => heartbeat, commit, abandon, subscribe, invalidate);
}
