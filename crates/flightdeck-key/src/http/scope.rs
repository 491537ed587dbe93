//! Tenant scope: who may share a result with whom.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use flightdeck_core::http::Present;
use flightdeck_core::{Digest, KeyEncoder};
use http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION};
use http::request::Parts;
use http::HeaderName;

use crate::error::KeyConfigError;
use crate::extract::Reason;

type ScopeWriter = dyn Fn(&Parts, &mut KeyEncoder) -> bool + Send + Sync;

/// Version of the scope digest's encoding, hashed into every scope digest
/// so digests of different encodings never collide.
///
/// 2: the credentials are a configurable list of headers (by default
/// [`DEFAULT_CREDENTIAL_HEADERS`]), each hashed with its name, and a scope
/// secret keys the digest (BLAKE3 keyed mode). Version 1 hashed only
/// `Authorization` and `Cookie`, and mixed the secret in as a field.
pub const SCOPE_ENCODING_VERSION: u8 = 2;

/// The shortest scope secret accepted, in bytes: a shorter one (a word, a
/// placeholder left in a deployment file) could be found by trying
/// guesses against the digests it keys, which is what the secret is there
/// to prevent. Use 32 random bytes or more.
pub const MIN_SCOPE_SECRET_LEN: usize = 16;

/// Checks a scope secret as the key builders do (not empty, at least
/// [`MIN_SCOPE_SECRET_LEN`] bytes), never showing it in the error: for a
/// secret read somewhere else (an environment variable) and refused where
/// it is read, so that the error can name where it came from.
///
/// ```
/// use flightdeck_key::http::check_scope_secret;
///
/// assert!(check_scope_secret("a-random-secret-of-the-deployment").is_ok());
/// let err = check_scope_secret("hunter2").unwrap_err();
/// assert!(err.to_string().contains("7 bytes") && !err.to_string().contains("hunter2"));
/// ```
pub fn check_scope_secret(secret: impl AsRef<[u8]>) -> Result<(), KeyConfigError> {
    Secret::new(secret.as_ref()).check()
}

/// The `X-Api-Key` header.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The headers [`Scope::credentials`] reads by default: the ones gateways
/// and clients commonly authenticate with (gRPC's `authorization` metadata
/// is the `authorization` header).
pub static DEFAULT_CREDENTIAL_HEADERS: [HeaderName; 4] =
    [AUTHORIZATION, PROXY_AUTHORIZATION, COOKIE, X_API_KEY];

/// Where the tenant scope of a request comes from. Requests with different
/// scopes never share a result, whatever else they have in common.
///
/// The default, [`Scope::credentials`], is secure: a request carrying any
/// credential header (`Authorization`, `Proxy-Authorization`, `Cookie`,
/// `X-Api-Key`; the list is configurable) is scoped by a hash of those
/// headers, so two users never share; requests without credentials share
/// with each other. A configured rule ([`Scope::header`],
/// [`Scope::extension`], [`Scope::from_fn`]) replaces that default; a
/// request for which the rule finds no scope is then **not coalesced** (it
/// might be a request the auth middleware failed to mark).
///
/// Only the digest of the scope is kept, never the raw value.
///
/// # Why a scope secret matters
///
/// The scope digest ends up in Redis key names. Without a secret it is the
/// same function of the credentials in every deployment, so anyone who can
/// list those names (a Redis user, a backup, a log) can take a guess at a
/// low-entropy credential (a Basic-auth password, a short API key), hash it
/// the same way, and check the guess offline, as often as they like. With
/// a secret (the builders' `scope_secret`, the same on every node), the
/// digest is BLAKE3's keyed hash under a key derived from that secret:
/// without the secret a guess cannot be checked. Only digests that leave
/// the process are at risk: the extractor cannot tell where its keys go,
/// so it reports [`scope_digests_unkeyed`](super::HttpKeyExtractor::scope_digests_unkeyed)
/// and the layer that stores results in a shared backend (the `flightdeck`
/// facade) warns.
#[derive(Clone)]
pub struct Scope {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    /// The credential headers, sorted and without duplicates.
    Credentials(Vec<HeaderName>),
    Shared,
    Header(HeaderName),
    Rule(Arc<ScopeWriter>),
    Invalid(KeyConfigError),
}

impl Scope {
    /// The default: a hash of the credential headers
    /// ([`DEFAULT_CREDENTIAL_HEADERS`]) when the request carries any of
    /// them, otherwise no scope.
    pub fn credentials() -> Self {
        Self::credential_list(DEFAULT_CREDENTIAL_HEADERS.to_vec())
    }

    fn credential_list(mut names: Vec<HeaderName>) -> Self {
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Self {
            kind: Kind::Credentials(names),
        }
    }

    /// Credentials read from exactly these headers instead of the default
    /// list (names are case-insensitive).
    pub fn credential_headers<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Vec::new();
        for name in names {
            match credential_name(name.as_ref()) {
                Ok(h) => list.push(h),
                Err(e) => return Self::invalid(e),
            }
        }
        Self::credential_list(list)
    }

    /// The credentials plus one more header (e.g. `x-session-token`).
    /// Only for [`Scope::credentials`]; on another scope, building the
    /// extractor fails.
    pub fn with_credential_header(self, name: impl AsRef<str>) -> Self {
        self.edit_credentials(name.as_ref(), |list, h| list.push(h))
    }

    /// The credentials without one header (e.g. `cookie`, when cookies
    /// carry nothing about who the user is). Only for
    /// [`Scope::credentials`]; on another scope, building the extractor
    /// fails.
    ///
    /// # Warning
    ///
    /// Requests that differ only in that header share results.
    pub fn without_credential_header(self, name: impl AsRef<str>) -> Self {
        self.edit_credentials(name.as_ref(), |list, h| list.retain(|n| *n != h))
    }

    fn edit_credentials(
        self,
        name: &str,
        edit: impl FnOnce(&mut Vec<HeaderName>, HeaderName),
    ) -> Self {
        match self.kind {
            Kind::Credentials(mut list) => match credential_name(name) {
                Ok(h) => {
                    edit(&mut list, h);
                    Self::credential_list(list)
                }
                Err(e) => Self::invalid(e),
            },
            invalid @ Kind::Invalid(_) => Self { kind: invalid },
            _ => Self::invalid(KeyConfigError::new(
                "credential header",
                name,
                "credential headers apply to Scope::credentials() only, \
                 and another scope rule is configured",
            )),
        }
    }

    fn invalid(e: KeyConfigError) -> Self {
        Self {
            kind: Kind::Invalid(e),
        }
    }

    /// The credential headers, sorted, when this is a credentials scope.
    pub fn credential_header_names(&self) -> Option<&[HeaderName]> {
        match &self.kind {
            Kind::Credentials(list) => Some(list),
            _ => None,
        }
    }

    /// Every value of the named header (e.g. `x-tenant-id` set by a trusted
    /// gateway). A request without it is not coalesced.
    ///
    /// Only use a header that clients cannot forge (one your gateway or
    /// auth middleware overwrites).
    pub fn header(name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        let kind = match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => Kind::Header(h),
            Err(e) => Kind::Invalid(KeyConfigError::new("scope header name", name, e)),
        };
        Self { kind }
    }

    /// A request extension of type `T` set by the auth middleware (e.g. a
    /// `TenantId`). A request without it is not coalesced.
    pub fn extension<T>() -> Self
    where
        T: ScopeId + Send + Sync + 'static,
    {
        Self::rule(|parts: &Parts, enc: &mut KeyEncoder| {
            parts
                .extensions
                .get::<T>()
                .map(|id| enc.push(&id.scope_bytes()))
                .is_some()
        })
    }

    /// A closure over the request head, returning owned bytes (a `String`,
    /// a `Vec<u8>`, ...). `None` means "no scope found": the request is not
    /// coalesced.
    pub fn from_fn<F, V>(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<V> + Send + Sync + 'static,
        V: AsRef<[u8]>,
    {
        Self::rule(move |parts: &Parts, enc: &mut KeyEncoder| {
            f(parts).map(|v| enc.push(v.as_ref())).is_some()
        })
    }

    fn rule(writer: impl Fn(&Parts, &mut KeyEncoder) -> bool + Send + Sync + 'static) -> Self {
        Self {
            kind: Kind::Rule(Arc::new(writer)),
        }
    }

    /// No scope at all: **every user shares results with every other user**.
    ///
    /// # Warning
    ///
    /// Only for responses that do not depend on who asks (public data, or
    /// authorization fully decided before this layer and identical for all
    /// callers). With this setting, the answer computed for one user's
    /// request is handed to every other user whose request has the same key,
    /// credentials or not.
    pub fn shared_across_users() -> Self {
        Self { kind: Kind::Shared }
    }

    pub(crate) fn validate(&self) -> Result<(), KeyConfigError> {
        match &self.kind {
            Kind::Invalid(e) => Err(e.clone()),
            Kind::Credentials(list) if list.is_empty() => Err(KeyConfigError::new(
                "credential headers",
                "",
                "the list is empty, so no request would be scoped by who sent it; \
                 say shared_across_users() if every user may share every result",
            )),
            _ => Ok(()),
        }
    }

    /// The scope digest, unkeyed: `Ok(None)` = no scope, `Err(())` = a rule
    /// is configured and found nothing.
    fn compute(&self, parts: &Parts) -> Result<Option<Digest>, ()> {
        // The usual unscoped requests return before an encoder is made.
        match &self.kind {
            Kind::Shared | Kind::Invalid(_) => return Ok(None),
            Kind::Credentials(names)
                if !Present::of(&parts.headers, names).any(names, &parts.headers) =>
            {
                return Ok(None)
            }
            _ => {}
        }
        let mut enc = KeyEncoder::with_domain(b"flightdeck-key/scope");
        enc.push(&[SCOPE_ENCODING_VERSION]);
        match &self.kind {
            Kind::Shared | Kind::Invalid(_) => return Ok(None),
            Kind::Credentials(names) => {
                enc.push(b"credentials");
                super::write_headers(&mut enc, &parts.headers, names);
            }
            Kind::Header(name) => {
                if !parts.headers.contains_key(name) {
                    return Err(());
                }
                enc.push(b"rule");
                flightdeck_core::http::push_header_values(&mut enc, &parts.headers, name);
            }
            Kind::Rule(writer) => {
                enc.push(b"rule");
                if !writer(parts, &mut enc) {
                    return Err(());
                }
            }
        }
        Ok(Some(enc.finish()))
    }
}

fn credential_name(name: &str) -> Result<HeaderName, KeyConfigError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| KeyConfigError::new("credential header", name, e))
}

/// The key that makes scope digests keyed, derived from the deployment's
/// scope secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) enum Secret {
    /// None configured: digests are unkeyed.
    #[default]
    None,
    /// `scope_secret("")`: a mistake (an unset variable?), refused.
    Empty,
    /// Shorter than [`MIN_SCOPE_SECRET_LEN`] (its length): refused.
    Short(usize),
    Key([u8; 32]),
}

impl Secret {
    /// Derives the key (BLAKE3's key derivation, with a context string of
    /// its own, so the secret is never used as a key directly).
    pub(crate) fn new(secret: &[u8]) -> Self {
        if secret.is_empty() {
            Self::Empty
        } else if secret.len() < MIN_SCOPE_SECRET_LEN {
            Self::Short(secret.len())
        } else {
            Self::Key(blake3::derive_key(
                "flightdeck-key 2 tenant scope digest key",
                secret,
            ))
        }
    }

    fn check(&self) -> Result<(), KeyConfigError> {
        match self {
            Self::Empty => Err(KeyConfigError::new(
                "scope secret",
                "",
                "is empty; give every node the same random secret (32 bytes or more)",
            )),
            // The value is never shown.
            Self::Short(n) => Err(KeyConfigError::new(
                "scope secret",
                "(not shown)",
                format_args!(
                    "is {n} bytes long, shorter than {MIN_SCOPE_SECRET_LEN}; give every node \
                     the same random secret (32 bytes or more)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Never shows the secret.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "None",
            Self::Empty => "Empty",
            Self::Short(_) => "Short(..)",
            Self::Key(_) => "Key(..)",
        })
    }
}

/// A scope rule, the deployment secret that keys its digests, and the
/// builder's edits of the credential list (applied when building, so they
/// do not depend on the order of the builder's calls).
#[derive(Debug, Clone, Default)]
pub(crate) struct ScopeConfig {
    pub(crate) scope: Scope,
    pub(crate) secret: Secret,
    pub(crate) add: Vec<String>,
    pub(crate) remove: Vec<String>,
}

impl ScopeConfig {
    /// Applies the credential edits and validates.
    pub(crate) fn build(mut self) -> Result<Self, KeyConfigError> {
        for name in self.add.drain(..) {
            self.scope = self.scope.with_credential_header(name);
        }
        for name in self.remove.drain(..) {
            self.scope = self.scope.without_credential_header(name);
        }
        self.scope.validate()?;
        self.secret.check()?;
        Ok(self)
    }

    /// Whether requests get scope digests that no secret keys.
    pub(crate) fn unkeyed(&self) -> bool {
        self.secret == Secret::None && !matches!(self.scope.kind, Kind::Shared)
    }

    /// Keys the digests of built rules with `secret`: the same secret
    /// again changes nothing, another one is refused (two places would
    /// disagree on the key every node must share).
    pub(crate) fn set_secret(&mut self, secret: &[u8]) -> Result<(), KeyConfigError> {
        let new = Secret::new(secret);
        new.check()?;
        match &self.secret {
            Secret::Key(_) if self.secret != new => Err(KeyConfigError::new(
                "scope secret",
                "",
                "is already set to another secret; set it in one place",
            )),
            _ => {
                self.secret = new;
                Ok(())
            }
        }
    }

    /// The scope of a request, or the reason it has none although a rule
    /// asks for one.
    pub(crate) fn of(&self, parts: &Parts) -> Result<Option<Digest>, Reason> {
        let digest = self.scope.compute(parts).map_err(|()| Reason::NoScope)?;
        Ok(match (&self.secret, digest) {
            (Secret::Key(key), Some(d)) => Some(Digest::from_bytes(
                *blake3::keyed_hash(key, d.as_bytes()).as_bytes(),
            )),
            (_, d) => d,
        })
    }
}

impl Default for Scope {
    fn default() -> Self {
        Self::credentials()
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Credentials(list) => f.debug_tuple("Scope::Credentials").field(list).finish(),
            Kind::Shared => f.write_str("Scope::SharedAcrossUsers"),
            Kind::Header(h) => f.debug_tuple("Scope::Header").field(h).finish(),
            Kind::Rule(_) => f.write_str("Scope::Rule"),
            Kind::Invalid(e) => f.debug_tuple("Scope::Invalid").field(e).finish(),
        }
    }
}

/// A value that identifies a tenant or user, as stable bytes.
///
/// The bytes must be the same on every node and every build (keys are
/// compared across processes), which is why this is not `std::hash::Hash`.
/// Integers are written little endian.
pub trait ScopeId {
    /// The identifying bytes.
    fn scope_bytes(&self) -> Cow<'_, [u8]>;
}

impl ScopeId for String {
    fn scope_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl ScopeId for Arc<str> {
    fn scope_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl ScopeId for Vec<u8> {
    fn scope_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

macro_rules! scope_int {
    ($($t:ty),*) => {$(
        impl ScopeId for $t {
            fn scope_bytes(&self) -> Cow<'_, [u8]> {
                Cow::Owned(self.to_le_bytes().to_vec())
            }
        }
    )*};
}

scope_int!(u32, u64, u128, i32, i64);
