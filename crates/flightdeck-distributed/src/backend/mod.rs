//! The coordination backend: leases, heartbeats, commits, notifications.
//!
//! [`Backend`] is the contract between the L2 layer and a shared store (the
//! Redis backend in `flightdeck-redis`, the in-memory one in
//! `flightdeck-test`). Every implementation keeps these rules, and
//! `flightdeck-test`'s conformance suite checks each of them:
//!
//! - [`Backend::acquire_with`] (of which [`Backend::acquire`] and
//!   [`Backend::recheck`] are shorthands) answers [`Acquired::Hit`] when a result is stored
//!   and still fresh ([`CommitArgs::ttl`], the stage's replay TTL),
//!   [`Acquired::Follower`] when another token holds a live lease,
//!   [`Acquired::Owner`] when this token holds it (also on a retry with the
//!   same token, whatever the record says by then: a cached failure, a
//!   kept result past its stale window, the retry's not-after gone by;
//!   acquire is idempotent), and otherwise grants the flight
//!   to the caller with a new generation (the fencing token), marked
//!   `takeover` when it replaces an owner whose lease ran out without a
//!   commit or abandon. [`Acquired::Expired`] is the answer instead of a
//!   takeover when [`LeaseTerms::allow_takeover`] is false, and the answer
//!   to a token whose attempt already ended (committed, released or
//!   abandoned: it is never granted the flight again).
//! - **Generations never repeat and never decrease** for a flight,
//!   whatever expired in between (lease, result, the flight's whole
//!   record). A handler may therefore fence its own downstream writes with
//!   [`FencingToken::generation`]. Generations are not consecutive and do
//!   not start at 1: compare them, never count them. (The Redis backend
//!   takes `max(last + 1, server clock in µs)`, see its docs for the clock
//!   caveat.)
//! - [`Backend::heartbeat`] extends the lease only while (token,
//!   generation) holds it and it has not run out; it never re-creates or
//!   revives a lease.
//! - [`Backend::commit`] stores the result only for (token, generation) of
//!   the flight's last grant, whether its lease still runs or ran out with
//!   nobody granted since; it ends the lease and notifies followers
//!   (payload inline when small). The result is fresh for
//!   [`CommitArgs::ttl`] (new acquires replay it) and kept for the
//!   followers already waiting for [`CommitArgs::retain`]: a
//!   [`Backend::recheck`] naming that generation or an older one gets it
//!   (a later grant of the flight does not drop it; its commit replaces
//!   it). A retry of a commit that already happened
//!   answers [`Committed::Committed`]; a commit by any other token, or of
//!   any other generation, is [`Committed::Fenced`].
//! - [`Backend::abandon`] ends the lease of (token, generation) of the last
//!   grant (live or run out) at once, optionally caches a failure, and
//!   wakes followers.
//! - [`Backend::release`] ends the lease held by a token whatever its
//!   generation: what a node calls for every token it gave up on (its
//!   ACQUIRE timed out and may still have run, a deadline passed while a
//!   re-check was granting it the flight), so that nobody waits on a lease
//!   whose holder walked away. The token is never granted the flight
//!   afterwards, so an ACQUIRE of it that reaches the store late grants
//!   nothing.
//! - [`Backend::invalidate`] drops the stored result (fresh or kept to
//!   answer stale), any throttle and any lease and starts a newer
//!   generation: a running owner's commit (a refresh's too) is then
//!   fenced, so a purged result never comes back.
//! - **Stale results.** A commit keeps its result [`CommitArgs::stale_for`]
//!   past its freshness. Only an acquire that asks ([`Ask::stale`]) is
//!   answered it, and only while it is past its freshness and within that
//!   window: beside [`Acquired::Owner`] when the acquire is granted the
//!   flight (this caller refreshes it), beside [`Acquired::Follower`]
//!   while another token's lease runs (its refresh), and alone as
//!   [`Acquired::Stale`] while a throttle runs: an abandon with
//!   [`AbandonArgs::retry_after`] while a result is kept (fresh or not)
//!   makes every such acquire answer it and grant nothing for that long,
//!   by the store's clock; then the next acquire is granted. A grant
//!   keeps the result, an abandon never drops it (a failure it caches is
//!   replayed beside it, to acquires that do not ask for stale results),
//!   and only a commit of the flight's last grant replaces it. An early
//!   refresh ([`Ask::early`]) of a still-fresh result is granted with the
//!   fresh result beside [`Acquired::Owner`], unless a lease runs (then
//!   it is a [`Acquired::Hit`]: someone refreshes already) or the last
//!   refresh failed (its cached failure or throttle runs). An acquire
//!   that asks for neither is answered exactly as if nothing were kept
//!   past freshness: every `stale` is `None`.
//! - Every [`StoredResult`] says how old it is by the store's clock
//!   ([`StoredResult::age`]), how long it was fresh and how long its
//!   owner's work took (for early refreshes).
//! - [`Backend::subscribe`] delivers [`Notice`]s for one flight: at least
//!   those of grants that end after this node's ACQUIRE (or re-check) of
//!   the flight answered [`Acquired::Follower`] (the Redis backend tells
//!   only the nodes that follow). Delivery is at most once: callers must
//!   also poll. [`Backend::join_subscription`], taken before a flight's
//!   first call, delivers the same from that call on (or a
//!   [`Notice::Resync`]), when the backend can promise it.
//! - [`Backend::invalidated_since`] and [`Backend::wait_replicas`] are
//!   optional (by default: "not known", "no replicas"). The first lets the
//!   L2 layer tell a result that was invalidated from one the store lost
//!   (`singleflight_result_lost_total`); the second serves a stage's
//!   `commit_replicas`.
//!
//! **How long a flight's record lives.** A grant or heartbeat keeps the
//! flight's record for [`LeaseTerms::record_ttl`] (two leases with the
//! policy's state TTL): the lease, then one more lease during which the
//! owner may still commit or abandon late and, when takeover is not
//! allowed, ACQUIRE answers [`Acquired::Expired`]. A dead owner therefore
//! blocks a flight without takeover for one lease after its lease ran
//! out, never longer; the next grant after that has a larger generation.
//! A commit keeps the record for the longer of the result's freshness plus
//! its stale window and its retention for waiters, an abandon that caches
//! a failure for the failure's (never less than the stored result's); a
//! grant or heartbeat never shortens a retention under way.
//!
//! All durations are measured by the backend's clock (Redis: the server's
//! time and key expiry), never by the callers'.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_distributed::backend::{Acquired, Backend, CommitArgs, Committed, LeaseTerms};
//! use flightdeck_distributed::{FlightId, OwnerToken};
//! use flightdeck_test::MemoryBackend;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let backend = MemoryBackend::new();
//! let flight = FlightId::of(&FlightKey::from_bytes(StageName::new("report").unwrap(), "q"));
//! let terms = LeaseTerms {
//!     lease: Duration::from_secs(30),
//!     state_ttl: Duration::from_secs(120),
//!     allow_takeover: true,
//! };
//! let me = OwnerToken::random();
//! let Acquired::Owner { generation, .. } = backend.acquire(&flight, &me, &terms).await.unwrap() else {
//!     unreachable!("a fresh flight is owned by the first caller");
//! };
//! let args = CommitArgs {
//!     payload: "result".into(),
//!     ttl: Duration::from_secs(60),
//!     retain: Duration::from_secs(3),
//!     stale_for: Duration::ZERO,
//!     work_time: Duration::from_millis(40),
//!     inline_below: 1024,
//!     state_ttl: Duration::from_secs(120),
//!     sent: None,
//! };
//! assert_eq!(backend.commit(&flight, &me, generation, &args).await.unwrap(), Committed::Committed);
//! # }
//! ```

mod answers;
mod args;
mod connection;
mod error;
mod forward;
mod ids;
mod notice;
mod shard;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use answers::{Acquired, Committed, Released, Renewal, ResultStatus, StoredResult};
pub use args::{AbandonArgs, Ask, CommitArgs, LeaseTerms, MAX_DURATION};
pub use connection::{Connection, ConnectionWatch};
pub use error::{BackendError, BackendErrorKind};
pub use ids::{FencingToken, FlightId, OwnerToken};
pub use notice::{Notice, Subscription};
pub use shard::Shard;

/// The future returned by [`Backend`] methods.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// A shared coordination store for distributed single-flight.
///
/// See the module docs for the semantics every implementation must keep;
/// `flightdeck-test`'s conformance suite checks them.
pub trait Backend: Send + Sync + 'static {
    /// Tries to own the flight, asking what `ask` says (see [`Acquired`],
    /// [`Ask`]): the one acquire every backend implements, and the one a
    /// wrapper changes (the L2 layer calls only this;
    /// [`acquire`](Self::acquire) and [`recheck`](Self::recheck) are
    /// shorthands for it, not to be overridden).
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired>;

    /// A flight's first acquire, asking for no stale result:
    /// [`acquire_with`](Self::acquire_with) with [`Ask::default`].
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.acquire_with(flight, token, Ask::default(), terms)
    }

    /// Extends the lease held by (token, generation).
    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal>;

    /// Stores the result of (token, generation), ends the lease and notifies
    /// followers.
    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed>;

    /// Releases the lease of (token, generation) without a result and wakes
    /// followers.
    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released>;

    /// Releases the lease held by `token`, whatever its generation (the
    /// caller may never have learned it), and wakes followers (an
    /// [`Notice::Abandoned`] for that generation): [`Released::Released`].
    /// Otherwise [`Released::NotOwner`], and nothing else changes: a
    /// stored result stays, another token's lease stays.
    ///
    /// Either way the token is never granted the flight afterwards: an
    /// ACQUIRE of it that reaches the backend after this call (one that
    /// timed out on the client but was still queued) grants nothing. That
    /// memory lasts as long as the flight's record, or `state_ttl` when
    /// the flight had none. So one answer is final: a caller retries only
    /// calls that failed.
    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released>;

    /// Drops the flight's stored result and lease and starts a new
    /// generation, which fences any running owner's commit and wakes
    /// followers (they race again). Returns the new generation.
    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64>;

    /// Subscribes to the flight's notices (those of grants that end after
    /// this node's next ACQUIRE or re-check answers FOLLOWER, at least).
    /// Subscribe BEFORE re-checking the flight, so a notice sent in between
    /// is not missed.
    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription>;

    /// A subscription to the flight's notices that is in force already,
    /// without a call: it delivers every notice about the flight sent
    /// from now on, or a [`Notice::Resync`] where some may have been lost
    /// (the Redis backend: this node's inbox, subscribed once, which every
    /// ACQUIRE that answers FOLLOWER adds to the flight). Taken before the
    /// flight's first call, it spares a follower the subscribe and the
    /// re-check after it: a notice sent after that call ran cannot be
    /// missed. Every flight takes one, and most never read it (owners,
    /// hits): a backend should make it cheap, e.g. with
    /// [`Subscription::deferred`]. `None` when the backend cannot promise
    /// it now (the default): the follower subscribes, then re-checks.
    ///
    /// A wrapper that changes what [`subscribe`](Self::subscribe) does
    /// must not forward this to a backend that ignores the change.
    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        let _ = flight;
        None
    }

    /// Whether flights are spread over shards (see [`shard`](Self::shard)).
    /// `false` by default: every flight is on [`Shard::WHOLE`], and a caller
    /// need not name a flight to ask [`reject_early`](Self::reject_early).
    fn sharded(&self) -> bool {
        false
    }

    /// The shard that serves `flight` (see [`Shard`]): what a decorator
    /// judges failures by, so that one shard's outage degrades only the
    /// flights it serves. [`Shard::WHOLE`] by default (one store).
    fn shard(&self, flight: &FlightId) -> Shard {
        let _ = flight;
        Shard::WHOLE
    }

    /// The shards serving flights now, when the backend knows them (a
    /// Redis Cluster's primaries, by its slot map); `None` by default. A
    /// decorator forgets the state it kept for a shard that is no longer
    /// among them (a primary replaced in a failover): nothing would ever
    /// probe it again.
    fn shards(&self) -> Option<Vec<Shard>> {
        None
    }

    /// The backend knows it can send no call at all (no connection to any
    /// node): an unavailable error saying why. A layer built on a backend
    /// that answers so starts degraded. `None` by default.
    fn unreachable(&self) -> Option<BackendError> {
        None
    }

    /// Whether the backend has a connection to send calls on, now and at
    /// every change: a backend that connects in the background (the
    /// Redis backend) says [`Connection::NotConnected`] until its first
    /// connection is made, so that a layer built on it starts degraded
    /// and knows when to go distributed, even while no request comes.
    /// [`Connection::always_connected`] by default.
    fn connection(&self) -> ConnectionWatch {
        Connection::always_connected()
    }

    /// A cheap local check before the first call of a flight on `shard`
    /// (its [`shard`](Self::shard), or [`Shard::WHOLE`] when the backend
    /// is not [`sharded`](Self::sharded)): a decorator that knows the
    /// backend would refuse it says so (a breaker that is open for the
    /// shard), and so does a backend that knows it cannot send it (no
    /// connection to the shard: an unavailable error).
    /// [`unreachable`](Self::unreachable) by default.
    fn reject_early(&self, shard: &Shard) -> Option<BackendError> {
        let _ = shard;
        self.unreachable()
    }

    /// Asked after [`reject_early`](Self::reject_early) let a flight on
    /// `shard` through, for callers that have somewhere else to run it: a
    /// decorator that lets only part of the flights through for now (a
    /// breaker's ramp after closing) refuses this one. Callers with
    /// nowhere else to go never ask, so nothing holds them back. `None` by
    /// default.
    fn held_back(&self, shard: &Shard) -> Option<BackendError> {
        let _ = shard;
        None
    }

    /// Whether the flight was invalidated ([`invalidate`](Self::invalidate),
    /// by any node) after `generation` was granted, as far as the flight's
    /// record remembers: `Some(true)` when it was, `Some(false)` when the
    /// record holds no such invalidation (none happened, or the record
    /// itself was lost), `None` when the backend does not keep this (the
    /// default). The L2 layer asks it only when a result it saw committed
    /// is missing before its TTL ran out, to tell an invalidation from a
    /// lost result; `None` counts no loss.
    fn invalidated_since<'a>(
        &'a self,
        flight: &'a FlightId,
        generation: u64,
    ) -> BackendFuture<'a, Option<bool>> {
        let _ = (flight, generation);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Waits until `replicas` replicas acknowledged the writes this node
    /// sent to the flight's store so far (its last commit among them), for
    /// at most `timeout`: how many did (`Some`), or `None` when the
    /// backend has no replicas to ask (the default: nothing is sent). The
    /// Redis backend sends `WAIT` on the connection, and to the node, that
    /// ran the commit.
    fn wait_replicas<'a>(
        &'a self,
        flight: &'a FlightId,
        replicas: u32,
        timeout: Duration,
    ) -> BackendFuture<'a, Option<u32>> {
        let _ = (flight, replicas, timeout);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Tells the backend how long its callers let each call run (the L2
    /// layer's call timeout: [`DistributedPolicy::call_timeout`], told once
    /// by every layer built on it). A caller that cuts a call off takes it
    /// as *outcome unknown*, even one that was never sent: so a backend
    /// that waits before sending (for a connection being made, a slot being
    /// migrated) should give up before this and answer *unavailable*. The
    /// shortest timeout told is the one to keep. The default ignores it.
    ///
    /// [`DistributedPolicy::call_timeout`]: crate::DistributedPolicy::call_timeout
    fn call_timeout_hint(&self, timeout: Duration) {
        let _ = timeout;
    }

    /// A follower's re-check: the same as [`acquire`](Self::acquire) (it
    /// takes the flight over when the owner's lease expired), but it names
    /// the generation the follower first followed (`follows`): a result
    /// committed by that generation or a later one is a
    /// [`Acquired::Hit`] while the store keeps it (the later of
    /// [`CommitArgs::retain`] and its stale window's end), fresh or not,
    /// since this caller was
    /// waiting before it was committed. `None` (a retry of a first
    /// acquire) answers as [`acquire`](Self::acquire).
    /// [`acquire_with`](Self::acquire_with) with [`Ask::rechecking`]:
    /// marked a re-check so that a decorator can treat it differently (a
    /// breaker judges the backend by flights, not by polls).
    fn recheck<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        follows: Option<u64>,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.acquire_with(flight, token, Ask::rechecking(follows), terms)
    }
}

/// A shared backend is a backend (e.g. `Arc<dyn Backend>`, to give stages
/// of one layer different backends).
impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    crate::forward_backend!(*self => acquire_with, heartbeat, commit, abandon, invalidate, subscribe, join_subscription, release, reject_early, held_back, shard, sharded, shards, unreachable, connection, invalidated_since, wait_replicas, call_timeout_hint);
}
