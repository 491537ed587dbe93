//! A chaos run with the stage's stale windows on: the policy and the
//! phases in which the work fails, what each request was answered (its
//! generation, which node's work produced it, how: ran, hit or stale with
//! its marker), and the checks over every answer of the run
//! (`docs/guarantees.md`, stale answers): no stale answer older than its
//! freshness plus the window of its reason (by its marker, and on the node
//! that ran its work by that work's end), and no node answering a key's generation older than one it
//! had already answered from the store (so committed) before the request
//! began: a superseded refresh never replaces a newer result.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::stale::{Stale, StaleReason, StaleWindows};
use flightdeck_distributed::{Answered, DistributedPolicy};
use tokio::time::Instant;

use super::{distributed_policy, Exec};

/// How long a result is fresh in a stale run: a key of a window goes
/// stale, is refreshed and kept several times over.
pub const STALE_FRESH: Duration = Duration::from_secs(1);

/// The windows of a stale run: grace, stale-if-error, its throttle and a
/// soft timeout shorter than the slowest work (early refresh stays off:
/// every run before the freshness ends would be a duplicate).
pub const STALE_WINDOWS: StaleWindows = StaleWindows {
    revalidate: Duration::from_millis(1500),
    if_error: Duration::from_secs(4),
    retry_after: Duration::from_millis(400),
    soft_timeout: Duration::from_millis(700),
    early_refresh: Duration::ZERO,
};

/// How long a stale run's keys are requested: long enough for each to go
/// stale and be refreshed several times.
pub const STALE_KEY_WINDOW: Duration = Duration::from_secs(8);

/// The L2 policy of a stale run's nodes: [`distributed_policy`] with
/// [`STALE_FRESH`] and [`STALE_WINDOWS`].
pub fn stale_policy() -> DistributedPolicy {
    distributed_policy()
        .replay_ttl(STALE_FRESH)
        .stale_windows(STALE_WINDOWS)
}

/// Whether the work fails (as an execution timeout) `since` the load
/// began: for 2 s of every 5 s, from 3 s on, so each failing phase meets
/// results kept from the phase before.
pub fn work_down(since: Duration) -> bool {
    since.as_millis() % 5000 >= 3000
}

/// How a node process says it answered a request, after its value
/// (`flightdeck-node --stale`): `ran`, `hit` or `stale:REASON:AGE_US`.
pub fn answered_to_text(how: &Answered) -> String {
    match how {
        Answered::Hit { .. } => "hit".to_owned(),
        Answered::Stale { stale: s, .. } => {
            format!("stale:{}:{}", s.reason.as_str(), s.age.as_micros())
        }
        _ => "ran".to_owned(),
    }
}

/// [`answered_to_text`] read back (`None`: not one of its forms). A hit's
/// age and work times are not carried: the checks bound stale answers
/// alone, by their age.
pub fn answered_from_text(text: &str) -> Option<Answered> {
    match text {
        "ran" => return Some(Answered::Ran),
        "hit" => {
            return Some(Answered::Hit {
                age: Duration::ZERO,
                fresh_for: Duration::ZERO,
                work_time: Duration::ZERO,
            })
        }
        _ => {}
    }
    let mut parts = text.strip_prefix("stale:")?.split(':');
    let reason = parts.next()?;
    let reason = [
        StaleReason::Revalidate,
        StaleReason::Error,
        StaleReason::SoftTimeout,
        StaleReason::RedisDown,
        StaleReason::WaitTimeout,
    ]
    .into_iter()
    .find(|r| r.as_str() == reason)?;
    let age = Duration::from_micros(parts.next()?.parse().ok()?);
    Some(Answered::Stale {
        stale: Stale { reason, age },
        work_time: Duration::ZERO,
    })
}

/// What one request was answered.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The node it was sent to.
    pub node: usize,
    /// Its key.
    pub key: String,
    /// The generation of the result.
    pub generation: u64,
    /// The node whose work produced it.
    pub from: usize,
    /// When the request was sent.
    pub began: Instant,
    /// When its answer came back.
    pub received: Instant,
    /// How it was answered.
    pub how: Answered,
}

impl Answer {
    /// Whether the result came through the store, so it was committed:
    /// a hit, a stale answer, or another node's work.
    fn came_through_store(&self) -> bool {
        !matches!(self.how, Answered::Ran) || self.from != self.node
    }
}

/// The answers of a run, every node.
pub type Answers = Arc<Mutex<Vec<Answer>>>;

/// The oldest a stale answer of `reason` may be: the freshness plus the
/// window that answers it (a soft timeout's is the longer of the two).
pub fn stale_bound(fresh: Duration, windows: &StaleWindows, reason: StaleReason) -> Duration {
    let window = match reason {
        StaleReason::Revalidate => windows.revalidate,
        StaleReason::Error | StaleReason::WaitTimeout => windows.if_error,
        _ => windows.keep_stale(),
    };
    fresh + window
}

/// How much later than its work's end (as the work records it) the node
/// that ran it may date a result: the owner takes the time as it settles,
/// in the same poll, unless its thread is preempted in between.
pub const WORK_END_SLACK: Duration = Duration::from_millis(50);

/// What the checks found over a run's answers.
#[derive(Debug, Default)]
pub struct AnswerChecks {
    /// Answers by how (`ran`, `hit`, `stale revalidate`, ...).
    pub by_how: BTreeMap<String, u64>,
    /// The oldest stale answer of each reason, and its bound.
    pub oldest: BTreeMap<&'static str, (Duration, Duration)>,
    /// Stale answers of the node's own work, dated by its end: how many,
    /// and the longest from the work's end to a request, past its bound
    /// (negative: within it, in milliseconds).
    pub by_work_end: (u64, i128),
    /// Answers older than their bound, one line each.
    pub too_old: Vec<String>,
    /// Answers of a generation older than one their node had answered
    /// from the store before they began, one line each.
    pub backwards: Vec<String>,
}

/// Checks every answer of a run whose results are fresh for `fresh`,
/// answered stale within `windows`; `executions` (every node's) date the
/// results on the node that ran their work: a request that began longer
/// than the bound (and [`WORK_END_SLACK`]) after its result's work ended
/// there was answered older than the bound, whatever its marker says.
pub fn check_answers(
    answers: &[Answer],
    executions: &[Exec],
    fresh: Duration,
    windows: &StaleWindows,
) -> AnswerChecks {
    let ended: HashMap<(&str, u64, usize), Instant> = executions
        .iter()
        .filter_map(|e| Some(((e.key.as_str(), e.generation, e.node), e.end?)))
        .collect();
    let mut out = AnswerChecks {
        by_work_end: (0, i128::MIN),
        ..AnswerChecks::default()
    };
    for a in answers {
        if let (Answered::Stale { stale: s, .. }, Some(end)) =
            (a.how, ended.get(&(&*a.key, a.generation, a.from)))
        {
            let bound = stale_bound(fresh, windows, s.reason);
            let since = a.began.saturating_duration_since(*end);
            if a.from == a.node {
                let past = since.as_millis() as i128 - bound.as_millis() as i128;
                out.by_work_end = (out.by_work_end.0 + 1, out.by_work_end.1.max(past));
            }
            if a.from == a.node && since > bound + WORK_END_SLACK {
                out.too_old.push(format!(
                    "  {} on node {}: generation {} of its own work answered stale {}, begun {since:?} after the work ended (bound {bound:?}, marker {:?})",
                    a.key, a.node, a.generation, s.reason.as_str(), s.age
                ));
            }
        }
        let (how, age, bound) = match a.how {
            Answered::Ran => ("ran".to_owned(), Duration::ZERO, Duration::MAX),
            // A hit is fresh by the store's clock when it answers; by the
            // node's (its copy's work end, the trip back) it may be a hair
            // past: no bound here.
            Answered::Hit { .. } => ("hit".to_owned(), Duration::ZERO, Duration::MAX),
            Answered::Stale { stale: s, .. } => {
                let bound = stale_bound(fresh, windows, s.reason);
                let oldest = out.oldest.entry(s.reason.as_str()).or_default();
                *oldest = (oldest.0.max(s.age), bound);
                (format!("stale {}", s.reason.as_str()), s.age, bound)
            }
            _ => ("other".to_owned(), Duration::ZERO, Duration::MAX),
        };
        if age > bound {
            out.too_old.push(format!(
                "  {} on node {}: generation {} answered {how}, {age:?} old (bound {bound:?})",
                a.key, a.node, a.generation
            ));
        }
        *out.by_how.entry(how).or_default() += 1;
    }
    let mut by_node_key: HashMap<(usize, &str), Vec<&Answer>> = HashMap::new();
    for a in answers {
        by_node_key.entry((a.node, &a.key)).or_default().push(a);
    }
    for ((node, key), mut list) in by_node_key {
        list.sort_by_key(|a| a.received);
        for a in &list {
            let newer = list
                .iter()
                .take_while(|b| b.received < a.began)
                .filter(|b| b.came_through_store() && b.generation > a.generation)
                .max_by_key(|b| b.generation);
            if let Some(b) = newer {
                out.backwards.push(format!(
                    "  {key} on node {node}: generation {} answered {:?} after generation {} came from the store",
                    a.generation, a.how, b.generation
                ));
            }
        }
    }
    out
}

impl AnswerChecks {
    /// Lines for the run's summary.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!("answers by how: {:?}", self.by_how),
            format!(
                "oldest stale answer by reason (age, bound): {:?}",
                self.oldest
            ),
            format!(
                "stale answers of the node's own work, dated by its end: {}, the oldest {} ms past its bound (slack {WORK_END_SLACK:?})",
                self.by_work_end.0, self.by_work_end.1
            ),
            format!("answers older than their bound: {}", self.too_old.len()),
        ];
        lines.extend(self.too_old.iter().take(20).cloned());
        lines.push(format!(
            "answers older than a generation their node had from the store: {}",
            self.backwards.len()
        ));
        lines.extend(self.backwards.iter().take(20).cloned());
        lines
    }

    /// Asserts the checks, and that the run answered stale for a failing
    /// work and beside a refresh (or it exercised nothing).
    pub fn assert(&self) {
        assert!(
            self.too_old.is_empty(),
            "no answer older than its freshness plus the window of its reason"
        );
        assert!(
            self.backwards.is_empty(),
            "no node answers a generation older than one it had from the store"
        );
        for reason in [StaleReason::Revalidate, StaleReason::Error] {
            assert!(
                self.oldest.contains_key(reason.as_str()),
                "the run answered stale for {}",
                reason.as_str()
            );
        }
    }
}
