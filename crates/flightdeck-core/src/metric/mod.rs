//! Metric names, in one place, and how layers hold their handles.
//!
//! Every metric carries a `stage` label (breaker metrics: `breaker`;
//! [`UNKEYED_TOTAL`] and [`READONLY_REPLAY_TOTAL`]: none).
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade: install
//! any recorder (e.g. `metrics-exporter-prometheus`) to export them.

/// Label name for the stage.
pub const LABEL_STAGE: &str = "stage";

/// Label name for the shard of a sharded coordination store (a Redis
/// Cluster primary) on [`DEGRADED`] and [`DEGRADED_DURATION`]; absent on
/// the series of a store that is not sharded (and of the whole store).
pub const LABEL_SHARD: &str = "shard";

/// Counter: calls that started a local flight (the L1 leader).
pub const LOCAL_OWNER_TOTAL: &str = "singleflight_local_owner_total";
/// Counter: calls that joined a running local flight.
pub const LOCAL_WAITER_TOTAL: &str = "singleflight_local_waiter_total";
/// Counter: calls answered from a finished flight's replay window.
pub const LOCAL_REPLAY_TOTAL: &str = "singleflight_local_replay_total";
/// Counter: calls rejected by a bound (max flights, or max waiters per
/// flight; no `reason` label).
pub const LOCAL_REJECTED_TOTAL: &str = "singleflight_local_rejected_total";
/// Counter: waiters released to run alone because the result was not
/// shareable.
pub const LOCAL_UNSHARED_TOTAL: &str = "singleflight_local_unshared_total";
/// Counter: flights cancelled because every waiter left.
pub const LOCAL_CANCELLED_TOTAL: &str = "singleflight_local_cancelled_total";
/// Counter: flights whose work panicked.
pub const LOCAL_PANIC_TOTAL: &str = "singleflight_local_panic_total";
/// Counter: every request with a key that entered `SingleFlightLayer`,
/// whatever its mode (the denominator of the merge ratio).
pub const REQUEST_TOTAL: &str = "singleflight_request_total";
/// Counter: waiters that gave up after their wait timeout.
pub const WAIT_TIMEOUT_TOTAL: &str = "singleflight_wait_timeout_total";
/// Gauge: flights currently running.
pub const ACTIVE_FLIGHTS: &str = "singleflight_active_flights";
/// Histogram (seconds): how long waiters waited for a shared result (L1:
/// from joining until the result was handed to them).
pub const WAIT_DURATION: &str = "singleflight_wait_duration";
/// Histogram (seconds): how long each real execution of the inner service
/// took, one sample per execution (the facade and the L2 layer time the
/// inner call; the L1 layer alone times its work from its first poll until
/// it ended).
pub const EXECUTION_DURATION: &str = "singleflight_execution_duration";
/// Counter: L2 acquisitions that made this node the owner of a flight.
pub const OWNER_TOTAL: &str = "singleflight_owner_total";
/// Counter: L2 acquisitions that found another node's flight running.
pub const FOLLOWER_TOTAL: &str = "singleflight_follower_total";
/// Counter: L2 acquisitions answered from a stored result.
pub const HIT_TOTAL: &str = "singleflight_hit_total";
/// Counter: followers that took over a flight whose owner's lease expired.
pub const TAKEOVER_TOTAL: &str = "singleflight_takeover_total";
/// Counter: results that could not be written after execution (the value
/// was still returned to local callers).
pub const RESULT_WRITE_FAILURE_TOTAL: &str = "singleflight_result_write_failure_total";
/// Counter: heartbeats that found the lease lost.
pub const HEARTBEAT_LOST_TOTAL: &str = "singleflight_heartbeat_lost_total";
/// Counter: commits rejected because a newer owner holds the flight.
pub const FENCED_TOTAL: &str = "singleflight_fenced_total";
/// Counter: results this node saw committed that were gone before their
/// TTL ran out (not invalidated): a later acquire of the flight was
/// granted, or found it running, instead of replaying it. The store lost
/// writes (a failover to a replica that never got them, a flush). With
/// `commit_replicas`, only the owner's commits that enough replicas
/// acknowledged count.
pub const RESULT_LOST_TOTAL: &str = "singleflight_result_lost_total";
/// Counter: commits followed by a wait for replicas (the stage's
/// `commit-replicas`): `result` = `acked` (enough replicas acknowledged)
/// | `short` (fewer, within the timeout) | `failed` (the wait itself
/// failed, or the backend has no replicas to ask).
pub const COMMIT_REPLICAS_TOTAL: &str = "singleflight_commit_replicas_total";
/// Counter: Redis ACQUIREs refused because the server takes no writes
/// (`reason` = `noreplicas` | `readonly`) that were answered by a
/// read-only lookup of the stored result instead (`result` = `hit`: it was
/// replayed; `stale`: a stage with stale windows got the result kept past
/// its freshness; `miss`: none stored, the refusal stands; `failed`: the lookup
/// failed too, the refusal stands). Per node, without
/// a stage label (the backend serves every stage).
pub const READONLY_REPLAY_TOTAL: &str = "singleflight_readonly_replay_total";
/// Counter: protocol errors (unknown action, malformed reply, bad stored
/// result); `reason` label. Alert on any.
pub const UNKNOWN_ACTION_TOTAL: &str = "singleflight_unknown_action_total";
/// Counter: coordination calls that failed (`kind` = `unavailable` |
/// `outcome_unknown` | `protocol`, `op` = the call).
pub const COORDINATION_ERROR_TOTAL: &str = "singleflight_coordination_error_total";
/// Counter: tokens this node gave up on while they may have held a lease
/// (an acquire whose outcome is unknown, a flight abandoned mid-acquire),
/// released in the background (`result` = `released` | `not_owner` |
/// `dropped`).
pub const ORPHAN_RELEASE_TOTAL: &str = "singleflight_orphan_release_total";
/// Counter: requests that asked the coordination layer (L2) for a flight;
/// behind L1, only its leaders do.
pub const DISTRIBUTED_REQUEST_TOTAL: &str = "singleflight_distributed_request_total";
/// Counter: coordination failures seen by the facade (`kind` =
/// `unavailable` | `outcome_unknown` | `protocol`).
pub const DISTRIBUTED_FAILURE_TOTAL: &str = "singleflight_distributed_failure_total";
/// Counter: HYBRID leaders that ran locally instead of through L2
/// (`reason` = `circuit_open` | `unavailable` | `outcome_unknown` |
/// `protocol` | `wait_failure`).
pub const LOCAL_FALLBACK_TOTAL: &str = "singleflight_local_fallback_total";
/// Counter: real executions of the inner service, one per call the
/// bulkhead admitted (`path` = `owner` | `local` | `fallback` | `bypass`):
/// what the merge ratio and "executions saved" are computed from.
pub const EXECUTION_TOTAL: &str = "singleflight_execution_total";
/// Counter: real executions of the inner service in local fallback.
pub const FALLBACK_EXECUTION_TOTAL: &str = "singleflight_fallback_execution_total";
/// Counter: distributed acquisitions that found no stored result (this node
/// owned or followed the flight).
pub const MISS_TOTAL: &str = "singleflight_miss_total";
/// Counter: owners whose work failed (the business error is shared, never
/// retried, never counted against the coordination layer).
pub const OWNER_FAILURE_TOTAL: &str = "singleflight_owner_failure_total";
/// Counter: requests the key rules gave no key, so no layer coalesced
/// them (`reason` = the `NotCoalescable` reason of the key crate:
/// `no_stage` no rule, stage header or default stage placed it, `method`
/// a method that coalesces only through a rule, `unhashed_body`,
/// `body_too_large`, `not_allowlisted`, …). Without a `stage` label: the
/// request has none.
pub const UNKEYED_TOTAL: &str = "singleflight_unkeyed_total";
/// Counter: requests of a BYPASS stage (no coalescing at all).
pub const BYPASS_TOTAL: &str = "singleflight_bypass_total";
/// Counter: DISTRIBUTED_ONLY requests failed fast because the coordination
/// layer was unavailable (`reason` = `circuit_open` | `unavailable` |
/// `outcome_unknown` | `protocol`).
pub const FAIL_FAST_TOTAL: &str = "singleflight_fail_fast_total";
/// Counter: followers whose wait failed, by the stage's policy (`action` =
/// `wait` | `in_progress` | `fail` | `local`).
pub const WAIT_FAILURE_TOTAL: &str = "singleflight_wait_failure_total";
/// Gauge: 1 while a stage is degraded (its coordination breaker is open or
/// probing), else 0. Without a [`LABEL_SHARD`]: the whole store; with
/// one: that shard of a sharded store, whose flights only are degraded.
pub const DEGRADED: &str = "singleflight_degraded";
/// Histogram (seconds): how long each degraded period of a stage (or, with
/// a [`LABEL_SHARD`], of one shard) lasted, recorded when it ends.
pub const DEGRADED_DURATION: &str = "singleflight_degraded_duration";
/// Gauge: the stage's mode (0 DISTRIBUTED_ONLY, 1 LOCAL_ONLY, 2 HYBRID,
/// 3 BYPASS).
pub const MODE: &str = "singleflight_mode";

/// Counter: answers given from a stale result (`reason` =
/// [`StaleReason::as_str`](crate::StaleReason::as_str): `revalidate` |
/// `error` | `soft_timeout` | `redis_down` | `wait_timeout`).
pub const STALE_SERVED_TOTAL: &str = "singleflight_stale_served_total";
/// Counter: refreshes of a kept result that ran in the background (grace,
/// early refresh, a soft timeout's work), by how they ended (`outcome` =
/// `committed` their result replaced the kept one | `write_failed` (across
/// nodes) their result never got into the store | `failed` the work
/// failed | `fenced` a purge (or a newer result) came first, their result
/// was dropped | `abandoned` cut by the execution timeout or cancelled).
pub const REFRESH_TOTAL: &str = "singleflight_refresh_total";
/// Histogram (seconds): the age of each stale result answered.
pub const STALE_AGE_SECONDS: &str = "singleflight_stale_age_seconds";
/// Counter: callers that ran their own request at once because their
/// key's last response could not be shared (hit-for-pass).
pub const HIT_FOR_PASS_TOTAL: &str = "singleflight_hit_for_pass_total";

/// Label name for a circuit breaker's name (breaker metrics carry it
/// instead of `stage`: one breaker may guard several stages).
pub const LABEL_BREAKER: &str = "breaker";
/// Counter: a breaker's transitions to open (including forced); label
/// `breaker`.
pub const CIRCUIT_OPEN_TOTAL: &str = "singleflight_circuit_open_total";
/// Gauge: a breaker's state (0 closed, 1 open, 2 half-open, 3 forced open,
/// 4 forced closed); label `breaker`.
pub const CIRCUIT_STATE: &str = "singleflight_circuit_state";
/// Counter: calls a breaker rejected because it was open, half-open with no
/// free probe slot, or ramping; label `breaker`.
pub const CIRCUIT_REJECTED_TOTAL: &str = "singleflight_circuit_rejected_total";
/// Counter: calls a stage's bulkhead rejected, with `reason` = `full` |
/// `queue_timeout` | `rate` | `degraded_rate`.
pub const BULKHEAD_REJECTED_TOTAL: &str = "singleflight_bulkhead_rejected_total";
/// Gauge: 1 while a stage's bulkhead applies its degraded limit, else 0.
pub const BULKHEAD_DEGRADED: &str = "singleflight_bulkhead_degraded";

mod handles;

// How the layers of flightdeck's crates hold their handles: shared by
// those crates (local, distributed, breaker, the facade), so public, but
// plumbing, not an API: hidden from the docs, may change in any release.
#[doc(hidden)]
pub use handles::{records, Generation, Handles};
