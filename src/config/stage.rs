//! The policy of one stage, its validation, and the layers' policies it
//! describes.

use std::time::Duration;

use flightdeck_core::StaleWindows;
use flightdeck_distributed::DistributedPolicy;
use flightdeck_local::FlightPolicy;

#[cfg(feature = "serde")]
use super::duration::{opt_duration, required as duration};
use super::error::ConfigError;
use super::settings::{BreakerSettings, BulkheadSettings, SharingSettings};
use crate::mode::{Mode, OnWaitFailure};

/// The largest `max-flights` / `max-waiters` (far above any real need; a
/// typo of a few digits more is caught).
const MAX_COUNT: usize = 10_000_000;
/// The largest bulkhead limit or queue.
const MAX_CONCURRENCY: usize = 1_000_000;
/// Redis refuses values over 512 MiB.
const MAX_RESULT_BYTES: usize = 512 * 1024 * 1024;
/// Kept results per stage and node, by default.
pub(crate) const DEFAULT_STALE_MAX_ENTRIES: usize = 10_000;
/// Bytes of kept results per stage and node, by default (64 MiB).
pub(crate) const DEFAULT_STALE_MAX_BYTES: usize = 64 * 1024 * 1024;
/// The largest `stale-max-bytes` (4 GiB).
const MAX_STALE_BYTES: usize = 4 * 1024 * 1024 * 1024;

/// The configuration key of each field a distributed policy's validation
/// can name: a table, not a match with a catch-all arm, so that a field
/// missing here is reported as the policy names it, never as some other
/// key (the `policy_fields_have_keys` test walks it).
const POLICY_KEYS: [(&str, &str); 11] = [
    ("lease", "lease-timeout"),
    ("heartbeat", "heartbeat-interval"),
    ("wait_timeout", "wait-timeout"),
    ("poll_interval", "poll-interval"),
    ("replay_ttl", "replay-ttl"),
    ("failure_ttl", "failure-ttl"),
    ("call_timeout", "coordination-timeout"),
    ("commit_attempts", "commit-attempts"),
    ("commit_replicas", "commit-replicas"),
    ("commit_replicas_timeout", "commit-replicas-timeout"),
    ("max_result_bytes", "max-result-bytes"),
];

/// The configuration key of a distributed policy's field, or the field
/// itself when the table has none.
fn policy_key(field: &'static str) -> &'static str {
    POLICY_KEYS
        .iter()
        .find(|(f, _)| *f == field)
        .map_or(field, |(_, key)| key)
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
    /// The mode (default HYBRID; see [`StageConfig::new`] for a stage
    /// that names no backend).
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
    /// How long a finished result is replayed to *new* requests, in this
    /// process and (HYBRID, DISTRIBUTED_ONLY) across nodes: one setting,
    /// the same in every mode (0, the default: pure single-flight, callers
    /// share only a run that is under way). The callers already waiting
    /// when a result is committed get it whatever this says.
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub replay_ttl: Duration,
    /// How long an owner's failure is replayed to followers (0: not kept).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub failure_ttl: Duration,
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
    /// Replicas that must acknowledge each commit (0: no wait, the
    /// default; at most 16). After a successful commit the owner waits, in
    /// the background, up to `commit-replicas-timeout` (Redis: `WAIT`), and
    /// counts and logs a shortfall; callers have their value either way.
    /// Costs one more round trip per commit, up to the timeout; on Redis
    /// the wait holds this node's connection to the server meanwhile.
    pub commit_replicas: u32,
    /// The longest a `commit-replicas` wait lasts (100 ms; shorter than
    /// `coordination-timeout`).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub commit_replicas_timeout: Duration,
    /// Local flights running at once (10,000).
    pub max_flights: usize,
    /// Callers on one local flight, the leader included (10,000).
    pub max_waiters: usize,
    /// The stage's bulkhead.
    pub bulkhead: BulkheadSettings,
    /// The breaker guarding the stage's backend.
    pub breaker: BreakerSettings,
    /// What of a response may be shared with other callers (HTTP).
    pub sharing: SharingSettings,
    /// Past its freshness (the replay TTL), for this long a result this
    /// node kept answers at once while one refresh runs (0: off).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub stale_while_revalidate: Duration,
    /// Past its freshness, for this long a result this node kept answers
    /// when the work fails ([`Failures`](flightdeck_core::Failures); 0:
    /// off).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub stale_if_error: Duration,
    /// After a failure answered by a stale result, how long the stale
    /// result keeps answering before one caller runs the work again (0:
    /// every caller after a failure runs it; needs `stale-if-error`).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub stale_retry_after: Duration,
    /// Callers still waiting for the work after this long get a kept
    /// result, if one is within its windows; the work goes on (0: off;
    /// shorter than `execution-timeout` and `wait-timeout`).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub soft_timeout: Duration,
    /// For this long before its freshness ends, a result may be refreshed
    /// early by one caller, chosen at random, more likely as the end nears
    /// and the longer the work takes (XFetch; 0: off).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub early_refresh: Duration,
    /// How long a response that may not be shared is remembered for its
    /// key, so that later callers of the key run at once instead of
    /// queueing behind a leader whose result they cannot use (0: off).
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub hit_for_pass: Duration,
    /// Kept results (fresh or stale) of the stage on this node, at most
    /// (10,000; the oldest goes first). Used only when the stage keeps
    /// results: a window, hit-for-pass, or `cache-status` with a replay.
    pub stale_max_entries: usize,
    /// Bytes of kept results of the stage on this node, at most (64 MiB,
    /// counted by the share adapter's measure or the builder's
    /// `stale_weigher`, not the codec's encoding; the oldest goes first).
    pub stale_max_bytes: usize,
    /// Answers carry an RFC 9211 `Cache-Status` header (`flightdeck; hit`,
    /// `flightdeck; fwd=stale; …`), and those from a kept result (hits and
    /// stale ones) an `Age` (gRPC: the same as metadata). Off by default.
    pub cache_status: bool,
    /// Whether the mode was chosen ([`mode`](Self::mode), or `mode` in a
    /// file) rather than left at its default.
    #[cfg_attr(feature = "serde", serde(skip))]
    mode_given: bool,
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
            replay_ttl: Duration::ZERO,
            failure_ttl: Duration::ZERO,
            compress_result: true,
            compress_above: 16 * 1024,
            inline_publish_below: 8 * 1024,
            max_result_bytes: 8 * 1024 * 1024,
            allow_takeover: true,
            on_wait_failure: OnWaitFailure::Wait,
            coordination_timeout: Duration::from_millis(200),
            execution_timeout: None,
            commit_attempts: 3,
            commit_replicas: 0,
            commit_replicas_timeout: Duration::from_millis(100),
            max_flights: 10_000,
            max_waiters: 10_000,
            bulkhead: BulkheadSettings::default(),
            breaker: BreakerSettings::default(),
            sharing: SharingSettings::default(),
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            stale_retry_after: Duration::ZERO,
            soft_timeout: Duration::ZERO,
            early_refresh: Duration::ZERO,
            hit_for_pass: Duration::ZERO,
            stale_max_entries: DEFAULT_STALE_MAX_ENTRIES,
            stale_max_bytes: DEFAULT_STALE_MAX_BYTES,
            cache_status: false,
            mode_given: false,
        }
    }
}

impl StageConfig {
    /// The defaults (HYBRID, lease 30 s, heartbeat 5 s, wait 35 s, no
    /// replay, …).
    ///
    /// A stage that names no [`backend`](Self::backend) and leaves the mode
    /// at its default builds, and runs LOCAL_ONLY: it coalesces in this
    /// process only, as a HYBRID stage does when its store is down, and
    /// the build logs it (at `info`). A mode chosen on purpose
    /// ([`mode`](Self::mode), or `mode` in a file) that needs a backend
    /// without one is a configuration error instead.
    ///
    /// ```
    /// # #[cfg(feature = "http")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flightdeck::key::http::HttpKeyExtractor;
    /// use flightdeck::{Mode, SingleFlightLayer, StageConfig};
    ///
    /// let keys = HttpKeyExtractor::builder().default_stage("report").build()?;
    /// let layer = SingleFlightLayer::builder().keys(keys)
    ///     .stage("report", StageConfig::new())
    ///     .build()?;
    /// assert_eq!(layer.stage("report").unwrap().mode(), Mode::LocalOnly);
    ///
    /// let keys = HttpKeyExtractor::builder().default_stage("report").build()?;
    /// let err = SingleFlightLayer::builder().keys(keys)
    ///     .stage("report", StageConfig::new().mode(Mode::Hybrid))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), Some("backend"));
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "http"))]
    /// # fn main() {}
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self.mode_given = true;
        self
    }

    /// Records that a configuration file chose the mode.
    #[cfg(any(feature = "toml", feature = "yaml"))]
    pub(crate) fn mode_given(&mut self) {
        self.mode_given = true;
    }

    /// Whether this stage runs LOCAL_ONLY for want of a backend: HYBRID by
    /// default (not chosen), with none named.
    pub(crate) fn local_for_want_of_a_backend(&self) -> bool {
        self.mode == Mode::Hybrid && !self.mode_given && self.backend.is_none()
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
        // Bounds first: a value out of range is named as itself, not as
        // the other side of a relation it breaks.
        for (field, value, max) in [
            ("max-flights", self.max_flights, MAX_COUNT),
            ("max-waiters", self.max_waiters, MAX_COUNT),
            ("commit-attempts", self.commit_attempts as usize, 100),
            (
                "commit-replicas",
                self.commit_replicas as usize,
                flightdeck_distributed::policy::MAX_COMMIT_REPLICAS as usize,
            ),
            ("bulkhead.limit", self.bulkhead.limit, MAX_CONCURRENCY),
            ("bulkhead.queue", self.bulkhead.queue, MAX_CONCURRENCY),
            ("max-result-bytes", self.max_result_bytes, MAX_RESULT_BYTES),
            ("stale-max-entries", self.stale_max_entries, MAX_COUNT),
            ("stale-max-bytes", self.stale_max_bytes, MAX_STALE_BYTES),
        ] {
            if value > max {
                return bad(field, format!("{value} is over the bound of {max}"));
            }
        }
        for (field, d) in [
            ("lease-timeout", self.lease_timeout),
            ("heartbeat-interval", self.heartbeat_interval),
            ("wait-timeout", self.wait_timeout),
            ("poll-interval", self.poll_interval),
            ("replay-ttl", self.replay_ttl),
            ("failure-ttl", self.failure_ttl),
            ("coordination-timeout", self.coordination_timeout),
            ("commit-replicas-timeout", self.commit_replicas_timeout),
            ("stale-while-revalidate", self.stale_while_revalidate),
            ("stale-if-error", self.stale_if_error),
            ("stale-retry-after", self.stale_retry_after),
            ("soft-timeout", self.soft_timeout),
            ("early-refresh", self.early_refresh),
            ("hit-for-pass", self.hit_for_pass),
            (
                "execution-timeout",
                self.execution_timeout.unwrap_or_default(),
            ),
            ("bulkhead.queue-timeout", self.bulkhead.queue_timeout),
        ] {
            if d > flightdeck_core::time::MAX_SETTING {
                return bad(field, format!("{d:?} is over the bound of 30 days"));
            }
        }
        if self.mode.is_distributed()
            && self.backend.is_none()
            && !self.local_for_want_of_a_backend()
        {
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
        self.validate_stale(stage)?;
        self.breaker.validate(stage)?;
        // What the checks above let through, the layers accept; a failure
        // here names the setting all the same.
        if let Err(e) = self.distributed_policy().validate() {
            return bad(policy_key(e.field()), e.to_string());
        }
        Ok(())
    }

    /// The stale windows' relations (each window's bound is checked with
    /// the other durations).
    fn validate_stale(&self, stage: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, message: String| {
            Err(ConfigError::invalid(Some(stage), field, message))
        };
        if !self.stale_retry_after.is_zero() && self.stale_if_error.is_zero() {
            return bad(
                "stale-retry-after",
                "needs stale-if-error: it throttles the work of a key whose failures a \
                 stale result answers"
                    .into(),
            );
        }
        if !self.soft_timeout.is_zero() && self.stale_windows().keep_stale().is_zero() {
            return bad(
                "soft-timeout",
                "needs stale-if-error or stale-while-revalidate: callers past it get a \
                 result kept within one of them"
                    .into(),
            );
        }
        if !self.early_refresh.is_zero() && self.replay_ttl.is_zero() {
            return bad(
                "early-refresh",
                "needs replay-ttl: it refreshes a result before its replay ends".into(),
            );
        }
        if !self.soft_timeout.is_zero() && self.soft_timeout >= self.wait_timeout {
            return bad(
                "soft-timeout",
                format!(
                    "{:?} must be shorter than wait-timeout ({:?}): no caller waits that long",
                    self.soft_timeout, self.wait_timeout
                ),
            );
        }
        if let Some(hard) = self.execution_timeout {
            if !self.soft_timeout.is_zero() && self.soft_timeout >= hard {
                return bad(
                    "soft-timeout",
                    format!(
                        "{:?} must be shorter than execution-timeout ({hard:?})",
                        self.soft_timeout
                    ),
                );
            }
        }
        // Hit-for-pass and `cache-status` keep results too: a zero bound
        // would turn them off in silence.
        if self.keeps_results() {
            if self.stale_max_entries == 0 {
                return bad(
                    "stale-max-entries",
                    "must be positive while a stale window, hit-for-pass or cache-status \
                     keeps results"
                        .into(),
                );
            }
            if self.stale_max_bytes == 0 {
                return bad(
                    "stale-max-bytes",
                    "must be positive while a stale window, hit-for-pass or cache-status \
                     keeps results"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// The stale windows these settings describe (all off by default).
    pub fn stale_windows(&self) -> StaleWindows {
        StaleWindows {
            revalidate: self.stale_while_revalidate,
            if_error: self.stale_if_error,
            retry_after: self.stale_retry_after,
            soft_timeout: self.soft_timeout,
            early_refresh: self.early_refresh,
        }
    }

    /// Whether the stage keeps its results on this node: a stale window
    /// or hit-for-pass is on, or `cache-status` must tell its replays
    /// (hits, with their age) from the callers that joined a flight.
    pub(crate) fn keeps_results(&self) -> bool {
        self.stale_windows().any()
            || !self.hit_for_pass.is_zero()
            || (self.cache_status && !self.replay_ttl.is_zero())
    }

    /// How long after a work starts its result may still reach the store:
    /// the work's bound (`execution-timeout`, or `wait-timeout` without
    /// one), two leases (a commit's retries while its lease holds, and
    /// one more) and a call. What remains of a kept copy that went keeps
    /// older work from answering that much past the copy's windows.
    pub(crate) fn settle_bound(&self) -> Duration {
        self.execution_timeout
            .unwrap_or(self.wait_timeout)
            .saturating_add(self.lease_timeout.saturating_mul(2))
            .saturating_add(self.coordination_timeout)
    }

    /// The L2 policy these settings describe.
    pub fn distributed_policy(&self) -> DistributedPolicy {
        DistributedPolicy::new()
            .lease(self.lease_timeout)
            .heartbeat(self.heartbeat_interval)
            .wait_timeout(self.wait_timeout)
            .poll_interval(self.poll_interval)
            .replay_ttl(self.replay_ttl)
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
            .commit_replicas(self.commit_replicas)
            .commit_replicas_timeout(self.commit_replicas_timeout)
            .stale_windows(self.stale_windows())
    }

    /// The L1 policy these settings describe. The local wait covers the
    /// whole distributed wait (a local waiter waits on a leader that may be
    /// following another node). What happens to a flight its callers left
    /// is decided per flight, by the mode its leader found on arrival (a
    /// distributed flight finishes: other nodes may wait on it; a local one
    /// is cancelled).
    pub fn local_policy(&self) -> FlightPolicy {
        FlightPolicy::new()
            .wait_timeout(Some(
                self.wait_timeout
                    .saturating_add(self.coordination_timeout.saturating_mul(2)),
            ))
            .flight_ttl(self.lease_timeout.max(self.wait_timeout))
            // A stage that keeps its results for the stale windows replays
            // them from that copy (one copy, one purge), not from L1's.
            // Otherwise L1 replays in every mode, but only what a flight
            // led in a local mode produced: the leader says so per flight
            // (a flight led through the store is replayed from the store),
            // so a mode switch changes where a replay comes from, never
            // its age.
            .replay_ttl(if self.keeps_results() {
                Duration::ZERO
            } else {
                self.replay_ttl
            })
            .max_flights(self.max_flights)
            .max_waiters(self.max_waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key of the table is a key of the stage table, and the policy
    /// refuses a broken value of each field the table names.
    #[test]
    fn policy_fields_have_keys() {
        let stage = StageConfig::new();
        let broken: [(&str, DistributedPolicy); 4] = [
            ("lease", stage.distributed_policy().lease(Duration::ZERO)),
            (
                "heartbeat",
                stage.distributed_policy().heartbeat(Duration::ZERO),
            ),
            (
                "poll_interval",
                stage.distributed_policy().poll_interval(Duration::ZERO),
            ),
            (
                "commit_attempts",
                stage.distributed_policy().commit_attempts(0),
            ),
        ];
        for (field, policy) in broken {
            let err = policy.validate().unwrap_err();
            assert_eq!(err.field(), field);
            assert_ne!(policy_key(err.field()), field, "{field} has a key");
        }
        assert_eq!(policy_key("something_new"), "something_new");
    }
}
