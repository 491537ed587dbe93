//! The coordination backend: leases, heartbeats, commits, notifications.
//!
//! [`Backend`] is the contract between the L2 layer and a shared store (the
//! Redis backend in `flightdeck-redis`, the in-memory one in
//! `flightdeck-testkit`). Every implementation keeps these rules, and
//! `flightdeck-testkit`'s conformance suite checks each of them:
//!
//! - [`Backend::acquire`] answers [`Acquired::Hit`] when a result is stored,
//!   [`Acquired::Follower`] when another token holds a live lease,
//!   [`Acquired::Owner`] when this token holds it (also on a retry with the
//!   same token: acquire is idempotent), and otherwise grants the flight
//!   to the caller with a new generation (the fencing token), marked
//!   `takeover` when it replaces an owner whose lease ran out without a
//!   commit or abandon. [`Acquired::Expired`] is the answer instead of a
//!   takeover when [`LeaseTerms::allow_takeover`] is false, and the answer
//!   to a token whose attempt already ended (released or abandoned: it is
//!   never granted the flight again).
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
//!   (payload inline when small). A retry of a commit that already happened
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
//! - [`Backend::invalidate`] drops the stored result and any lease and
//!   starts a newer generation: a running owner's commit is then fenced.
//! - [`Backend::subscribe`] delivers [`Notice`]s for one flight. Delivery is
//!   at most once: callers must also poll.
//!
//! **How long a flight's record lives.** A grant or heartbeat keeps the
//! flight's record for [`LeaseTerms::record_ttl`] (two leases with the
//! policy's state TTL): the lease, then one more lease during which the
//! owner may still commit or abandon late and, when takeover is not
//! allowed, ACQUIRE answers [`Acquired::Expired`]. A dead owner therefore
//! blocks a flight without takeover for one lease after its lease ran
//! out, never longer; the next grant after that has a larger generation.
//! A commit keeps the record for the result's TTL, an abandon that caches
//! a failure for the failure's.
//!
//! All durations are measured by the backend's clock (Redis: the server's
//! time and key expiry), never by the callers'.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_distributed::backend::{Acquired, Backend, CommitArgs, Committed, LeaseTerms};
//! use flightdeck_distributed::{FlightId, OwnerToken};
//! use flightdeck_testkit::MemoryBackend;
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
//!     inline_below: 1024,
//!     state_ttl: Duration::from_secs(120),
//! };
//! assert_eq!(backend.commit(&flight, &me, generation, &args).await.unwrap(), Committed::Committed);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::error::BoxError;
use flightdeck_core::{Digest, FlightKey};
use tokio::sync::broadcast;

/// The future returned by [`Backend`] methods.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// The name of one flight in the backend: the flight digest of its key
/// ([`FlightKey::flight_digest`]). Never contains raw input.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlightId(Digest);

impl FlightId {
    /// The id of a key's flight.
    pub fn of(key: &FlightKey) -> Self {
        Self(key.flight_digest())
    }

    /// Wraps a digest computed elsewhere.
    pub const fn from_digest(digest: Digest) -> Self {
        Self(digest)
    }

    /// The digest.
    pub fn digest(&self) -> &Digest {
        &self.0
    }

    /// The digest as 64 hex characters (the `{h}` of Redis key names).
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }
}

impl fmt::Debug for FlightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FlightId({})", self.0.short())
    }
}

impl fmt::Display for FlightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.short(), f)
    }
}

/// A random token naming one attempt to own a flight. Retries of the same
/// attempt reuse it, which is what makes acquire and commit idempotent.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(String);

impl OwnerToken {
    /// A fresh random token (128 bits, hex).
    pub fn random() -> Self {
        let v: u128 = rand::random();
        Self(format!("{v:032x}"))
    }

    /// A token from a string (tests, or callers with their own ids). Must be
    /// non-empty ASCII without `|`; invalid input gets a random token.
    pub fn from_string(s: impl Into<String>) -> Self {
        let s = s.into();
        if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic() && b != b'|') {
            return Self::random();
        }
        Self(s)
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", &self.0[..self.0.len().min(8)])
    }
}

/// The fencing token of an owner: put into the request's extensions so the
/// handler can guard its own downstream writes (reject writes carrying a
/// lower generation than one already seen).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FencingToken {
    /// Increases on every grant of the flight, takeovers included.
    pub generation: u64,
    /// The owner's token for this attempt.
    pub owner: OwnerToken,
}

/// How a stored result ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultStatus {
    /// The owner's work succeeded; the payload is the encoded result.
    Ok,
    /// The owner's work failed and the stage caches failures; the payload is
    /// the error message (UTF-8).
    Failed,
}

impl ResultStatus {
    /// The wire name (`ok` | `err`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "err",
        }
    }
}

/// A result stored by a committed owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResult {
    /// The generation that committed it.
    pub generation: u64,
    /// Success or cached failure.
    pub status: ResultStatus,
    /// The encoded result, or the failure message.
    pub payload: Bytes,
}

/// The answer to [`Backend::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A result is stored: replay it.
    Hit(StoredResult),
    /// This token owns the flight with this generation.
    Owner {
        /// The fencing generation.
        generation: u64,
        /// True when the grant took over a dead owner's flight.
        takeover: bool,
    },
    /// Another token owns the flight.
    Follower {
        /// The owner's generation.
        generation: u64,
        /// The owner's remaining lease, by the backend's clock.
        lease_remaining: Duration,
    },
    /// The owner's lease expired without a commit and takeover was not
    /// allowed (for at most [`LeaseTerms::record_ttl`] after the dead
    /// owner's grant or last heartbeat). Also the answer to a token whose
    /// own attempt already ended (it released or abandoned the flight):
    /// such a token is never granted the flight again.
    Expired {
        /// The dead owner's generation (or the ended attempt's; 0 when the
        /// flight has none).
        generation: u64,
    },
}

/// The answer to [`Backend::heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The lease is gone or belongs to someone else; it was not re-created.
    Lost,
}

/// The answer to [`Backend::commit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// The result is stored (now, or by an earlier try of the same commit).
    Committed,
    /// A newer owner holds the flight; nothing was written.
    Fenced,
}

/// The answer to [`Backend::abandon`] and [`Backend::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lease was released and followers were woken.
    Released,
    /// The lease was not held by this (token, generation) (by this token,
    /// for [`Backend::release`]); nothing changed.
    NotOwner,
}

/// Lease parameters for [`Backend::acquire`] and [`Backend::heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    /// How long a grant or heartbeat keeps the lease.
    pub lease: Duration,
    /// The longest a grant keeps the flight's record (see
    /// [`record_ttl`](Self::record_ttl)); also how long an invalidation,
    /// or a release of a flight that had no record, is remembered.
    /// Generations do not depend on it: they never repeat, whatever
    /// expires.
    pub state_ttl: Duration,
    /// Whether an expired, uncommitted flight may be taken over.
    pub allow_takeover: bool,
}

impl LeaseTerms {
    /// How long a grant or a heartbeat keeps the flight's record: two
    /// leases, but at most [`state_ttl`](Self::state_ttl) and never less
    /// than one lease.
    ///
    /// The lease, then up to one more lease during which the owner whose
    /// lease ran out may still commit or abandon (if nobody was granted
    /// the flight since) and, without takeover, ACQUIRE answers
    /// [`Acquired::Expired`]. After that the record is gone and the next
    /// grant is a fresh one, with a larger generation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use flightdeck_distributed::backend::LeaseTerms;
    ///
    /// let terms = LeaseTerms {
    ///     lease: Duration::from_secs(30),
    ///     state_ttl: Duration::from_secs(120),
    ///     allow_takeover: false,
    /// };
    /// assert_eq!(terms.record_ttl(), Duration::from_secs(60));
    /// ```
    pub fn record_ttl(&self) -> Duration {
        self.lease
            .saturating_mul(2)
            .min(self.state_ttl)
            .max(self.lease)
    }
}

/// What [`Backend::commit`] writes.
#[derive(Clone, Debug)]
pub struct CommitArgs {
    /// The encoded result.
    pub payload: Bytes,
    /// How long the result is replayed.
    pub ttl: Duration,
    /// Payloads up to this size travel inline in the completion notice.
    pub inline_below: usize,
    /// See [`LeaseTerms::state_ttl`]. Once committed, a flight's record
    /// lives as long as its result (`ttl`): the backends in this workspace
    /// do not need this.
    pub state_ttl: Duration,
}

/// What [`Backend::abandon`] writes.
#[derive(Clone, Debug)]
pub struct AbandonArgs {
    /// A failure message to cache for `failure_ttl` (none: followers re-race
    /// at once).
    pub failure: Option<Bytes>,
    /// How long the failure is replayed (zero: not cached).
    pub failure_ttl: Duration,
    /// See [`LeaseTerms::state_ttl`]. An abandon keeps the record's
    /// expiry (or sets `failure_ttl` when it caches a failure): the
    /// backends in this workspace do not need this.
    pub state_ttl: Duration,
}

/// A message about one flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A generation committed; small payloads come inline.
    Committed {
        /// The generation that committed.
        generation: u64,
        /// The payload, when it was small enough to travel inline.
        inline: Option<Bytes>,
    },
    /// A generation was abandoned: race for the flight again.
    Abandoned {
        /// The generation that was abandoned.
        generation: u64,
    },
    /// Messages may have been lost (reconnect, lag): re-check now.
    Resync,
}

/// A subscription to one flight's notices. Dropping it releases the
/// backend's (reference-counted) subscription.
pub struct Subscription {
    rx: broadcast::Receiver<Notice>,
    _guard: Box<dyn Send + Sync + 'static>,
}

impl Subscription {
    /// Wraps a receiver and a guard that is dropped with the subscription.
    pub fn new(rx: broadcast::Receiver<Notice>, guard: impl Send + Sync + 'static) -> Self {
        Self {
            rx,
            _guard: Box::new(guard),
        }
    }

    /// The next notice; [`Notice::Resync`] if some were lost; `None` once the
    /// backend closed the subscription (fall back to polling).
    pub async fn recv(&mut self) -> Option<Notice> {
        match self.rx.recv().await {
            Ok(n) => Some(n),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Notice::Resync),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

/// A shared coordination store for distributed single-flight.
///
/// See the module docs for the semantics every implementation must keep;
/// `flightdeck-testkit`'s conformance suite checks them.
pub trait Backend: Send + Sync + 'static {
    /// Tries to own the flight (see [`Acquired`]).
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired>;

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

    /// Subscribes to the flight's notices. Subscribe BEFORE re-checking the
    /// flight, so a notice sent in between is not missed.
    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription>;

    /// A cheap local check before a flight's first call: a decorator that
    /// knows the backend would refuse it says so (a breaker that is open),
    /// sparing the caller the work of naming the flight. `None` by default.
    fn reject_early(&self) -> Option<BackendError> {
        None
    }

    /// A follower's re-check: the same as [`acquire`](Self::acquire) (it
    /// takes the flight over when the owner's lease expired), told apart so
    /// that a decorator can treat it differently (a breaker judges the
    /// backend by flights, not by polls).
    fn recheck<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        self.acquire(flight, token, terms)
    }
}

/// A shared backend is a backend (e.g. `Arc<dyn Backend>`, to give stages
/// of one layer different backends).
impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        (**self).acquire(flight, token, terms)
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        (**self).heartbeat(flight, token, generation, terms)
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        (**self).commit(flight, token, generation, args)
    }

    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released> {
        (**self).abandon(flight, token, generation, args)
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        (**self).invalidate(flight, state_ttl)
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        (**self).subscribe(flight)
    }

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        (**self).release(flight, token, state_ttl)
    }

    fn reject_early(&self) -> Option<BackendError> {
        (**self).reject_early()
    }

    fn recheck<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        (**self).recheck(flight, token, terms)
    }
}

/// The three ways a backend call can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendErrorKind {
    /// The backend could not be reached; nothing happened.
    Unavailable,
    /// The backend answered something we do not understand, or refused the
    /// call for a reason retrying will not fix.
    Protocol,
    /// The call may or may not have taken effect (timeout or connection
    /// loss after sending). Retry with the same token.
    OutcomeUnknown,
}

impl BackendErrorKind {
    /// A short label for metrics (`unavailable`, `protocol`,
    /// `outcome_unknown`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Protocol => "protocol",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// A failed backend call, classified.
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    rejected: bool,
    source: BoxError,
}

impl BackendError {
    /// A classified error.
    pub fn new(kind: BackendErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            rejected: false,
            source: source.into(),
        }
    }

    /// A local guard (a circuit breaker) refused the call: nothing was
    /// sent. Unavailable, and told apart (see [`is_rejected`](Self::is_rejected)).
    /// `source` is the guard's own error, one of `flightdeck_core`'s (a
    /// `CircuitOpen`): [`into_core`](Self::into_core) hands it on as it is.
    pub fn rejected(source: impl Into<BoxError>) -> Self {
        Self {
            kind: BackendErrorKind::Unavailable,
            rejected: true,
            source: source.into(),
        }
    }

    /// Whether a local guard refused the call before it was sent.
    pub fn is_rejected(&self) -> bool {
        self.rejected
    }

    /// The backend could not be reached.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::Unavailable, source)
    }

    /// The backend's answer made no sense.
    pub fn protocol(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::Protocol, source)
    }

    /// The call may have happened.
    pub fn outcome_unknown(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::OutcomeUnknown, source)
    }

    /// The class of the failure.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Converts into the matching flightdeck-core error
    /// ([`CoordinationUnavailable`](flightdeck_core::error::CoordinationUnavailable),
    /// [`ProtocolError`](flightdeck_core::error::ProtocolError) or
    /// [`OutcomeUnknown`](flightdeck_core::error::OutcomeUnknown)), keeping
    /// this error as the source.
    pub fn into_core(self) -> BoxError {
        use flightdeck_core::error::{CoordinationUnavailable, OutcomeUnknown, ProtocolError};
        // A local guard's refusal is already a core error (a breaker's
        // `CircuitOpen`; see `rejected`): no wrapper, no second allocation
        // on the degraded path.
        if self.rejected {
            return self.source;
        }
        match self.kind {
            BackendErrorKind::Unavailable => Box::new(CoordinationUnavailable::new(self)),
            BackendErrorKind::Protocol => {
                Box::new(ProtocolError::with_source("backend reply", self))
            }
            BackendErrorKind::OutcomeUnknown => Box::new(OutcomeUnknown::new(self)),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            BackendErrorKind::Unavailable => "backend unavailable",
            BackendErrorKind::Protocol => "backend protocol error",
            BackendErrorKind::OutcomeUnknown => "backend outcome unknown",
        };
        write!(f, "{what}: {}", self.source)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Implements the listed [`Backend`] methods of a wrapper by forwarding them
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_validated() {
        assert_ne!(OwnerToken::random(), OwnerToken::random());
        assert_eq!(OwnerToken::random().as_str().len(), 32);
        assert_eq!(OwnerToken::from_string("node-1").as_str(), "node-1");
        assert_ne!(OwnerToken::from_string("a|b").as_str(), "a|b");
        assert_ne!(OwnerToken::from_string("").as_str(), "");
    }

    #[test]
    fn errors_convert_to_core_types() {
        use flightdeck_core::error::{
            find, CoordinationUnavailable, OutcomeUnknown, ProtocolError,
        };
        let e = BackendError::unavailable("refused").into_core();
        assert!(e.is::<CoordinationUnavailable>());
        assert!(find::<BackendError>(&*e).is_some());
        assert!(BackendError::protocol("x")
            .into_core()
            .is::<ProtocolError>());
        assert!(BackendError::outcome_unknown("x")
            .into_core()
            .is::<OutcomeUnknown>());
    }
}
