//! `forward_backend!`: a wrapper writes out only the methods it changes.

/// Implements the listed [`Backend`](crate::Backend) methods of a wrapper by forwarding them
/// to one of its fields, so that a wrapper writes out only the methods it
/// changes.
///
/// ```
/// use flightdeck_distributed::backend::{Acquired, Backend, BackendFuture, LeaseTerms};
/// use flightdeck_distributed::{forward_backend, FlightId, OwnerToken};
///
/// /// Counts acquires, forwards everything else.
/// struct Counting<B> {
///     inner: B,
///     acquires: std::sync::atomic::AtomicUsize,
/// }
///
/// impl<B: Backend> Backend for Counting<B> {
///     fn acquire<'a>(
///         &'a self,
///         flight: &'a FlightId,
///         token: &'a OwnerToken,
///         terms: &'a LeaseTerms,
///     ) -> BackendFuture<'a, Acquired> {
///         self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.acquire(flight, token, terms)
///     }
///     forward_backend!(inner => heartbeat, commit, abandon, invalidate, subscribe, release, recheck, reject_early);
/// }
/// ```
#[macro_export]
macro_rules! forward_backend {
    ($field:ident => $($method:ident),+ $(,)?) => {
        $( $crate::forward_backend!(@one $field $method); )+
    };
    (@one $f:ident acquire) => {
        fn acquire<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            terms: &'a $crate::backend::LeaseTerms,
        ) -> $crate::backend::BackendFuture<'a, $crate::Acquired> {
                        $crate::Backend::acquire(&self.$f, flight, token, terms)
        }
    };
    (@one $f:ident heartbeat) => {
        fn heartbeat<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            terms: &'a $crate::backend::LeaseTerms,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Renewal> {
                        $crate::Backend::heartbeat(&self.$f, flight, token, generation, terms)
        }
    };
    (@one $f:ident commit) => {
        fn commit<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            args: &'a $crate::backend::CommitArgs,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Committed> {
                        $crate::Backend::commit(&self.$f, flight, token, generation, args)
        }
    };
    (@one $f:ident release) => {
        fn release<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            state_ttl: ::std::time::Duration,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Released> {
                        $crate::Backend::release(&self.$f, flight, token, state_ttl)
        }
    };
    (@one $f:ident reject_early) => {
        fn reject_early(&self) -> ::std::option::Option<$crate::BackendError> {
                        $crate::Backend::reject_early(&self.$f)
        }
    };
    (@one $f:ident recheck) => {
        fn recheck<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            terms: &'a $crate::backend::LeaseTerms,
        ) -> $crate::backend::BackendFuture<'a, $crate::Acquired> {
                        $crate::Backend::recheck(&self.$f, flight, token, terms)
        }
    };
    (@one $f:ident abandon) => {
        fn abandon<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            args: &'a $crate::backend::AbandonArgs,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Released> {
                        $crate::Backend::abandon(&self.$f, flight, token, generation, args)
        }
    };
    (@one $f:ident invalidate) => {
        fn invalidate<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            state_ttl: ::std::time::Duration,
        ) -> $crate::backend::BackendFuture<'a, u64> {
                        $crate::Backend::invalidate(&self.$f, flight, state_ttl)
        }
    };
    (@one $f:ident subscribe) => {
        fn subscribe<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
        ) -> $crate::backend::BackendFuture<'a, $crate::Subscription> {
                        $crate::Backend::subscribe(&self.$f, flight)
        }
    };
}
