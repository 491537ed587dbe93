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
        let settings = Settings {
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
        let scenario = Self {
            seed,
            nodes,
            callers,
            keys,
            settings,
            call_faults,
            work_faults,
            events,
        };
        (scenario, rng)
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
        for (t, e) in &self.events {
            writeln!(f, "  at {:>6}ms {e:?}", t.as_millis())?;
        }
        Ok(())
    }
}
