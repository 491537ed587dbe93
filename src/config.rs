//! Per-stage policy: [`StageConfig`], loadable from TOML and YAML in the
//! shape of the design articles (seed 002 §11), with defaults, and
//! validated with errors that name the stage and the field.
//!
//! ```
//! # #[cfg(feature = "yaml")] {
//! use std::time::Duration;
//! use flightdeck::{Mode, SingleFlightConfig};
//!
//! let cfg = SingleFlightConfig::from_yaml(r#"
//! single-flight:
//!   stages:
//!     interview-score:
//!       backend: main
//!       lease-timeout: 30s
//!       heartbeat-interval: 5s
//!       wait-timeout: 35s
//!       result-ttl: 60s
//!     resume-question:
//!       mode: local-only
//! "#).unwrap();
//! let score = &cfg.stages["interview-score"];
//! assert_eq!(score.mode, Mode::Hybrid);
//! assert_eq!(score.heartbeat_interval, Duration::from_secs(5));
//!
//! let err = SingleFlightConfig::from_yaml(r#"
//! single-flight:
//!   stages:
//!     final-report:
//!       backend: main
//!       lease-timeout: 30s
//!       heartbeat-interval: 15s
//! "#).unwrap_err();
//! assert_eq!(err.stage(), Some("final-report"));
//! assert_eq!(err.field(), Some("heartbeat-interval"));
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use flightdeck_breaker::{BreakerConfig, Ramp};
use flightdeck_distributed::DistributedPolicy;
use flightdeck_local::{FlightPolicy, OnAbandon};

use crate::mode::{Mode, OnWaitFailure};

/// The `single-flight:` section: one [`StageConfig`] per stage name.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct SingleFlightConfig {
    /// The stages, by name.
    pub stages: BTreeMap<String, StageConfig>,
}

#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(rename = "single-flight")]
    single_flight: SingleFlightConfig,
}

impl SingleFlightConfig {
    /// An empty configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a stage.
    pub fn stage(mut self, name: impl Into<String>, cfg: StageConfig) -> Self {
        self.stages.insert(name.into(), cfg);
        self
    }

    /// Checks every stage (see [`StageConfig::validate`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, stage) in &self.stages {
            if flightdeck_core::StageName::new(name).is_err() {
                return Err(ConfigError::invalid(
                    Some(name),
                    "stage",
                    "is not a valid stage name",
                ));
            }
            stage.validate(name)?;
        }
        Ok(())
    }

    /// Parses a TOML document with a `[single-flight.stages.NAME]` table per
    /// stage, then validates it.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let doc: Document = toml::from_str(text).map_err(|e| ConfigError::Parse {
            format: "toml",
            message: e.to_string(),
        })?;
        doc.single_flight.validate()?;
        Ok(doc.single_flight)
    }

    /// Parses a YAML document with a `single-flight: stages: NAME:` mapping
    /// per stage, then validates it.
    #[cfg(feature = "yaml")]
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let doc: Document = serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
            format: "yaml",
            message: e.to_string(),
        })?;
        doc.single_flight.validate()?;
        Ok(doc.single_flight)
    }
}

/// The policy of one stage. Every field has a default (see
/// [`StageConfig::default`]); configuration files use the kebab-case names
/// (`lease-timeout`, `heartbeat-interval`, …) and durations written as
/// `"500ms"`, `"30s"`, `"10m"`, `"1h"` or combinations like `"1m30s"`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct StageConfig {
    /// The mode (default HYBRID).
    pub mode: Mode,
    /// The name of the coordination backend (given to the
    /// [`SingleFlightLayer`](crate::SingleFlightLayer) builder); required by
    /// HYBRID and DISTRIBUTED_ONLY.
    pub backend: Option<String>,
    /// How long an owner holds a flight without a heartbeat (30 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub lease_timeout: Duration,
    /// How often the owner renews its lease (5 s; at most a third of the
    /// lease).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub heartbeat_interval: Duration,
    /// How long a caller waits for a shared result, locally or from another
    /// node (35 s; at least the lease when takeover is allowed).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub wait_timeout: Duration,
    /// The longest pause between two re-checks of a follower (1 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub poll_interval: Duration,
    /// How long a committed result is replayed to other nodes (60 s).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub result_ttl: Duration,
    /// How long an owner's failure is replayed to followers (0: not kept).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub failure_ttl: Duration,
    /// How long a finished local result is replayed to newcomers in this
    /// process (0: pure single-flight).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub local_replay_ttl: Duration,
    /// Compress stored results (true).
    pub compress_result: bool,
    /// Size above which stored results are compressed (16 KiB).
    pub compress_above: usize,
    /// Results up to this size travel inside the completion notice (8 KiB).
    pub inline_publish_below: usize,
    /// Larger results are not stored (8 MiB).
    pub max_result_bytes: usize,
    /// A follower may take over a flight whose owner's lease expired
    /// (true).
    pub allow_takeover: bool,
    /// What a follower's caller gets when the wait fails (`wait`).
    pub on_wait_failure: OnWaitFailure,
    /// Each coordination round trip (acquire, heartbeat, commit) gets at
    /// most this long (200 ms): the coordination slice of the budget.
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub coordination_timeout: Duration,
    /// Total time the real execution may take (none by default): the
    /// execution slice of the budget, enforced around the inner service.
    #[cfg_attr(feature = "serde", serde(with = "opt_duration"))]
    pub execution_timeout: Option<Duration>,
    /// Attempts to write a result after execution (3); never re-executes.
    pub commit_attempts: u32,
    /// Local flights running at once (10,000).
    pub max_flights: usize,
    /// Callers on one local flight, the leader included (10,000).
    pub max_waiters: usize,
    /// The stage's bulkhead.
    pub bulkhead: BulkheadSettings,
    /// The breaker guarding the stage's backend.
    pub breaker: BreakerSettings,
}

impl Default for StageConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Hybrid,
            backend: None,
            lease_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(35),
            poll_interval: Duration::from_secs(1),
            result_ttl: Duration::from_secs(60),
            failure_ttl: Duration::ZERO,
            local_replay_ttl: Duration::ZERO,
            compress_result: true,
            compress_above: 16 * 1024,
            inline_publish_below: 8 * 1024,
            max_result_bytes: 8 * 1024 * 1024,
            allow_takeover: true,
            on_wait_failure: OnWaitFailure::Wait,
            coordination_timeout: Duration::from_millis(200),
            execution_timeout: None,
            commit_attempts: 3,
            max_flights: 10_000,
            max_waiters: 10_000,
            bulkhead: BulkheadSettings::default(),
            breaker: BreakerSettings::default(),
        }
    }
}

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
    /// `RateLimited` (429 / `RESOURCE_EXHAUSTED`). Seed 000 §10: during a
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

impl BreakerSettings {
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

impl StageConfig {
    /// The defaults (HYBRID, lease 30 s, heartbeat 5 s, wait 35 s, result
    /// TTL 60 s, …).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Names the backend.
    pub fn backend(mut self, name: impl Into<String>) -> Self {
        self.backend = Some(name.into());
        self
    }

    /// Checks the settings; the error names `stage` and the field (in the
    /// configuration file's spelling).
    pub fn validate(&self, stage: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, message: String| {
            Err(ConfigError::invalid(Some(stage), field, message))
        };
        if self.mode.is_distributed() && self.backend.is_none() {
            return bad(
                "backend",
                format!("is required by mode {}", self.mode.as_str()),
            );
        }
        if self.lease_timeout < Duration::from_millis(10) {
            return bad("lease-timeout", "must be at least 10ms".into());
        }
        if self.heartbeat_interval.is_zero() {
            return bad("heartbeat-interval", "must be positive".into());
        }
        if self.heartbeat_interval.saturating_mul(3) > self.lease_timeout {
            return bad(
                "heartbeat-interval",
                format!(
                    "{:?} must be at most a third of lease-timeout ({:?})",
                    self.heartbeat_interval, self.lease_timeout
                ),
            );
        }
        if self.wait_timeout.is_zero() {
            return bad("wait-timeout", "must be positive".into());
        }
        if self.allow_takeover && self.wait_timeout < self.lease_timeout {
            return bad(
                "wait-timeout",
                format!(
                    "{:?} must be at least lease-timeout ({:?}) when takeover is allowed",
                    self.wait_timeout, self.lease_timeout
                ),
            );
        }
        if self.poll_interval.is_zero() {
            return bad("poll-interval", "must be positive".into());
        }
        if self.result_ttl <= self.poll_interval {
            return bad("result-ttl", "must be longer than poll-interval".into());
        }
        if self.coordination_timeout.is_zero() || self.coordination_timeout >= self.lease_timeout {
            return bad(
                "coordination-timeout",
                "must be positive and shorter than lease-timeout".into(),
            );
        }
        if self.execution_timeout.is_some_and(|d| d.is_zero()) {
            return bad("execution-timeout", "must be positive".into());
        }
        if self.commit_attempts == 0 {
            return bad("commit-attempts", "must be at least 1".into());
        }
        if self.max_result_bytes == 0 {
            return bad("max-result-bytes", "must be positive".into());
        }
        if self.max_flights == 0 {
            return bad("max-flights", "must be positive".into());
        }
        if self.max_waiters == 0 {
            return bad("max-waiters", "must be positive".into());
        }
        if self.on_wait_failure == OnWaitFailure::Local && self.mode == Mode::DistributedOnly {
            return bad(
                "on-wait-failure",
                "local execution is an opt-in of hybrid stages, never of distributed-only".into(),
            );
        }
        if self.bulkhead.limit == 0 {
            return bad("bulkhead.limit", "must be positive".into());
        }
        if let Some(d) = self.bulkhead.degraded_limit {
            if d == 0 || d > self.bulkhead.limit {
                return bad(
                    "bulkhead.degraded-limit",
                    format!("must be in 1..={}", self.bulkhead.limit),
                );
            }
        }
        if self.bulkhead.degraded_rate_limit == Some(0) {
            return bad(
                "bulkhead.degraded-rate-limit",
                "must be at least 1 (permits per second)".into(),
            );
        }
        if self.bulkhead.queue > 0 && self.bulkhead.queue_timeout.is_zero() {
            return bad(
                "bulkhead.queue-timeout",
                "must be positive with a queue".into(),
            );
        }
        if let Err(e) = self.breaker.to_breaker_config().validate() {
            return bad("breaker", e.to_string());
        }
        if let Err(e) = self.distributed_policy().validate() {
            return bad("policy", e.to_string());
        }
        Ok(())
    }

    /// The L2 policy these settings describe.
    pub fn distributed_policy(&self) -> DistributedPolicy {
        DistributedPolicy::new()
            .lease(self.lease_timeout)
            .heartbeat(self.heartbeat_interval)
            .wait_timeout(self.wait_timeout)
            .poll_interval(self.poll_interval)
            .result_ttl(self.result_ttl)
            .failure_ttl(self.failure_ttl)
            .compress_above(if self.compress_result {
                self.compress_above
            } else {
                usize::MAX
            })
            .inline_below(self.inline_publish_below)
            .max_result_bytes(self.max_result_bytes)
            .allow_takeover(self.allow_takeover)
            .call_timeout(self.coordination_timeout)
            .commit_attempts(self.commit_attempts)
            // "in progress" and "fail" answer as soon as a follower's
            // re-check fails; "wait" and "local" wait until the lease must
            // have expired (never run at once while another node may own it).
            .give_up_on_wait_failure(matches!(
                self.on_wait_failure,
                OnWaitFailure::InProgress | OnWaitFailure::Fail
            ))
    }

    /// The L1 policy these settings describe. The local wait covers the
    /// whole distributed wait (a local waiter waits on a leader that may be
    /// following another node), and flights finish when their callers leave
    /// (other nodes may be waiting on them).
    pub fn local_policy(&self) -> FlightPolicy {
        FlightPolicy::new()
            .wait_timeout(Some(
                self.wait_timeout
                    .saturating_add(self.coordination_timeout.saturating_mul(2)),
            ))
            .flight_ttl(self.lease_timeout.max(self.wait_timeout))
            .replay_ttl(self.local_replay_ttl)
            .on_abandon(if self.mode.is_distributed() {
                OnAbandon::Finish
            } else {
                OnAbandon::Cancel
            })
            .max_flights(self.max_flights)
            .max_waiters(self.max_waiters)
    }
}

/// A configuration that cannot be used. Names the stage and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The document does not parse (the message comes from the parser and
    /// names the line and the key).
    Parse {
        /// `toml` or `yaml`.
        format: &'static str,
        /// The parser's message.
        message: String,
    },
    /// A value is out of range or contradicts another.
    Invalid {
        /// The stage, when the error is about one.
        stage: Option<String>,
        /// The field, as spelled in the configuration file.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(
        stage: Option<&str>,
        field: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            stage: stage.map(str::to_owned),
            field,
            message: message.into(),
        }
    }

    /// The stage the error is about, if any.
    pub fn stage(&self) -> Option<&str> {
        match self {
            Self::Invalid { stage, .. } => stage.as_deref(),
            Self::Parse { .. } => None,
        }
    }

    /// The field the error is about, if known.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Parse { .. } => None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse { format, message } => write!(f, "invalid {format} config: {message}"),
            Self::Invalid {
                stage: Some(stage),
                field,
                message,
            } => write!(f, "stage {stage:?}: {field}: {message}"),
            Self::Invalid {
                stage: None,
                field,
                message,
            } => write!(f, "{field}: {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses a duration such as `500ms`, `30s`, `10m`, `1h`, `2d` or
/// `1m30s` (units `ms`, `s`, `m`, `h`, `d`; a bare `0` is zero).
///
/// ```
/// use std::time::Duration;
/// use flightdeck::config::parse_duration;
///
/// assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
/// assert!(parse_duration("30").is_err());
/// assert!(parse_duration("-1s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {text:?}: expected a number"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "d" => Duration::from_secs(n.saturating_mul(86_400)),
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit (ms, s, m, h, d)"
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (ms, s, m, h, d)"
                ))
            }
        };
        total = total.saturating_add(part);
    }
    Ok(total)
}

#[cfg(feature = "serde")]
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "serde")]
mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| super::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}
