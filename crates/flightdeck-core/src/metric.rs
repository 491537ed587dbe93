//! Metric names, as in the design articles (seed 000 §15, seed 002 §12).
//!
//! Every metric carries a `stage` label (breaker metrics: `breaker`).
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade: install
//! any recorder (e.g. `metrics-exporter-prometheus`) to export them.

/// Label name for the stage.
pub const LABEL_STAGE: &str = "stage";

/// Counter: calls that started a local flight (the L1 leader).
pub const LOCAL_OWNER_TOTAL: &str = "singleflight_local_owner_total";
/// Counter: calls that joined a running local flight.
pub const LOCAL_WAITER_TOTAL: &str = "singleflight_local_waiter_total";
/// Counter: calls answered from a finished flight's replay window.
pub const LOCAL_REPLAY_TOTAL: &str = "singleflight_local_replay_total";
/// Counter: calls rejected by a bound (`reason` = `flights` | `waiters`).
pub const LOCAL_REJECTED_TOTAL: &str = "singleflight_local_rejected_total";
/// Counter: waiters released to run alone because the result was not
/// shareable.
pub const LOCAL_UNSHARED_TOTAL: &str = "singleflight_local_unshared_total";
/// Counter: flights cancelled because every waiter left.
pub const LOCAL_CANCELLED_TOTAL: &str = "singleflight_local_cancelled_total";
/// Counter: flights whose work panicked.
pub const LOCAL_PANIC_TOTAL: &str = "singleflight_local_panic_total";
/// Counter: every request seen by a coalescing layer.
pub const REQUEST_TOTAL: &str = "singleflight_request_total";
/// Counter: waiters that gave up after their wait timeout.
pub const WAIT_TIMEOUT_TOTAL: &str = "singleflight_wait_timeout_total";
/// Gauge: flights currently running.
pub const ACTIVE_FLIGHTS: &str = "singleflight_active_flights";
/// Histogram (seconds): how long waiters waited for a shared result.
pub const WAIT_DURATION: &str = "singleflight_wait_duration";
/// Histogram (seconds): how long the one execution took.
pub const EXECUTION_DURATION: &str = "singleflight_execution_duration";
