//! Tenant scope: who may share a result with whom.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use flightdeck_core::{Digest, KeyEncoder};
use http::header::{AUTHORIZATION, COOKIE};
use http::request::Parts;
use http::HeaderName;

use crate::error::ConfigError;
use crate::extract::Reason;

type ScopeWriter = dyn Fn(&Parts, &mut KeyEncoder) -> bool + Send + Sync;

/// Where the tenant scope of a request comes from. Requests with different
/// scopes never share a result, whatever else they have in common.
///
/// The default, [`Scope::credentials`], is secure: a request carrying
/// `Authorization` or `Cookie` is scoped by a hash of those credentials, so
/// two users never share; requests without credentials share with each
/// other. A configured rule ([`Scope::header`], [`Scope::extension`],
/// [`Scope::from_fn`]) replaces that default; a request for which the rule
/// finds no scope is then **not coalesced** (it might be a request the auth
/// middleware failed to mark).
///
/// Only the digest of the scope is kept, never the raw value.
#[derive(Clone)]
pub struct Scope {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Credentials,
    Shared,
    Header(HeaderName),
    Rule(Arc<ScopeWriter>),
    Invalid(ConfigError),
}

impl Scope {
    /// The default: a hash of `Authorization` and `Cookie` when the request
    /// carries either, otherwise no scope.
    pub fn credentials() -> Self {
        Self {
            kind: Kind::Credentials,
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
            Err(e) => Kind::Invalid(ConfigError::new("scope header name", name, e)),
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

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match &self.kind {
            Kind::Invalid(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// The scope digest: `Ok(None)` = no scope, `Err(())` = a rule is
    /// configured and found nothing.
    pub(crate) fn compute(&self, parts: &Parts, secret: &[u8]) -> Result<Option<Digest>, ()> {
        let mut enc = KeyEncoder::with_domain(b"flightdeck-key/scope/1");
        enc.push(secret);
        match &self.kind {
            Kind::Shared | Kind::Invalid(_) => Ok(None),
            Kind::Credentials => {
                let auth = parts.headers.get_all(AUTHORIZATION);
                let cookie = parts.headers.get_all(COOKIE);
                if auth.iter().next().is_none() && cookie.iter().next().is_none() {
                    return Ok(None);
                }
                enc.push(b"credentials");
                super::write_values(&mut enc, auth);
                super::write_values(&mut enc, cookie);
                Ok(Some(enc.finish()))
            }
            Kind::Header(name) => {
                let values = parts.headers.get_all(name);
                if values.iter().next().is_none() {
                    return Err(());
                }
                enc.push(b"rule");
                super::write_values(&mut enc, values);
                Ok(Some(enc.finish()))
            }
            Kind::Rule(writer) => {
                enc.push(b"rule");
                if writer(parts, &mut enc) {
                    Ok(Some(enc.finish()))
                } else {
                    Err(())
                }
            }
        }
    }
}

/// A scope rule and the deployment secret mixed into its digests.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScopeConfig {
    pub(crate) scope: Scope,
    pub(crate) secret: Vec<u8>,
}

impl ScopeConfig {
    /// The scope of a request, or the reason it has none although a rule
    /// asks for one.
    pub(crate) fn of(&self, parts: &Parts) -> Result<Option<Digest>, Reason> {
        self.scope
            .compute(parts, &self.secret)
            .map_err(|()| Reason::NoScope)
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
            Kind::Credentials => f.write_str("Scope::Credentials"),
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
