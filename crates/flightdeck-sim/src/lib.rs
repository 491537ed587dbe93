//! Deterministic simulation of flightdeck: the real facade, L1 and L2 code
//! of 2–4 nodes × 4–32 callers (in 1–4 bursts) × 1–4 keys, over one simulated backend, on
//! paused tokio time, every choice drawn from one seed. A failing seed
//! prints its schedule and trace, and replays byte for byte
//! (`SIM_SEED=… scripts/simulate 1`).
//!
//! Not published: a test harness of the workspace (`cargo test -p
//! flightdeck-sim` runs a fixed set of seeds, `scripts/simulate N` runs
//! N more in a release build).
//!
//! # The world
//!
//! - **Nodes.** Each node is a [`GenericSingleFlightLayer::http`] layer of one
//!   stage (`sim`), with its own L1, breaker, bulkhead and budgets, over
//!   its own `SimBackend` (module `world`) handle of the shared backend. A caller
//!   sends an HTTP request with its key (a `FlightKey` extension), its id,
//!   and its own deadline (`x-request-timeout`).
//! - **The backend** is the memory backend of `flightdeck-distributed`
//!   (kept in step with the Redis scripts by the conformance suite),
//!   behind a decorator that applies every command in a task of its own,
//!   as a server would: a command the caller gave up on may still be
//!   applied, late.
//! - **Time** is tokio's paused clock on a current-thread runtime: timers
//!   fire in order, and the clock jumps to the next one when every task
//!   waits. Nothing reads the wall clock.
//! - **Randomness** comes from the seed only. The schedule and every fault
//!   are drawn from one `StdRng`; the library's own draws (owner tokens,
//!   poll and breaker jitter) go through `flightdeck_core::random`, which
//!   the run seeds for its thread (`flightdeck_core::random::seed_this_thread`),
//!   and its `select!`s are `biased` (tokio picks a ready branch at random
//!   otherwise). The simulation's own code keeps an order wherever tokio
//!   or a hash map would not (a thaw wakes the queued commands in the
//!   order they came, not through a `watch` channel, whose waiters wake
//!   in a random order). The replay test runs seeds twice and compares
//!   their traces line by line; 400 seeds traced twice, in two
//!   processes, gave the same 40,000 lines.
//!
//! # What it found
//!
//! Defects, each fixed with its seed as a regression test
//! (`tests/seeds.rs`): a waiter's own run past its deadline (seed 34), a
//! `Set-Cookie` response handed to a waiter (111), a panic in a waiter's
//! own run reaching its caller (562), a token whose ACQUIRE could still
//! run left unreleased (491); with the stale windows on, a hit-for-pass
//! caller's run alone past its deadline (1017654) and its panic reaching
//! the caller (1008810), and a soft timeout answering the copy it had
//! looked up though a later result had replaced it since (1006980; the
//! fix that keeps a purged copy from answering covers it), and a
//! purge whose store was slow to apply it letting a flight keep the old
//! result read there meanwhile (3031915). And two limits, both closed
//! since: a late ACQUIRE (queued on a frozen server, or resent) was
//! granted once the record that knew its token was gone, leaving a lease
//! nobody worked on for one lease; each ACQUIRE now carries its call's
//! deadline as its not-after and the store refuses it from then on (seed
//! 38; the report's `late grants`, seeds 1000000–1002999: 1,727 before,
//! 6 after, each of a caller that left before its call's deadline, the
//! lease released in the background, as docs/guarantees.md says); and a
//! result read back from the store was as old, in a node's copy, as its
//! arrival, even on the node whose work produced it (2001736; that node
//! now dates it from its work's end). Seeds 7011144, 7017003 and 7031719
//! found a node's copy of a local-fallback run dated from its flight's
//! start (the failed store call included), so the store's older result
//! answered in its place; the copy is now dated by its end. Seed 7051418
//! found an early refresh across nodes asking the store from a task the
//! stage's `idle` did not wait for: a lease it was granted, its answer
//! lost, was still held when the node was idle. Seed 9021986 found a
//! follower's run in the local fallback kept from its flight's start, so
//! the owner's older-started result on the same node stayed the copy;
//! both are now kept from their work's start. Seeds 9023623, 9032838,
//! 9052612 and 9056798 found a node's copy expired while the store's
//! result of older work, which ended later, could still answer stale in
//! its place, and 9044177 a failover bringing back a result a purge had
//! removed: a copy that goes, and a purge, now leave a floor that keeps
//! older work from answering. Seeds 9036686, 3026286 and 3018727 found a
//! caller told how another run of its key, beside its own on the same
//! node (after a purge, or a waiter's own run), was answered (stale);
//! each run now notes its answer under its leader's arrival. Seeds
//! 9022866 and 9041767 found a result a follower received ordered by its
//! flight's start on this node, not by its work's, which began earlier on
//! another node; the commit notice now carries the work's time. Seeds
//! 1046349, 7028086 and 3050253 found a commit held up on its way by a
//! frozen store dated from its arrival, so the store's result looked
//! younger by the hold-up and answered in place of a newer one; a commit
//! now says when it was sent, and the store dates it from then (seed
//! 8178885: from its work's end, whichever attempt lands; a retry's own
//! time made its work look as if it had begun later). Seeds
//! 3003319, 32937, 105192 and 2006125 found the store's kept result, given
//! stale in place of an older copy, not kept, so that the copy answered after
//! it (once callers past freshness stopped waiting for their node's
//! flight); it is now kept as the copy. Seed 10224 found a follower's
//! kept result standing by answered at the soft timeout after its node's
//! own refresh had committed and given a newer one; it now yields to a
//! newer copy. Seeds 7112008 and 7116734 found an owner whose commit (or
//! abandon) failed on every try give up with its lease still renewed by
//! the heartbeats it sent while it tried: its node was idle with a lease
//! nobody worked on; the settling now waits for the last renewal to run
//! out (seed 5175895: or the last heartbeat whose answer was lost). Seeds
//! 3123145 and 3211498 found a node switched to local-only while the
//! store had granted its flight a refresh start a refresh of its own
//! beside it; a granted refresh now marks the node's copy while it runs.
//! Seed 9137408 found a refresh whose work outlived L1's wait timeout
//! drop its claim while the work went on, so a second refresh ran beside
//! it; the work now holds the claim itself, until it ends. Seed
//! 5158570 found a node's follower given another node's newer result
//! that a purge here kept from becoming the copy: the node's older copy
//! then answered stale after it; a result given but not kept now retires
//! an older copy. Seeds 5416816 and 5459434 found a node that could not
//! give the store's throttled result (past its windows, older than a
//! result it gave) run its caller's work beside the throttle; it now
//! answers the throttled failure and runs nothing. Seeds 4106302 and
//! 4113215 found an ACQUIRE granted beside a stale result whose reply was
//! lost: sent again after that result's stale window ended, it was
//! answered the cached failure of the refresh before, and the node went
//! idle while its token held the lease; the holder of the live lease is
//! now answered OWNER on every retry. Seeds 0–159999, 1000000–1059999,
//! 2000000–2059999, 3000000–3059999, 3100000–3399999, 5000000–5059999,
//! 5100000–5699999, 7000000–7299999, 8000000–8299999, 9000000–9059999
//! and 9100000–9399999 passed before that last fix; on the build of its
//! first version (which also put the holder before a fresh result), seeds
//! 0–99999, 1000000–1099999, 3100000–3199999, 4000000–4299999,
//! 5100000–5199999, 5400000–5499999, 7000000–7099999, 8000000–8099999,
//! 9100000–9199999 and 10000000–12299999 (300,000 of each million) pass.
//!
//! # The fault model
//!
//! Drawn per run (a run is "calm" with probability 0.15: no faults at
//! all), then per event:
//!
//! | fault | how |
//! |---|---|
//! | a reply delayed | the command reaches the backend 1–400 ms late |
//! | a command refused | an *unavailable* error at once, nothing applied |
//! | lost before it applied | never applied; the caller hears nothing (its call timeout cuts it) or an *outcome unknown* error |
//! | lost after it applied | applied, the answer lost the same two ways |
//! | duplicated | applied, its reply lost with the connection, sent again and applied again up to 600 ms later; the caller hears the second answer (a client that resends what got no reply; TCP never delivers a command twice otherwise) |
//! | the backend frozen and thawed | every command waits 50 ms – 3 s, then the queue runs (late, after the callers gave up) |
//! | a record expiring | the key's record dropped now ([`MemoryBackend::expire`]) |
//! | a failover | the backend goes back to its last replication ([`MemoryBackend::snapshot`] / [`MemoryBackend::restore`]): the writes since are lost; generations keep increasing (Redis's server clock) |
//! | notices dropped | pub/sub loses every notice for 100 ms – 2 s: followers must poll |
//! | a node crash | the node's callers vanish, its work and its commands never end or arrive; it restarts empty (a new layer) 10 ms – 3 s later |
//! | a caller leaving | it drops its future 0–1.5 s after sending; and each caller has its own deadline (100 ms – 5 s) |
//! | the work | fails, panics, hangs past the execution timeout, or answers with `Set-Cookie` (never shared) |
//! | a mode switch | `StageHandle::set_mode` to any of the four modes, on one node |
//! | a purge | `StageHandle::invalidate` of one key on one node (runs with stale windows) |
//! | the work's outage | every execution fails for 100 ms – 2.5 s, up to twice (runs with stale windows) |
//!
//! The stage's settings (lease, heartbeat, wait, poll, result and failure
//! TTLs, execution and coordination timeouts, `on-wait-failure`, takeover)
//! are drawn per run too. Half the runs turn the stale windows on
//! (`replay-ttl` with some of `stale-while-revalidate`,
//! `stale-if-error` with `stale-retry-after`, `soft-timeout`,
//! `early-refresh`, `hit-for-pass`), half of those on LOCAL_ONLY stages
//! (where every window answers; a distributed stage's copy answers only
//! while its store is degraded).
//!
//! # The invariants (docs/guarantees.md), checked after every run
//!
//! On the server side, as the decorator applies each command (so in the
//! order the backend ran them):
//!
//! - at most one committed result per (key, generation);
//! - generations strictly increase per key (a generation granted twice,
//!   or after a larger one, is a violation);
//! - no commit by a superseded owner is accepted: a commit of generation
//!   g is refused once a later generation was granted (and not lost in a
//!   failover, which the guarantees except).
//!
//! On the callers' side:
//!
//! - every caller ends by its own deadline (within the millisecond a timer
//!   takes), with a response for its own key or a typed error (one of
//!   flightdeck's errors, or the work's own);
//! - no response is shared against the sharing rules: a response with
//!   `Set-Cookie` reaches only the caller whose request ran it.
//!
//! Each value a caller gets (its body names the execution that made it,
//! `exec=N`, numbered in the order they started) is checked when it
//! comes:
//!
//! - a stale answer's age (its `Stale` marker's, and by the simulation's
//!   clock from the end of the execution when it ran on that node) is at
//!   most the freshness plus its reason's window;
//! - a stale answer (in LOCAL_ONLY) is never of an execution older than
//!   one whose value a caller on that node already got for that key;
//! - a caller sent after a purge returned `Ok` on its node never gets the
//!   value of an execution that started before the purge (unless a
//!   failover since brought the store's result back);
//! - at most one refresh runs per key per node at a time (LOCAL_ONLY),
//!   but for one a purge passed by: a refresh is the run of a request
//!   whose caller the copy had answered already.
//!
//! Every execution is attributed to a documented cause and counted: the
//! first grant of a key; a later grant by what ended the one before (its
//! lease ran out: a takeover; abandoned or released: never committed; the
//! result expired; a failover or an expiry lost it); a run outside L2 by
//! its path (`fallback` needs a fault in the schedule, or
//! `on-wait-failure = local` when counted as a failed wait, `local` a switch to
//! LOCAL_ONLY or an unshareable response, `bypass` a switch to BYPASS).
//! Runs with a fencing token must match `path="owner"`, the others the
//! other paths, one for one; a grant never executes twice. A grant after
//! a purge (INVALIDATE) has the purge as its cause, and the refreshes are
//! a cause of their own, all counted in `singleflight_refresh_total`.
//!
//! At quiescence (faults healed, every live node idle): no flight running
//! and no bulkhead permit held on a live node, no lease held by a live
//! node's token, no subscription left; a minute later (the dead nodes'
//! leftovers timed out) `singleflight_active_flights` is back to zero.
//!
//! # Adding a fault
//!
//! 1. Add a variant to `scenario::Event` (a scheduled fault) or to
//!    `world::CallFault` (one command's fault), and draw it in
//!    `Scenario::draw` or `SimBackend::draw`. Draw only from the run's
//!    generator, and only in a fixed order: a new draw changes every later
//!    one, so seeds found before no longer replay the same schedule (keep
//!    their regression tests by what they check, not by their trace).
//! 2. Play it in `sim::simulate` (an event) or `SimBackend::call` (a
//!    command), logging what it does with `State::log`: the trace is the
//!    replay's evidence.
//! 3. If the backend needs a hook to show it, add it to the memory
//!    backend's test API and document it there.
//! 4. If it is a new reason for the work to run again, add it to
//!    docs/guarantees.md and to the attribution (`World::granted`,
//!    `sim::attribute`).
//!
//! [`GenericSingleFlightLayer::http`]: flightdeck::GenericSingleFlightLayer::http
//! [`MemoryBackend::expire`]: flightdeck_test::memory::MemoryBackend::expire
//! [`MemoryBackend::snapshot`]: flightdeck_test::memory::MemoryBackend::snapshot
//! [`MemoryBackend::restore`]: flightdeck_test::memory::MemoryBackend::restore

mod node;
mod scenario;
mod sim;
mod world;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Once;

/// What one run found.
#[derive(Debug)]
pub struct Report {
    /// The run's seed.
    pub seed: u64,
    /// The schedule drawn from the seed.
    pub schedule: String,
    /// Everything that happened, one line per event, with virtual times.
    pub trace: Vec<String>,
    /// The invariants broken (empty: the run passed).
    pub violations: Vec<String>,
    /// Executions by cause.
    pub causes: BTreeMap<String, u64>,
    /// Call faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// What the run's checks saw of answering anyway (stale answers,
    /// purges that returned `Ok`, refresh executions), and the leases
    /// granted late to a token its node had given up on.
    pub exercised: BTreeMap<&'static str, u64>,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "=== seed {} ===", self.seed)?;
        write!(f, "{}", self.schedule)?;
        writeln!(f, "--- trace ---")?;
        for line in &self.trace {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "--- violations ---")?;
        for v in &self.violations {
            writeln!(f, "{v}")?;
        }
        writeln!(
            f,
            "replay: SIM_SEED={} scripts/simulate 1 (or cargo test -p flightdeck-sim)",
            self.seed
        )
    }
}

/// Keeps the work's injected panics off stderr (other panics print as
/// usual).
fn quiet_injected_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if msg != Some(node::PANIC) {
                previous(info);
            }
        }));
    });
}

/// Runs the simulation of `seed` on this thread and checks its invariants.
pub fn run(seed: u64) -> Report {
    quiet_injected_panics();
    let (scenario, rng) = scenario::Scenario::draw(seed);
    let schedule = scenario.to_string();
    flightdeck_core::random::seed_this_thread(Some(seed.rotate_left(17) ^ 0x5eed_f11e));
    let kept = flightdeck_test::recorded::Recorded::new();
    let found = {
        let _recorder = metrics::set_default_local_recorder(&kept);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime");
        let world = rt.block_on(async { world::World::new(rng, scenario.call_faults) });
        let found = rt.block_on(sim::simulate(scenario, world, &kept));
        // The dead nodes' last tasks are dropped here, still under the
        // run's recorder and generator.
        drop(rt);
        found
    };
    flightdeck_core::random::seed_this_thread(None);
    Report {
        seed,
        schedule,
        trace: found.trace,
        violations: found.violations,
        causes: found.causes,
        faults: found.faults,
        exercised: found.exercised,
    }
}
