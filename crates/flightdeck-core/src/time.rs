//! Time plumbing that flightdeck's crates share: "never" as an instant,
//! and the backoff every retry schedule uses. Not an API: public only
//! because those are other crates, hidden from the docs, and it may change
//! in any release. All of it is `tokio::time`, so paused-time tests drive
//! it.
//!
//! The backoff is ours, not tower's (`retry::backoff`) or backon's: our
//! schedules need the pause itself, not a sleep (an owner's retries stop
//! when the next pause would outlast its lease and keep heartbeating
//! through it; the breaker reports its open wait in its events), the
//! breaker's factor is configured (any float `>= 1`) and its wait computed
//! from a count of opens in a row, and its jitter is a proportion of the
//! pause (`pause × (1 + U[lo, hi])`), where tower and backon add up to a
//! fixed base.

use std::time::Duration;

use tokio::time::Instant;

/// Far enough to mean "never" (about 30 years), near enough that adding it
/// to an instant of a running process cannot overflow.
pub const FAR_FUTURE: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// The longest duration a setting may have (30 days): every configured
/// timeout, TTL and window is checked against it, so that no deadline
/// computed from one can overflow.
pub const MAX_SETTING: Duration = Duration::from_secs(30 * 24 * 3600);

/// `at + d`, where a `d` past [`FAR_FUTURE`] (a `Duration::MAX` timeout or
/// TTL, meaning "never") counts as [`FAR_FUTURE`]: never overflows.
pub fn later(at: Instant, d: Duration) -> Instant {
    // `at` itself when even that overflows, which a running process's
    // clock does not reach.
    at.checked_add(d.min(FAR_FUTURE)).unwrap_or(at)
}

/// An exponential backoff: each step multiplies the pause by `factor`,
/// kept within `[floor, max]` (saturating: a pause that would overflow is
/// `max`). Holds no state; the caller keeps its pause (which it may also
/// set by other rules).
///
/// ```
/// # use std::time::Duration;
/// use flightdeck_core::time::Backoff;
///
/// let ms = Duration::from_millis;
/// let b = Backoff::doubling(ms(100), ms(2_000));
/// assert_eq!(b.next(ms(20)), ms(100), "lifted to the floor");
/// assert_eq!(b.next(ms(400)), ms(800));
/// assert_eq!(b.next(ms(1_500)), ms(2_000), "capped");
/// assert_eq!(b.nth(ms(100), 3), ms(800), "three steps from 100 ms");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    factor: f64,
    floor: Duration,
    max: Duration,
}

impl Backoff {
    /// Doubles the pause at each step, within `[floor, max]` (`max` below
    /// `floor` counts as `floor`).
    pub const fn doubling(floor: Duration, max: Duration) -> Self {
        Self::growing(2.0, floor, max)
    }

    /// Multiplies the pause by `factor` at each step, within `[floor,
    /// max]` (`max` below `floor` counts as `floor`). A `factor` of 1 or
    /// less keeps the pause as it is (within the bounds).
    pub const fn growing(factor: f64, floor: Duration, max: Duration) -> Self {
        let max = if max.as_nanos() < floor.as_nanos() {
            floor
        } else {
            max
        };
        Self { factor, floor, max }
    }

    /// The pause after `pause`.
    pub fn next(&self, pause: Duration) -> Duration {
        self.nth(pause, 1)
    }

    /// The pause `steps` steps after `first` (`first` itself, within the
    /// bounds, for 0).
    pub fn nth(&self, first: Duration, steps: u32) -> Duration {
        let grown = if steps == 0 || self.factor <= 1.0 {
            first
        } else {
            // Past 1,000 steps every factor > 1 has long reached any cap.
            let factor = self.factor.powi(steps.min(1_000) as i32);
            Duration::try_from_secs_f64(first.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        };
        grown.clamp(self.floor, self.max)
    }
}

/// `d` multiplied by a factor drawn uniformly from `lo..=hi` (exactly `lo`
/// when the range is empty or a point), saturating at `Duration::MAX`.
/// Callers so spread out what would otherwise happen at the same moment on
/// every node (probes of a breaker, polls of a flight). Drawn through
/// [`crate::random`] (seeded under simulation).
pub fn jittered(d: Duration, lo: f64, hi: f64) -> Duration {
    let factor = if hi > lo {
        crate::random::range_f64(lo, hi)
    } else {
        lo
    };
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn later_caps_at_the_far_future() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
    }

    #[test]
    fn backoff_grows_within_its_bounds() {
        let ms = Duration::from_millis;
        let b = Backoff::doubling(Duration::ZERO, ms(2_000));
        let mut pause = ms(50);
        let seen: Vec<_> = (0..7)
            .map(|_| {
                pause = b.next(pause);
                pause.as_millis()
            })
            .collect();
        assert_eq!(seen, [100, 200, 400, 800, 1_600, 2_000, 2_000]);
        let grow = Backoff::growing(1.5, ms(100), ms(50));
        assert_eq!(grow.nth(ms(100), 2), ms(100), "max below floor is floor");
        let huge = Backoff::growing(10.0, ms(1), Duration::MAX);
        assert_eq!(huge.nth(ms(1), u32::MAX), Duration::MAX, "saturates");
        assert_eq!(Backoff::growing(0.5, ms(1), ms(9)).nth(ms(4), 3), ms(4));
    }

    #[test]
    fn jitter_stays_in_its_range() {
        let d = Duration::from_secs(10);
        for _ in 0..200 {
            let j = jittered(d, 0.5, 1.0);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
        assert_eq!(jittered(d, 1.0, 1.0), d);
        assert_eq!(
            jittered(d, 1.5, 1.0),
            d.mul_f64(1.5),
            "an empty range is its low end"
        );
        assert_eq!(jittered(Duration::MAX, 2.0, 3.0), Duration::MAX);
    }
}
