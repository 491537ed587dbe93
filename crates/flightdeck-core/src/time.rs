//! Time plumbing that flightdeck's crates share: "never" as an instant.
//! Not an API: public only because those are other crates, hidden from
//! the docs, and it may change in any release. All of it is
//! `tokio::time`, so paused-time tests drive it.

use std::time::Duration;

use tokio::time::Instant;

/// Far enough to mean "never" (about 30 years), near enough that adding it
/// to an instant of a running process cannot overflow.
pub const FAR_FUTURE: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// `at + d`, where a `d` past [`FAR_FUTURE`] (a `Duration::MAX` timeout or
/// TTL, meaning "never") counts as [`FAR_FUTURE`]: never overflows.
pub fn later(at: Instant, d: Duration) -> Instant {
    // `at` itself when even that overflows, which a running process's
    // clock does not reach.
    at.checked_add(d.min(FAR_FUTURE)).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn later_caps_at_the_far_future() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::from_secs(5)), now + Duration::from_secs(5));
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
    }
}
