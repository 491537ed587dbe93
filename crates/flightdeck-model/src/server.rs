//! The Redis side: a flight's record, its invalidation key, and the six
//! scripts of `flightdeck_redis::scripts`, one function each, line for
//! line.
//!
//! Time is counted in ticks; a lease, a TTL and the server clock are whole
//! ticks. A tick stands for at least a millisecond, so a generation taken
//! from the clock is `now * US_PER_TICK` (the server's `TIME` in µs), and
//! `g + 1` wins only when a flight is granted more than once within one
//! tick, as on a real server within one microsecond.
//!
//! Where the Lua tells two field states apart (absent, empty, `0`), this
//! does too; where it does not (`w` absent or `''`), neither does this.

use std::fmt;

/// A server time, in ticks (starts at 1: a lease deadline `0` means
/// "ended", as in the scripts).
pub type Tick = u8;
/// A generation: `max(g + 1, now * US_PER_TICK)`.
pub type Gen = u16;
/// An owner token; `EMPTY` is the `''` an invalidation leaves in `t`.
pub type Tok = u8;
/// A node (one `RedisBackend`, one inbox).
pub type NodeId = u8;

/// The token an invalidation writes (`t = ''`): never a node's.
pub const EMPTY: Tok = 0;

/// The server's `TIME` in µs per tick. Larger than the generations any
/// explored run takes within one tick (each needs a script, and another
/// one to end the grant before it), which is what the protocol assumes of
/// a microsecond.
pub const US_PER_TICK: Gen = 16;

/// The durations of a run, in ticks (`LeaseTerms`, `CommitArgs`,
/// `AbandonArgs` of the L2 layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Terms {
    /// `LeaseTerms::lease`.
    pub lease: Tick,
    /// `LeaseTerms::state_ttl`.
    pub state_ttl: Tick,
    /// `LeaseTerms::allow_takeover`.
    pub takeover: bool,
    /// `CommitArgs::ttl`: how long a result is fresh (replayed to new
    /// acquires).
    pub result_ttl: Tick,
    /// `CommitArgs::retain`: how long a result is kept for the followers
    /// already waiting (a re-check naming its generation or an older one).
    pub retain: Tick,
    /// `CommitArgs::stale_for`: how long past `result_ttl` a success is
    /// kept to answer an ACQUIRE that asks for stale results (the stage's
    /// longest stale window; 0: none).
    pub stale_for: Tick,
    /// `AbandonArgs::failure_ttl` of an abandon that caches its failure.
    pub failure_ttl: Tick,
    /// `AbandonArgs::retry_after` of a failed attempt's abandon: while a
    /// success is kept to answer stale, nothing is granted to an ACQUIRE
    /// asking for stale results for so long (0: no throttle).
    pub retry_after: Tick,
    /// `CommitArgs::work_time`: how long the work took, carried with the
    /// result for early refreshes.
    pub work_time: Tick,
}

impl Terms {
    /// `LeaseTerms::record_ttl`: two leases, at most `state_ttl`, at least
    /// one lease.
    pub fn record_ttl(&self) -> Tick {
        self.lease
            .saturating_mul(2)
            .min(self.state_ttl)
            .max(self.lease)
    }

    /// How long a commit keeps its result (`ku`, the record's expiry):
    /// the longest of its freshness and stale window and its retention
    /// for waiters, at least a tick (the Lua's 1 ms).
    pub fn keep(&self) -> Tick {
        (self.result_ttl + self.stale_for).max(self.retain).max(1)
    }
}

/// How a result ended: `s` of a stored result, `ok`; a failure an
/// abandon cached (`eg`, `eb`: beside the stored result) answers `err`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// `ok`: committed.
    Ok,
    /// `err`: a failure cached by an abandon.
    Err,
}

/// A stored body (`b`): the value the owner with this token computed, or
/// the failure it cached. What the replay sends as the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// The result of the attempt with this token.
    Value(Tok),
    /// The failure of the attempt with this token.
    Failure(Tok),
}

/// The record `{prefix}:{h}:f5` (see `flightdeck_redis::scripts`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    /// `g`.
    pub g: Option<Gen>,
    /// `t` ([`EMPTY`] after an invalidation).
    pub t: Option<Tok>,
    /// `d`: the lease deadline; `Some(0)` once the grant ended.
    pub d: Option<Tick>,
    /// `s`: `ok` once a commit stored a result (kept through later
    /// grants until a commit replaces it or an invalidation drops it).
    pub s: Option<Status>,
    /// `b`.
    pub b: Option<Body>,
    /// `rg`: the generation that stored the result.
    pub rg: Option<Gen>,
    /// `ct`: when the result was stored.
    pub ct: Tick,
    /// `fu`: the result is fresh until then.
    pub fu: Tick,
    /// `su`: a success is answered stale (to an ACQUIRE asking for it)
    /// until then.
    pub su: Tick,
    /// `ku`: the result is kept (for the waiters, and the record lives)
    /// until then; 0 with no result.
    pub ku: Tick,
    /// `wt`: the result's work time.
    pub wt: Tick,
    /// `ra`: a failed refresh's throttle ends then (absent and `0` alike:
    /// none).
    pub ra: Tick,
    /// `eg`, `eb`: a failure cached by an abandon (its generation and
    /// body), beside the stored result, which it never replaces.
    pub failure: Option<(Gen, Body)>,
    /// `ec`: when the failure was cached.
    pub ec: Tick,
    /// `eu`: the failure is replayed until then (absent and `0` alike:
    /// none).
    pub eu: Tick,
    /// `x`, newest first (never more than [`RELEASED_KEPT`]): tokens
    /// released, or whose attempt ended here (committed, abandoned,
    /// released).
    pub x: Vec<Tok>,
    /// `w`, in the order added (absent and `''` alike: empty).
    pub w: Vec<NodeId>,
    /// The key's expiry: present while `now < exp`; `None`: no expiry.
    pub exp: Option<Tick>,
}

/// How many released tokens `x` keeps.
pub const RELEASED_KEPT: usize = 8;

/// What the server holds of one flight.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Store {
    /// The record, while it lives.
    pub record: Option<Record>,
    /// `{prefix}:{h}:f5:i`: the last invalidation's generation and the
    /// key's expiry.
    pub inv: Option<(Gen, Tick)>,
}

impl Store {
    /// Drops what expired by `now` (Redis: a key is gone once its
    /// deadline passed, whether or not it was deleted yet).
    pub fn expire(&mut self, now: Tick) {
        if self
            .record
            .as_ref()
            .and_then(|r| r.exp)
            .is_some_and(|e| e <= now)
        {
            self.record = None;
        }
        if self.inv.is_some_and(|(_, e)| e <= now) {
            self.inv = None;
        }
    }
}

/// What an ACQUIRE asks besides the lease (`Ask` of the L2 layer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ask {
    /// A follower's re-check: the generation it first followed (`None`:
    /// an acquire, or the retry of one).
    pub follows: Option<Gen>,
    /// The stage has stale windows: a success kept past its freshness
    /// goes beside the answer.
    pub stale: bool,
    /// An early refresh: granted although the result is still fresh.
    pub early: bool,
    /// When its node gives the call up, in the server's ticks (`None`:
    /// never): run after it, the ACQUIRE answers `LATE` and changes
    /// nothing.
    pub not_after: Option<Tick>,
}

/// A script call, as a node sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// `ACQUIRE(tok, lease, takeover, record_ttl, inbox, follows, stale,
    /// early, not_after)`; the inbox is the sending node's.
    Acquire(Tok, Ask),
    /// `HEARTBEAT(tok, gen, lease, record_ttl)`.
    Heartbeat(Tok, Gen),
    /// `COMMIT(tok, gen, value(tok), result_ttl, inline=1, retain,
    /// stale_for, work_time)`.
    Commit(Tok, Gen),
    /// `ABANDON(tok, gen, failure, failure_ttl, retry_after)`; `true`:
    /// the work failed (its failure cached when `failure_ttl` > 0, a
    /// throttle for `retry_after`), `false`: no failure, no throttle.
    Abandon(Tok, Gen, bool),
    /// `RELEASE(tok, state_ttl)`.
    Release(Tok),
    /// `INVALIDATE(state_ttl)`.
    Invalidate,
}

/// A stored result as an answer carries it (`StoredResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Res {
    /// The generation that stored it (`rg`).
    pub gen: Gen,
    /// `s`.
    pub status: Status,
    /// `b`.
    pub body: Body,
    /// Its age by the server's clock (`now - ct`, never below 0).
    pub age: Tick,
    /// How long it was fresh (`fu - ct`).
    pub ttl: Tick,
    /// Its work time (`wt`).
    pub work: Tick,
}

/// A script's answer, as the client parses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// `{HIT, <result>}`.
    Hit(Res),
    /// `{OWNER, gen, takeover[, <result>]}`: with the result kept past
    /// its freshness (asked `stale`) or still fresh (asked `early`).
    Owner(Gen, bool, Option<Res>),
    /// `{FOLLOWER, gen, remaining[, <result>]}` (remaining: ticks,
    /// rounded up), with the result kept past its freshness (asked
    /// `stale`).
    Follower(Gen, Tick, Option<Res>),
    /// `{STALE, <result>}`: a failed refresh's throttle runs.
    Stale(Res),
    /// `{EXPIRED, gen}` (0 when the record has none).
    Expired(Gen),
    /// `{LATE}`: run past its not-after, nothing changed.
    Late,
    /// `RENEWED`.
    Renewed,
    /// `LOST`.
    Lost,
    /// `COMMITTED`.
    Committed,
    /// `FENCED`.
    Fenced,
    /// `RELEASED` (abandon, release).
    Released,
    /// `NOT_OWNER` (abandon, release).
    NotOwner,
    /// INVALIDATE's new generation.
    Invalidated(Gen),
}

impl Answer {
    /// The stored result the answer carries, if any.
    pub fn result(&self) -> Option<Res> {
        match *self {
            Self::Hit(r) | Self::Stale(r) => Some(r),
            Self::Owner(_, _, r) | Self::Follower(_, _, r) => r,
            _ => None,
        }
    }
}

/// A message published to a node's inbox: `<record>|<gen>|c<work_ms>,<age_ms>|<payload>`
/// (`Some`: inline, which the model always asks for; the work's time and
/// the result's age are not modelled) or `<record>|<gen>|a` (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Notice {
    /// The inbox's node.
    pub node: NodeId,
    /// The generation named.
    pub gen: Gen,
    /// The committed body (inline), or `None` for "abandoned".
    pub body: Option<Body>,
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.body {
            Some(b) => write!(f, "n{}<-{}|c|{b:?}", self.node, self.gen),
            None => write!(f, "n{}<-{}|a", self.node, self.gen),
        }
    }
}

/// Puts `tok` first in `x`, newest first, at most [`RELEASED_KEPT`].
fn remember(rec: &mut Record, tok: Tok) {
    let mut x = vec![tok];
    for &t in &rec.x {
        if x.len() >= RELEASED_KEPT {
            break;
        }
        if t != tok {
            x.push(t);
        }
    }
    rec.x = x;
}

/// `max(g + 1, now in µs)`: the generation a grant or an invalidation takes.
fn next_gen(g: Option<Gen>, now: Tick) -> Gen {
    let now_us = Gen::from(now) * US_PER_TICK;
    match g {
        Some(g) if g >= now_us => g + 1,
        _ => now_us,
    }
}

fn publish(w: &[NodeId], gen: Gen, body: Option<Body>) -> Vec<Notice> {
    w.iter().map(|&node| Notice { node, gen, body }).collect()
}

/// Runs one script on `store` at `now` for `node`: its answer and the
/// messages it published. `store` must have been [expired](Store::expire)
/// at `now`.
pub fn run(
    store: &mut Store,
    now: Tick,
    terms: &Terms,
    node: NodeId,
    call: Call,
) -> (Answer, Vec<Notice>) {
    match call {
        Call::Acquire(tok, ask) => (acquire(store, now, terms, node, tok, ask), Vec::new()),
        Call::Heartbeat(tok, gen) => (heartbeat(store, now, terms, tok, gen), Vec::new()),
        Call::Commit(tok, gen) => commit(store, now, terms, tok, gen),
        Call::Abandon(tok, gen, fail) => abandon(store, now, terms, tok, gen, fail),
        Call::Release(tok) => release(store, now, terms, tok),
        Call::Invalidate => invalidate(store, now, terms),
    }
}

/// The record's expiry from a grant or a heartbeat at `now`: the record
/// TTL, never before the stored result's `ku` or the cached failure's
/// `eu`.
fn grant_expiry(rec: &Record, now: Tick, terms: &Terms) -> Tick {
    (now + terms.record_ttl()).max(rec.ku).max(rec.eu)
}

/// ACQUIRE.
pub fn acquire(
    store: &mut Store,
    now: Tick,
    terms: &Terms,
    node: NodeId,
    tok: Tok,
    ask: Ask,
) -> Answer {
    let r = store.record.clone().unwrap_or_default();
    let d = r.d.unwrap_or(0);
    let g = r.g.unwrap_or(0);
    let live = d > now;
    let mine = r.t == Some(tok);
    // The token that holds the live lease is answered OWNER whatever else
    // the record says: an earlier attempt of its ACQUIRE was applied.
    let held = live && mine;
    if ask.not_after.is_some_and(|t| now > t) && !held {
        return Answer::Late;
    }
    let mut beside = None;
    if let Some(s) = r.s {
        let res = Res {
            // The model never stores a status without `rg` and `b`.
            gen: r.rg.unwrap_or(0),
            status: s,
            body: r.b.unwrap_or(Body::Value(EMPTY)),
            age: now.saturating_sub(r.ct),
            ttl: r.fu - r.ct,
            work: r.wt,
        };
        if now < r.fu || (ask.follows.is_some_and(|f| f <= res.gen) && now < r.ku) {
            if !ask.early
                || ask.follows.is_some()
                || now >= r.fu
                || s != Status::Ok
                || now < r.ra
                || now < r.eu
                || (live && !mine)
            {
                return Answer::Hit(res);
            }
            beside = Some(res);
        } else if ask.stale && s == Status::Ok && now < r.su {
            beside = Some(res);
        }
    }
    if let (true, None, Some((gen, body))) = (now < r.eu && !held, beside, r.failure) {
        return Answer::Hit(Res {
            gen,
            status: Status::Err,
            body,
            age: now.saturating_sub(r.ec),
            ttl: r.eu - r.ec,
            work: 0,
        });
    }
    if let (true, Some(res)) = (now < r.ra && !held, beside) {
        return Answer::Stale(res);
    }
    let mut takeover = false;
    if mine {
        if live {
            return Answer::Owner(g, false, beside);
        }
        if d == 0 {
            return Answer::Expired(g);
        }
    } else if live {
        let rec = store.record.as_mut().expect("a live lease has a record");
        if !rec.w.contains(&node) {
            rec.w.push(node);
        }
        return Answer::Follower(g, d - now, beside);
    }
    if d > 0 {
        if !terms.takeover {
            return Answer::Expired(g);
        }
        takeover = true;
    }
    if r.x.contains(&tok) {
        return Answer::Expired(g);
    }
    let gen = next_gen(r.g, now);
    let rec = store.record.get_or_insert_with(Record::default);
    rec.g = Some(gen);
    rec.t = Some(tok);
    rec.d = Some(now + terms.lease);
    rec.ra = 0;
    rec.exp = Some(grant_expiry(rec, now, terms));
    Answer::Owner(gen, takeover, beside)
}

/// HEARTBEAT.
pub fn heartbeat(store: &mut Store, now: Tick, terms: &Terms, tok: Tok, gen: Gen) -> Answer {
    let Some(rec) = store.record.as_mut() else {
        return Answer::Lost;
    };
    if rec.t != Some(tok) || rec.g != Some(gen) {
        return Answer::Lost;
    }
    let d = rec.d.unwrap_or(0);
    if d == 0 || d <= now {
        return Answer::Lost;
    }
    rec.d = Some(now + terms.lease);
    rec.exp = Some(grant_expiry(rec, now, terms));
    Answer::Renewed
}

/// COMMIT (the payload always inline).
pub fn commit(
    store: &mut Store,
    now: Tick,
    terms: &Terms,
    tok: Tok,
    gen: Gen,
) -> (Answer, Vec<Notice>) {
    let Some(rec) = store.record.as_mut() else {
        return (Answer::Fenced, Vec::new());
    };
    if rec.t != Some(tok) || rec.g != Some(gen) {
        return (Answer::Fenced, Vec::new());
    }
    if let (Some(s), true) = (rec.s, rec.rg == Some(gen)) {
        let answer = if s == Status::Ok {
            Answer::Committed
        } else {
            Answer::Fenced
        };
        return (answer, Vec::new());
    }
    if rec.d.unwrap_or(0) == 0 {
        return (Answer::Fenced, Vec::new());
    }
    let w = std::mem::take(&mut rec.w);
    rec.d = Some(0);
    rec.s = Some(Status::Ok);
    rec.b = Some(Body::Value(tok));
    rec.rg = Some(gen);
    rec.ct = now;
    rec.fu = now + terms.result_ttl;
    rec.su = rec.fu + terms.stale_for;
    rec.ku = now + terms.keep();
    rec.wt = terms.work_time;
    // `eu = 0`: the failure no longer answers (`eg`, `ec` stay in Redis,
    // unread; cleared here so that equal records are one state). `ra`
    // stays: a grant, always between an abandon and a commit, ended it.
    rec.failure = None;
    rec.ec = 0;
    rec.eu = 0;
    rec.exp = Some(now + terms.keep());
    remember(rec, tok);
    (Answer::Committed, publish(&w, gen, Some(Body::Value(tok))))
}

/// ABANDON.
pub fn abandon(
    store: &mut Store,
    now: Tick,
    terms: &Terms,
    tok: Tok,
    gen: Gen,
    fail: bool,
) -> (Answer, Vec<Notice>) {
    let Some(rec) = store.record.as_mut() else {
        return (Answer::NotOwner, Vec::new());
    };
    if rec.t != Some(tok) || rec.g != Some(gen) || rec.d.unwrap_or(0) == 0 {
        return (Answer::NotOwner, Vec::new());
    }
    let w = std::mem::take(&mut rec.w);
    rec.d = Some(0);
    remember(rec, tok);
    if fail && terms.retry_after > 0 && rec.s == Some(Status::Ok) && now < rec.su {
        rec.ra = now + terms.retry_after;
    }
    if fail && terms.failure_ttl > 0 {
        rec.failure = Some((gen, Body::Failure(tok)));
        rec.ec = now;
        rec.eu = now + terms.failure_ttl;
        // Never shortens the stored result's life.
        rec.exp = Some(rec.eu.max(rec.ku));
    }
    (Answer::Released, publish(&w, gen, None))
}

/// RELEASE.
pub fn release(store: &mut Store, now: Tick, terms: &Terms, tok: Tok) -> (Answer, Vec<Notice>) {
    if let Some(rec) = store.record.as_mut() {
        if rec.t == Some(tok) && rec.d.is_some_and(|d| d != 0) {
            let w = std::mem::take(&mut rec.w);
            rec.d = Some(0);
            remember(rec, tok);
            // `r[3]` may be nil only for a record our scripts did not write.
            return (Answer::Released, publish(&w, rec.g.unwrap_or(0), None));
        }
    }
    let had = store
        .record
        .as_ref()
        .is_some_and(|r| r.t.is_some() || r.g.is_some() || !r.x.is_empty());
    let rec = store.record.get_or_insert_with(Record::default);
    remember(rec, tok);
    if !had {
        rec.exp = Some(now + terms.state_ttl);
    }
    (Answer::NotOwner, Vec::new())
}

/// INVALIDATE.
pub fn invalidate(store: &mut Store, now: Tick, terms: &Terms) -> (Answer, Vec<Notice>) {
    let (g, w) = match &store.record {
        Some(r) => (r.g, r.w.clone()),
        None => (None, Vec::new()),
    };
    let gen = next_gen(g, now);
    let rec = store.record.get_or_insert_with(Record::default);
    rec.g = Some(gen);
    rec.t = Some(EMPTY);
    rec.d = Some(0);
    rec.s = None;
    rec.b = None;
    rec.rg = None;
    rec.ct = 0;
    rec.fu = 0;
    rec.su = 0;
    rec.ku = 0;
    rec.wt = 0;
    rec.ra = 0;
    rec.failure = None;
    rec.ec = 0;
    rec.eu = 0;
    rec.w.clear();
    rec.exp = Some(now + terms.state_ttl);
    store.inv = Some((gen, now + terms.state_ttl));
    (Answer::Invalidated(gen), publish(&w, gen, None))
}
