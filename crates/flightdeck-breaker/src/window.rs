//! Sliding windows of recent call outcomes, with fixed memory.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::WindowKind;

/// Calls and failures currently in a breaker's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowStats {
    /// Calls recorded in the window.
    pub calls: u32,
    /// Of which failures.
    pub failures: u32,
}

impl WindowStats {
    /// `failures / calls`, or 0 for an empty window.
    pub fn failure_rate(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            f64::from(self.failures) / f64::from(self.calls)
        }
    }
}

#[derive(Debug)]
pub(crate) enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Window {
    pub(crate) fn new(kind: WindowKind, now: Instant) -> Self {
        match kind {
            WindowKind::Count { size } => Self::Count(CountWindow::new(size as usize)),
            WindowKind::Time { duration, buckets } => {
                Self::Time(TimeWindow::new(duration, buckets as usize, now))
            }
        }
    }

    pub(crate) fn needs_clock(&self) -> bool {
        matches!(self, Self::Time(_))
    }

    /// Records one outcome; `now` is only read by time windows.
    pub(crate) fn record(&mut self, failure: bool, now: impl FnOnce() -> Instant) {
        match self {
            Self::Count(w) => w.push(failure),
            Self::Time(w) => w.push(failure, now()),
        }
    }

    pub(crate) fn stats(&mut self, now: impl FnOnce() -> Instant) -> WindowStats {
        match self {
            Self::Count(w) => w.stats(),
            Self::Time(w) => {
                w.advance(now());
                w.stats()
            }
        }
    }

    pub(crate) fn clear(&mut self, now: Instant) {
        match self {
            Self::Count(w) => w.clear(),
            Self::Time(w) => w.clear(now),
        }
    }

    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        match self {
            Self::Count(w) => w.ring.len(),
            Self::Time(w) => w.buckets.len(),
        }
    }
}

/// The last N outcomes in a ring: each new one evicts the oldest.
#[derive(Debug)]
pub(crate) struct CountWindow {
    ring: Box<[bool]>,
    pos: usize,
    len: usize,
    failures: u32,
}

impl CountWindow {
    fn new(size: usize) -> Self {
        Self {
            ring: vec![false; size].into_boxed_slice(),
            pos: 0,
            len: 0,
            failures: 0,
        }
    }

    fn push(&mut self, failure: bool) {
        if self.len == self.ring.len() {
            self.failures -= u32::from(self.ring[self.pos]);
        } else {
            self.len += 1;
        }
        self.ring[self.pos] = failure;
        self.failures += u32::from(failure);
        self.pos = (self.pos + 1) % self.ring.len();
    }

    fn stats(&self) -> WindowStats {
        WindowStats {
            calls: self.len as u32,
            failures: self.failures,
        }
    }

    fn clear(&mut self) {
        self.pos = 0;
        self.len = 0;
        self.failures = 0;
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    calls: u32,
    failures: u32,
}

/// Fixed buckets over the last `duration`; totals are kept by
/// subtract-on-evict, so reading them is O(1) and memory is O(buckets).
#[derive(Debug)]
pub(crate) struct TimeWindow {
    buckets: Box<[Bucket]>,
    bucket_len: Duration,
    origin: Instant,
    head: u64,
    calls: u32,
    failures: u32,
}

impl TimeWindow {
    fn new(duration: Duration, buckets: usize, now: Instant) -> Self {
        Self {
            buckets: vec![Bucket::default(); buckets].into_boxed_slice(),
            bucket_len: duration / buckets as u32,
            origin: now,
            head: 0,
            calls: 0,
            failures: 0,
        }
    }

    fn index_of(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.origin).as_nanos() / self.bucket_len.as_nanos()) as u64
    }

    /// Expires every bucket that has left the window by `now`.
    fn advance(&mut self, now: Instant) {
        let cur = self.index_of(now);
        if cur <= self.head {
            return;
        }
        let n = self.buckets.len() as u64;
        let first = (self.head + 1).max(cur.saturating_sub(n - 1));
        for i in first..=cur {
            let b = &mut self.buckets[(i % n) as usize];
            self.calls -= b.calls;
            self.failures -= b.failures;
            *b = Bucket {
                index: i,
                calls: 0,
                failures: 0,
            };
        }
        // Buckets skipped over (a jump longer than the window) were all
        // reset by the loop above, which then covers all n slots.
        self.head = cur;
    }

    fn push(&mut self, failure: bool, now: Instant) {
        self.advance(now);
        let n = self.buckets.len() as u64;
        let b = &mut self.buckets[(self.head % n) as usize];
        debug_assert_eq!(b.index, self.head);
        b.calls += 1;
        b.failures += u32::from(failure);
        self.calls += 1;
        self.failures += u32::from(failure);
    }

    fn stats(&self) -> WindowStats {
        WindowStats {
            calls: self.calls,
            failures: self.failures,
        }
    }

    fn clear(&mut self, now: Instant) {
        self.buckets.fill(Bucket::default());
        self.origin = now;
        self.head = 0;
        self.calls = 0;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_window_evicts_oldest_calls() {
        let now = Instant::now();
        let mut w = Window::new(WindowKind::Count { size: 4 }, now);
        for _ in 0..4 {
            w.record(true, || now);
        }
        assert_eq!(
            w.stats(|| now),
            WindowStats {
                calls: 4,
                failures: 4
            }
        );
        // Old failures leave as new successes arrive.
        for i in 1..=4 {
            w.record(false, || now);
            assert_eq!(
                w.stats(|| now),
                WindowStats {
                    calls: 4,
                    failures: 4 - i
                }
            );
        }
        // Memory does not grow with calls.
        for i in 0..100_000 {
            w.record(i % 3 == 0, || now);
        }
        assert_eq!(w.slots(), 4);
        assert_eq!(w.stats(|| now).calls, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn time_window_buckets_expire() {
        let t0 = Instant::now();
        let kind = WindowKind::Time {
            duration: Duration::from_secs(10),
            buckets: 10,
        };
        let mut w = Window::new(kind, t0);
        w.record(true, || t0);
        w.record(true, || t0 + Duration::from_millis(500));
        w.record(false, || t0 + Duration::from_secs(5));
        assert_eq!(
            w.stats(|| t0 + Duration::from_secs(5)),
            WindowStats {
                calls: 3,
                failures: 2
            }
        );
        // The first bucket (0..1 s) leaves the window at 10 s.
        assert_eq!(
            w.stats(|| t0 + Duration::from_millis(9_999)),
            WindowStats {
                calls: 3,
                failures: 2
            }
        );
        assert_eq!(
            w.stats(|| t0 + Duration::from_secs(10)),
            WindowStats {
                calls: 1,
                failures: 0
            }
        );
        assert_eq!(
            w.stats(|| t0 + Duration::from_secs(15)),
            WindowStats {
                calls: 0,
                failures: 0
            }
        );
        // A jump far past the window clears everything, and memory is fixed.
        for i in 0..100_000u64 {
            w.record(true, || t0 + Duration::from_millis(20_000 + i));
        }
        assert_eq!(w.slots(), 10);
        let s = w.stats(|| t0 + Duration::from_millis(120_000));
        assert!(s.calls <= 10_000, "{s:?}");
        assert_eq!(
            w.stats(|| t0 + Duration::from_secs(1_000)),
            WindowStats::default()
        );
    }
}
