//! The stage policy of distributed single-flight, validated.
//!
//! # The clocks, and the lease rules they serve
//!
//! - **`lease`**: how long an owner holds a flight without a heartbeat.
//!   The owner renews it every **`heartbeat`** (at most a third of the
//!   lease, so two renewals may fail before it runs out) from its grant
//!   until its commit or abandon has returned, not only while the work
//!   runs. A follower takes the flight over only once the lease has run
//!   out (or, with `allow_takeover(false)`, stops waiting then). While the
//!   work runs, the heartbeats are sent by the owner's own future: work
//!   that holds its thread without yielding (a blocking call, a long
//!   computation with no `.await`) for longer than the lease lets it lapse;
//!   such work belongs in `tokio::task::spawn_blocking`.
//! - **`call_timeout`**: the deadline of each backend call (shorter than
//!   the lease). A call cut by it has an unknown outcome: if it was an
//!   acquire, the token may hold a lease anyway, so it is released in the
//!   background as soon as the backend answers.
//! - **`wait_timeout`**: how long a follower waits for another node's
//!   result (at least the lease when takeover is allowed, so a follower
//!   outlives a dead owner's lease and takes over). Past it the stage's
//!   fallback decides.
//! - **`poll_interval`**: the longest a follower goes without re-checking,
//!   whatever the push channel does.
//! - **`replay_ttl`** / **`failure_ttl`**: how long a committed result (or
//!   the owner's cached failure) is replayed to *new* requests (both zero
//!   by default: single-flight, no caching).
//! - **retention for waiters** (derived, [`waiter_retention`]): how long
//!   the store keeps a committed result for the followers that were
//!   already waiting when it was committed, whatever `replay_ttl` says:
//!   two poll intervals and a call timeout, so a follower that missed the
//!   notice still finds it at its next re-check. Not caching: a new
//!   request never gets it.
//!
//! [`waiter_retention`]: DistributedPolicy::waiter_retention
//! - **`stale_windows`**: how long past `replay_ttl` the store keeps a
//!   result to answer stale across nodes, and when it answers (see
//!   [`StaleWindows`]; all off by default). A stage with a window asks the
//!   store for stale results; one without pays nothing.
//! - **`state_ttl`** (derived): how long the backend keeps a flight's
//!   record after its last write. Generations never go back for a key,
//!   whatever expired: they do not depend on it.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_distributed::DistributedPolicy;
//!
//! let policy = DistributedPolicy::new()
//!     .lease(Duration::from_secs(9))
//!     .heartbeat(Duration::from_secs(3))
//!     .validate()
//!     .unwrap();
//! assert_eq!(policy.heartbeat_interval(), Duration::from_secs(3));
//!
//! // A heartbeat slower than a third of the lease is rejected, naming the field.
//! let err = DistributedPolicy::new()
//!     .lease(Duration::from_secs(10))
//!     .heartbeat(Duration::from_secs(5))
//!     .validate()
//!     .unwrap_err();
//! assert!(err.to_string().contains("heartbeat"));
//! ```

use std::fmt;
use std::time::Duration;

use flightdeck_core::stale::StaleWindows;

/// How one stage coordinates across nodes (see the [module docs](self)
/// for how its clocks relate). Build with the setters, then
/// [`validate`](Self::validate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistributedPolicy {
    lease: Duration,
    heartbeat: Duration,
    wait_timeout: Duration,
    poll_interval: Duration,
    replay_ttl: Duration,
    failure_ttl: Duration,
    compress_above: usize,
    inline_below: usize,
    max_result_bytes: usize,
    allow_takeover: bool,
    cancel_on_lease_loss: bool,
    call_timeout: Duration,
    commit_attempts: u32,
    commit_replicas: u32,
    commit_replicas_timeout: Duration,
    stale: StaleWindows,
}

/// The most replicas [`DistributedPolicy::commit_replicas`] may ask for.
pub const MAX_COMMIT_REPLICAS: u32 = 16;

impl DistributedPolicy {
    /// The defaults: lease 30 s, heartbeat 5 s, wait timeout 35 s, poll
    /// every 1 s, results and failures not replayed to new requests, compression above
    /// 16 KiB, inline notices up to 8 KiB, results up to 8 MiB, takeover
    /// allowed, work not cancelled on lease loss, 1 s per backend call,
    /// 3 commit attempts, no wait for replicas (`commit_replicas` 0, a
    /// 100 ms timeout when set).
    pub const fn new() -> Self {
        Self {
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(35),
            poll_interval: Duration::from_secs(1),
            replay_ttl: Duration::ZERO,
            failure_ttl: Duration::ZERO,
            compress_above: 16 * 1024,
            inline_below: 8 * 1024,
            max_result_bytes: 8 * 1024 * 1024,
            allow_takeover: true,
            cancel_on_lease_loss: false,
            call_timeout: Duration::from_secs(1),
            commit_attempts: 3,
            commit_replicas: 0,
            commit_replicas_timeout: Duration::from_millis(100),
            stale: StaleWindows::OFF,
        }
    }

    /// Answering anyway across nodes (all off by default): results are
    /// kept [`StaleWindows::keep_stale`] past `replay_ttl`, and a stale
    /// one answers within `revalidate` while one refresh runs, within
    /// `if_error` when the work fails (judged by
    /// [`Execute::failures`](crate::Execute::failures)), then throttled
    /// for `retry_after`, past `soft_timeout`, and `early_refresh` before
    /// freshness ends (one caller refreshes).
    #[must_use]
    pub const fn stale_windows(mut self, w: StaleWindows) -> Self {
        self.stale = w;
        self
    }

    /// How long an owner holds a flight without a heartbeat.
    #[must_use]
    pub const fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }

    /// How often the owner renews its lease (at most a third of the lease).
    #[must_use]
    pub const fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = d;
        self
    }

    /// How long a follower waits for another node's result.
    #[must_use]
    pub const fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = d;
        self
    }

    /// The longest a follower goes without re-checking the flight (with
    /// jitter), whatever pub/sub does.
    #[must_use]
    pub const fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// How long a committed result is replayed to new requests (zero, the
    /// default: never; the followers already waiting get it all the same,
    /// see [`waiter_retention`](Self::waiter_retention)).
    #[must_use]
    pub const fn replay_ttl(mut self, d: Duration) -> Self {
        self.replay_ttl = d;
        self
    }

    /// How long an owner's failure is replayed (zero: followers race again
    /// at once).
    #[must_use]
    pub const fn failure_ttl(mut self, d: Duration) -> Self {
        self.failure_ttl = d;
        self
    }

    /// Encoded results larger than this are compressed (lz4).
    #[must_use]
    pub const fn compress_above(mut self, bytes: usize) -> Self {
        self.compress_above = bytes;
        self
    }

    /// Stored results up to this size travel inline in the completion
    /// notice, sparing followers a read.
    #[must_use]
    pub const fn inline_below(mut self, bytes: usize) -> Self {
        self.inline_below = bytes;
        self
    }

    /// Larger results are not stored: the owner's callers get the value,
    /// followers race again.
    #[must_use]
    pub const fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// Whether a follower may take over a flight whose owner died.
    #[must_use]
    pub const fn allow_takeover(mut self, yes: bool) -> Self {
        self.allow_takeover = yes;
        self
    }

    /// Whether the owner's work is cancelled when a heartbeat finds the
    /// lease lost (the caller gets `LeaseLost`). Off by default: the work
    /// finishes, its commit is fenced and the value is served locally.
    #[must_use]
    pub const fn cancel_on_lease_loss(mut self, yes: bool) -> Self {
        self.cancel_on_lease_loss = yes;
        self
    }

    /// The deadline of every single backend call.
    #[must_use]
    pub const fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// How many times a commit is tried (same token, idempotent).
    #[must_use]
    pub const fn commit_attempts(mut self, n: u32) -> Self {
        self.commit_attempts = n;
        self
    }

    /// After each successful commit, wait until `n` replicas of the store
    /// acknowledged it (Redis: `WAIT n timeout` on the connection, and to
    /// the node, that ran the commit), for at most
    /// [`commit_replicas_timeout`](Self::commit_replicas_timeout). The
    /// outcome is counted (`singleflight_commit_replicas_total`, `result` =
    /// `acked` | `short` | `failed`) and a shortfall logged; the callers
    /// have their value either way (the commit happened on the primary),
    /// and a shortfall is not retried.
    ///
    /// It also decides which results count as lost when they go missing
    /// (`singleflight_result_lost_total`): with a wait, only a commit that
    /// enough replicas acknowledged (one that was counted `short` or
    /// `failed` was already reported, and a failover may drop it), and only
    /// on the owner's node (a follower cannot tell); without one, every
    /// commit this node made or saw.
    ///
    /// Cost: one more round trip per commit, which lasts up to the timeout
    /// while replicas lag or are missing. It runs in the background, under
    /// the owner's lease, after the callers were answered; but on Redis the
    /// wait holds the connection it runs on (Redis answers nothing else on
    /// it meanwhile), so every coordination call of this node to that
    /// server waits behind it: keep the timeout short. 0 (the default):
    /// no wait. At most [`MAX_COMMIT_REPLICAS`].
    #[must_use]
    pub const fn commit_replicas(mut self, n: u32) -> Self {
        self.commit_replicas = n;
        self
    }

    /// The longest a [`commit_replicas`](Self::commit_replicas) wait lasts
    /// (positive, shorter than the call timeout; Redis counts it in whole
    /// milliseconds).
    #[must_use]
    pub const fn commit_replicas_timeout(mut self, d: Duration) -> Self {
        self.commit_replicas_timeout = d;
        self
    }

    /// Checks the policy; the error names the field.
    pub fn validate(self) -> Result<Self, PolicyError> {
        let err = |field, reason| Err(PolicyError { field, reason });
        // Bounded so deadline arithmetic can never overflow.
        const MAX: Duration = flightdeck_core::time::MAX_SETTING;
        for (field, d) in [
            ("lease", self.lease),
            ("heartbeat", self.heartbeat),
            ("wait_timeout", self.wait_timeout),
            ("poll_interval", self.poll_interval),
            ("replay_ttl", self.replay_ttl),
            ("failure_ttl", self.failure_ttl),
            ("call_timeout", self.call_timeout),
            ("stale_while_revalidate", self.stale.revalidate),
            ("stale_if_error", self.stale.if_error),
            ("stale_retry_after", self.stale.retry_after),
            ("soft_timeout", self.stale.soft_timeout),
            ("early_refresh", self.stale.early_refresh),
        ] {
            if d > MAX {
                return err(field, "must be at most 30 days");
            }
        }
        if self.lease < Duration::from_millis(10) {
            return err("lease", "must be at least 10ms");
        }
        if self.heartbeat.is_zero() {
            return err("heartbeat", "must be positive");
        }
        if self.heartbeat.saturating_mul(3) > self.lease {
            return err("heartbeat", "must be at most a third of the lease");
        }
        if self.poll_interval.is_zero() {
            return err("poll_interval", "must be positive");
        }
        if self.wait_timeout.is_zero() {
            return err("wait_timeout", "must be positive");
        }
        if self.allow_takeover && self.wait_timeout < self.lease {
            return err(
                "wait_timeout",
                "must be at least the lease when takeover is allowed (followers must outlive a dead owner's lease)",
            );
        }
        if self.call_timeout.is_zero() {
            return err("call_timeout", "must be positive");
        }
        if self.call_timeout >= self.lease {
            return err("call_timeout", "must be shorter than the lease");
        }
        if self.commit_attempts == 0 {
            return err("commit_attempts", "must be at least 1");
        }
        if self.commit_replicas > MAX_COMMIT_REPLICAS {
            return err("commit_replicas", "must be at most 16");
        }
        if self.commit_replicas > 0 && self.commit_replicas_timeout < Duration::from_millis(1) {
            return err("commit_replicas_timeout", "must be at least 1ms");
        }
        if self.commit_replicas > 0 && self.commit_replicas_timeout >= self.call_timeout {
            return err(
                "commit_replicas_timeout",
                "must be shorter than the call timeout",
            );
        }
        if self.max_result_bytes == 0 {
            return err("max_result_bytes", "must be positive");
        }
        Ok(self)
    }

    /// The stale windows.
    pub const fn stale(&self) -> StaleWindows {
        self.stale
    }

    /// The lease.
    pub const fn lease_duration(&self) -> Duration {
        self.lease
    }
    /// The heartbeat interval.
    pub const fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }
    /// The follower wait timeout.
    pub const fn wait_timeout_duration(&self) -> Duration {
        self.wait_timeout
    }
    /// The follower poll bound.
    pub const fn poll_interval_duration(&self) -> Duration {
        self.poll_interval
    }
    /// How long a committed result is replayed to new requests.
    pub const fn replay_ttl_duration(&self) -> Duration {
        self.replay_ttl
    }
    /// How long the store keeps a committed result for the followers
    /// already waiting: two poll intervals and a call timeout (a follower
    /// re-checks at least once a poll interval, and its re-check may take
    /// a call timeout to arrive).
    pub fn waiter_retention(&self) -> Duration {
        self.poll_interval
            .saturating_mul(2)
            .saturating_add(self.call_timeout)
    }
    /// The failure TTL.
    pub const fn failure_ttl_duration(&self) -> Duration {
        self.failure_ttl
    }
    /// The compression threshold.
    pub const fn compress_above_bytes(&self) -> usize {
        self.compress_above
    }
    /// The inline notice limit.
    pub const fn inline_below_bytes(&self) -> usize {
        self.inline_below
    }
    /// The stored result limit.
    pub const fn max_result_size(&self) -> usize {
        self.max_result_bytes
    }
    /// Whether takeover is allowed.
    pub const fn takeover_allowed(&self) -> bool {
        self.allow_takeover
    }
    /// Whether work is cancelled on lease loss.
    pub const fn cancels_on_lease_loss(&self) -> bool {
        self.cancel_on_lease_loss
    }
    /// The per-call deadline.
    pub const fn call_timeout_duration(&self) -> Duration {
        self.call_timeout
    }
    /// The number of commit attempts.
    pub const fn commit_attempt_count(&self) -> u32 {
        self.commit_attempts
    }
    /// How many replicas a commit waits for (0: none).
    pub const fn commit_replica_count(&self) -> u32 {
        self.commit_replicas
    }
    /// The longest a commit waits for its replicas.
    pub const fn commit_replicas_timeout_duration(&self) -> Duration {
        self.commit_replicas_timeout
    }
    /// The bound on how long a backend keeps what it remembers of a flight
    /// without a lease or result (a released token, an invalidation): two
    /// leases plus the longest of the replay TTL, the retention for
    /// waiters and the failure TTL. Generations
    /// do not depend on it: they never go back, whatever expired.
    pub fn state_ttl(&self) -> Duration {
        self.lease.saturating_mul(2).saturating_add(
            self.replay_ttl
                .saturating_add(self.stale.keep_stale())
                .max(self.waiter_retention())
                .max(self.failure_ttl),
        )
    }
}

impl Default for DistributedPolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// A [`DistributedPolicy`] was rejected by [`DistributedPolicy::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    field: &'static str,
    reason: &'static str,
}

impl PolicyError {
    /// The offending field.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid distributed policy: {} {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for PolicyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        DistributedPolicy::new().validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let ms = Duration::from_millis;
        let cases = [
            (DistributedPolicy::new().heartbeat(ms(15_000)), "heartbeat"),
            (DistributedPolicy::new().heartbeat(ms(10_001)), "heartbeat"),
            (
                DistributedPolicy::new().heartbeat(Duration::ZERO),
                "heartbeat",
            ),
            (
                DistributedPolicy::new().replay_ttl(Duration::from_secs(31 * 24 * 3600)),
                "replay_ttl",
            ),
            (
                DistributedPolicy::new().wait_timeout(ms(29_000)),
                "wait_timeout",
            ),
            (
                DistributedPolicy::new().call_timeout(ms(30_000)),
                "call_timeout",
            ),
            (DistributedPolicy::new().lease(ms(1)), "lease"),
            (
                DistributedPolicy::new().commit_attempts(0),
                "commit_attempts",
            ),
            (
                DistributedPolicy::new().commit_replicas(17),
                "commit_replicas",
            ),
            (
                DistributedPolicy::new()
                    .commit_replicas(1)
                    .commit_replicas_timeout(ms(1000)),
                "commit_replicas_timeout",
            ),
        ];
        for (p, field) in cases {
            let e = p.validate().unwrap_err();
            assert_eq!(e.field(), field, "{e}");
            assert!(e.to_string().contains(field));
        }
        // Without takeover a short wait is fine.
        DistributedPolicy::new()
            .allow_takeover(false)
            .wait_timeout(ms(2000))
            .validate()
            .unwrap();
    }
}
