//! Bounded waits for a condition a test cannot be told about (a server's
//! state, a process's answer): checked every 20 ms, and a panic naming
//! what was awaited once the limit has passed. A wait never hangs.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is checked.
const EVERY: Duration = Duration::from_millis(20);

/// Blocks until `done` holds; panics with `what` if it does not within
/// `limit`.
///
/// ```
/// use std::time::Duration;
/// let mut n = 0;
/// flightdeck_harness::wait_until("three checks", Duration::from_secs(5), || {
///     n += 1;
///     n == 3
/// });
/// ```
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(EVERY);
    }
}

/// [`wait_until`] for a check that is asynchronous (or that must not block
/// the test's runtime); it sleeps on tokio's clock between checks.
pub async fn wait_until_async<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < until,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(EVERY).await;
    }
}
