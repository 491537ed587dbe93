//! Sharing one result with many waiters.
//!
//! A flight runs once and many callers receive its result, but responses are
//! rarely `Clone` (an `http::Response` owns a body stream). A [`Share`]
//! adapter turns the one response into a cheap-to-clone shared form and back.
//!
//! - [`CloneShare`] is for values that are already `Clone` (wrap big ones in
//!   an `Arc`).
//! - `HttpShare` (feature `http`) buffers status, headers, body bytes and
//!   trailers up to a cap, and declares streaming or oversize responses
//!   [`Shareable::Unshared`]: the caller that started the flight gets its
//!   response untouched, and the waiters run the service themselves. It
//!   also refuses what HTTP forbids sharing (`Set-Cookie`, `Cache-Control:
//!   private`, `no-store`, `no-cache`, `Vary: *`) and implements `Vary`
//!   through [`Serves`].
//!
//! The order of calls a coalescing layer makes, for one flight:
//!
//! 1. [`Serves::leader`] on the leader's request, before it is consumed;
//! 2. [`Share::share`] on the response: either [`Shareable::Unshared`] (the
//!    leader gets the output it carries, every other caller runs its own
//!    request, nothing is stored), or the shared form;
//! 3. [`Serves::record`] with the snapshot of step 1, before the shared
//!    form is handed to anyone or stored;
//! 4. [`Share::restore_leader`] for the leader's own copy;
//! 5. for each other request (a waiter, a local replay, a result read from
//!    the backend): [`Serves::serves`], then [`Share::restore`] if it
//!    serves, or the request runs its own if not.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::marker::PhantomData;

use crate::error::BoxError;

/// The result of trying to share a response.
#[derive(Debug)]
pub enum Shareable<S, O> {
    /// The response was turned into its shared form.
    Shared(S),
    /// The response cannot be shared (streaming, too large, or meant for
    /// its caller alone). It is handed, intact, to the caller that started
    /// the flight; waiters run their own request, and nothing is stored.
    Unshared(O, Unshareable),
}

/// Why a response was not shared (the `reason` label of
/// `singleflight_local_unshared_total`).
///
/// ```
/// use flightdeck_core::Unshareable;
///
/// assert_eq!(Unshareable::SetCookie.as_str(), "set_cookie");
/// assert_eq!(Unshareable::Other("custom").as_str(), "custom");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unshareable {
    /// A stream (`text/event-stream`, no known length, a partial response).
    Stream,
    /// A body over the sharing cap.
    Oversize,
    /// The response sets a cookie (`Set-Cookie`): meant for its caller.
    SetCookie,
    /// `Cache-Control: private`, `no-store` or `no-cache`.
    CacheControl,
    /// `Vary: *`: no other request can be known to match.
    VaryStar,
    /// A waiter's request differs from the leader's in a header the
    /// response varies on (`Vary`): the waiter runs its own request.
    Vary,
    /// A reason of an adapter of your own.
    Other(&'static str),
}

impl Unshareable {
    /// The label value (`stream`, `oversize`, `set_cookie`,
    /// `cache_control`, `vary_star`, `vary`, or yours).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Oversize => "oversize",
            Self::SetCookie => "set_cookie",
            Self::CacheControl => "cache_control",
            Self::VaryStar => "vary_star",
            Self::Vary => "vary",
            Self::Other(reason) => reason,
        }
    }
}

impl fmt::Display for Unshareable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cheap-to-clone form a [`Share`] adapter produces.
///
/// It is separate from [`Share`] because coalescing layers create their
/// state (the in-flight map holding shared results) when the layer is
/// built, before they know the response type of the service they wrap.
pub trait SharedForm: Clone + Send + Sync + 'static {
    /// The cheap-to-clone form handed to every waiter.
    type Shared: Clone + Send + Sync + 'static;
}

/// Turns a service's response into a cheap-to-clone shared form and back.
///
/// `Output` is what the coalescing layer returns to its callers: the same
/// type for every caller, whether it got a shared copy, its own response,
/// or the leader's unshared original.
pub trait Share<T>: SharedForm {
    /// What callers of the layer receive.
    type Output: Send + 'static;
    /// Converting may need to read a body, so it is asynchronous.
    type Future: Future<Output = Result<Shareable<Self::Shared, Self::Output>, BoxError>>
        + Send
        + 'static;

    /// Converts the one response into its shared form, or declares it
    /// unshareable (handing back the output for the leader).
    fn share(&self, value: T) -> Self::Future;

    /// Rebuilds an output for one waiter from the shared form.
    ///
    /// This is the copy for everyone but the leader: waiters, local
    /// replays, results replayed from another node.
    fn restore(&self, shared: &Self::Shared) -> Self::Output;

    /// Rebuilds the output of the leader: the one caller whose own request
    /// produced the shared form.
    ///
    /// The same as [`restore`](Self::restore) unless the adapter keeps
    /// parts of the response for the leader alone. `HttpShare` with
    /// `SetCookie::Strip` does: the shared form holds the leader's
    /// `Set-Cookie` values apart, `restore` never returns them, this does.
    /// Coalescing layers call it for the leader's own copy and for no one
    /// else.
    fn restore_leader(&self, shared: &Self::Shared) -> Self::Output {
        self.restore(shared)
    }

    /// [`restore_leader`](Self::restore_leader) from the leader's own
    /// handle on the shared form, which the caller gives up: an adapter
    /// may move out of it what no one else holds (no waiter joined, no
    /// replay kept it) instead of copying it. The same output either way.
    fn restore_leader_owned(&self, shared: Self::Shared) -> Self::Output {
        self.restore_leader(&shared)
    }

    /// Wraps a response that was never shared (a bypassed request, or a
    /// waiter that ran the service itself).
    fn passthrough(&self, value: T) -> Self::Output;
}

/// Which requests a shared result may serve: HTTP's `Vary`, generalized.
///
/// A response may depend on parts of the request that are not in its key
/// (a response with `Vary: Accept-Language` depends on that header). The
/// coalescing layers therefore take a [`leader`](Self::leader) snapshot of
/// the leader's request before it is consumed, [`record`](Self::record) in
/// the shared result what it varies on, and hand the result to another
/// request (a waiter, a replay, a hit from another node) only when it
/// [`serves`](Self::serves) it; a request it does not serve runs its own.
///
/// [`CloneShare`] serves every request; `HttpShare` (feature `http`)
/// implements `Vary`.
pub trait Serves<Req>: SharedForm {
    /// What the result must remember of its leader's request.
    type Leader: Send + 'static;

    /// Takes the snapshot, before the leader's request is consumed.
    fn leader(&self, req: &Req) -> Self::Leader;

    /// Records in `shared` what it needs of its leader's request.
    fn record(&self, shared: Self::Shared, leader: Self::Leader) -> Self::Shared;

    /// Whether `shared` may be handed to `req`.
    fn serves(&self, shared: &Self::Shared, req: &Req) -> bool;
}

/// Shares values of type `T` that are `Clone` by cloning them (wrap large
/// values in an `Arc`).
pub struct CloneShare<T>(PhantomData<fn() -> T>);

impl<T> CloneShare<T> {
    /// Creates the adapter.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Clone for CloneShare<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for CloneShare<T> {}

impl<T> Default for CloneShare<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for CloneShare<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CloneShare")
    }
}

impl<T> SharedForm for CloneShare<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Shared = T;
}

impl<T> Share<T> for CloneShare<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Output = T;
    type Future = Ready<Result<Shareable<T, T>, BoxError>>;

    fn share(&self, value: T) -> Self::Future {
        ready(Ok(Shareable::Shared(value)))
    }

    fn restore(&self, shared: &T) -> T {
        shared.clone()
    }

    fn passthrough(&self, value: T) -> T {
        value
    }
}

/// A `Clone` value depends on nothing but its key: it serves every request.
impl<T, Req> Serves<Req> for CloneShare<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Leader = ();

    #[inline]
    fn leader(&self, _req: &Req) {}

    #[inline]
    fn record(&self, shared: T, _leader: ()) -> T {
        shared
    }

    #[inline]
    fn serves(&self, _shared: &T, _req: &Req) -> bool {
        true
    }
}
