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
//!   response untouched, and the waiters run the service themselves.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::marker::PhantomData;

use crate::error::BoxError;

/// The result of trying to share a response.
#[derive(Debug)]
pub enum Shareable<S, O> {
    /// The response was turned into its shared form.
    Shared(S),
    /// The response cannot be shared (streaming, too large). It is handed,
    /// intact, to the caller that started the flight; waiters run alone.
    Unshared(O),
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
    fn restore(&self, shared: &Self::Shared) -> Self::Output;

    /// Wraps a response that was never shared (a bypassed request, or a
    /// waiter that ran the service itself).
    fn passthrough(&self, value: T) -> Self::Output;
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
