//! `forward_backend!`: a wrapper writes out only the methods it changes.

/// With `*self =>` instead of a field, forwards through `Deref` (a smart
/// pointer to a backend).
///
/// Implements the listed [`Backend`](crate::Backend) methods of a wrapper by forwarding them
/// to one of its fields, so that a wrapper writes out only the methods it
/// changes.
///
/// ```
/// use flightdeck_distributed::backend::{Acquired, Ask, Backend, BackendFuture, LeaseTerms};
/// use flightdeck_distributed::{forward_backend, FlightId, OwnerToken};
///
/// /// Counts acquires, forwards everything else.
/// struct Counting<B> {
///     inner: B,
///     acquires: std::sync::atomic::AtomicUsize,
/// }
///
/// impl<B: Backend> Backend for Counting<B> {
///     fn acquire_with<'a>(
///         &'a self,
///         flight: &'a FlightId,
///         token: &'a OwnerToken,
///         ask: Ask,
///         terms: &'a LeaseTerms,
///     ) -> BackendFuture<'a, Acquired> {
///         self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.acquire_with(flight, token, ask, terms)
///     }
///     forward_backend!(inner => heartbeat, commit, abandon, invalidate, subscribe, release,
///         reject_early, unreachable, sharded, shard, shards);
/// }
/// ```
#[macro_export]
macro_rules! forward_backend {
    (*self => $($method:ident),+ $(,)?) => {
        $( $crate::forward_backend!(@one [deref] $method); )+
    };
    ($field:ident => $($method:ident),+ $(,)?) => {
        $( $crate::forward_backend!(@one [field $field] $method); )+
    };
    (@via $s:ident [deref]) => { &**$s };
    (@via $s:ident [field $f:ident]) => { &$s.$f };
    (@one $via:tt acquire_with) => {
        fn acquire_with<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            ask: $crate::backend::Ask,
            terms: &'a $crate::backend::LeaseTerms,
        ) -> $crate::backend::BackendFuture<'a, $crate::Acquired> {
            $crate::Backend::acquire_with($crate::forward_backend!(@via self $via), flight, token, ask, terms)
        }
    };
    (@one $via:tt heartbeat) => {
        fn heartbeat<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            terms: &'a $crate::backend::LeaseTerms,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Renewal> {
                        $crate::Backend::heartbeat($crate::forward_backend!(@via self $via), flight, token, generation, terms)
        }
    };
    (@one $via:tt commit) => {
        fn commit<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            args: &'a $crate::backend::CommitArgs,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Committed> {
                        $crate::Backend::commit($crate::forward_backend!(@via self $via), flight, token, generation, args)
        }
    };
    (@one $via:tt release) => {
        fn release<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            state_ttl: ::std::time::Duration,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Released> {
                        $crate::Backend::release($crate::forward_backend!(@via self $via), flight, token, state_ttl)
        }
    };
    (@one $via:tt reject_early) => {
        fn reject_early(&self, shard: &$crate::backend::Shard) -> ::std::option::Option<$crate::BackendError> {
                        $crate::Backend::reject_early($crate::forward_backend!(@via self $via), shard)
        }
    };
    (@one $via:tt held_back) => {
        fn held_back(&self, shard: &$crate::backend::Shard) -> ::std::option::Option<$crate::BackendError> {
            $crate::Backend::held_back($crate::forward_backend!(@via self $via), shard)
        }
    };
    (@one $via:tt connection) => {
        fn connection(&self) -> $crate::backend::ConnectionWatch {
            $crate::Backend::connection($crate::forward_backend!(@via self $via))
        }
    };
    (@one $via:tt shards) => {
        fn shards(&self) -> ::std::option::Option<::std::vec::Vec<$crate::backend::Shard>> {
                        $crate::Backend::shards($crate::forward_backend!(@via self $via))
        }
    };
    (@one $via:tt sharded) => {
        fn sharded(&self) -> bool {
                        $crate::Backend::sharded($crate::forward_backend!(@via self $via))
        }
    };
    (@one $via:tt unreachable) => {
        fn unreachable(&self) -> ::std::option::Option<$crate::BackendError> {
                        $crate::Backend::unreachable($crate::forward_backend!(@via self $via))
        }
    };
    (@one $via:tt shard) => {
        fn shard(&self, flight: &$crate::FlightId) -> $crate::backend::Shard {
                        $crate::Backend::shard($crate::forward_backend!(@via self $via), flight)
        }
    };
    (@one $via:tt join_subscription) => {
        fn join_subscription(
            &self,
            flight: &$crate::FlightId,
        ) -> ::std::option::Option<$crate::backend::Subscription> {
            $crate::Backend::join_subscription($crate::forward_backend!(@via self $via), flight)
        }
    };
    (@one $via:tt abandon) => {
        fn abandon<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            token: &'a $crate::OwnerToken,
            generation: u64,
            args: &'a $crate::backend::AbandonArgs,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Released> {
                        $crate::Backend::abandon($crate::forward_backend!(@via self $via), flight, token, generation, args)
        }
    };
    (@one $via:tt invalidate) => {
        fn invalidate<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            state_ttl: ::std::time::Duration,
        ) -> $crate::backend::BackendFuture<'a, u64> {
                        $crate::Backend::invalidate($crate::forward_backend!(@via self $via), flight, state_ttl)
        }
    };
    (@one $via:tt invalidated_since) => {
        fn invalidated_since<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            generation: u64,
        ) -> $crate::backend::BackendFuture<'a, ::std::option::Option<bool>> {
                        $crate::Backend::invalidated_since($crate::forward_backend!(@via self $via), flight, generation)
        }
    };
    (@one $via:tt wait_replicas) => {
        fn wait_replicas<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
            replicas: u32,
            timeout: ::std::time::Duration,
        ) -> $crate::backend::BackendFuture<'a, ::std::option::Option<u32>> {
                        $crate::Backend::wait_replicas($crate::forward_backend!(@via self $via), flight, replicas, timeout)
        }
    };
    (@one $via:tt call_timeout_hint) => {
        fn call_timeout_hint(&self, timeout: ::std::time::Duration) {
                        $crate::Backend::call_timeout_hint($crate::forward_backend!(@via self $via), timeout)
        }
    };
    (@one $via:tt subscribe) => {
        fn subscribe<'a>(
            &'a self,
            flight: &'a $crate::FlightId,
        ) -> $crate::backend::BackendFuture<'a, $crate::Subscription> {
                        $crate::Backend::subscribe($crate::forward_backend!(@via self $via), flight)
        }
    };
}
