//! One run: the schedule played against the nodes, then quiescence and
//! the checks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck::core::error::{
    find, BulkheadFull, CircuitOpen, CoordinationUnavailable, DeadlineExceeded, FlightAbandoned,
    InProgress, LeaseLost, OutcomeUnknown, OwnerGone, ProtocolError, RemoteFailure, TooManyFlights,
    TooManyWaiters, WaitTimeout, WorkPanicked,
};
use flightdeck::core::{metric, FlightKey, StageName};
use flightdeck::distributed::FlightId;
use flightdeck::Mode;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::node::{Behaviour, Node, SimFailure, STAGE};
use crate::scenario::StaleSettings;
use crate::scenario::{Event, Scenario};
use crate::world::{Incarnation, Purged, State, World};
use flightdeck::core::stale::{Stale, StaleReason};
use flightdeck_test::recorded::Recorded;

/// How a caller ended.
#[derive(Debug)]
enum Outcome {
    /// A response: status, whether it sets a cookie, body.
    Value(u16, bool, String),
    /// An error, and whether it is one of the typed errors.
    Error(String, bool),
    /// The caller left (dropped its future) before an answer.
    Left,
}

struct Ended {
    at: Instant,
    outcome: Outcome,
}

struct Caller {
    id: usize,
    /// Sent to a BYPASS stage: the layer is off, the caller's fate is the
    /// service's own (no deadline of ours, no caught panic).
    bypassed: bool,
    key: usize,
    who: Incarnation,
    sent: Instant,
    deadline: Duration,
    task: JoinHandle<Ended>,
}

/// Whether an error is one flightdeck's callers are promised (or the
/// work's own).
fn typed(e: &(dyn std::error::Error + 'static)) -> bool {
    find::<SimFailure>(e).is_some()
        || find::<RemoteFailure>(e).is_some()
        || find::<DeadlineExceeded>(e).is_some()
        || find::<WaitTimeout>(e).is_some()
        || find::<CircuitOpen>(e).is_some()
        || find::<CoordinationUnavailable>(e).is_some()
        || find::<ProtocolError>(e).is_some()
        || find::<OutcomeUnknown>(e).is_some()
        || find::<LeaseLost>(e).is_some()
        || find::<OwnerGone>(e).is_some()
        || find::<InProgress>(e).is_some()
        || find::<WorkPanicked>(e).is_some()
        || find::<FlightAbandoned>(e).is_some()
        || find::<BulkheadFull>(e).is_some()
        || find::<TooManyFlights>(e).is_some()
        || find::<TooManyWaiters>(e).is_some()
}

pub(crate) fn flight(key: usize) -> FlightId {
    let stage = StageName::new(STAGE).expect("a valid stage name");
    FlightId::of(&FlightKey::from_bytes(stage, format!("k{key}")))
}

/// What a run found.
pub(crate) struct Found {
    pub(crate) trace: Vec<String>,
    pub(crate) violations: Vec<String>,
    pub(crate) causes: BTreeMap<String, u64>,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) exercised: BTreeMap<&'static str, u64>,
}

pub(crate) async fn simulate(sc: Scenario, world: Arc<World>, kept: &Recorded) -> Found {
    let s = &sc.settings;
    {
        let mut st = world.lock();
        for k in 0..sc.keys {
            st.names.insert(flight(k), format!("k{k}"));
        }
        let start = st.start;
        st.fail_windows = sc
            .fail_windows
            .iter()
            .map(|(a, b)| (start + *a, start + *b))
            .collect();
        st.modes = vec![s.mode; sc.nodes];
    }
    let mut nodes: Vec<Option<Node>> = (0..sc.nodes)
        .map(|n| Some(Node::start(&world, (n, 0), s, sc.work_faults)))
        .collect();
    let mut starts = vec![0u32; sc.nodes];
    let mut callers: Vec<Caller> = Vec::new();
    let mut modes = vec![s.mode; sc.nodes];
    let mut local_modes = s.mode == Mode::LocalOnly;
    let mut bypass = false;
    let start = Instant::now();

    // A request reads its node's mode when its task first runs: after
    // every event of the same instant (a mode switch among them), since
    // the schedule yields only when time moves on. So whether a caller
    // was bypassed is settled when it does.
    let mut arrived: Vec<(usize, usize)> = Vec::new();
    for (t, event) in &sc.events {
        if start + *t > Instant::now() {
            for (i, node) in arrived.drain(..) {
                callers[i].bypassed = modes[node] == Mode::Bypass;
            }
        }
        tokio::time::sleep_until(start + *t).await;
        world.lock().log(format!("EVENT {event:?}"));
        match *event {
            Event::Call {
                caller,
                node,
                key,
                deadline,
                leave,
            } => {
                let Some(n) = &nodes[node] else {
                    world.lock().log(format!("c{caller}: n{node} is down"));
                    continue;
                };
                let req = Request::builder()
                    .uri("/sim")
                    .header("x-sim-key", key.to_string())
                    .header("x-sim-caller", caller.to_string())
                    .header("x-request-timeout", format!("{}ms", deadline.as_millis()))
                    .extension(FlightKey::from_bytes(
                        StageName::new(STAGE).expect("a valid stage name"),
                        format!("k{key}"),
                    ))
                    .body(Full::new(Bytes::new()))
                    .expect("a valid request");
                let call = n.svc.clone().oneshot(req);
                let w = Arc::clone(&world);
                let (who, stale, sent) = (n.who, s.stale, Instant::now());
                let task = tokio::spawn(async move {
                    let answer = match leave {
                        Some(l) => tokio::time::timeout(l, call).await.ok(),
                        None => Some(call.await),
                    };
                    let outcome = match answer {
                        None => Outcome::Left,
                        Some(Ok(resp)) => {
                            let marker = resp.extensions().get::<Stale>().copied();
                            // Whether a flight brought it (not the copy).
                            let flown = resp
                                .headers()
                                .get("cache-status")
                                .and_then(|v| v.to_str().ok())
                                .is_some_and(|v| v.contains("fwd=miss"));
                            let status = resp.status().as_u16();
                            let cookie = resp.headers().contains_key(http::header::SET_COOKIE);
                            let body = resp
                                .into_body()
                                .collect()
                                .await
                                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                                .unwrap_or_else(|e| format!("<body error {e}>"));
                            if status == 200 && !cookie {
                                let answer = Answer {
                                    caller,
                                    key,
                                    who,
                                    sent,
                                    marker,
                                    flown,
                                };
                                answer.check(&mut w.lock(), &body, stale);
                            }
                            Outcome::Value(status, cookie, body)
                        }
                        Some(Err(e)) => Outcome::Error(format!("{e}"), typed(&*e)),
                    };
                    w.lock().log(format!("c{caller} ended: {outcome:?}"));
                    Ended {
                        at: Instant::now(),
                        outcome,
                    }
                });
                arrived.push((callers.len(), node));
                callers.push(Caller {
                    id: caller,
                    bypassed: false,
                    key,
                    who: n.who,
                    sent: Instant::now(),
                    deadline,
                    task,
                });
            }
            Event::Freeze { span } => {
                world.freeze(true);
                let w = Arc::clone(&world);
                drop(tokio::spawn(async move {
                    tokio::time::sleep(span).await;
                    w.freeze(false);
                    w.lock().log("thawed");
                }));
            }
            Event::Replicate => world.replicate(),
            Event::Failover => world.failover(),
            Event::Expire { key } => world.expire(&flight(key)),
            Event::DropNotices { span } => {
                world.mem.set_drop_notices(true);
                let w = Arc::clone(&world);
                drop(tokio::spawn(async move {
                    tokio::time::sleep(span).await;
                    w.mem.set_drop_notices(false);
                    w.lock().log("notices flow again");
                }));
            }
            Event::Purge { node, key } => {
                let Some(n) = &nodes[node] else {
                    continue;
                };
                let (handle, who, w) = (n.handle.clone(), n.who, Arc::clone(&world));
                drop(tokio::spawn(async move {
                    let k = FlightKey::from_bytes(
                        StageName::new(STAGE).expect("a valid stage name"),
                        format!("k{key}"),
                    );
                    let (began, floor) = (Instant::now(), w.lock().execs.len());
                    // The node's copies and flights go at the first poll.
                    let res = handle.invalidate(&k).await;
                    let mut st = w.lock();
                    st.log(format!("n{}.{} purged k{key}: {res:?}", who.0, who.1));
                    st.purges.push(Purged {
                        who,
                        key,
                        began,
                        done: Instant::now(),
                        floor,
                        ok: res.is_ok(),
                    });
                }));
            }
            Event::Crash { node } => {
                if let Some(n) = nodes[node].take() {
                    world.lock().dead.insert(n.who);
                    for c in callers.iter().filter(|c| c.who == n.who) {
                        c.task.abort();
                    }
                }
            }
            Event::Restart { node } => {
                if nodes[node].is_none() {
                    starts[node] += 1;
                    modes[node] = s.mode;
                    world.lock().modes[node] = s.mode;
                    nodes[node] =
                        Some(Node::start(&world, (node, starts[node]), s, sc.work_faults));
                }
            }
            Event::SetMode { node, mode } => {
                if let Some(n) = &nodes[node] {
                    local_modes |= mode == Mode::LocalOnly;
                    bypass |= mode == Mode::Bypass;
                    modes[node] = mode;
                    world.lock().modes[node] = mode;
                    let prev = n.handle.set_mode(mode);
                    world
                        .lock()
                        .log(format!("n{node}: mode {prev:?} -> {mode}"));
                }
            }
        }
    }

    for (i, node) in arrived.drain(..) {
        callers[i].bypassed = modes[node] == Mode::Bypass;
    }

    // Every caller ends by its own deadline.
    for c in callers {
        let by = c.sent + c.deadline;
        let dead = world.lock().dead.contains(&c.who);
        let ended = tokio::time::timeout_at(by + Duration::from_secs(30), c.task).await;
        let mut st = world.lock();
        if c.bypassed {
            st.log(format!(
                "c{}: sent in bypass, not ours to check (ended: {})",
                c.id,
                ended.is_ok()
            ));
            continue;
        }
        let ended = match ended {
            Err(_) => {
                st.violation(format!("c{}: still waiting 30 s past its deadline", c.id));
                continue;
            }
            // Its node crashed under it.
            Ok(Err(_)) if dead => continue,
            Ok(Err(e)) => {
                st.violation(format!("c{}: its task failed: {e}", c.id));
                continue;
            }
            Ok(Ok(ended)) => ended,
        };
        // Timers fire on the millisecond after their instant.
        if ended.at > by + Duration::from_millis(2) {
            st.violation(format!(
                "c{}: ended {:?} after its deadline",
                c.id,
                ended.at - by
            ));
        }
        match ended.outcome {
            Outcome::Left => {}
            Outcome::Error(e, typed) => {
                if !typed {
                    st.violation(format!("c{}: an untyped error: {e}", c.id));
                }
            }
            Outcome::Value(status, cookie, body) => {
                if status != 200 || !body.starts_with(&format!("key=k{} ", c.key)) {
                    st.violation(format!(
                        "c{} (k{}): another key's value or a wrong status: {status} {body}",
                        c.id, c.key
                    ));
                }
                if cookie && !body.contains(&format!(" caller={} ", c.id)) {
                    st.violation(format!(
                        "c{}: got a response another caller's run set a cookie in: {body}",
                        c.id
                    ));
                }
            }
        }
    }

    // Quiescence: faults healed, every live node drains.
    world.freeze(false);
    world.mem.set_drop_notices(false);
    world.lock().call_faults = 0.0;
    let live: Vec<&Node> = nodes.iter().flatten().collect();
    let drained = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            for n in &live {
                n.layer.idle().await;
            }
            // Every command sent has run, as a thawed server runs its
            // queue: a lease is judged by what the store did, not by a
            // command still on its way.
            if world.in_flight() == 0
                && live.iter().all(|n| {
                    n.layer.running_flights(STAGE) == Some(0) && n.handle.bulkhead().active() == 0
                })
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    {
        let mut st = world.lock();
        st.log("quiescent");
        if drained.is_err() {
            st.violation("the live nodes' flights never drained".to_owned());
        }
        let mut leases = world.mem.live_leases();
        // The backend's map has no order of its own: the trace needs one.
        leases.sort_by_key(|(flight, _, gen)| (st.names.get(flight).cloned(), *gen));
        for (flight, token, gen) in leases {
            let holder = st.tokens.get(token.as_str()).copied();
            let by_dead = holder.is_some_and(|h| st.dead.contains(&h));
            if st.zombies.contains(token.as_str())
                || World::ended_before_failover(&st, token.as_str())
            {
                st.log(format!(
                    "a lease (generation {gen}) a failover brought back: it lapses by itself"
                ));
            } else if !by_dead {
                let name = st.names.get(&flight).cloned().unwrap_or_default();
                st.violation(format!(
                    "{name}: a lease (generation {gen}) left behind by {holder:?}, which works on nothing"
                ));
            }
        }
    }
    // The dead incarnations' leftovers run out too (timeouts cut what
    // they wait on); then no subscription is left, and every gauge is
    // back to zero.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut st = world.lock();
    // (A crashed node's followers held theirs until their wait ended.)
    for k in 0..sc.keys {
        let subs = world.mem.subscribers(&flight(k));
        if subs > 0 {
            st.violation(format!("k{k}: {subs} subscriptions left behind"));
        }
    }
    let active = kept.gauge_total(metric::ACTIVE_FLIGHTS);
    if active != 0.0 {
        st.violation(format!(
            "{} = {active} at quiescence",
            metric::ACTIVE_FLIGHTS
        ));
    }
    for n in nodes.iter().flatten() {
        if n.layer.running_flights(STAGE) != Some(0) || n.handle.bulkhead().active() != 0 {
            st.violation(format!(
                "n{}.{}: flights or permits left behind",
                n.who.0, n.who.1
            ));
        }
    }

    let disturbed = !st.faults.is_empty()
        || sc.work_faults > 0.0
        || sc
            .events
            .iter()
            .any(|(_, e)| !matches!(e, Event::Call { .. } | Event::SetMode { .. }));
    one_refresh_at_a_time(&mut st);
    let wait_local = s.on_wait_failure == flightdeck::OnWaitFailure::Local;
    let mut causes = attribute(&mut st, kept, local_modes, bypass, disturbed, wait_local);
    refreshes(&mut st, kept, &mut causes);
    let faults = st.faults.clone();
    let mut exercised = BTreeMap::new();
    exercised.insert("stale answers", st.stale_answers);
    exercised.insert("purges", st.purges.iter().filter(|p| p.ok).count() as u64);
    exercised.insert("refreshes", refresh_execs(&st).len() as u64);
    // Leases granted by an ACQUIRE applied after its caller gave it up
    // (allowed: released in the background, or they lapse by themselves).
    exercised.insert("late grants", st.late_grants);
    Found {
        exercised,
        trace: std::mem::take(&mut st.trace),
        violations: std::mem::take(&mut st.violations),
        causes,
        faults,
    }
}

/// A value a caller got, checked when it came (stale windows, purges,
/// the copy's order).
struct Answer {
    caller: usize,
    key: usize,
    who: Incarnation,
    sent: Instant,
    marker: Option<Stale>,
    /// A flight's result (`Cache-Status: fwd=miss`), not a copy's.
    flown: bool,
}

/// The execution a value's body names (`exec=N`).
fn exec_of(body: &str) -> Option<usize> {
    body.rsplit_once("exec=").and_then(|(_, n)| n.parse().ok())
}

impl Answer {
    fn check(&self, st: &mut State, body: &str, windows: Option<StaleSettings>) {
        let Some(e) = exec_of(body) else {
            return;
        };
        let now = Instant::now();
        let (c, k, (n, i)) = (self.caller, self.key, self.who);
        let tick = st.tick();
        st.answers.insert(c, (tick, e));
        if let Some(stale) = self.marker {
            st.stale_answers += 1;
            match windows {
                None => st.violation(format!("c{c}: a stale answer with no window on: {stale:?}")),
                Some(w) => {
                    let limit = w.limit(stale.reason);
                    if stale.age > limit {
                        st.violation(format!(
                            "c{c} (k{k}): a stale answer ({}) aged {:?}, past freshness + window {limit:?}",
                            stale.reason, stale.age
                        ));
                    }
                    // By our own clock, from the end of the work when it
                    // ran on this node, or from the result's last arrival
                    // here by a flight (from the store: as old as its
                    // arrival, docs/guarantees.md).
                    let ended = st
                        .execs
                        .get(e)
                        .filter(|x| x.who == self.who)
                        .and_then(|x| x.ended);
                    let arrived = st.arrived.get(&(self.who, e)).copied();
                    if let Some(since) = ended.max(arrived) {
                        let age = now.saturating_duration_since(since);
                        if age > limit {
                            st.violation(format!(
                                "c{c} (k{k}): a stale answer ({}) of exec {e}, which ended or arrived {age:?} ago, past freshness + window {limit:?}",
                                stale.reason
                            ));
                        }
                    }
                }
            }
            if stale.reason != StaleReason::RedisDown {
                let given = st.given.get(&(self.who, k)).copied();
                if given.is_some_and(|g| g > e) {
                    st.violation(format!(
                        "c{c} (k{k}): a stale answer of exec {e} on n{n}.{i}, which had given exec {} already",
                        given.unwrap_or_default()
                    ));
                }
            }
        }
        let failover = st.last_failover;
        let purged = st
            .purges
            .iter()
            // A caller sent after the purge returned; and the copy is
            // gone from the purge's start, whoever it answers.
            .filter(|p: &&Purged| {
                p.ok && p.who == self.who
                    && p.key == k
                    && (p.done < self.sent || (self.marker.is_some() && p.began < now))
            })
            // A failover can bring the store's result back (a write it
            // lost: docs/guarantees.md).
            .filter(|p| failover.is_none_or(|f| f < p.began))
            .find(|p| e < p.floor)
            .cloned();
        if let Some(p) = purged {
            st.violation(format!(
                "c{c} (k{k}): after n{n}.{i}'s purge, got exec {e}, which started before it (purge floor {}, stale {:?})",
                p.floor, self.marker
            ));
        }
        if self.flown {
            st.arrived.insert((self.who, e), now);
        }
        // A run in BYPASS is the service's own: the layer never saw it.
        if st
            .execs
            .get(e)
            .is_some_and(|x| x.mode != Some(Mode::Bypass))
        {
            let given = st.given.entry((self.who, k)).or_default();
            *given = (*given).max(e);
        }
    }
}

/// At most one refresh (grace, early refresh) runs per key per node at a
/// time (LOCAL_ONLY). A refresh is the execution of a caller's request
/// that started after its caller had its answer, another execution's
/// value: the copy answered and the request went on in the background.
fn refresh_execs(st: &State) -> Vec<usize> {
    st.execs
        .iter()
        .enumerate()
        .filter(|(id, x)| {
            st.answers
                .get(&x.caller)
                .is_some_and(|(at, e)| e != id && *at < x.tick)
        })
        .map(|(id, _)| id)
        .collect()
}

fn one_refresh_at_a_time(st: &mut State) {
    let ids = refresh_execs(st);
    let mut problems = Vec::new();
    for (a, &i) in ids.iter().enumerate() {
        for &j in &ids[a + 1..] {
            let (x, y) = (&st.execs[i], &st.execs[j]);
            let local = |m: Option<Mode>| m == Some(Mode::LocalOnly);
            if x.who != y.who || x.key != y.key || !local(x.mode) || !local(y.mode) {
                continue;
            }
            // A purge passes a running refresh by, as it does a flight:
            // the next copy may start its own.
            let passed = st.purges.iter().any(|p| {
                p.who == x.who && p.key == x.key && x.started <= p.began && p.began <= y.started
            });
            let overlap = !passed && x.ended.is_none_or(|end| y.started < end);
            if overlap && !st.dead.contains(&x.who) {
                problems.push(format!(
                    "k{}: refreshes exec {i} and exec {j} ran at once on n{}.{}",
                    x.key, x.who.0, x.who.1
                ));
            }
        }
    }
    for p in problems {
        st.violation(p);
    }
}

/// Refreshes are a cause of their own: counted by
/// `singleflight_refresh_total`, which covers every refresh execution.
fn refreshes(st: &mut State, kept: &Recorded, causes: &mut BTreeMap<String, u64>) {
    let ran = refresh_execs(st).len() as u64;
    let counted = kept.counter_total(metric::REFRESH_TOTAL, None);
    if ran > counted {
        st.violation(format!(
            "{ran} executions were refreshes, {counted} counted in {}",
            metric::REFRESH_TOTAL
        ));
    }
    if ran > 0 {
        *causes
            .entry("a refresh (stale-while-revalidate or early refresh)".into())
            .or_default() += ran;
    }
}

/// Attributes every execution to a documented cause and counts them (an
/// execution without one is a violation): a flight's owner's run to its
/// grant's cause (the first grant of a key, or what ended the grant
/// before: see the server journal), a run outside L2 to its path
/// (`singleflight_execution_total{path}`), which needs its cause in the
/// schedule (a fault for `fallback`, or `on-wait-failure = local` for
/// one counted as a failed wait; a mode switch or an unshareable response
/// for `local`, a switch to BYPASS for `bypass`).
fn attribute(
    st: &mut crate::world::State,
    kept: &Recorded,
    local_modes: bool,
    bypass: bool,
    disturbed: bool,
    wait_local: bool,
) -> BTreeMap<String, u64> {
    let mut causes: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen_key = std::collections::HashSet::new();
    let mut seen_grant = std::collections::HashSet::new();
    let mut owner_runs = 0u64;
    let mut other_runs = 0u64;
    let mut unshareable = false;
    let mut problems = Vec::new();
    for e in &st.execs {
        unshareable |= matches!(e.behaviour, Behaviour::Unshareable(_));
        let first = seen_key.insert(e.key);
        let Some((gen, token)) = &e.fence else {
            // Counted by path below.
            other_runs += 1;
            continue;
        };
        owner_runs += 1;
        let f = flight(e.key);
        let grant = st.flights.get(&f).and_then(|l| l.grants.get(gen));
        let cause = match grant {
            Some((t, _)) if t != token => {
                problems.push(format!(
                    "k{}: ran with generation {gen} of another token",
                    e.key
                ));
                continue;
            }
            None => {
                problems.push(format!(
                    "k{}: ran with generation {gen}, never granted",
                    e.key
                ));
                continue;
            }
            Some((_, cause)) => *cause,
        };
        if !seen_grant.insert((e.key, *gen)) {
            problems.push(format!("k{}: generation {gen} ran twice", e.key));
            continue;
        }
        let cause = if first {
            "first"
        } else if cause == "first" {
            "the first grant, after runs outside L2"
        } else {
            cause
        };
        *causes.entry(cause.into()).or_default() += 1;
    }
    let path = |p: &str| kept.counter_total(metric::EXECUTION_TOTAL, Some(("path", p)));
    let (owner, local, fallback, bypassed) = (
        path("owner"),
        path("local"),
        path("fallback"),
        path("bypass"),
    );
    if owner != owner_runs {
        problems.push(format!(
            "{owner_runs} runs with a fencing token, {owner} counted as path=owner"
        ));
    }
    if local + fallback + bypassed != other_runs {
        problems.push(format!(
            "{other_runs} runs without a fencing token, {} counted as local, fallback or bypass",
            local + fallback + bypassed
        ));
    }
    // A follower whose wait failed runs here with `on-wait-failure =
    // local` (HYBRID), counted by its reason.
    let after_wait = kept
        .counter_total(
            metric::LOCAL_FALLBACK_TOTAL,
            Some(("reason", "wait_failure")),
        )
        .min(fallback);
    for (n, ok, cause) in [
        (
            fallback - after_wait,
            disturbed,
            "local fallback (coordination failed)",
        ),
        (
            after_wait,
            wait_local,
            "local fallback (a follower's wait failed, on-wait-failure = local)",
        ),
        (
            local,
            local_modes || unshareable,
            "local-only mode, or an unshareable response",
        ),
        (bypassed, bypass, "bypass mode"),
    ] {
        if n == 0 {
            continue;
        }
        if !ok {
            problems.push(format!("{n} runs of path {cause:?} without that cause"));
        }
        *causes.entry(cause.into()).or_default() += n;
    }
    for p in problems {
        st.violation(p);
    }
    causes
}
