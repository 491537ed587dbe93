//! Breaker settings and their validation.

use std::fmt;
use std::time::Duration;

/// How the breaker remembers recent calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// The last `size` calls. A new call evicts the oldest one, so the
    /// failure rate is always over the most recent calls (not a cumulative
    /// count that is only reset on a state change).
    Count {
        /// Number of calls kept.
        size: u32,
    },
    /// The calls of the last `duration`, kept in `buckets` fixed buckets:
    /// memory is O(buckets) whatever the call rate; a whole bucket expires
    /// at once.
    Time {
        /// Length of the window.
        duration: Duration,
        /// Number of buckets the window is split into.
        buckets: u32,
    },
}

/// A gradual return to full traffic after the breaker closes, so a
/// dependency that just recovered is not hit by every caller at once.
///
/// For `step` after closing, only `shares[0]` of the calls are let through
/// (the rest are rejected as if the circuit were open), then `shares[1]`,
/// and so on; after the last step every call goes through. Admission is
/// counted, not random, so a step lets through its share to within one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    pub(crate) shares: Vec<f64>,
    pub(crate) step: Duration,
}

impl Ramp {
    /// A ramp over `shares` (each in `(0, 1]`), each lasting `step`.
    pub fn new(shares: impl Into<Vec<f64>>, step: Duration) -> Self {
        Self {
            shares: shares.into(),
            step,
        }
    }

    /// The shares of each step.
    pub fn shares(&self) -> &[f64] {
        &self.shares
    }

    /// How long each step lasts.
    pub fn step(&self) -> Duration {
        self.step
    }
}

/// Settings of one circuit breaker. Start from [`BreakerConfig::default`]
/// and change what you need; [`Breaker::new`](crate::Breaker::new) validates.
///
/// Defaults: count window of 100 calls, opens at a 50 % failure rate once 10
/// calls are in the window, no consecutive-failure rule, no slow-call rule;
/// open for 5 s plus a random 0–50 % (so nodes do not probe together); 3
/// probes in half-open, all must succeed; a probe that has not finished after
/// 10 s frees its slot; no growth of the open wait; no ramp.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    pub(crate) window: WindowKind,
    pub(crate) failure_rate: f64,
    pub(crate) min_calls: u32,
    pub(crate) consecutive_failures: Option<u32>,
    pub(crate) slow_call: Option<Duration>,
    pub(crate) wait_in_open: Duration,
    pub(crate) jitter: (f64, f64),
    pub(crate) wait_growth: f64,
    pub(crate) max_wait: Duration,
    pub(crate) half_open_probes: u32,
    pub(crate) success_threshold: Option<u32>,
    pub(crate) probe_timeout: Duration,
    pub(crate) ramp: Option<Ramp>,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: WindowKind::Count { size: 100 },
            failure_rate: 0.5,
            min_calls: 10,
            consecutive_failures: None,
            slow_call: None,
            wait_in_open: Duration::from_secs(5),
            jitter: (0.0, 0.5),
            wait_growth: 1.0,
            max_wait: Duration::from_secs(300),
            half_open_probes: 3,
            success_threshold: None,
            probe_timeout: Duration::from_secs(10),
            ramp: None,
        }
    }
}

impl BreakerConfig {
    /// Keeps the last `size` calls (a truly sliding count window).
    pub fn count_window(mut self, size: u32) -> Self {
        self.window = WindowKind::Count { size };
        self
    }

    /// Keeps the calls of the last `duration` in `buckets` fixed buckets.
    pub fn time_window(mut self, duration: Duration, buckets: u32) -> Self {
        self.window = WindowKind::Time { duration, buckets };
        self
    }

    /// Opens when the share of failures in the window reaches `rate`
    /// (`0.0 < rate <= 1.0`).
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = rate;
        self
    }

    /// The failure rate is only judged once the window holds this many
    /// calls (it does not wait for the window to be full).
    pub fn min_calls(mut self, n: u32) -> Self {
        self.min_calls = n;
        self
    }

    /// Also opens after `n` failures in a row, whatever the rate.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = Some(n);
        self
    }

    /// A call slower than `threshold` counts as a failure, whatever its
    /// result.
    pub fn slow_call(mut self, threshold: Duration) -> Self {
        self.slow_call = Some(threshold);
        self
    }

    /// Base time the circuit stays open before probing.
    pub fn wait_in_open(mut self, wait: Duration) -> Self {
        self.wait_in_open = wait;
        self
    }

    /// Random extra open time, as fractions of the wait: the actual wait is
    /// `wait * (1 + u)` with `u` uniform in `[min, max]`. Breakers on many
    /// nodes that opened together then probe at different moments.
    /// `(0.0, 0.0)` disables jitter.
    pub fn jitter(mut self, min: f64, max: f64) -> Self {
        self.jitter = (min, max);
        self
    }

    /// Each reopening without a successful close in between multiplies the
    /// wait by `factor` (`>= 1.0`), up to `max` (before jitter).
    pub fn wait_growth(mut self, factor: f64, max: Duration) -> Self {
        self.wait_growth = factor;
        self.max_wait = max;
        self
    }

    /// How many probe calls half-open admits at once (not every call):
    /// 1 to 10,000.
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.half_open_probes = n;
        self
    }

    /// How many successful probes close the circuit (default: the number of
    /// probes). One failed probe reopens it.
    pub fn success_threshold(mut self, n: u32) -> Self {
        self.success_threshold = Some(n);
        self
    }

    /// A probe that has not finished after this long frees its slot, so a
    /// hung call cannot keep the breaker half-open forever. Its late result
    /// is ignored.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Returns gradually to full traffic after closing.
    pub fn ramp(mut self, ramp: Ramp) -> Self {
        self.ramp = Some(ramp);
        self
    }

    pub(crate) fn successes_needed(&self) -> u32 {
        self.success_threshold.unwrap_or(self.half_open_probes)
    }

    /// Checks the settings, naming the first bad one.
    pub fn validate(&self) -> Result<(), BreakerConfigError> {
        let bad = |what: &'static str| Err(BreakerConfigError { what });
        match self.window {
            WindowKind::Count { size: 0 } => return bad("count window size must be > 0"),
            WindowKind::Time { duration, buckets } => {
                if buckets == 0 || buckets > 10_000 {
                    return bad("time window buckets must be in 1..=10000");
                }
                if duration.is_zero() || duration / buckets < Duration::from_millis(1) {
                    return bad("time window buckets must be at least 1 ms long");
                }
            }
            WindowKind::Count { .. } => {}
        }
        if !(self.failure_rate > 0.0 && self.failure_rate <= 1.0) {
            return bad("failure rate must be in (0, 1]");
        }
        if self.consecutive_failures == Some(0) {
            return bad("consecutive failures must be > 0");
        }
        if self.slow_call.is_some_and(|d| d.is_zero()) {
            return bad("slow call threshold must be > 0");
        }
        let (lo, hi) = self.jitter;
        if !(0.0..=10.0).contains(&lo) || !(lo..=10.0).contains(&hi) {
            return bad("jitter must satisfy 0 <= min <= max <= 10");
        }
        if !(self.wait_growth >= 1.0 && self.wait_growth.is_finite()) {
            return bad("wait growth factor must be >= 1");
        }
        // Each probe holds a slot of an array allocated up front.
        if self.half_open_probes == 0 || self.half_open_probes > MAX_PROBES {
            return bad("half-open probes must be in 1..=10000");
        }
        if self.successes_needed() == 0 {
            return bad("success threshold must be > 0");
        }
        if self.probe_timeout.is_zero() {
            return bad("probe timeout must be > 0");
        }
        if let Some(r) = &self.ramp {
            if r.shares.is_empty() || r.step.is_zero() {
                return bad("ramp needs at least one step of non-zero length");
            }
            if r.shares.iter().any(|s| !(*s > 0.0 && *s <= 1.0)) {
                return bad("ramp shares must be in (0, 1]");
            }
        }
        Ok(())
    }
}

/// The most half-open probes (each holds a slot, allocated when the
/// breaker is built).
const MAX_PROBES: u32 = 10_000;

/// A breaker setting is out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfigError {
    what: &'static str,
}

impl fmt::Display for BreakerConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid breaker config: {}", self.what)
    }
}

impl std::error::Error for BreakerConfigError {}
