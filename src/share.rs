//! How results travel through the facade's two layers without converting
//! them twice.
//!
//! L1 shares the shared form (`Sh::Shared`) among a process's waiters; L2
//! stores the same form in the backend. The facade therefore asks both to
//! hand it [`Flown`] values (the shared form, or an output that could not
//! be shared) and restores the caller's output once, at the end.
//!
//! ```
//! use flightdeck::share::Flown;
//!
//! // What the facade does with each L1 result: restore a shared value for
//! // the caller, or hand over an output that was never shared.
//! fn finish(flown: Flown<std::sync::Arc<str>, String>) -> String {
//!     match flown {
//!         Flown::Shared(v) => v.to_string(),
//!         Flown::Output(o) => o,
//!     }
//! }
//! assert_eq!(finish(Flown::Shared("a".into())), "a");
//! assert_eq!(finish(Flown::Output("b".to_owned())), "b");
//! ```

use std::fmt;
use std::future::{ready, Future, Ready};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use flightdeck_core::{BoxError, Share, Shareable, SharedForm};
use pin_project_lite::pin_project;

/// A result on its way through the facade: its shared form, or an output
/// that cannot be shared (a stream, an oversize body) handed to the caller
/// that produced it.
#[derive(Debug, Clone)]
pub enum Flown<V, O> {
    /// The cheap-to-clone shared form.
    Shared(V),
    /// An output that was not shared.
    Output(O),
}

/// The L1 share adapter of the facade: shares [`Flown::Shared`] values as
/// they are and leaves [`Flown::Output`] unshared.
pub struct FlownShare<V>(PhantomData<fn() -> V>);

impl<V> FlownShare<V> {
    pub(crate) const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<V> Clone for FlownShare<V> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<V> fmt::Debug for FlownShare<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FlownShare")
    }
}

impl<V: Clone + Send + Sync + 'static> SharedForm for FlownShare<V> {
    type Shared = V;
}

impl<V, O> Share<Flown<V, O>> for FlownShare<V>
where
    V: Clone + Send + Sync + 'static,
    O: Send + 'static,
{
    type Output = Flown<V, O>;
    type Future = Ready<Result<Shareable<V, Flown<V, O>>, BoxError>>;

    fn share(&self, value: Flown<V, O>) -> Self::Future {
        ready(Ok(match value {
            Flown::Shared(v) => Shareable::Shared(v),
            out @ Flown::Output(_) => {
                Shareable::Unshared(out, flightdeck_core::Unshareable::Stream)
            }
        }))
    }

    fn restore(&self, shared: &V) -> Flown<V, O> {
        Flown::Shared(shared.clone())
    }

    fn passthrough(&self, value: Flown<V, O>) -> Flown<V, O> {
        value
    }
}

/// The L2 share adapter of the facade: shares like `Sh`, but hands back
/// the shared form instead of restoring it.
#[derive(Clone, Debug)]
pub struct KeepShared<Sh>(pub(crate) Sh);

impl<Sh: SharedForm> SharedForm for KeepShared<Sh> {
    type Shared = Sh::Shared;
}

impl<T, Sh: Share<T>> Share<T> for KeepShared<Sh> {
    type Output = Flown<Sh::Shared, Sh::Output>;
    type Future = KeepFuture<Sh::Future>;

    fn share(&self, value: T) -> Self::Future {
        KeepFuture {
            fut: self.0.share(value),
        }
    }

    fn restore(&self, shared: &Sh::Shared) -> Self::Output {
        Flown::Shared(shared.clone())
    }

    fn passthrough(&self, value: T) -> Self::Output {
        Flown::Output(self.0.passthrough(value))
    }
}

pin_project! {
    /// Future of [`KeepShared::share`].
    pub struct KeepFuture<F> {
        #[pin]
        fut: F,
    }
}

impl<F> fmt::Debug for KeepFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeepFuture")
    }
}

impl<F, V, O> Future for KeepFuture<F>
where
    F: Future<Output = Result<Shareable<V, O>, BoxError>>,
{
    type Output = Result<Shareable<V, Flown<V, O>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = ready!(self.project().fut.poll(cx));
        Poll::Ready(res.map(|s| match s {
            Shareable::Shared(v) => Shareable::Shared(v),
            Shareable::Unshared(o, r) => Shareable::Unshared(Flown::Output(o), r),
        }))
    }
}
