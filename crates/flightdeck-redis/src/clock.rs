//! The server's clock as this client estimates it, for the not-after
//! deadline every ACQUIRE carries (see [`scripts::ACQUIRE`]).
//!
//! Every ACQUIRE reply ends with the server's `TIME` (ms) when the script
//! ran. The estimate of the server's clock now is the last such time from
//! the node serving the flight's slot plus the tokio time elapsed since
//! that reply arrived: it lags the server by the reply's transit, so a
//! deadline built on it errs early. It assumes the server's clock runs at
//! the rate of the client's tokio clock over the time between two replies
//! plus one call (an NTP slew of at most 500 ppm moves it by 0.5 ms a
//! second). Until a reply from a slot arrived (a backend's first ACQUIRE
//! on it) the estimate is unknown and the ACQUIRE carries no deadline.
//!
//! [`scripts::ACQUIRE`]: crate::scripts::ACQUIRE

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use foldhash::fast::FixedState;
use tokio::time::Instant;

/// Per slot (`0` on one server, where no slot is worked out): the server
/// time in ms the last ACQUIRE reply carried and when it arrived.
#[derive(Debug, Default)]
pub(crate) struct ServerClocks {
    /// foldhash's fixed state, not SipHash (every ACQUIRE looks its slot
    /// up twice): slots are ours, not an attacker's keys.
    seen: Mutex<HashMap<u16, (u64, Instant), FixedState>>,
}

/// Whole milliseconds of `d`, saturating.
fn ms(d: Duration) -> i128 {
    i128::try_from(d.as_millis()).unwrap_or(i128::MAX)
}

impl ServerClocks {
    /// A reply from `slot`'s node carried `server_ms`; it arrived `at`.
    /// Kept unless an earlier reply gives a later estimate of the server's
    /// clock: every estimate lags (by its reply's transit, and by however
    /// long the reply waited to be read: a busy runtime polls it late), so
    /// the latest one is the closest.
    pub(crate) fn saw(&self, slot: u16, server_ms: u64, at: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let newer = seen.get(&slot).is_none_or(|&(before_ms, before_at)| {
            let before_now = i128::from(before_ms) + ms(at.saturating_duration_since(before_at))
                - ms(before_at.saturating_duration_since(at));
            i128::from(server_ms) >= before_now
        });
        if newer {
            seen.insert(slot, (server_ms, at));
        }
    }

    /// The server time in ms at which a call to `slot` that its caller
    /// gives up at `give_up` (in tokio time; past or future) is too late:
    /// the estimate of the server's clock `now` plus the time left until
    /// `give_up`. `None` until a reply from `slot` was seen.
    pub(crate) fn not_after(&self, slot: u16, now: Instant, give_up: Instant) -> Option<u64> {
        let (server_ms, at) = *self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&slot)?;
        let estimate = i128::from(server_ms) + ms(now.saturating_duration_since(at));
        let left = if give_up >= now {
            ms(give_up - now)
        } else {
            -ms(now - give_up)
        };
        // A deadline before 1970 is one past already: 0 refuses as well.
        Some(u64::try_from((estimate + left).max(0)).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_follows_the_last_reply() {
        let clocks = ServerClocks::default();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(clocks.not_after(0, t0, t0 + second), None);
        clocks.saw(0, 5_000, t0);
        // 250 ms after the reply, a call given up 1 s later.
        let now = t0 + Duration::from_millis(250);
        assert_eq!(clocks.not_after(0, now, now + second), Some(6_250));
        // A caller that gave up 100 ms ago: already past.
        let gone = now - Duration::from_millis(100);
        assert_eq!(clocks.not_after(0, now, gone), Some(5_150));
        // Another slot, another node: unknown.
        assert_eq!(clocks.not_after(7, now, now + second), None);
        // Before the server's epoch: clamped, never wrapped.
        clocks.saw(1, 10, now);
        assert_eq!(clocks.not_after(1, now, gone), Some(0));
    }

    /// A reply read late (its task polled after a busy spell) gives an
    /// older estimate than the one already kept: it does not replace it.
    #[tokio::test(start_paused = true)]
    async fn the_latest_estimate_is_kept() {
        let clocks = ServerClocks::default();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        clocks.saw(0, 5_000, t0);
        // Read 400 ms after it, a reply the server sent at 5_100: it lags.
        let late = t0 + Duration::from_millis(400);
        clocks.saw(0, 5_100, late);
        assert_eq!(clocks.not_after(0, late, late + second), Some(6_400));
        // A reply ahead of the estimate (the one before lagged) replaces it.
        clocks.saw(0, 5_900, late);
        assert_eq!(clocks.not_after(0, late, late + second), Some(6_900));
    }
}
