//! The schedule of one run, drawn from its seed: the cluster's shape, the
//! stage's settings, and every event with its (virtual) time.

use std::fmt;
use std::time::Duration;

use flightdeck::{Mode, OnWaitFailure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Milliseconds.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The stage's settings of a run (the same on every node).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) mode: Mode,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) wait: Duration,
    pub(crate) poll: Duration,
    pub(crate) result_ttl: Duration,
    pub(crate) failure_ttl: Duration,
    pub(crate) execution_timeout: Duration,
    pub(crate) coordination_timeout: Duration,
    pub(crate) on_wait_failure: OnWaitFailure,
    pub(crate) allow_takeover: bool,
    /// The stale windows, when the run turns them on.
    pub(crate) stale: Option<StaleSettings>,
}

/// A run's stale windows (each zero: off), and the replay TTL they
/// extend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StaleSettings {
    /// `replay-ttl`: the freshness.
    pub(crate) fresh: Duration,
    pub(crate) revalidate: Duration,
    pub(crate) if_error: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) soft_timeout: Duration,
    pub(crate) early_refresh: Duration,
    pub(crate) hit_for_pass: Duration,
}

impl StaleSettings {
    /// The longest a stale answer of `reason` may be past its work's end:
    /// freshness plus the reason's window (`redis_down` answers within
    /// any of them).
    pub(crate) fn limit(&self, reason: flightdeck::core::stale::StaleReason) -> Duration {
        use flightdeck::core::stale::StaleReason;
        let window = match reason {
            StaleReason::Revalidate => self.revalidate,
            StaleReason::Error => self.if_error,
            _ => self.revalidate.max(self.if_error),
        };
        self.fresh + window
    }
}

/// One scheduled event.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// Caller `caller` sends a request for `key` to `node`, with its own
    /// deadline; it leaves (drops its future) after `leave` if set.
    Call {
        caller: usize,
        node: usize,
        key: usize,
        deadline: Duration,
        leave: Option<Duration>,
    },
    /// The backend stops answering (every command waits) for `span`, then
    /// runs what queued up.
    Freeze { span: Duration },
    /// The replica catches up: what a failover keeps from now on.
    Replicate,
    /// A failover: the backend goes back to the last `Replicate`.
    Failover,
    /// A key's record expires now.
    Expire { key: usize },
    /// Pub/sub drops every notice for `span`.
    DropNotices { span: Duration },
    /// The node's process dies: its callers, work and calls vanish.
    Crash { node: usize },
    /// The node starts again, empty.
    Restart { node: usize },
    /// The node's stage switches mode.
    SetMode { node: usize, mode: Mode },
    /// The node purges a key (`StageHandle::invalidate`).
    Purge { node: usize, key: usize },
}

/// A whole run's schedule.
#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    pub(crate) seed: u64,
    pub(crate) nodes: usize,
    pub(crate) callers: usize,
    pub(crate) keys: usize,
    pub(crate) settings: Settings,
    /// Chance that one backend command meets a fault (delay, loss,
    /// duplicate, refusal).
    pub(crate) call_faults: f64,
    /// Chance that one execution of the work fails, panics, hangs or
    /// answers something that may not be shared.
    pub(crate) work_faults: f64,
    /// While the stale windows are on: spans (from the run's start)
    /// during which every execution of the work fails.
    pub(crate) fail_windows: Vec<(Duration, Duration)>,
    /// The events, by time.
    pub(crate) events: Vec<(Duration, Event)>,
}

impl Scenario {
    /// The schedule of `seed` (and the generator that drew it, which the
    /// run goes on drawing its faults from).
    pub(crate) fn draw(seed: u64) -> (Self, StdRng) {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = rng.random_range(2..=4);
        let callers = rng.random_range(4..=32);
        let keys = rng.random_range(1..=4);
        let lease = ms(rng.random_range(600..=2_000));
        let mode = if rng.random_bool(0.7) {
            Mode::Hybrid
        } else {
            Mode::DistributedOnly
        };
        let poll = ms(rng.random_range(50..=500));
        let mut settings = Settings {
            mode,
            lease,
            heartbeat: lease / rng.random_range(3..=5),
            wait: lease + ms(rng.random_range(0..=2_000)),
            poll,
            // Longer than the poll interval (validated).
            result_ttl: poll + ms(rng.random_range(100..=4_000)),
            failure_ttl: if rng.random_bool(0.3) {
                ms(rng.random_range(100..=1_000))
            } else {
                Duration::ZERO
            },
            execution_timeout: ms(rng.random_range(300..=2_000)),
            coordination_timeout: ms(rng.random_range(100..=300)),
            // `local` is an opt-in of HYBRID stages only.
            on_wait_failure: [
                OnWaitFailure::Wait,
                OnWaitFailure::InProgress,
                OnWaitFailure::Fail,
                OnWaitFailure::Local,
            ][rng.random_range(0..if mode == Mode::Hybrid { 4 } else { 3 })],
            allow_takeover: rng.random_bool(0.8),
            stale: None,
        };
        let horizon = rng.random_range(1_000..=6_000u64);
        let at = |rng: &mut StdRng| ms(rng.random_range(0..=horizon));
        // Callers come in bursts (where flights coalesce, and race).
        let bursts: Vec<Duration> = (0..rng.random_range(1..=4)).map(|_| at(&mut rng)).collect();
        let mut events = Vec::new();
        for caller in 0..callers {
            let leave = rng
                .random_bool(0.15)
                .then(|| ms(rng.random_range(0..=1_500)));
            let burst = bursts[rng.random_range(0..bursts.len())];
            events.push((
                burst + ms(rng.random_range(0..=300)),
                Event::Call {
                    caller,
                    node: rng.random_range(0..nodes),
                    key: rng.random_range(0..keys),
                    deadline: ms(rng.random_range(100..=5_000)),
                    leave,
                },
            ));
        }
        let calm = rng.random_bool(0.15);
        let faults = if calm { 0 } else { rng.random_range(0..=6) };
        for _ in 0..faults {
            let t = at(&mut rng);
            let event = match rng.random_range(0..7) {
                0 => Event::Freeze {
                    span: ms(rng.random_range(50..=3_000)),
                },
                1 => {
                    // A replica that lags: it catches up, then the
                    // primary fails a little later.
                    events.push((t, Event::Replicate));
                    Event::Failover
                }
                2 => Event::Expire {
                    key: rng.random_range(0..keys),
                },
                3 => Event::DropNotices {
                    span: ms(rng.random_range(100..=2_000)),
                },
                4 => {
                    let node = rng.random_range(0..nodes);
                    events.push((
                        t + ms(rng.random_range(10..=3_000)),
                        Event::Restart { node },
                    ));
                    Event::Crash { node }
                }
                _ => Event::SetMode {
                    node: rng.random_range(0..nodes),
                    mode: [
                        Mode::Hybrid,
                        Mode::DistributedOnly,
                        Mode::LocalOnly,
                        Mode::Bypass,
                    ][rng.random_range(0..4)],
                },
            };
            let t = if matches!(event, Event::Failover) {
                t + ms(rng.random_range(0..=1_500))
            } else {
                t
            };
            events.push((t, event));
        }
        // Stable: events of one instant keep the order they were drawn in.
        events.sort_by_key(|(t, _)| *t);
        let call_faults = if calm {
            0.0
        } else {
            rng.random_range(0.0..0.3)
        };
        let work_faults = if calm {
            0.0
        } else {
            rng.random_range(0.0..0.3)
        };
        // Drawn last, so that the draws above (and the seeds found with
        // them) keep their schedules.
        let mut fail_windows = Vec::new();
        if rng.random_bool(0.5) {
            let stale = draw_stale(&mut rng, &settings);
            settings.stale = Some(stale);
            if rng.random_bool(0.5) {
                // Where every window answers.
                settings.mode = Mode::LocalOnly;
                if settings.on_wait_failure == OnWaitFailure::Local {
                    settings.on_wait_failure = OnWaitFailure::Wait;
                }
            }
            for _ in 0..rng.random_range(0..=2) {
                let from = at(&mut rng);
                fail_windows.push((from, from + ms(rng.random_range(100..=2_500))));
            }
            for _ in 0..rng.random_range(0..=3) {
                let t = at(&mut rng);
                events.push((
                    t,
                    Event::Purge {
                        node: rng.random_range(0..nodes),
                        key: rng.random_range(0..keys),
                    },
                ));
            }
            events.sort_by_key(|(t, _)| *t);
        }
        let scenario = Self {
            seed,
            nodes,
            callers,
            keys,
            settings,
            call_faults,
            work_faults,
            fail_windows,
            events,
        };
        (scenario, rng)
    }
}

/// The stale windows of a run: each on or off, drawn within the other
/// settings' bounds (a soft timeout shorter than the execution and wait
/// timeouts, early refresh within the replay TTL).
fn draw_stale(rng: &mut StdRng, s: &Settings) -> StaleSettings {
    let maybe = |rng: &mut StdRng, p: f64, lo: u64, hi: u64| {
        if rng.random_bool(p) {
            ms(rng.random_range(lo..=hi))
        } else {
            Duration::ZERO
        }
    };
    let fresh = ms(rng.random_range(50..=1_500));
    let mut revalidate = maybe(rng, 0.6, 50, 2_000);
    let if_error = maybe(rng, 0.6, 50, 3_000);
    if revalidate.is_zero() && if_error.is_zero() {
        revalidate = ms(rng.random_range(50..=2_000));
    }
    let retry_after = if if_error.is_zero() {
        Duration::ZERO
    } else {
        maybe(rng, 0.5, 20, 1_000)
    };
    let soft_timeout = maybe(
        rng,
        0.5,
        10,
        (s.execution_timeout.as_millis() as u64)
            .saturating_sub(1)
            .max(10),
    );
    // Shorter than the execution timeout and than the wait (validated).
    let soft_timeout = soft_timeout
        .min(s.execution_timeout.saturating_sub(ms(1)))
        .min(s.wait.saturating_sub(ms(1)));
    let early_refresh = maybe(rng, 0.4, 1, fresh.as_millis() as u64);
    let hit_for_pass = maybe(rng, 0.3, 10, 2_000);
    StaleSettings {
        fresh,
        revalidate,
        if_error,
        retry_after,
        soft_timeout,
        early_refresh,
        hit_for_pass,
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        writeln!(
            f,
            "seed {}: {} nodes, {} callers, {} keys; call faults {:.3}, work faults {:.3}",
            self.seed, self.nodes, self.callers, self.keys, self.call_faults, self.work_faults
        )?;
        writeln!(
            f,
            "stage: {} lease {:?} heartbeat {:?} wait {:?} poll {:?} replay-ttl {:?} \
             failure-ttl {:?} execution-timeout {:?} coordination-timeout {:?} \
             on-wait-failure {} takeover {}",
            s.mode,
            s.lease,
            s.heartbeat,
            s.wait,
            s.poll,
            s.result_ttl,
            s.failure_ttl,
            s.execution_timeout,
            s.coordination_timeout,
            s.on_wait_failure,
            s.allow_takeover
        )?;
        if let Some(w) = &s.stale {
            writeln!(
                f,
                "stale: replay-ttl {:?} stale-while-revalidate {:?} stale-if-error {:?} \
                 stale-retry-after {:?} soft-timeout {:?} early-refresh {:?} hit-for-pass {:?}; \
                 the work fails in {:?}",
                w.fresh,
                w.revalidate,
                w.if_error,
                w.retry_after,
                w.soft_timeout,
                w.early_refresh,
                w.hit_for_pass,
                self.fail_windows
            )?;
        }
        for (t, e) in &self.events {
            writeln!(f, "  at {:>6}ms {e:?}", t.as_millis())?;
        }
        Ok(())
    }
}
