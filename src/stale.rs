//! Answering anyway in this process: how a stage's kept copy answers (the
//! flows are in the service), and how an answer tells its caller what
//! happened ([`MarkAnswer`]: the [`Stale`] marker, and with
//! `cache-status = true` an RFC 9211 `Cache-Status` and an `Age`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::stale::{Failures, Stale};
use flightdeck_core::BoxError;
use flightdeck_local::Answer;

use crate::kept::Kept;

/// How a caller was answered, for [`MarkAnswer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Served {
    /// From this node's fresh copy: `age` old, fresh for `ttl` more.
    Hit {
        /// How old the copy is.
        age: Duration,
        /// How long it stays fresh.
        ttl: Duration,
    },
    /// From this node's stale copy, `past` its freshness.
    Stale {
        /// Why, and how old the copy is.
        stale: Stale,
        /// How far past its freshness.
        past: Duration,
    },
    /// By the work this caller's flight ran (or a stored result: a miss
    /// of this node's copy).
    Miss,
    /// By joining another caller's flight.
    Collapsed,
    /// By its own run, at once, because its key's last response could
    /// not be shared (hit-for-pass).
    Pass,
    /// By a flight this node coordinated alone although the stage is
    /// distributed: its backend failed or its breaker is open (HYBRID's
    /// local fallback), so another node may run the same work. Told only
    /// on a stage that keeps its results (a `replay-ttl` with
    /// `cache-status`, a stale window or hit-for-pass).
    Fallback {
        /// The caller joined the flight another caller led.
        collapsed: bool,
    },
}

impl Served {
    /// The RFC 9211 `Cache-Status` member of flightdeck for this answer
    /// (`flightdeck; hit; ttl=4`, `flightdeck; fwd=stale; ttl=-3;
    /// detail=revalidate`, `flightdeck; fwd=miss; collapsed`, …).
    pub fn cache_status(&self) -> String {
        match self {
            Served::Hit { ttl, .. } => format!("flightdeck; hit; ttl={}", ttl.as_secs()),
            // The remaining freshness in whole seconds, rounded down: a
            // stale answer's is negative (an sf-integer is never "-0").
            Served::Stale { stale, past } => format!(
                "flightdeck; fwd=stale; ttl={}; detail={}",
                -i128::from(past.as_secs() + u64::from(past.subsec_nanos() > 0)),
                stale.reason.as_str()
            ),
            Served::Miss => "flightdeck; fwd=miss".to_owned(),
            Served::Collapsed => "flightdeck; fwd=miss; collapsed".to_owned(),
            Served::Pass => "flightdeck; fwd=bypass; detail=hit-for-pass".to_owned(),
            Served::Fallback { collapsed: false } => {
                "flightdeck; fwd=miss; detail=local-fallback".to_owned()
            }
            Served::Fallback { collapsed: true } => {
                "flightdeck; fwd=miss; collapsed; detail=local-fallback".to_owned()
            }
        }
    }

    /// The age of the copy that answered (an `Age` header), for hits and
    /// stale answers.
    pub fn age(&self) -> Option<Duration> {
        match self {
            Served::Hit { age, .. } => Some(*age),
            Served::Stale { stale, .. } => Some(stale.age),
            _ => None,
        }
    }

    /// The [`Stale`] marker of a stale answer.
    pub fn stale(&self) -> Option<Stale> {
        match self {
            Served::Stale { stale, .. } => Some(*stale),
            _ => None,
        }
    }

    /// How a caller answered by the store itself (`answered`: a hit, a
    /// result past its freshness) is told, `fresh` being the stage's
    /// `replay-ttl`; `None` for an answer the work gave.
    pub(crate) fn by_store(
        answered: flightdeck_distributed::Answered,
        fresh: Duration,
    ) -> Option<Served> {
        use flightdeck_distributed::Answered as By;
        match answered {
            By::Hit { age, fresh_for, .. } => Some(Served::Hit {
                age,
                ttl: fresh_for,
            }),
            By::Stale { stale, .. } => Some(Served::Stale {
                stale,
                past: stale.age.saturating_sub(fresh),
            }),
            _ => None,
        }
    }
}

/// Tells a caller how it was answered: a share adapter puts the [`Stale`]
/// marker on a stale answer (HTTP: in the response's extensions), and,
/// when the stage asks for it (`cache-status = true`), the `Cache-Status`
/// and `Age` of [`Served`] (HTTP and gRPC: headers, which tonic reads as
/// metadata). Values have nowhere to carry either: [`CloneShare`]'s does
/// nothing.
///
/// [`CloneShare`]: flightdeck_core::CloneShare
pub trait MarkAnswer<O> {
    /// Marks `out`; `headers`: the stage's `cache-status`.
    fn mark(&self, out: &mut O, served: Served, headers: bool);
}

impl<T> MarkAnswer<T> for flightdeck_core::CloneShare<T> {
    fn mark(&self, _out: &mut T, _served: Served, _headers: bool) {}
}

#[cfg(feature = "http")]
impl<B> MarkAnswer<http::Response<B>> for flightdeck_core::http::HttpShare {
    fn mark(&self, out: &mut http::Response<B>, served: Served, headers: bool) {
        if let Some(stale) = served.stale() {
            out.extensions_mut().insert(stale);
        }
        if !headers {
            return;
        }
        // Members of our cache go first: RFC 9211 lists the cache nearest
        // the origin first, and we are nearer than whatever adds later.
        if let Ok(v) = http::HeaderValue::from_str(&served.cache_status()) {
            let h = out.headers_mut();
            let before: Vec<_> = h.get_all("cache-status").iter().cloned().collect();
            h.remove("cache-status");
            h.append("cache-status", v);
            for b in before {
                h.append("cache-status", b);
            }
        }
        if let Some(age) = served.age() {
            out.headers_mut()
                .insert(http::header::AGE, http::HeaderValue::from(age.as_secs()));
        }
    }
}

/// An answer of the stale paths, with how it was served.
pub(crate) type Answered<V, O> = (Answer<V, O>, Served);

/// A boxed future of the stale paths (the kept copy, hit-for-pass, a
/// flight raced against its soft timeout): allocated only there.
pub type Answering<V, O> =
    Pin<Box<dyn Future<Output = Result<Answered<V, O>, BoxError>> + Send + 'static>>;

/// A stage's kept copies and the rule of which outcomes they answer for.
pub(crate) struct StaleSetup<V> {
    pub(crate) kept: Arc<Kept<V>>,
    pub(crate) failures: Arc<dyn Failures<V>>,
    /// The builder's weigher (`stale_weigher`), instead of the share
    /// adapter's `kept_size`.
    pub(crate) weigh: Option<Weigher<V>>,
}

/// How many bytes a kept copy counts for against `stale-max-bytes`.
pub(crate) type Weigher<V> = Arc<dyn Fn(&V) -> usize + Send + Sync>;

impl<V> Clone for StaleSetup<V> {
    fn clone(&self) -> Self {
        Self {
            kept: Arc::clone(&self.kept),
            failures: Arc::clone(&self.failures),
            weigh: self.weigh.clone(),
        }
    }
}
