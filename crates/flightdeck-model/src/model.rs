//! The protocol as a [`stateright`](https://docs.rs/stateright) model: the [`server`]
//! (a primary and its replica), the nodes that call it (clients of the L2
//! layer's shape, every timing allowed), the network between them, the
//! server clock, failovers, and the invariants of `docs/guarantees.md`,
//! checked over every interleaving.
//!
//! **Nodes** act as the L2 layer does, at any moment it may: a flight
//! takes a fresh token and ACQUIREs; an answer that does not come back (a
//! call cut off: outcome unknown) is retried once with the same token, or
//! given up, and a token given up on while it may hold a lease is
//! released in the background (once more after a `NOT_OWNER`, as the
//! orphan list does); a follower re-checks with its token, naming the
//! generation it first followed (a result of that generation or a later
//! one is kept for it past its freshness), or leaves, and one whose
//! re-check was cut off keeps following but releases its token when it
//! leaves; an owner heartbeats (while its commit or abandon is on its way
//! too), commits or abandons (its work failed or not) and retries either
//! after an unknown outcome; any node invalidates; a node crashes (its
//! calls on their way still run) and starts again empty; a node's
//! subscriber reconnects (its inbox is out of force until it subscribes
//! again).
//!
//! **A stage with stale windows** ([`Config::stale_windows`]) asks for
//! stale results in every ACQUIRE: a success kept past its freshness
//! (within `Terms::stale_for`) goes beside the grant that refreshes it
//! and beside the FOLLOWER answers while the refresh runs; a refresh
//! whose work failed starts a throttle (`Terms::retry_after`) during which
//! the kept result is the answer and nothing is granted. An idle node may
//! start an early refresh ([`Config::early`]): granted beside the still
//! fresh result unless a lease runs.
//!
//! **The network.** A call runs at once and its answer comes back, or it
//! is cut off: its sender takes the outcome as unknown, and the call stays
//! on its way, to run at any later moment (after calls sent after it: a
//! new connection's call can reach the server before an old one's) or to
//! be lost. [`Config::cut_off`] bounds how many calls are cut off in a
//! run. An ACQUIRE carries its not-after, the tick it was sent (and cut
//! off) in: run in a later tick by the server's clock, it answers `LATE`
//! and changes nothing.
//!
//! **The server** runs one call at a time ([`server::run`]); its clock
//! ticks; its replica copies it at any moment (asynchronous replication:
//! the replica holds some earlier state); a failover makes the replica the
//! primary, losing what was not copied, and takes at least a tick. With
//! [`Config::clock_steps_back`] the new primary's clock may also be a tick
//! behind, within the assumption the protocol states (not by more than the
//! time since the flight's record was last written).
//!
//! **Draining.** At any moment the run may settle: nobody works on the
//! key any more (owners and followers stop, pending calls are given up
//! and their tokens released), every call on its way lands or is lost,
//! then only time passes. Every run ends so; there the key must be free
//! ([`key_free`]: a fresh ACQUIRE is granted the flight or replays a
//! result), the liveness half of "no lease blocks a key nobody works on".
//!
//! **Adding states.** A new script is a [`Call`] and a function in
//! [`server`]; a new field of the record is a field of [`Record`]; a new
//! thing a node may do is a [`Role`] and an [`Action`]; a new promise is a
//! bit of [`Broken`], set where a step breaks it, and a property; a state
//! the checker must reach is a bit of [`Seen`] and a "sometimes"
//! property.
//!
//! [`Record`]: crate::server::Record

use std::fmt;

use stateright::{Model, Property};

use crate::server::{
    self, Answer, Ask, Body, Call, Gen, NodeId, Notice, Status, Store, Terms, Tick, Tok, EMPTY,
};

/// What is explored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Nodes (each one `RedisBackend`, one inbox).
    pub nodes: u8,
    /// Tokens (flight attempts) made in a run, over all nodes.
    pub tokens: u8,
    /// Grants in a run (more are not explored).
    pub grants: u8,
    /// Invalidations in a run.
    pub invalidations: u8,
    /// Failovers in a run.
    pub failovers: u8,
    /// Node crashes in a run.
    pub crashes: u8,
    /// Subscriber reconnects in a run.
    pub reconnects: u8,
    /// Whether a failover's new primary may have a clock a tick behind
    /// (within the protocol's clock assumption).
    pub clock_steps_back: bool,
    /// The last tick at which nodes start work (the run then drains).
    pub horizon: Tick,
    /// Calls cut off (or heartbeats sent) whose run is left to the
    /// network, in a run: each is run later, at any moment, or lost.
    pub cut_off: u8,
    /// The stage has stale windows: every ACQUIRE asks for stale results
    /// (`Ask::stale`); set with `terms.stale_for` > 0.
    pub stale_windows: bool,
    /// Early refreshes in a run (an ACQUIRE with `Ask::early` and a new
    /// token, as after a hit the early-refresh draw picked).
    pub early: u8,
    /// The [`Seen`] states this configuration must reach (each a
    /// "sometimes" property; tracked only when asked, as each splits
    /// states).
    pub witness: u8,
    /// The durations.
    pub terms: Terms,
}

impl Config {
    /// 2 nodes, 1 key, 3 grants (3 tokens), every fault once: two calls
    /// cut off, an invalidation, a failover (its clock a tick behind), a
    /// crash, a subscriber reconnect; a lease of one tick, records of two,
    /// work until tick 4; results fresh for a tick, kept for the waiters
    /// for two.
    pub fn small() -> Self {
        Self {
            nodes: 2,
            tokens: 3,
            grants: 3,
            invalidations: 1,
            failovers: 1,
            crashes: 1,
            reconnects: 1,
            clock_steps_back: true,
            horizon: 4,
            cut_off: 2,
            stale_windows: false,
            early: 0,
            witness: 0,
            terms: Terms {
                lease: 1,
                state_ttl: 3,
                takeover: true,
                result_ttl: 1,
                retain: 2,
                stale_for: 0,
                failure_ttl: 1,
                retry_after: 0,
                work_time: 1,
            },
        }
    }

    /// The last tick of a run: the horizon, then long enough for every
    /// lease and record a settled key still has to run out.
    pub fn end(&self) -> Tick {
        self.horizon + self.terms.record_ttl().max(self.terms.state_ttl) + 1
    }
}

/// What a node is doing about the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// No flight.
    Idle,
    /// Its last ACQUIRE's outcome is unknown (cut off).
    Unknown {
        /// That ACQUIRE was the retry with the same token.
        retried: bool,
        /// It was an early refresh.
        early: bool,
    },
    /// Follows a grant, and re-checks naming the generation it first
    /// followed.
    Follower {
        /// The generation of its first FOLLOWER answer.
        follows: Gen,
        /// A re-check was cut off: it may still grant this token a lease
        /// (released when the follower gives up).
        ambiguous: bool,
    },
    /// Owns the flight with this generation, works.
    Owner(Gen),
    /// Its COMMIT (`abandon: None`) or ABANDON (`Some(caches)`) of this
    /// generation was cut off: it may retry.
    Ending {
        /// The generation.
        gen: Gen,
        /// `None`: a commit; `Some(fail)`: an abandon.
        abandon: Option<bool>,
    },
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// The flight's token (`EMPTY`: none).
    pub tok: Tok,
    /// What it does.
    pub role: Role,
    /// Its inbox is in force (subscribed and confirmed).
    pub inbox: bool,
    /// Tokens to release in the background, oldest first: (token,
    /// answered `NOT_OWNER` once).
    pub orphans: Vec<(Tok, bool)>,
}

/// A call on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Req {
    /// The sender.
    pub node: NodeId,
    /// The call.
    pub call: Call,
}

/// Promises a step broke (sticky bits, one per property).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Broken(pub u16);

impl Broken {
    /// Two tokens committed a result for one generation.
    pub const ONE_RESULT: u16 = 1;
    /// A generation was issued that is not larger than every earlier one.
    pub const GENERATIONS: u16 = 1 << 1;
    /// A commit was accepted for a generation that is not the newest one
    /// the server kept, or that was never granted to that token.
    pub const SUPERSEDED: u16 = 1 << 2;
    /// A token whose attempt ended (it committed, abandoned or released)
    /// was granted the flight again while the record that remembers it
    /// lives.
    pub const REGRANTED: u16 = 1 << 3;
    /// A grant ended without a notice to a follower whose inbox was in
    /// force at its ACQUIRE and since.
    pub const NOTICE: u16 = 1 << 4;
    /// A hit replayed something other than the result committed (or the
    /// failure cached) for its generation.
    pub const REPLAY: u16 = 1 << 5;
    /// A follower was told a lease that outlives the record.
    pub const TOLD: u16 = 1 << 6;
    /// A follower's re-check was not answered the result the server keeps
    /// for it (of the generation it followed or a later one, within its
    /// retention, neither invalidated nor lost in a failover).
    pub const WAITED: u16 = 1 << 7;
    /// A new ACQUIRE (not a re-check) got a HIT past the result's TTL.
    pub const FRESH: u16 = 1 << 8;
    /// A result was answered stale past its TTL and stale window, or a
    /// failure was answered stale.
    pub const STALE_AGE: u16 = 1 << 9;
    /// A commit replaced a result of its own generation or a newer one.
    pub const NEWER: u16 = 1 << 10;
    /// A result older than an invalidation the server knows of answered.
    pub const PURGED: u16 = 1 << 11;
    /// An answer's age or TTL is not the result's by the server's clock.
    pub const AGE: u16 = 1 << 12;
    /// An ACQUIRE asking for stale results, while a success is kept past
    /// its freshness within its stale window (and no throttle runs), got
    /// an answer without it.
    pub const STALE_KEPT: u16 = 1 << 13;
    /// An ACQUIRE was granted after its node gave it up (by real time,
    /// not the server's clock), to a token its node no longer waits with:
    /// a lease nobody works on.
    pub const LATE_GRANT: u16 = 1 << 14;
}

/// What the model remembers of a run (not the system's state).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ghost {
    /// Every generation issued, in order, with its token (`EMPTY`: an
    /// invalidation).
    pub issued: Vec<(Gen, Tok)>,
    /// The newest generation the server still knows of (after a failover:
    /// the replica's).
    pub kept: Gen,
    /// Commits accepted: (generation, token, server time).
    pub committed: Vec<(Gen, Tok, Tick)>,
    /// Failures cached: (generation, token, server time).
    pub failed: Vec<(Gen, Tok, Tick)>,
    /// The result the server must keep (its generation and status), and
    /// until when: the last one committed, unless an invalidation dropped
    /// it or a failover lost it (a cached failure goes beside it).
    pub latest: Option<(Gen, Status, Tick)>,
    /// The newest invalidation the server still knows of (0: none).
    pub purged: Gen,
    /// The throttle a failed refresh started, as far as the server keeps
    /// it: (the kept success's generation, until).
    pub throttle: Option<(Gen, Tick)>,
    /// Tokens that committed, abandoned or released since the record was
    /// last lost.
    pub ended: Vec<Tok>,
    /// Nodes told FOLLOWER with their inbox in force since the last end
    /// of a grant.
    pub followers: Vec<NodeId>,
    /// The tick of the last write to the record.
    pub last_write: Tick,
    /// What the run reached, for the "sometimes" properties.
    pub reached: Reached,
    /// Promises broken.
    pub broken: Broken,
    /// Ticks the failovers set the server's clock back, in all: real
    /// time is the server's clock plus these.
    pub set_back: Tick,
}

/// What a run reached, for the "sometimes" properties: only what
/// [`Config::witness`] asks for is kept (the rest would tell otherwise
/// equal states apart).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reached {
    /// [`Seen`] bits.
    pub seen: u8,
    /// Grants answered with a result beside them (refreshes), kept only
    /// for [`Seen::PURGE_FENCED`].
    pub refreshes: Vec<Gen>,
}

/// What a run reached (sticky bits of [`Reached::seen`]).
#[derive(Debug)]
pub struct Seen;

impl Seen {
    /// A re-check got a result kept for the waiters past its freshness.
    pub const KEPT_RECHECK: u8 = 1;
    /// A grant came with the result it refreshes, past its freshness.
    pub const STALE_OWNER: u8 = 1 << 1;
    /// A FOLLOWER answer came with the result being refreshed.
    pub const STALE_FOLLOWER: u8 = 1 << 2;
    /// A STALE answer, in a failed refresh's throttle.
    pub const THROTTLED: u8 = 1 << 3;
    /// An early refresh was granted, the fresh result beside it.
    pub const EARLY: u8 = 1 << 4;
    /// An invalidation fenced a refresh's commit.
    pub const PURGE_FENCED: u8 = 1 << 5;
    /// A late ACQUIRE was granted a lease nobody works on: after a
    /// failover to a clock behind ([`Config::clock_steps_back`]), the
    /// server's clock had not passed the ACQUIRE's not-after when real
    /// time had (see [`Broken::LATE_GRANT`] for the other runs).
    pub const ORPHAN_GRANT: u8 = 1 << 6;
}

/// A state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// The server's clock.
    pub now: Tick,
    /// The primary.
    pub primary: Store,
    /// Its replica.
    pub replica: Store,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Calls on their way (sorted: a multiset).
    pub net: Vec<Req>,
    /// Tokens made so far (the last one's number).
    pub made: u8,
    /// Grants so far.
    pub grants: u8,
    /// Invalidations sent so far.
    pub invalidations: u8,
    /// Failovers so far.
    pub failovers: u8,
    /// Crashes so far.
    pub crashes: u8,
    /// Subscriber reconnects so far.
    pub reconnects: u8,
    /// Calls cut off so far.
    pub cut_off: u8,
    /// Early refreshes so far.
    pub early: u8,
    /// Settled: nobody works on the key any more.
    pub draining: bool,
    /// What the checker remembers.
    pub ghost: Ghost,
}

/// A step of the model. A node's call either runs at once and its
/// answer comes back (`cut: false`), or is cut off (`cut: true`): it
/// goes on its way, to run at any later moment or be lost, and its sender
/// takes the outcome as unknown. (A call that runs while its answer is
/// still on the way is the same to the server as one run at once, and
/// its sender does nothing meanwhile but heartbeat, which the heartbeats
/// cut off cover.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A node ACQUIREs: a new flight with a new token, or the retry of an
    /// ACQUIRE whose outcome is unknown, or a follower's re-check (same
    /// token).
    Acquire(NodeId, bool),
    /// An idle node starts an early refresh: an ACQUIRE with a new token
    /// asking `early`.
    Early(NodeId, bool),
    /// A node gives up its flight; a token that may hold a lease goes to
    /// its orphans.
    GiveUp(NodeId),
    /// An owner heartbeats.
    Heartbeat(NodeId, bool),
    /// An owner commits (or retries its commit).
    Commit(NodeId, bool),
    /// An owner abandons, caching its failure or not (or retries).
    Abandon(NodeId, bool, bool),
    /// A node releases its oldest orphan.
    Release(NodeId, bool),
    /// A node invalidates the key.
    Invalidate(NodeId),
    /// A node crashes and starts again empty.
    Crash(NodeId),
    /// A node's subscriber reconnects: its inbox is out of force.
    Reconnect(NodeId),
    /// A node's inbox is subscribed again, confirmed.
    Subscribe(NodeId),
    /// The server runs a call on its way.
    Run(Req),
    /// A call on its way is lost.
    Lose(Req),
    /// The clock ticks.
    Tick,
    /// The replica copies the primary.
    Replicate,
    /// The replica becomes the primary, its clock `behind` ticks behind.
    Failover {
        /// Ticks the new primary's clock is behind.
        behind: Tick,
    },
    /// Nobody works on the key any more.
    Settle,
}

/// The model: a [`Config`].
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// What is explored.
    pub config: Config,
}

impl ProtocolModel {
    /// The model of `config`.
    pub fn new(config: Config) -> Self {
        Self { config }
    }

    fn can_cut_off(&self, s: &State) -> bool {
        s.cut_off < self.config.cut_off
    }

    /// What a node's ACQUIRE sent at `now` asks besides the lease. Its
    /// not-after is `now`: a call is given up when it is cut off, in the
    /// step that sends it (the model's call timeout is shorter than a
    /// tick), so one that runs in a later tick runs after its node gave it
    /// up.
    fn ask(&self, now: Tick, follows: Option<Gen>, early: bool) -> Ask {
        Ask {
            follows,
            stale: self.config.stale_windows,
            early,
            not_after: Some(now),
        }
    }
}

fn take(s: &mut State, req: &Req) -> bool {
    match s.net.iter().position(|r| r == req) {
        Some(i) => {
            s.net.remove(i);
            true
        }
        None => false,
    }
}

/// The record was lost (expired, or a failover): what it remembered goes
/// with it.
fn record_lost(g: &mut Ghost) {
    g.ended.clear();
    g.followers.clear();
}

fn expire(s: &mut State) {
    let had = s.primary.record.is_some();
    s.primary.expire(s.now);
    s.replica.expire(s.now);
    if had && s.primary.record.is_none() {
        record_lost(&mut s.ghost);
    }
}

/// Whether a fresh ACQUIRE (a token nobody used) would be granted the
/// flight or answered a result now.
pub fn key_free(config: &Config, s: &State) -> bool {
    let mut store = s.primary.clone();
    let probe = config.tokens + 1;
    let ask = Ask {
        stale: config.stale_windows,
        ..Ask::default()
    };
    matches!(
        server::acquire(&mut store, s.now, &config.terms, config.nodes, probe, ask),
        Answer::Owner(..) | Answer::Hit(..) | Answer::Stale(..)
    )
}

/// When the result of `gen` with `status` and `body` was last stored, if
/// it was.
fn stored_at(g: &Ghost, gen: Gen, status: Status, body: Body) -> Option<Tick> {
    let (list, tok) = match (status, body) {
        (Status::Ok, Body::Value(tok)) => (&g.committed, tok),
        (Status::Err, Body::Failure(tok)) => (&g.failed, tok),
        _ => return None,
    };
    // The last time: a failover may have lost an earlier one.
    list.iter()
        .rev()
        .find(|&&(x, t, _)| x == gen && t == tok)
        .map(|&(_, _, at)| at)
}

impl ProtocolModel {
    /// Runs `req` on the primary: the answer and the notices, the ghost's
    /// checks, the sender's reaction.
    fn run(&self, s: &mut State, req: Req) -> (Answer, Vec<Notice>) {
        let terms = &self.config.terms;
        let before = s.primary.clone();
        let ended_before = before
            .record
            .as_ref()
            .is_some_and(|r| r.d.is_some_and(|d| d != 0));
        let (answer, notices) = server::run(&mut s.primary, s.now, terms, req.node, req.call);
        // Only the clock assumption reads it: kept only when it is checked
        // (it would tell otherwise equal states apart).
        if self.config.clock_steps_back && s.primary != before {
            s.ghost.last_write = s.now;
        }
        let now = s.now;
        let g = &mut s.ghost;
        let newest = g.issued.iter().map(|&(gen, _)| gen).max();
        let issue = |g: &mut Ghost, gen: Gen, tok: Tok| -> bool {
            match g.issued.iter().find(|&&(x, _)| x == gen) {
                Some(&(_, t)) => {
                    if t != tok {
                        g.broken.0 |= Broken::ONE_RESULT;
                    }
                    false
                }
                None => {
                    if newest.is_some_and(|n| gen <= n) {
                        g.broken.0 |= Broken::GENERATIONS;
                    }
                    g.issued.push((gen, tok));
                    g.kept = gen;
                    true
                }
            }
        };
        if let Call::Acquire(_, ask) = req.call {
            self.check_answer(g, now, ask, answer);
        }
        let mut grant_ended = false;
        match (req.call, answer) {
            (Call::Acquire(tok, _), Answer::Owner(gen, _, kept)) if issue(g, gen, tok) => {
                s.grants += 1;
                // A grant ends a throttle.
                g.throttle = None;
                if kept.is_some() && self.config.witness & Seen::PURGE_FENCED != 0 {
                    g.reached.refreshes.push(gen);
                }
                if g.ended.contains(&tok) {
                    g.broken.0 |= Broken::REGRANTED;
                }
            }
            (Call::Acquire(_, _), Answer::Follower(_, left, _)) => {
                let exp = s.primary.record.as_ref().and_then(|r| r.exp);
                if left == 0 || exp.is_none_or(|e| e < s.now + left) {
                    g.broken.0 |= Broken::TOLD;
                }
                if s.nodes[usize::from(req.node)].inbox && !g.followers.contains(&req.node) {
                    g.followers.push(req.node);
                    g.followers.sort();
                }
            }
            (Call::Invalidate, Answer::Invalidated(gen)) => {
                issue(g, gen, EMPTY);
                g.latest = None;
                g.throttle = None;
                g.purged = gen;
                grant_ended = true;
            }
            (Call::Commit(tok, gen), Answer::Committed) => {
                if !g.issued.contains(&(gen, tok)) || gen != g.kept {
                    g.broken.0 |= Broken::SUPERSEDED;
                }
                if g.committed.iter().any(|&(x, t, _)| x == gen && t != tok) {
                    g.broken.0 |= Broken::ONE_RESULT;
                }
                // A commit, not the retry of a done one (a commit a failover
                // lost may be made again): what it replaces is older.
                let replaced = before.record.as_ref().and_then(|r| r.s.and(r.rg));
                if replaced != Some(gen) {
                    if replaced.is_some_and(|rg| rg >= gen) {
                        g.broken.0 |= Broken::NEWER;
                    }
                    g.committed.push((gen, tok, now));
                    g.latest = Some((gen, Status::Ok, now + terms.keep()));
                    g.throttle = None;
                }
                if !g.ended.contains(&tok) {
                    g.ended.push(tok);
                }
                grant_ended = ended_before;
            }
            (Call::Commit(_, gen), Answer::Fenced)
                if g.reached.refreshes.contains(&gen) && gen < g.purged =>
            {
                g.reached.seen |= self.config.witness & Seen::PURGE_FENCED;
            }
            (Call::Abandon(tok, gen, fail), Answer::Released) => {
                if fail && terms.retry_after > 0 {
                    let kept = g.latest.and_then(|(lg, status, _)| {
                        if status != Status::Ok {
                            return None;
                        }
                        let at = g.committed.iter().rev().find(|&&(x, _, _)| x == lg)?.2;
                        (now < at + terms.result_ttl + terms.stale_for).then_some(lg)
                    });
                    if let Some(lg) = kept {
                        g.throttle = Some((lg, now + terms.retry_after));
                    }
                }
                if fail && terms.failure_ttl > 0 {
                    g.failed.push((gen, tok, now));
                }
                if !g.ended.contains(&tok) {
                    g.ended.push(tok);
                }
                grant_ended = true;
            }
            (Call::Release(tok), answer) => {
                if !g.ended.contains(&tok) {
                    g.ended.push(tok);
                }
                grant_ended = answer == Answer::Released;
            }
            _ => {}
        }
        if grant_ended {
            for &n in &g.followers {
                if s.nodes[usize::from(n)].inbox && !notices.iter().any(|m| m.node == n) {
                    g.broken.0 |= Broken::NOTICE;
                }
            }
            g.followers.clear();
        }
        (answer, notices)
    }

    /// The promises about what an ACQUIRE answered with `ask` at `now`
    /// carries, checked against what the run stored.
    fn check_answer(&self, g: &mut Ghost, now: Tick, ask: Ask, answer: Answer) {
        if answer == Answer::Late {
            // Nothing answered, nothing changed: its caller gave it up.
            return;
        }
        let terms = &self.config.terms;
        if let Some(res) = answer.result() {
            match stored_at(g, res.gen, res.status, res.body) {
                None => g.broken.0 |= Broken::REPLAY,
                Some(at) => {
                    let (ttl, work) = match res.status {
                        Status::Ok => (terms.result_ttl, terms.work_time),
                        Status::Err => (terms.failure_ttl, 0),
                    };
                    if res.age != now.saturating_sub(at) || res.ttl != ttl || res.work != work {
                        g.broken.0 |= Broken::AGE;
                    }
                    if res.gen < g.purged {
                        g.broken.0 |= Broken::PURGED;
                    }
                    let fresh = now < at + ttl;
                    match answer {
                        Answer::Hit(_) => {
                            if ask.follows.is_none() && !fresh {
                                g.broken.0 |= Broken::FRESH;
                            }
                            if ask.follows.is_some() && !fresh {
                                g.reached.seen |= self.config.witness & Seen::KEPT_RECHECK;
                            }
                        }
                        _ => {
                            let ok = res.status == Status::Ok
                                && if fresh {
                                    ask.early && matches!(answer, Answer::Owner(..))
                                } else {
                                    ask.stale && now < at + ttl + terms.stale_for
                                };
                            if !ok {
                                g.broken.0 |= Broken::STALE_AGE;
                            }
                            g.reached.seen |= self.config.witness
                                & match answer {
                                    Answer::Owner(..) if fresh => Seen::EARLY,
                                    Answer::Owner(..) => Seen::STALE_OWNER,
                                    Answer::Follower(..) => Seen::STALE_FOLLOWER,
                                    _ => Seen::THROTTLED,
                                };
                        }
                    }
                }
            }
        }
        // What the server keeps must answer: the latest result to a
        // waiter of its generation or an older one, within its retention;
        // a success to an ACQUIRE asking for stale results, within its
        // stale window (alone while a throttle runs).
        let Some((lg, status, until)) = g.latest else {
            return;
        };
        let carries = answer.result().is_some_and(|r| r.gen == lg);
        if let Some(f) = ask.follows {
            if lg >= f && now < until {
                if !(carries && matches!(answer, Answer::Hit(_))) {
                    g.broken.0 |= Broken::WAITED;
                }
                return;
            }
        }
        let at = g.committed.iter().rev().find(|&&(x, _, _)| x == lg);
        let (Status::Ok, Some(&(_, _, at))) = (status, at) else {
            return;
        };
        let stale = now >= at + terms.result_ttl && now < at + terms.result_ttl + terms.stale_for;
        if ask.stale && stale {
            let throttled = g.throttle.is_some_and(|(tg, tu)| tg == lg && now < tu);
            let ok = match answer {
                Answer::Stale(_) => carries && throttled,
                Answer::Owner(..) | Answer::Follower(..) => carries && !throttled,
                // An ended or refused token is not answered stale.
                Answer::Expired(_) => !throttled,
                _ => false,
            };
            if !ok {
                g.broken.0 |= Broken::STALE_KEPT;
            }
        }
    }

    /// The sender's reaction to the answer of a call run at once.
    fn answered(&self, s: &mut State, req: Req, answer: Answer) {
        let node = &mut s.nodes[usize::from(req.node)];
        match req.call {
            Call::Acquire(..) => {
                let ambiguous = match node.role {
                    Role::Unknown { .. } => true,
                    Role::Follower { ambiguous, .. } => ambiguous,
                    _ => false,
                };
                node.role = match (answer, node.role) {
                    (Answer::Owner(gen, ..), _) => Role::Owner(gen),
                    (Answer::Follower(..), Role::Follower { follows, .. }) => {
                        Role::Follower { follows, ambiguous }
                    }
                    (Answer::Follower(gen, ..), _) => Role::Follower {
                        follows: gen,
                        ambiguous,
                    },
                    _ => Role::Idle,
                };
                if node.role == Role::Idle {
                    node.tok = EMPTY;
                }
            }
            Call::Commit(..) | Call::Abandon(..) => {
                node.role = Role::Idle;
                node.tok = EMPTY;
            }
            Call::Release(tok) => {
                // Once more after a call's deadline on `NOT_OWNER`: an
                // ACQUIRE that reached the server late, on another
                // connection.
                let (t, confirmed) = node.orphans.remove(0);
                debug_assert_eq!(t, tok);
                if answer == Answer::NotOwner && !confirmed {
                    node.orphans.push((tok, true));
                }
            }
            Call::Heartbeat(..) | Call::Invalidate => {}
        }
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let node = Node {
            tok: EMPTY,
            role: Role::Idle,
            inbox: true,
            orphans: Vec::new(),
        };
        vec![State {
            now: 1,
            primary: Store::default(),
            replica: Store::default(),
            nodes: vec![node; usize::from(self.config.nodes)],
            net: Vec::new(),
            made: 0,
            grants: 0,
            invalidations: 0,
            failovers: 0,
            crashes: 0,
            reconnects: 0,
            cut_off: 0,
            early: 0,
            draining: false,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let c = &self.config;
        let working = !s.draining;
        let cut = self.can_cut_off(s);
        let both = |out: &mut Vec<Action>, f: &dyn Fn(bool) -> Action| {
            out.push(f(false));
            if cut {
                out.push(f(true));
            }
        };
        for (i, node) in s.nodes.iter().enumerate() {
            let n = i as NodeId;
            if working {
                match node.role {
                    Role::Idle if s.made < c.tokens => {
                        both(out, &|st| Action::Acquire(n, st));
                        if s.early < c.early {
                            both(out, &|st| Action::Early(n, st));
                        }
                    }
                    Role::Unknown { retried: false, .. } | Role::Follower { .. } => {
                        both(out, &|st| Action::Acquire(n, st));
                    }
                    Role::Owner(_) => {
                        both(out, &|st| Action::Heartbeat(n, st));
                        both(out, &|st| Action::Commit(n, st));
                        both(out, &|st| Action::Abandon(n, false, st));
                        both(out, &|st| Action::Abandon(n, true, st));
                    }
                    Role::Ending { abandon, .. } => match abandon {
                        None => both(out, &|st| Action::Commit(n, st)),
                        Some(fail) => both(out, &|st| Action::Abandon(n, fail, st)),
                    },
                    _ => {}
                }
                if matches!(
                    node.role,
                    Role::Unknown { .. } | Role::Follower { .. } | Role::Ending { .. }
                ) {
                    out.push(Action::GiveUp(n));
                }
                if s.invalidations < c.invalidations {
                    out.push(Action::Invalidate(n));
                }
                if s.crashes < c.crashes {
                    out.push(Action::Crash(n));
                }
                if node.inbox && s.reconnects < c.reconnects {
                    out.push(Action::Reconnect(n));
                }
                if !node.inbox {
                    out.push(Action::Subscribe(n));
                }
            }
            if !node.orphans.is_empty() && s.now < c.end() {
                both(out, &|st| Action::Release(n, st));
            }
        }
        let mut seen: Vec<Req> = Vec::new();
        for &req in &s.net {
            if !seen.contains(&req) {
                seen.push(req);
                out.push(Action::Run(req));
                out.push(Action::Lose(req));
            }
        }
        if (working && s.now < c.horizon) || (s.draining && s.net.is_empty() && s.now < c.end()) {
            out.push(Action::Tick);
        }
        if working && s.failovers < c.failovers && s.replica != s.primary {
            out.push(Action::Replicate);
        }
        if working && s.failovers < c.failovers {
            out.push(Action::Failover { behind: 0 });
            // Within the assumption: the new clock is not behind the
            // record's last write.
            if c.clock_steps_back && s.now > s.ghost.last_write {
                out.push(Action::Failover { behind: 1 });
            }
        }
        // At the horizon, when the clock stops for the working run (a
        // failover may have moved it past).
        if working && s.now >= c.horizon {
            out.push(Action::Settle);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        self.step(&mut s, action);
        Some(s)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.grants <= self.config.grants
    }

    fn properties(&self) -> Vec<Property<Self>> {
        fn holds(s: &State, bit: u16) -> bool {
            s.ghost.broken.0 & bit == 0
        }
        let mut properties = vec![
            Property::always(
                "at most one committed result per generation",
                |_, s: &State| holds(s, Broken::ONE_RESULT),
            ),
            Property::always("generations strictly increase", |_, s: &State| {
                holds(s, Broken::GENERATIONS)
            }),
            Property::always(
                "no commit by a superseded owner accepted",
                |_, s: &State| holds(s, Broken::SUPERSEDED),
            ),
            Property::always(
                "a token whose attempt ended is not granted again",
                |_, s: &State| holds(s, Broken::REGRANTED),
            ),
            Property::always(
                "followers get a notice when the grant they follow ends",
                |_, s: &State| holds(s, Broken::NOTICE),
            ),
            Property::always(
                "a hit replays its generation's own result",
                |_, s: &State| holds(s, Broken::REPLAY),
            ),
            Property::always(
                "a follower's lease ends within the record's life",
                |_, s: &State| holds(s, Broken::TOLD),
            ),
            Property::always("every record expires", |_, s: &State| {
                s.primary.record.as_ref().is_none_or(|r| r.exp.is_some())
            }),
            Property::eventually(
                "no lease blocks a key nobody works on",
                |m: &Self, s: &State| {
                    s.draining && s.now == m.config.end() && key_free(&m.config, s)
                },
            ),
            Property::sometimes("a commit is accepted", |_, s: &State| {
                !s.ghost.committed.is_empty()
            }),
            Property::sometimes("three grants", |m: &Self, s: &State| {
                s.grants == m.config.grants
            }),
            Property::always("a waiter gets the result kept for it", |_, s: &State| {
                holds(s, Broken::WAITED)
            }),
            Property::always(
                "nothing is replayed to a new acquire past its ttl",
                |_, s: &State| holds(s, Broken::FRESH),
            ),
            Property::always("no stale answer past ttl + stale_for", |_, s: &State| {
                holds(s, Broken::STALE_AGE)
            }),
            Property::always(
                "a superseded refresh never replaces a newer result",
                |_, s: &State| holds(s, Broken::NEWER),
            ),
            Property::always(
                "after an invalidate no older result answers",
                |_, s: &State| holds(s, Broken::PURGED),
            ),
            Property::always(
                "answers carry the result's age and ttl by the server's clock",
                |_, s: &State| holds(s, Broken::AGE),
            ),
            Property::always(
                "a kept success answers stale within its window",
                |_, s: &State| holds(s, Broken::STALE_KEPT),
            ),
            Property::always("no late ACQUIRE is granted", |_, s: &State| {
                holds(s, Broken::LATE_GRANT)
            }),
        ];
        let c = &self.config;
        let mut reach = |bit: u8, name: &'static str, seen: fn(&Self, &State) -> bool| {
            if c.witness & bit != 0 {
                properties.push(Property::sometimes(name, seen));
            }
        };
        reach(
            Seen::KEPT_RECHECK,
            "a re-check gets a result past its ttl",
            |_, s| s.ghost.reached.seen & Seen::KEPT_RECHECK != 0,
        );
        reach(
            Seen::STALE_OWNER,
            "a refresh is granted beside the stale result",
            |_, s| s.ghost.reached.seen & Seen::STALE_OWNER != 0,
        );
        reach(
            Seen::STALE_FOLLOWER,
            "a follower is answered the stale result",
            |_, s| s.ghost.reached.seen & Seen::STALE_FOLLOWER != 0,
        );
        reach(
            Seen::PURGE_FENCED,
            "an invalidation fences a refresh",
            |_, s| s.ghost.reached.seen & Seen::PURGE_FENCED != 0,
        );
        reach(
            Seen::THROTTLED,
            "a failed refresh's throttle answers STALE",
            |_, s| s.ghost.reached.seen & Seen::THROTTLED != 0,
        );
        reach(Seen::EARLY, "an early refresh is granted", |_, s| {
            s.ghost.reached.seen & Seen::EARLY != 0
        });
        // The known limit, reached: if it is ever closed, this fails and
        // docs/guarantees.md's "Known limits" must change with it.
        reach(
            Seen::ORPHAN_GRANT,
            "a late ACQUIRE is granted after a failover to a clock behind (known limit)",
            |_, s| s.ghost.reached.seen & Seen::ORPHAN_GRANT != 0,
        );
        if self.config.failovers > 0 {
            properties.push(Property::sometimes(
                "a failover loses a grant",
                |_, s: &State| s.ghost.issued.iter().any(|&(g, _)| g > s.ghost.kept),
            ));
        }
        properties
    }
}

impl ProtocolModel {
    /// Sends `call` for `node`: run at once and answered, or (`cut`)
    /// left on its way.
    fn call(&self, s: &mut State, node: NodeId, call: Call, cut: bool) -> Option<ServerStep> {
        let req = Req { node, call };
        if cut {
            s.cut_off += 1;
            s.net.push(req);
            s.net.sort();
            return None;
        }
        let (answer, notices) = self.run(s, req);
        self.answered(s, req, answer);
        Some(ServerStep::Run {
            node,
            call,
            answer,
            notices,
        })
    }

    /// Applies `action` to `s`; the server's side of it, if any.
    pub fn step(&self, s: &mut State, action: Action) -> Option<ServerStep> {
        let c = &self.config;
        match action {
            Action::Acquire(n, cut) | Action::Early(n, cut) => {
                let now = s.now;
                let node = &mut s.nodes[usize::from(n)];
                let (ask, role) = match node.role {
                    Role::Idle => {
                        let early = matches!(action, Action::Early(..));
                        s.made += 1;
                        if early {
                            s.early += 1;
                        }
                        node.tok = s.made;
                        let role = Role::Unknown {
                            retried: false,
                            early,
                        };
                        (self.ask(now, None, early), role)
                    }
                    Role::Unknown { early, .. } => {
                        let role = Role::Unknown {
                            retried: true,
                            early,
                        };
                        (self.ask(now, None, early), role)
                    }
                    Role::Follower { follows, .. } => {
                        let role = Role::Follower {
                            follows,
                            ambiguous: true,
                        };
                        (self.ask(now, Some(follows), false), role)
                    }
                    _ => unreachable!("only idle nodes, retries and followers acquire"),
                };
                if cut {
                    node.role = role;
                }
                let tok = node.tok;
                return self.call(s, n, Call::Acquire(tok, ask), cut);
            }
            Action::GiveUp(n) => give_up(s, n),
            Action::Heartbeat(n, cut) => {
                let node = &s.nodes[usize::from(n)];
                let Role::Owner(gen) = node.role else {
                    unreachable!("only owners heartbeat")
                };
                let tok = node.tok;
                return self.call(s, n, Call::Heartbeat(tok, gen), cut);
            }
            Action::Commit(n, cut) | Action::Abandon(n, _, cut) => {
                let node = &mut s.nodes[usize::from(n)];
                let gen = match node.role {
                    Role::Owner(gen) | Role::Ending { gen, .. } => gen,
                    _ => unreachable!("only owners end a grant"),
                };
                let abandon = match action {
                    Action::Abandon(_, fail, _) => Some(fail),
                    _ => None,
                };
                if cut {
                    node.role = Role::Ending { gen, abandon };
                }
                let tok = node.tok;
                let call = match abandon {
                    None => Call::Commit(tok, gen),
                    Some(fail) => Call::Abandon(tok, gen, fail),
                };
                return self.call(s, n, call, cut);
            }
            Action::Release(n, cut) => {
                let node = &mut s.nodes[usize::from(n)];
                let (tok, confirmed) = node.orphans[0];
                if cut {
                    // Unknown: released again later.
                    node.orphans.remove(0);
                    node.orphans.push((tok, confirmed));
                }
                return self.call(s, n, Call::Release(tok), cut);
            }
            Action::Invalidate(n) => {
                s.invalidations += 1;
                return self.call(s, n, Call::Invalidate, false);
            }
            Action::Crash(n) => {
                s.crashes += 1;
                s.nodes[usize::from(n)] = Node {
                    tok: EMPTY,
                    role: Role::Idle,
                    inbox: false,
                    orphans: Vec::new(),
                };
                s.ghost.followers.retain(|&f| f != n);
            }
            Action::Reconnect(n) => {
                s.reconnects += 1;
                s.nodes[usize::from(n)].inbox = false;
                s.ghost.followers.retain(|&f| f != n);
            }
            Action::Subscribe(n) => s.nodes[usize::from(n)].inbox = true,
            Action::Run(req) => {
                take(s, &req);
                // A token that held the live lease already is answered
                // OWNER again (its earlier attempt granted it): a grant is
                // an OWNER answer that issued a generation, as `run`
                // counts it.
                let grants = s.grants;
                let (answer, notices) = self.run(s, req);
                if let (Call::Acquire(tok, ask), Answer::Owner(..), true) =
                    (req.call, answer, s.grants > grants)
                {
                    // Nobody works on a lease granted to a token its node
                    // no longer waits with, after the tick it gave the
                    // call up (in real time: the server's clock plus the
                    // ticks a failover set it back). In the tick it gave
                    // it up the grant is one that ran before its deadline
                    // and whose answer was lost: its node releases it.
                    let node = &s.nodes[usize::from(req.node)];
                    let waits = matches!(node.role, Role::Unknown { .. } | Role::Follower { .. });
                    let late = ask.not_after.is_some_and(|t| s.now + s.ghost.set_back > t);
                    if late && (node.tok != tok || !waits) {
                        if c.clock_steps_back {
                            // docs/guarantees.md, "Known limits".
                            s.ghost.reached.seen |= c.witness & Seen::ORPHAN_GRANT;
                        } else {
                            s.ghost.broken.0 |= Broken::LATE_GRANT;
                        }
                    }
                }
                return Some(ServerStep::Run {
                    node: req.node,
                    call: req.call,
                    answer,
                    notices,
                });
            }
            Action::Lose(req) => {
                take(s, &req);
            }
            Action::Tick => {
                s.now += 1;
                past_due(s);
                expire(s);
                return Some(ServerStep::Tick);
            }
            Action::Replicate => {
                s.replica = s.primary.clone();
                return Some(ServerStep::Replicate);
            }
            Action::Failover { behind } => {
                s.failovers += 1;
                s.primary = s.replica.clone();
                s.now = s.now + 1 - behind;
                s.ghost.set_back += behind;
                let kept = [
                    s.primary.record.as_ref().and_then(|r| r.g),
                    s.primary.inv.map(|(g, _)| g),
                ];
                s.ghost.kept = kept.into_iter().flatten().max().unwrap_or(0);
                if s.ghost.purged > s.ghost.kept {
                    // The invalidation was not copied: an older result
                    // may answer again (the documented failover limit).
                    s.ghost.purged = s.primary.inv.map_or(0, |(g, _)| g);
                }
                // What the server keeps now is what the replica had.
                let rec = s.primary.record.as_ref();
                let res = rec.and_then(|r| Some((r.rg?, r.s?, r.b?, r.ra)));
                s.ghost.latest = res.and_then(|(rg, status, body, _)| {
                    let at = stored_at(&s.ghost, rg, status, body)?;
                    let keep = match status {
                        Status::Ok => c.terms.keep(),
                        Status::Err => c.terms.failure_ttl,
                    };
                    Some((rg, status, at + keep))
                });
                s.ghost.throttle = res
                    .filter(|&(_, status, _, ra)| status == Status::Ok && ra > 0)
                    .map(|(rg, _, _, ra)| (rg, ra));
                record_lost(&mut s.ghost);
                for node in &mut s.nodes {
                    node.inbox = false;
                }
                expire(s);
                return Some(ServerStep::Failover { behind });
            }
            Action::Settle => {
                s.draining = true;
                for n in 0..c.nodes {
                    give_up(s, n);
                }
            }
        }
        None
    }
}

/// The not-afters of the ACQUIREs on their way that the server's clock
/// passed are all alike (the clock never goes back past a tick: they
/// stay past, by it and by real time): one value for them, `now - 1`, so
/// that states differing only there are one.
fn past_due(s: &mut State) {
    let due = s.now.saturating_sub(1);
    let mut changed = false;
    for req in &mut s.net {
        if let Call::Acquire(_, ask) = &mut req.call {
            if ask.not_after.is_some_and(|t| t < due) {
                ask.not_after = Some(due);
                changed = true;
            }
        }
    }
    if changed {
        s.net.sort();
    }
}

/// A node gives up its flight: a token whose ACQUIRE may have granted it
/// a lease it does not know of is released in the background; an owner
/// stops (its lease runs out).
fn give_up(s: &mut State, n: NodeId) {
    let node = &mut s.nodes[usize::from(n)];
    let suspect = matches!(
        node.role,
        Role::Unknown { .. }
            | Role::Follower {
                ambiguous: true,
                ..
            }
    );
    if suspect && !node.orphans.iter().any(|&(t, _)| t == node.tok) {
        node.orphans.push((node.tok, false));
    }
    node.role = Role::Idle;
    node.tok = EMPTY;
}

/// What the server did in a step: what a replay does to a real Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerStep {
    /// Ran a call: its answer and the notices it published.
    Run {
        /// The caller.
        node: NodeId,
        /// The call.
        call: Call,
        /// The answer.
        answer: Answer,
        /// Published, in the order sent.
        notices: Vec<Notice>,
    },
    /// The clock ticked.
    Tick,
    /// The replica copied the primary.
    Replicate,
    /// The replica became the primary, its clock a tick later less
    /// `behind`.
    Failover {
        /// Ticks behind.
        behind: Tick,
    },
}

impl fmt::Display for ServerStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run {
                node,
                call,
                answer,
                notices,
            } => {
                write!(f, "n{node} {call:?} -> {answer:?}")?;
                for m in notices {
                    write!(f, " {m}")?;
                }
                Ok(())
            }
            Self::Tick => f.write_str("tick"),
            Self::Replicate => f.write_str("replicate"),
            Self::Failover { behind } => write!(f, "failover (clock {behind} behind)"),
        }
    }
}

/// The server's steps along `actions` from the initial state.
pub fn server_steps(model: &ProtocolModel, actions: &[Action]) -> Vec<ServerStep> {
    let mut s = model.init_states().remove(0);
    actions
        .iter()
        .filter_map(|&a| model.step(&mut s, a))
        .collect()
}
