//! The nested settings of a stage: sharing, bulkhead, breaker.

use std::time::Duration;

use flightdeck_breaker::{BreakerConfig, Ramp};

#[cfg(feature = "serde")]
use super::duration::required as duration;
use super::error::ConfigError;

/// What of an HTTP response a stage may share with other callers, and
/// replay from the backend. The defaults are HTTP's rules for shared caches
/// (those of nginx and Varnish): a response with `Set-Cookie`, with
/// `Cache-Control: private`, `no-store` or `no-cache`, or with `Vary: *` is
/// for its caller alone; `Vary` on named headers is honoured. Each opt-in
/// trades that safety for more sharing; see the values' docs for the risk.
/// (A route gets its own policy by getting its own stage.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct SharingSettings {
    /// Responses that set cookies: `refuse` (the default), `strip` (shared
    /// without their cookies, which only their caller gets) or `share` (the
    /// same cookie to everyone: only for cookies that are not per user).
    /// Unset: the layer's share adapter decides (`refuse` unless it was
    /// built otherwise).
    #[cfg(feature = "http")]
    pub set_cookie: Option<flightdeck_core::http::SetCookie>,
    /// `Cache-Control: private / no-store / no-cache`: `respect` (the
    /// default) or `ignore` (shared and stored anyway: only for origins
    /// whose headers say nothing about who may see a response). Unset: the
    /// layer's share adapter decides.
    #[cfg(feature = "http")]
    pub cache_control: Option<flightdeck_core::http::CacheControl>,
}

/// The `[single-flight.keys]` table: what of the HTTP key a deployment,
/// rather than the code, decides. The layer's builder applies it to its
/// key rules (HTTP or gRPC) when given the configuration
/// ([`SingleFlightLayerBuilder::config`](crate::SingleFlightLayerBuilder::config));
/// a key builder takes it with [`apply`](Self::apply).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct KeySettings {
    /// Leave the authority (URI authority or `Host`) out of HTTP keys, for
    /// a service reached under several names (each node's own address, a
    /// load balancer's name): `false` by default, since one deployment may
    /// serve several sites whose responses differ by host. (The port is
    /// never part of a key.) `false` keeps what the code chose.
    pub ignore_authority: bool,
    /// The name of an environment variable that holds the scope secret:
    /// the same random secret (32 bytes or more) on every node, which keys
    /// the tenant scope digests stored in Redis key names so they cannot
    /// be checked offline against guessed credentials. The secret itself
    /// never goes in the file. Building fails when the variable is unset
    /// or empty, or when the code set another secret.
    pub scope_secret_env: Option<String>,
}

impl KeySettings {
    /// These settings applied to an HTTP key builder. Fails, naming the
    /// setting, when the scope secret's variable is unset or empty.
    #[cfg(feature = "http")]
    pub fn apply(
        &self,
        mut builder: flightdeck_key::http::HttpKeyExtractorBuilder,
    ) -> Result<flightdeck_key::http::HttpKeyExtractorBuilder, ConfigError> {
        if self.ignore_authority {
            builder = builder.ignore_authority();
        }
        if let Some(secret) = self.scope_secret()? {
            builder = builder.scope_secret(secret);
        }
        Ok(builder)
    }

    /// Whether any setting differs from the default (something to apply).
    pub(crate) fn is_set(&self) -> bool {
        *self != Self::default()
    }

    /// The settings that are set, by their names in the file.
    pub(crate) fn fields_set(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.ignore_authority {
            set.push(IGNORE_AUTHORITY);
        }
        if self.scope_secret_env.is_some() {
            set.push(SCOPE_SECRET_ENV);
        }
        set
    }

    /// The secret named by `scope-secret-env`, read now and checked by the
    /// key rules' own rule (never shown), the error naming the variable.
    #[cfg(feature = "http")]
    pub(crate) fn scope_secret(&self) -> Result<Option<String>, ConfigError> {
        let Some(var) = &self.scope_secret_env else {
            return Ok(None);
        };
        let bad = |message: String| ConfigError::invalid(None, SCOPE_SECRET_ENV, message);
        match std::env::var(var) {
            Ok(secret) => match flightdeck_key::http::check_scope_secret(&secret) {
                Ok(()) => Ok(Some(secret)),
                Err(e) => Err(bad(format!("the variable {var}: {e}"))),
            },
            Err(std::env::VarError::NotPresent) => Err(bad(format!(
                "the variable {var} is not set; set it to the same random secret \
                 (32 bytes or more) on every node"
            ))),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(bad(format!("the variable {var} is not valid UTF-8")))
            }
        }
    }
}

/// `keys.ignore-authority`, as errors name it.
pub(crate) const IGNORE_AUTHORITY: &str = "keys.ignore-authority";
/// `keys.scope-secret-env`, as errors name it.
pub(crate) const SCOPE_SECRET_ENV: &str = "keys.scope-secret-env";

/// The bulkhead of a stage: concurrent real executions, tighter while the
/// stage is degraded.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct BulkheadSettings {
    /// Concurrent executions (1,024).
    pub limit: usize,
    /// Concurrent executions while degraded (default: a quarter of the
    /// limit, at least 1).
    pub degraded_limit: Option<usize>,
    /// Real executions started per second while degraded, in bursts of up
    /// to as many (none by default); beyond it calls are rejected with
    /// `RateLimited` (429 / `RESOURCE_EXHAUSTED`). During a
    /// Redis outage every node runs its own copy, so the rate reaching the
    /// downstream is bounded too, not only the concurrency.
    pub degraded_rate_limit: Option<u32>,
    /// Calls allowed to wait for a slot (0: reject at once).
    pub queue: usize,
    /// How long a queued call waits (100 ms).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub queue_timeout: Duration,
}

impl Default for BulkheadSettings {
    fn default() -> Self {
        Self {
            limit: 1024,
            degraded_limit: None,
            degraded_rate_limit: None,
            queue: 0,
            queue_timeout: Duration::from_millis(100),
        }
    }
}

impl BulkheadSettings {
    /// The degraded limit in force (explicit, or a quarter of the limit).
    pub fn effective_degraded_limit(&self) -> usize {
        self.degraded_limit.unwrap_or((self.limit / 4).max(1))
    }
}

/// The breaker guarding a stage's backend. It counts coordination failures
/// only (unavailable, outcome unknown, protocol), never business errors.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct BreakerSettings {
    /// Calls remembered (100).
    pub window: u32,
    /// Calls needed before the rate is judged (10).
    pub min_calls: u32,
    /// Failure share that opens the circuit (0.5).
    pub failure_rate: f64,
    /// Also open after this many failures in a row (5).
    pub consecutive_failures: Option<u32>,
    /// Base time open before probing (5 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub wait_in_open: Duration,
    /// Random extra open time, as a fraction of the wait (0.5).
    pub jitter: f64,
    /// Probe calls admitted while half-open (3).
    pub half_open_probes: u32,
    /// A probe still running after this long frees its slot (10 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub probe_timeout: Duration,
    /// Gradual return to distributed mode after closing: the share of
    /// leaders sent to the backend in each step (empty: no ramp).
    pub ramp: Vec<f64>,
    /// How long each ramp step lasts (5 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub ramp_step: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            window: 100,
            min_calls: 10,
            failure_rate: 0.5,
            consecutive_failures: Some(5),
            wait_in_open: Duration::from_secs(5),
            jitter: 0.5,
            half_open_probes: 3,
            probe_timeout: Duration::from_secs(10),
            ramp: Vec::new(),
            ramp_step: Duration::from_secs(5),
        }
    }
}

/// The largest breaker window and call counts (the window is kept in
/// memory, per stage).
const MAX_WINDOW: u32 = 100_000;
/// The most half-open probes (each holds a slot in a fixed array).
const MAX_PROBES: u32 = 1_000;

impl BreakerSettings {
    /// Checks the settings, naming the field as the configuration file
    /// spells it (`breaker.half-open-probes`).
    pub(crate) fn validate(&self, stage: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, message: String| {
            Err(ConfigError::invalid(Some(stage), field, message))
        };
        if self.window == 0 || self.window > MAX_WINDOW {
            return bad("breaker.window", format!("must be in 1..={MAX_WINDOW}"));
        }
        if self.min_calls > self.window {
            return bad(
                "breaker.min-calls",
                format!(
                    "{} is more than breaker.window ({})",
                    self.min_calls, self.window
                ),
            );
        }
        if !(self.failure_rate > 0.0 && self.failure_rate <= 1.0) {
            return bad(
                "breaker.failure-rate",
                "must be in (0, 1] (a failure rate)".into(),
            );
        }
        if let Some(n) = self.consecutive_failures {
            if n == 0 || n > MAX_WINDOW {
                return bad(
                    "breaker.consecutive-failures",
                    format!("must be in 1..={MAX_WINDOW}"),
                );
            }
        }
        if !(0.0..=10.0).contains(&self.jitter) {
            return bad(
                "breaker.jitter",
                "must be in 0..=10 (a fraction of the wait)".into(),
            );
        }
        if self.half_open_probes == 0 || self.half_open_probes > MAX_PROBES {
            return bad(
                "breaker.half-open-probes",
                format!("must be in 1..={MAX_PROBES}"),
            );
        }
        for (field, d) in [
            ("breaker.wait-in-open", self.wait_in_open),
            ("breaker.probe-timeout", self.probe_timeout),
            ("breaker.ramp-step", self.ramp_step),
        ] {
            if d > flightdeck_core::time::MAX_SETTING {
                return bad(field, format!("{d:?} is over the bound of 30 days"));
            }
        }
        if self.probe_timeout.is_zero() {
            return bad("breaker.probe-timeout", "must be positive".into());
        }
        if !self.ramp.is_empty() {
            if self.ramp_step.is_zero() {
                return bad("breaker.ramp-step", "must be positive with a ramp".into());
            }
            if self.ramp.len() > 100 || self.ramp.iter().any(|s| !(*s > 0.0 && *s <= 1.0)) {
                return bad(
                    "breaker.ramp",
                    "must be at most 100 shares, each in (0, 1]".into(),
                );
            }
        }
        // What the checks above let through, the breaker accepts; a
        // failure here names the section all the same.
        self.to_breaker_config()
            .validate()
            .map_err(|e| ConfigError::invalid(Some(stage), "breaker", e.to_string()))
    }

    /// The breaker configuration these settings describe.
    pub fn to_breaker_config(&self) -> BreakerConfig {
        let mut cfg = BreakerConfig::default()
            .count_window(self.window)
            .min_calls(self.min_calls)
            .failure_rate(self.failure_rate)
            .wait_in_open(self.wait_in_open)
            .jitter(0.0, self.jitter)
            .half_open_probes(self.half_open_probes)
            .probe_timeout(self.probe_timeout);
        if let Some(n) = self.consecutive_failures {
            cfg = cfg.consecutive_failures(n);
        }
        if !self.ramp.is_empty() {
            cfg = cfg.ramp(Ramp::new(self.ramp.clone(), self.ramp_step));
        }
        cfg
    }
}
