//! How L2 runs the request of a flight: [`Execute`] (the caller's side of
//! the work: the service, sharing the response) and [`Fence`] (handing the
//! owner's fencing token to the request).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use flightdeck_core::error::BoxError;
use flightdeck_core::stale::{ErrorFailures, Failures};
use flightdeck_core::Shareable;

use crate::backend::FencingToken;

/// Why L2 runs a request here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// This node owns the flight with this token: the result is committed
    /// for the other nodes.
    Owner(FencingToken),
    /// The local fallback path: the
    /// [`Fallback`](crate::fallback::Fallback) said
    /// [`RunHere`](crate::fallback::Verdict::RunHere), so the request runs
    /// here without coordination and its result is not stored.
    Fallback,
    /// A stored result does not serve this request (HTTP's `Vary`): it runs
    /// its own, uncoordinated.
    Unserved,
}

/// The work of a flight as L2 sees it: run a request and turn its response
/// into the shared form (or leave it unshared), and tell whether a stored
/// result serves a request.
pub trait Execute<Req>: Send {
    /// The shared form of a result (what the codec stores).
    type Shared: Clone + Send + Sync + 'static;
    /// What a caller gets of a result that was not shared.
    type Output: Send + 'static;

    /// Runs `req` in `role` (an owner fences its request with its token).
    /// A flight runs its request at most once, so this consumes the work.
    fn execute(
        self,
        req: Req,
        role: Role,
    ) -> impl Future<Output = Result<Shareable<Self::Shared, Self::Output>, BoxError>> + Send;

    /// Whether a result stored by another node may serve `req`.
    fn serves(&self, shared: &Self::Shared, req: &Req) -> bool {
        let _ = (shared, req);
        true
    }

    /// Which outcomes of the work a stale result may answer for
    /// (`stale-if-error`, see [`DistributedPolicy::stale_windows`]), asked
    /// before the work runs when a stale result stands by. By default
    /// [`ErrorFailures`]: errors whose class says the work could not be
    /// done now; every value is an answer.
    ///
    /// [`DistributedPolicy::stale_windows`]: crate::DistributedPolicy::stale_windows
    fn failures(&self) -> Arc<dyn Failures<Self::Shared>> {
        Arc::new(ErrorFailures)
    }

    /// This node's own copy of the key's result, if it keeps one (see
    /// [`KeptHere`]). When a stale result would answer, the copy answers
    /// instead unless the store's kept result's work started after the
    /// copy's ended: a node never answers a result older than one it gave
    /// already. Once the copy went (expired or evicted) while a result of
    /// older work may still answer from the store, what remains of it
    /// (when it ended) keeps that older result from answering stale. By
    /// default none.
    fn kept_here(&self) -> Option<KeptHere<Self::Shared>> {
        None
    }

    /// When this node's copy of the key ended, asked again later: a kept
    /// result standing by for a flight's work (`stale-if-error`,
    /// `soft-timeout`) answers only if no copy of newer work came meanwhile
    /// (this node's own refresh may commit while its followers wait). By
    /// default none: nothing is asked again.
    fn kept_end(&self) -> Option<KeptEnd> {
        None
    }

    /// Asked when this flight's work is about to run as a refresh of a
    /// kept result (the store granted it past the result's freshness, or
    /// near its end): what it returns is held until the refresh ends. A
    /// node that keeps copies marks its copy with it, so that it starts no
    /// refresh of its own meanwhile (after a switch to `local-only`, its
    /// callers no longer ask the store, which granted this one). By
    /// default nothing.
    fn refresh_mark(&self) -> Option<RefreshMark> {
        None
    }
}

/// Held while a refresh granted by the store runs on this node (see
/// [`Execute::refresh_mark`]); what it holds is dropped when the refresh
/// ends.
pub struct RefreshMark {
    _held: Box<dyn Send>,
}

impl RefreshMark {
    /// Holds `held` until the refresh ends.
    pub fn new(held: impl Send + 'static) -> Self {
        Self {
            _held: Box::new(held),
        }
    }
}

impl std::fmt::Debug for RefreshMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefreshMark")
    }
}

/// When a node's copy of a key ended ([`Execute::kept_end`]), asked at any
/// time: the end of the work of the copy, or, once it went, of what
/// remains of it (see [`KeptHere::gone`]); `None` when there is neither.
#[derive(Clone)]
pub struct KeptEnd(Arc<dyn Fn() -> Option<Instant> + Send + Sync>);

impl KeptEnd {
    /// Asks `ended` each time.
    pub fn new(ended: impl Fn() -> Option<Instant> + Send + Sync + 'static) -> Self {
        Self(Arc::new(ended))
    }

    /// When the copy's work ended, as of now.
    pub fn now(&self) -> Option<Instant> {
        (self.0)()
    }
}

impl std::fmt::Debug for KeptEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeptEnd").field(&self.now()).finish()
    }
}

/// A node's own copy of a key's result, as [`Execute::kept_here`] tells
/// it: the copy while it may still answer, when the work that produced it
/// ended, by this node's clock, and how long it took (a copy standing in
/// for the store's result is told with it). The copy is dated by its end:
/// the time its work took, as a node measures it, may include its flight's
/// store calls, which would date it too early.
#[derive(Clone, Debug)]
pub struct KeptHere<T> {
    value: Option<T>,
    ended: Duration,
    took: Duration,
}

impl<T> KeptHere<T> {
    /// The copy `value`, of work that ended `ended` ago and took `took`.
    pub fn copy(value: T, ended: Duration, took: Duration) -> Self {
        Self {
            value: Some(value),
            ended,
            took,
        }
    }

    /// No copy any more, but the node gave a result of work that ended
    /// `ended` ago (its copy expired, was evicted, or was too large to
    /// keep): no stale result of work that started before then answers.
    pub fn gone(ended: Duration) -> Self {
        Self {
            value: None,
            ended,
            took: Duration::ZERO,
        }
    }

    /// The copy, if it may still answer.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// How long ago the work that produced it ended.
    pub fn ended(&self) -> Duration {
        self.ended
    }

    /// How long the work that produced it took.
    pub fn took(&self) -> Duration {
        self.took
    }

    /// The copy lent: `KeptHere<&T>`.
    pub fn as_ref(&self) -> KeptHere<&T> {
        KeptHere {
            value: self.value.as_ref(),
            ended: self.ended,
            took: self.took,
        }
    }

    /// Its parts: the copy, if any, when its work ended, and how long it
    /// took.
    pub(crate) fn into_parts(self) -> (Option<T>, Duration, Duration) {
        (self.value, self.ended, self.took)
    }
}

/// Hands the owner's [`FencingToken`] to its request, so the handler can
/// fence its own writes downstream (refuse a write carrying a lower
/// generation than one already seen).
///
/// Implemented by [`NoFence`] (drops the token), by closures
/// `Fn(&mut Req, FencingToken)`, and with the `http` feature by
/// [`ExtensionFence`] (the token goes into the `http::Request`'s
/// extensions).
pub trait Fence<Req>: Clone + Send + Sync + 'static {
    /// Hands `token` to `req`.
    fn fence(&self, req: &mut Req, token: FencingToken);
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
}
