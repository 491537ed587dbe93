//! The extractor trait, the decision it returns, and where the decision is
//! stored on the request.

use std::fmt;
use std::future::Future;

use flightdeck_core::{BoxError, FlightKey, StageName};

/// Computes the [`FlightKey`] of a request, or decides that the request must
/// not be coalesced.
///
/// An extractor may need to read the request (a body to hash), so it takes
/// the request by value and hands back the request to forward, possibly with
/// a different type (e.g. a body that was buffered and re-attached).
///
/// Extractors that only look at the request head answer at once with
/// [`Extraction::Ready`]; then [`Key`](crate::Key) calls the inner service
/// directly, without cloning it. Extractors that must wait (reading a body)
/// return [`Extraction::Pending`].
pub trait KeyExtractor<Req> {
    /// The request forwarded to the inner service.
    type Request: KeySlot;
    /// The future of a pending extraction.
    type Future: Future<Output = Result<Extracted<Self::Request>, BoxError>>;

    /// Starts extracting the key of `req`.
    fn extract(&self, req: Req) -> Extraction<Self::Request, Self::Future>;
}

/// The answer of [`KeyExtractor::extract`].
#[derive(Debug)]
pub enum Extraction<R, F> {
    /// The decision is known now.
    Ready(Result<Extracted<R>, BoxError>),
    /// The decision needs more work (e.g. reading the body).
    Pending(F),
}

/// A request together with the extractor's decision about it.
#[derive(Debug)]
pub struct Extracted<R> {
    /// The request to forward.
    pub request: R,
    /// Whether, and under which key, it may be coalesced.
    pub decision: Decision,
}

impl<R> Extracted<R> {
    /// Pairs a request with a decision.
    pub fn new(request: R, decision: impl Into<Decision>) -> Self {
        Self {
            request,
            decision: decision.into(),
        }
    }
}

/// Whether a request may share its execution with others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Coalesce with every request of the same key.
    Key(FlightKey),
    /// Never coalesce: every layer below passes the request straight through.
    Bypass(NotCoalescable),
}

impl Decision {
    /// The key, if the request may be coalesced.
    pub fn key(&self) -> Option<&FlightKey> {
        match self {
            Self::Key(k) => Some(k),
            Self::Bypass(_) => None,
        }
    }
}

impl From<FlightKey> for Decision {
    fn from(key: FlightKey) -> Self {
        Self::Key(key)
    }
}

impl From<NotCoalescable> for Decision {
    fn from(n: NotCoalescable) -> Self {
        Self::Bypass(n)
    }
}

impl From<Option<FlightKey>> for Decision {
    fn from(key: Option<FlightKey>) -> Self {
        match key {
            Some(k) => Self::Key(k),
            None => Self::Bypass(NotCoalescable::new(Reason::Declined)),
        }
    }
}

/// Marker put into the extensions of a request that must not be coalesced.
///
/// The layers below only look for a [`FlightKey`]: its absence alone means
/// "pass straight through". This marker adds *why*, for metrics, logs and
/// tests. [`KeyLayer`](crate::KeyLayer) always removes a stale `FlightKey`
/// when it inserts this marker, and removes a stale marker when it inserts a
/// key, so the two never appear together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NotCoalescable {
    reason: Reason,
}

impl NotCoalescable {
    /// A marker with the given reason.
    pub const fn new(reason: Reason) -> Self {
        Self { reason }
    }

    /// Why the request is not coalesced.
    pub const fn reason(&self) -> Reason {
        self.reason
    }
}

impl fmt::Display for NotCoalescable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not coalescable: {}", self.reason.as_str())
    }
}

/// Why a request is not coalesced. [`Reason::as_str`] is a fixed, short,
/// log- and metric-safe label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// A closure extractor returned `None`.
    Declined,
    /// The method is not coalesced by default (only GET and HEAD are) and no
    /// route rule or `Idempotency-Key` allows it.
    Method,
    /// No route rule, stage header or default stage gave a stage.
    NoStage,
    /// The stage header named a stage that is not in the allowed list, or
    /// was given more than once.
    UnknownStage,
    /// The request has a body, and body hashing is not enabled for it:
    /// requests that differ only in unhashed bytes must not share.
    UnhashedBody,
    /// The body is larger than the cap; it was forwarded intact.
    BodyTooLarge,
    /// The body ended with trailers, which are not part of keys.
    Trailers,
    /// A scope rule is configured but the request carries no scope.
    NoScope,
    /// More than one `Idempotency-Key` header, or an empty one.
    BadIdempotencyKey,
    /// Not a gRPC request (no `application/grpc` content type, or not POST).
    NotGrpc,
    /// A gRPC method that is not on the allowlist of unary methods.
    NotAllowlisted,
}

impl Reason {
    /// Every reason, in the order of [`index`](Self::index).
    #[cfg(feature = "http")]
    pub(crate) const ALL: [Reason; 11] = [
        Self::Declined,
        Self::Method,
        Self::NoStage,
        Self::UnknownStage,
        Self::UnhashedBody,
        Self::BodyTooLarge,
        Self::Trailers,
        Self::NoScope,
        Self::BadIdempotencyKey,
        Self::NotGrpc,
        Self::NotAllowlisted,
    ];

    /// This reason's place in [`ALL`](Self::ALL).
    #[cfg(feature = "http")]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// A short label: `"declined"`, `"method"`, `"no_stage"`, ...
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Declined => "declined",
            Self::Method => "method",
            Self::NoStage => "no_stage",
            Self::UnknownStage => "unknown_stage",
            Self::UnhashedBody => "unhashed_body",
            Self::BodyTooLarge => "body_too_large",
            Self::Trailers => "trailers",
            Self::NoScope => "no_scope",
            Self::BadIdempotencyKey => "bad_idempotency_key",
            Self::NotGrpc => "not_grpc",
            Self::NotAllowlisted => "not_allowlisted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stages an extractor's rules can name. A layer that is built with
/// both the key rules and the stages' policies checks them against each
/// other, so a rule naming a stage without a policy (a typo in a config
/// file) fails at build time instead of on every request.
pub trait NamedStages {
    /// Every stage a request can be keyed into, each once, sorted.
    fn stages(&self) -> Vec<StageName>;
}

/// A request that can carry the extractor's [`Decision`].
///
/// Implemented for `http::Request<B>` (feature `http`: the decision goes into
/// the extensions) and for [`Keyed<R>`]. Implement it for your own request
/// type to use [`KeyLayer`](crate::KeyLayer) with a non-HTTP service.
pub trait KeySlot {
    /// Stores the decision, replacing any earlier one.
    fn set_decision(&mut self, decision: Decision);
}

/// A request of any type together with its key: the [`KeySlot`] for services
/// that do not speak HTTP (and for tests).
///
/// ```
/// use flightdeck_key::{Keyed, KeySlot, Decision};
/// use flightdeck_core::{FlightKey, StageName};
///
/// let mut req = Keyed::new("payload");
/// assert!(req.key().is_none());
/// let key = FlightKey::from_bytes(StageName::new("s").unwrap(), "payload");
/// req.set_decision(Decision::Key(key.clone()));
/// assert_eq!(req.key(), Some(&key));
/// ```
#[derive(Debug, Clone)]
pub struct Keyed<R> {
    request: R,
    decision: Option<Decision>,
}

impl<R> Keyed<R> {
    /// Wraps a request; it has no decision yet.
    pub const fn new(request: R) -> Self {
        Self {
            request,
            decision: None,
        }
    }

    /// The request.
    pub fn get_ref(&self) -> &R {
        &self.request
    }

    /// The request, mutably.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.request
    }

    /// Unwraps the request.
    pub fn into_inner(self) -> R {
        self.request
    }

    /// The key, if the request may be coalesced.
    pub fn key(&self) -> Option<&FlightKey> {
        self.decision.as_ref().and_then(Decision::key)
    }

    /// The full decision, once one was made.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }
}

impl<R> KeySlot for Keyed<R> {
    fn set_decision(&mut self, decision: Decision) {
        self.decision = Some(decision);
    }
}

#[cfg(feature = "http")]
impl<B> KeySlot for http::Request<B> {
    fn set_decision(&mut self, decision: Decision) {
        let ext = self.extensions_mut();
        match decision {
            Decision::Key(key) => {
                ext.remove::<NotCoalescable>();
                ext.insert(key);
            }
            Decision::Bypass(marker) => {
                ext.remove::<FlightKey>();
                ext.insert(marker);
            }
        }
    }
}

/// A [`KeyExtractor`] made of a closure over `&Req`: for services that are
/// not HTTP, and for tests. Made by [`key_fn`].
#[derive(Clone)]
pub struct FnExtractor<F> {
    f: F,
}

impl<F> fmt::Debug for FnExtractor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnExtractor").finish_non_exhaustive()
    }
}

/// Builds a [`KeyExtractor`] from a closure.
///
/// The closure returns anything that converts into a [`Decision`]: a
/// [`FlightKey`], an `Option<FlightKey>` (`None` = not coalescable) or a
/// [`NotCoalescable`]. Build keys with [`KeyEncoder`](flightdeck_core::KeyEncoder)
/// so no raw input ends up in them.
///
/// ```
/// use flightdeck_core::{KeyEncoder, StageName};
/// use flightdeck_key::{key_fn, KeyLayer, Keyed};
/// use tower_layer::Layer;
///
/// let stage = StageName::new("score").unwrap();
/// let layer = KeyLayer::new(key_fn(move |req: &Keyed<String>| {
///     KeyEncoder::new().field(req.get_ref().as_bytes()).finish_key(stage.clone(), None)
/// }));
/// # let _ = layer;
/// ```
pub fn key_fn<F>(f: F) -> FnExtractor<F> {
    FnExtractor { f }
}

impl<F, Req, D> KeyExtractor<Req> for FnExtractor<F>
where
    F: Fn(&Req) -> D,
    D: Into<Decision>,
    Req: KeySlot,
{
    type Request = Req;
    type Future = std::future::Ready<Result<Extracted<Req>, BoxError>>;

    fn extract(&self, req: Req) -> Extraction<Req, Self::Future> {
        let decision = (self.f)(&req).into();
        Extraction::Ready(Ok(Extracted::new(req, decision)))
    }
}
