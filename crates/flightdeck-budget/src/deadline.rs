//! The per-request deadline and its phase slices.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::time::later;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};

/// A phase of a request's work, each with its own slice of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Talking to the coordination layer (Redis): acquire, wait, takeover.
    Coordination,
    /// Running the real work (the inner service).
    Execution,
    /// Handling the result: commit, publish, replay.
    Result,
}

impl Phase {
    /// The phase's name, as carried by `DeadlineExceeded`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Coordination => "coordination",
            Self::Execution => "execution",
            Self::Result => "result",
        }
    }
}

/// The most each phase may take. A phase never gets more than what remains
/// of the request's deadline, whatever its slice says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    /// Coordination slice (default 200 ms).
    pub coordination: Duration,
    /// Execution slice; `None` (the default) means all that remains.
    pub execution: Option<Duration>,
    /// Result-handling slice (default 100 ms).
    pub result: Duration,
}

impl Default for Slices {
    fn default() -> Self {
        Self {
            coordination: Duration::from_millis(200),
            execution: None,
            result: Duration::from_millis(100),
        }
    }
}

impl Slices {
    /// The configured slice of `phase` (`None`: unbounded).
    pub fn of(&self, phase: Phase) -> Option<Duration> {
        match phase {
            Phase::Coordination => Some(self.coordination),
            Phase::Execution => self.execution,
            Phase::Result => Some(self.result),
        }
    }
}

/// One request's deadline (tokio's clock) and its phase slices. The budget
/// layer puts it in the request's extensions; inner layers read it and run
/// their phases within it.
///
/// ```
/// use std::time::Duration;
/// use flightdeck_budget::{Deadline, Phase, Slices};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(150), Slices::default());
/// // The coordination slice is 200 ms, but only 150 ms remain.
/// assert_eq!(deadline.slice(Phase::Coordination), Duration::from_millis(150));
/// let slow = tokio::time::sleep(Duration::from_secs(1));
/// let err = deadline.within(Phase::Coordination, slow).await.unwrap_err();
/// assert_eq!(err.phase(), "coordination");
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
    slices: Slices,
}

impl Deadline {
    /// A deadline at `at`.
    pub fn new(at: Instant, slices: Slices) -> Self {
        Self { at, slices }
    }

    /// A deadline `budget` from now (saturating far in the future).
    pub fn after(budget: Duration, slices: Slices) -> Self {
        Self::new(later(Instant::now(), budget), slices)
    }

    /// When the request's time is up.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The phase slices.
    pub fn slices(&self) -> &Slices {
        &self.slices
    }

    /// Time left now.
    pub fn remaining(&self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// Time left at `now`.
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// True when no time is left.
    pub fn is_expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// How long `phase` may take if it starts now: its slice, capped by what
    /// remains.
    pub fn slice(&self, phase: Phase) -> Duration {
        self.slice_at(phase, Instant::now())
    }

    /// How long `phase` may take if it starts at `now`.
    pub fn slice_at(&self, phase: Phase, now: Instant) -> Duration {
        let remaining = self.remaining_at(now);
        match self.slices.of(phase) {
            Some(slice) => slice.min(remaining),
            None => remaining,
        }
    }

    /// When `phase`, starting now, must be over.
    pub fn slice_end(&self, phase: Phase) -> Instant {
        let now = Instant::now();
        now + self.slice_at(phase, now)
    }

    /// The earlier of two deadlines (with these slices).
    pub fn min(self, other: Deadline) -> Deadline {
        Self::new(self.at.min(other.at), self.slices)
    }

    /// Runs `fut` within `phase`'s slice, starting now: its output, or
    /// [`DeadlineExceeded`] naming the phase.
    pub fn within<F: Future>(&self, phase: Phase, fut: F) -> Within<F> {
        Within {
            fut,
            sleep: sleep_until(self.slice_end(phase)),
            phase,
        }
    }
}

pin_project! {
    /// A future bounded by a phase slice, from [`Deadline::within`].
    #[derive(Debug)]
    pub struct Within<F> {
        #[pin]
        fut: F,
        #[pin]
        sleep: Sleep,
        phase: Phase,
    }
}

impl<F: Future> Future for Within<F> {
    type Output = Result<F::Output, DeadlineExceeded>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(DeadlineExceeded::new(this.phase.name()))),
            Poll::Pending => Poll::Pending,
        }
    }
}
