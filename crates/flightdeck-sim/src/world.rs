//! The simulated world: the one backend every node shares (the memory
//! backend), the fault-injecting [`SimBackend`] each node incarnation
//! talks to it through, the seeded generator every fault is drawn from,
//! the trace, and the server-side journal the invariants are checked on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendError, BackendFuture, CommitArgs, Committed,
    FlightId, LeaseTerms, OwnerToken, Released, Renewal, Subscription,
};
use flightdeck_test::memory::{MemoryBackend, MemorySnapshot};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A node incarnation: (node, how many times it started before).
pub(crate) type Incarnation = (usize, u32);

/// What became of a flight's last grant, as the backend applied it: what
/// the next grant's cause is read from.
#[derive(Clone, Debug)]
pub(crate) enum Last {
    Granted { deadline: Instant },
    Committed { expires: Instant },
    Ended,
}

/// One flight's history, server side.
#[derive(Clone, Debug, Default)]
pub(crate) struct FlightLog {
    /// Every grant: generation → (token, cause).
    pub(crate) grants: BTreeMap<u64, (String, &'static str)>,
    /// The highest generation granted that the backend still remembers
    /// (a failover forgets those granted after its snapshot).
    pub(crate) remembered: u64,
    pub(crate) last: Option<Last>,
    /// A failover or a forced expiry happened since the last write.
    pub(crate) lost: Option<&'static str>,
    /// Generations whose commit was accepted, with the token.
    pub(crate) committed: BTreeMap<u64, HashSet<String>>,
    /// Highest generation in server order (grants only).
    pub(crate) high: u64,
}

/// Everything the world keeps, behind one lock (the run is on one thread;
/// the lock is never held across an await).
pub(crate) struct State {
    pub(crate) rng: StdRng,
    pub(crate) start: Instant,
    pub(crate) call_faults: f64,
    pub(crate) trace: Vec<String>,
    pub(crate) violations: Vec<String>,
    pub(crate) flights: HashMap<FlightId, FlightLog>,
    /// `flights` as the last replication left it (restored by a failover).
    replica: Option<(MemorySnapshot, HashMap<FlightId, FlightLog>)>,
    /// Which incarnation acquired each token.
    pub(crate) tokens: HashMap<String, Incarnation>,
    pub(crate) dead: HashSet<Incarnation>,
    /// Call faults injected, by kind.
    pub(crate) faults: BTreeMap<&'static str, u64>,
    /// Flight → key name, for the trace.
    pub(crate) names: HashMap<FlightId, String>,
    /// Tokens whose attempt ended (committed, fenced, abandoned,
    /// released), and when: the backend never grants them again, unless
    /// a failover lost that memory.
    ended: HashMap<String, Instant>,
    pub(crate) last_failover: Option<Instant>,
    /// Tokens granted again after their record, which remembered that
    /// their attempt had ended, expired or was lost in a failover (see
    /// docs/guarantees.md, known limits): their lease lapses by itself.
    pub(crate) zombies: HashSet<String>,
    /// Every execution of the work, in order.
    pub(crate) execs: Vec<crate::node::Exec>,
    /// The spans during which every execution fails.
    pub(crate) fail_windows: Vec<(Instant, Instant)>,
    /// Each node's mode now.
    pub(crate) modes: Vec<flightdeck::Mode>,
    /// Per node incarnation and key: the latest-started execution whose
    /// value a caller there was given.
    pub(crate) given: HashMap<(Incarnation, usize), usize>,
    /// The purges.
    pub(crate) purges: Vec<Purged>,
    /// Each caller's value: when it came (by `ticks`), and the execution
    /// that made it.
    pub(crate) answers: HashMap<usize, (u64, usize)>,
    /// Orders the executions' starts and the callers' answers, also
    /// within one instant.
    pub(crate) ticks: u64,
    /// When each execution's value last came to a node by a flight.
    pub(crate) arrived: HashMap<(Incarnation, usize), Instant>,
    /// Stale answers checked.
    pub(crate) stale_answers: u64,
    /// Whether the command being applied granted a lease (read and reset
    /// by [`World::applied`] right after it).
    granting: bool,
    /// Leases granted by an ACQUIRE applied after its caller had given it
    /// up (the leases nobody works on that a not-after prevents).
    pub(crate) late_grants: u64,
}

/// A purge.
#[derive(Clone, Debug)]
pub(crate) struct Purged {
    pub(crate) who: Incarnation,
    pub(crate) key: usize,
    /// When it began (the node's copies went then) and returned.
    pub(crate) began: Instant,
    pub(crate) done: Instant,
    /// Executions that started before it began.
    pub(crate) floor: usize,
    /// Whether it returned `Ok` (the node's copies went either way).
    pub(crate) ok: bool,
}

impl State {
    /// The virtual time since the run began, in milliseconds.
    pub(crate) fn now_ms(&self) -> u128 {
        Instant::now().duration_since(self.start).as_millis()
    }

    /// Adds a line to the trace.
    pub(crate) fn log(&mut self, line: impl AsRef<str>) {
        let t = self.now_ms();
        self.trace.push(format!("{t:>7}ms {}", line.as_ref()));
    }

    /// The next tick of the run's order of starts and answers.
    pub(crate) fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    pub(crate) fn violation(&mut self, what: String) {
        self.log(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    fn name(&self, flight: &FlightId) -> String {
        self.names
            .get(flight)
            .cloned()
            .unwrap_or_else(|| flight.to_string())
    }
}

/// The shared world.
pub(crate) struct World {
    pub(crate) mem: MemoryBackend,
    state: Mutex<State>,
    /// While frozen, the commands waiting to run, woken in the order they
    /// came (a `watch` channel would wake them in a random order).
    frozen: Mutex<Option<Vec<oneshot::Sender<()>>>>,
    /// Commands sent and not yet applied (delayed, queued behind a
    /// freeze, or waiting to be sent again): the checks at quiescence
    /// wait for none to be left, as a real server would have run them.
    in_flight: AtomicUsize,
}

impl World {
    pub(crate) fn new(rng: StdRng, call_faults: f64) -> Arc<Self> {
        Arc::new(Self {
            mem: MemoryBackend::new(),
            state: Mutex::new(State {
                rng,
                start: Instant::now(),
                call_faults,
                trace: Vec::new(),
                violations: Vec::new(),
                flights: HashMap::new(),
                replica: None,
                tokens: HashMap::new(),
                dead: HashSet::new(),
                faults: BTreeMap::new(),
                names: HashMap::new(),
                execs: Vec::new(),
                ended: HashMap::new(),
                last_failover: None,
                zombies: HashSet::new(),
                fail_windows: Vec::new(),
                modes: Vec::new(),
                given: HashMap::new(),
                purges: Vec::new(),
                answers: HashMap::new(),
                ticks: 0,
                arrived: HashMap::new(),
                stale_answers: 0,
                granting: false,
                late_grants: 0,
            }),
            frozen: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, Option<Vec<oneshot::Sender<()>>>> {
        self.frozen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Freezes the backend, or thaws it: the commands that waited run,
    /// in the order they came.
    pub(crate) fn freeze(&self, yes: bool) {
        let mut q = self.queue();
        if yes {
            q.get_or_insert_with(Vec::new);
        } else if let Some(waiting) = q.take() {
            for w in waiting {
                let _ = w.send(());
            }
        }
    }

    /// How many commands were sent and have not run yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits while the backend is frozen.
    async fn thawed(&self) {
        let rx = {
            let mut q = self.queue();
            let Some(waiting) = q.as_mut() else {
                return;
            };
            let (tx, rx) = oneshot::channel();
            waiting.push(tx);
            rx
        };
        let _ = rx.await;
    }

    /// The replica catches up with the primary.
    pub(crate) fn replicate(&self) {
        let snap = self.mem.snapshot();
        let mut st = self.lock();
        let logs = st.flights.clone();
        st.replica = Some((snap, logs));
    }

    /// A failover to the replica: what was written since it last caught
    /// up is lost.
    pub(crate) fn failover(&self) {
        let mut st = self.lock();
        let Some((snap, logs)) = st.replica.clone() else {
            st.log("failover with no replica: nothing lost");
            return;
        };
        self.mem.restore(&snap);
        st.last_failover = Some(Instant::now());
        for (flight, log) in st.flights.iter_mut() {
            let before = logs.get(flight);
            log.remembered = before.map_or(0, |b| b.remembered);
            log.last = before.and_then(|b| b.last.clone());
            log.lost = Some("a failover lost the last writes");
        }
    }

    /// Whether `token`'s attempt ended before the last failover, which
    /// may have brought its lease back (or forgotten that it ended).
    pub(crate) fn ended_before_failover(st: &State, token: &str) -> bool {
        st.ended
            .get(token)
            .is_some_and(|e| st.last_failover.is_some_and(|f| f >= *e))
    }

    /// A key's record expires now.
    pub(crate) fn expire(&self, flight: &FlightId) {
        self.mem.expire(flight);
        let mut st = self.lock();
        let log = st.flights.entry(*flight).or_default();
        log.last = None;
        log.lost = Some("the record expired");
    }

    /// Right after a command was applied: whether its caller had already
    /// given it up; a lease it granted then is counted as granted late.
    fn applied(&self, caller_gone: bool) {
        let mut st = self.lock();
        if std::mem::take(&mut st.granting) && caller_gone {
            st.late_grants += 1;
            st.log("  (granted after its caller gave it up: nobody works on it)");
        }
    }

    /// Journals an applied ACQUIRE's answer and checks it.
    fn granted(
        &self,
        who: Incarnation,
        flight: &FlightId,
        token: &OwnerToken,
        lease: Duration,
        remembered: bool,
        answer: &Acquired,
    ) {
        let mut st = self.lock();
        let name = st.name(flight);
        st.log(format!(
            "  n{}.{} ACQUIRE {name} t{} -> {answer:?}",
            who.0,
            who.1,
            short(token)
        ));
        st.granting = matches!(answer, Acquired::Owner { .. });
        let Acquired::Owner {
            generation,
            takeover,
            stale,
        } = answer
        else {
            return;
        };
        let (generation, takeover) = (*generation, *takeover);
        // An early refresh is granted while the result is still fresh.
        let early = stale.as_ref().is_some_and(|r| !r.fresh_for().is_zero());
        let now = Instant::now();
        if st.ended.contains_key(token.as_str()) {
            if !remembered {
                // The record that remembered its end expired, or a
                // failover lost it (docs/guarantees.md, known limits).
                st.log("  (a token whose attempt ended, granted again: its record was gone)");
                st.zombies.insert(token.as_str().to_owned());
            } else {
                st.violation(format!(
                    "{name}: generation {generation} granted to a token whose attempt had ended"
                ));
            }
        }
        let log = st.flights.entry(*flight).or_default();
        let held = log
            .grants
            .iter()
            .find(|(g, (t, _))| **g != generation && t == token.as_str())
            .map(|(g, _)| *g);
        if let Some(held) = held {
            // A late ACQUIRE of a token that holds an earlier generation
            // (its record was lost, or its lease ran out): its holder works
            // on that one (docs/guarantees.md, known limits).
            st.log(format!(
                "  (granted again to a token that held generation {held}: the lease lapses)"
            ));
            st.zombies.insert(token.as_str().to_owned());
        }
        let log = st.flights.entry(*flight).or_default();
        if let Some((t, _)) = log.grants.get(&generation) {
            if t != token.as_str() {
                let msg = format!("{name}: generation {generation} granted to two tokens");
                st.violation(msg);
            }
            return;
        }
        let cause = if log.grants.is_empty() {
            "first"
        } else if early {
            "an early refresh of a fresh result (early-refresh)"
        } else if takeover {
            "takeover: the owner's lease ran out (cut off, crashed or frozen)"
        } else {
            match (&log.last, log.lost) {
                (_, Some(lost)) => lost,
                (Some(Last::Committed { expires }), _) if now >= *expires => {
                    "the stored result expired (replay-ttl)"
                }
                (Some(Last::Granted { deadline }), _) if now >= *deadline => {
                    "the owner's lease ran out and its record expired"
                }
                (Some(Last::Ended), _) => "the result was never committed (abandoned or released)",
                (None, _) => "the record expired (failure-ttl or record-ttl)",
                _ => "UNATTRIBUTED",
            }
        };
        let stale = generation <= log.high;
        let high = log.high;
        log.high = log.high.max(generation);
        log.remembered = log.remembered.max(generation);
        log.grants
            .insert(generation, (token.as_str().to_owned(), cause));
        log.last = Some(Last::Granted {
            deadline: now + lease,
        });
        log.lost = None;
        st.tokens.insert(token.as_str().to_owned(), who);
        if stale {
            st.violation(format!(
                "{name}: generation {generation} granted after generation {high}"
            ));
        }
        if cause == "UNATTRIBUTED" {
            st.violation(format!(
                "{name}: generation {generation} granted while the last one's result should be live"
            ));
        }
    }

    /// Journals an applied heartbeat: the lease's new deadline.
    fn renewed(&self, flight: &FlightId, gen: u64, lease: Duration, answer: &Renewal) {
        let mut st = self.lock();
        let log = st.flights.entry(*flight).or_default();
        if *answer == Renewal::Renewed && log.high == gen {
            log.last = Some(Last::Granted {
                deadline: Instant::now() + lease,
            });
        }
    }

    /// Journals an applied COMMIT's answer and checks it: its `ttl` runs
    /// from when it was `sent` (see `CommitArgs::sent`), never later than
    /// now.
    fn committed(
        &self,
        who: Incarnation,
        flight: &FlightId,
        token: &OwnerToken,
        gen: u64,
        (ttl, sent): (Duration, Option<Instant>),
        answer: &Committed,
    ) {
        let mut st = self.lock();
        let name = st.name(flight);
        st.log(format!(
            "  n{}.{} COMMIT {name} t{} g{gen} -> {answer:?}",
            who.0,
            who.1,
            short(token)
        ));
        st.ended.insert(token.as_str().to_owned(), Instant::now());
        if *answer != Committed::Committed {
            return;
        }
        let log = st.flights.entry(*flight).or_default();
        let remembered = log.remembered;
        let owners = log.committed.entry(gen).or_default();
        let first = owners.insert(token.as_str().to_owned());
        let two = owners.len() > 1;
        if first {
            // A retry of the commit (or its duplicate) answers COMMITTED
            // again and changes nothing: the result's TTL runs from the
            // first.
            let now = Instant::now();
            log.last = Some(Last::Committed {
                expires: sent.map_or(now, |sent| sent.min(now)) + ttl,
            });
            log.lost = None;
        }
        if two {
            st.violation(format!(
                "{name}: two results committed for generation {gen}"
            ));
        }
        if remembered > gen {
            st.violation(format!(
                "{name}: commit of generation {gen} accepted after generation {remembered} was granted"
            ));
        }
    }

    /// Journals an applied INVALIDATE: its generation fences every commit
    /// of an earlier one, and the next grant's cause is the purge.
    fn invalidated(&self, who: Incarnation, flight: &FlightId, answer: &u64) {
        let mut st = self.lock();
        let name = st.name(flight);
        st.log(format!(
            "  n{}.{} INVALIDATE {name} -> generation {answer}",
            who.0, who.1
        ));
        let log = st.flights.entry(*flight).or_default();
        log.remembered = log.remembered.max(*answer);
        log.high = log.high.max(*answer);
        log.last = None;
        log.lost = Some("a purge dropped the result (invalidate)");
    }

    /// Journals an applied ABANDON or RELEASE that ended a lease.
    fn ended(
        &self,
        who: Incarnation,
        what: &str,
        flight: &FlightId,
        token: &OwnerToken,
        answer: &Released,
    ) {
        let mut st = self.lock();
        let name = st.name(flight);
        st.log(format!(
            "  n{}.{} {what} {name} t{} -> {answer:?}",
            who.0,
            who.1,
            short(token)
        ));
        st.ended.insert(token.as_str().to_owned(), Instant::now());
        if *answer == Released::Released {
            let log = st.flights.entry(*flight).or_default();
            log.last = Some(Last::Ended);
            log.lost = None;
        }
    }
}

/// A command as the trace names it.
fn label(what: &str, flight: &FlightId, token: Option<&OwnerToken>) -> String {
    match token {
        Some(t) => format!("{what} {flight} t{}", short(t)),
        None => format!("{what} {flight}"),
    }
}

/// A token's first characters, for the trace.
fn short(token: &OwnerToken) -> &str {
    &token.as_str()[..token.as_str().len().min(6)]
}

/// A fault one backend command meets.
#[derive(Clone, Copy, Debug)]
enum CallFault {
    None,
    /// Reaches the backend late.
    Delayed(Duration),
    /// Refused at once (no connection): nothing applied.
    Refused,
    /// Lost on the way: never applied; the caller hears nothing (`hang`)
    /// or an error after a while.
    LostBefore {
        hang: bool,
    },
    /// Applied, but the answer is lost.
    LostAfter {
        hang: bool,
    },
    /// Applied, its reply lost with the connection, and sent again on a
    /// new one (a client that resends what got no reply): applied twice,
    /// the second time later, and answered by the second.
    Duplicated(Duration),
}

/// One node incarnation's backend: the shared memory backend behind the
/// seeded faults. Every command is applied by a task of its own (the
/// server), so a command the caller gave up on may still be applied, late.
#[derive(Clone)]
pub(crate) struct SimBackend {
    pub(crate) world: Arc<World>,
    pub(crate) who: Incarnation,
}

impl SimBackend {
    fn dead(&self) -> bool {
        self.world.lock().dead.contains(&self.who)
    }

    fn draw(&self, what: &str) -> CallFault {
        let mut st = self.world.lock();
        let p = st.call_faults;
        if p <= 0.0 || !st.rng.random_bool(p) {
            let who = self.who;
            st.log(format!("  n{}.{} sends {what}", who.0, who.1));
            return CallFault::None;
        }
        let fault = match st.rng.random_range(0..6) {
            0 => CallFault::Delayed(Duration::from_millis(st.rng.random_range(1..=400))),
            1 => CallFault::Refused,
            2 => CallFault::LostBefore {
                hang: st.rng.random_bool(0.5),
            },
            3 => CallFault::LostAfter {
                hang: st.rng.random_bool(0.5),
            },
            4 => CallFault::Duplicated(Duration::from_millis(st.rng.random_range(0..=600))),
            _ => CallFault::Delayed(Duration::from_millis(st.rng.random_range(1..=50))),
        };
        let kind = match fault {
            CallFault::None => "none",
            CallFault::Delayed(_) => "delayed",
            CallFault::Refused => "refused",
            CallFault::LostBefore { .. } => "lost before applied",
            CallFault::LostAfter { .. } => "lost after applied",
            CallFault::Duplicated(_) => "duplicated",
        };
        *st.faults.entry(kind).or_default() += 1;
        let who = self.who;
        st.log(format!("  n{}.{} {what}: fault {fault:?}", who.0, who.1));
        fault
    }

    /// Sends one command through the faults. `apply` runs it on the
    /// backend (and journals it); it may run twice (duplicated).
    fn call<T: Send + 'static>(
        &self,
        what: String,
        apply: impl Fn(&World) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> BackendFuture<'static, T> {
        if self.dead() {
            // Nothing a dead process sends arrives anywhere.
            return Box::pin(std::future::pending());
        }
        let fault = self.draw(&what);
        match fault {
            CallFault::Refused => {
                return Box::pin(std::future::ready(Err(BackendError::unavailable(
                    "sim: connection refused",
                ))))
            }
            CallFault::LostBefore { hang } => return lost(hang),
            _ => {}
        }
        let apply: Arc<ApplyFn<T>> = Arc::new(apply);
        let (tx, rx) = oneshot::channel();
        let world = Arc::clone(&self.world);
        let delay = match fault {
            CallFault::Delayed(d) => d,
            _ => Duration::ZERO,
        };
        let again = apply.clone();
        self.world.in_flight.fetch_add(1, Ordering::SeqCst);
        drop(tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            world.thawed().await;
            let mut answer = apply(&world);
            world.applied(tx.is_closed());
            if let CallFault::Duplicated(d) = fault {
                // The connection dropped before the reply, and the client
                // sent the command again on a new one: it runs twice, and
                // the caller hears the second answer.
                tokio::time::sleep(d).await;
                world.thawed().await;
                world.lock().log(format!("  {what} sent again and applied"));
                answer = again(&world);
                world.applied(tx.is_closed());
            }
            world.in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(answer);
        }));
        Box::pin(async move {
            let answer = rx
                .await
                .map_err(|_| BackendError::outcome_unknown("sim: dropped"))?;
            match fault {
                CallFault::LostAfter { hang } => lost(hang).await,
                _ => answer,
            }
        })
    }
}

/// A command as the server applies it (maybe twice).
type ApplyFn<T> = dyn Fn(&World) -> Result<T, BackendError> + Send + Sync;

/// The answer to a command whose answer never comes: silence, or an error
/// after a while (a reset connection).
fn lost<T: Send + 'static>(hang: bool) -> BackendFuture<'static, T> {
    if hang {
        return Box::pin(std::future::pending());
    }
    Box::pin(async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Err(BackendError::outcome_unknown("sim: connection reset"))
    })
}

impl Backend for SimBackend {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        let (flight, token, terms, who) = (*flight, token.clone(), *terms, self.who);
        self.call(label("ACQUIRE", &flight, Some(&token)), move |w| {
            let remembered = w.mem.remembers(&flight, &token);
            let answer = now(w.mem.acquire_with(&flight, &token, ask, &terms))?;
            w.granted(who, &flight, &token, terms.lease, remembered, &answer);
            Ok(answer)
        })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        let (flight, token, terms) = (*flight, token.clone(), *terms);
        self.call(label("HEARTBEAT", &flight, Some(&token)), move |w| {
            let answer = now(w.mem.heartbeat(&flight, &token, generation, &terms))?;
            w.renewed(&flight, generation, terms.lease, &answer);
            Ok(answer)
        })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        let (flight, token, args, who) = (*flight, token.clone(), args.clone(), self.who);
        self.call(label("COMMIT", &flight, Some(&token)), move |w| {
            let answer = now(w.mem.commit(&flight, &token, generation, &args))?;
            w.committed(
                who,
                &flight,
                &token,
                generation,
                (args.ttl, args.sent),
                &answer,
            );
            Ok(answer)
        })
    }

    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released> {
        let (flight, token, args, who) = (*flight, token.clone(), args.clone(), self.who);
        self.call(label("ABANDON", &flight, Some(&token)), move |w| {
            let answer = now(w.mem.abandon(&flight, &token, generation, &args))?;
            w.ended(who, "ABANDON", &flight, &token, &answer);
            Ok(answer)
        })
    }

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        let (flight, token, who) = (*flight, token.clone(), self.who);
        self.call(label("RELEASE", &flight, Some(&token)), move |w| {
            let answer = now(w.mem.release(&flight, &token, state_ttl))?;
            w.ended(who, "RELEASE", &flight, &token, &answer);
            Ok(answer)
        })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        let (flight, who) = (*flight, self.who);
        self.call(label("INVALIDATE", &flight, None), move |w| {
            let answer = now(w.mem.invalidate(&flight, state_ttl))?;
            w.invalidated(who, &flight, &answer);
            Ok(answer)
        })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        if self.dead() {
            return Box::pin(std::future::pending());
        }
        self.world.mem.subscribe(flight)
    }

    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        if self.dead() {
            return None;
        }
        self.world.mem.join_subscription(flight)
    }

    fn invalidated_since<'a>(
        &'a self,
        flight: &'a FlightId,
        generation: u64,
    ) -> BackendFuture<'a, Option<bool>> {
        self.world.mem.invalidated_since(flight, generation)
    }
}

/// The answer of a memory backend future, which is ready at once (the
/// memory backend does its work when called).
fn now<T>(fut: BackendFuture<'_, T>) -> Result<T, BackendError> {
    let mut fut: Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + '_>> = fut;
    let waker = std::task::Waker::noop();
    match fut
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    {
        std::task::Poll::Ready(answer) => answer,
        std::task::Poll::Pending => Err(BackendError::protocol(
            "sim: the memory backend did not answer at once",
        )),
    }
}
