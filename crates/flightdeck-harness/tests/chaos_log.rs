//! The journal lines node processes write: what a `Recorder`
//! logs reads back as the journal it kept, executions of a killed process
//! end at the kill, and a duplicate names the run it replaced.

use std::time::Duration;

use flightdeck_core::stale::{Stale, StaleReason};
use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::Answered;
use flightdeck_distributed::FlightId;
use flightdeck_harness::chaos::{
    check_answers, duplicates, log_exec_end, log_exec_start, Answer, Exec, NodeLog,
    AFTER_COMMITTED, AFTER_KILLED, AFTER_UNCOMMITTED, REFRESHED, STALE_WINDOWS,
};
use flightdeck_harness::recorder::{CommitRecord, EventLog, SharedBuffer, WallClock};
use flightdeck_harness::{Journal, Recorder};
use flightdeck_test::{conformance, MemoryBackend};
use tokio::time::Instant;

fn flight_of(key: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(StageName::new("node").unwrap(), key))
}

#[tokio::test]
async fn the_logged_journal_reads_back_as_recorded() {
    let buffer = SharedBuffer::default();
    let backend = Recorder::new(MemoryBackend::new()).logging_to(EventLog::new(buffer.clone()));
    conformance::owner_follower_hit(&backend).await;
    conformance::takeover_fences_the_stale_owner(&backend).await;
    let kept = backend.journal();
    let (read, malformed) = Journal::from_log(&buffer.text(), &WallClock::now());
    assert_eq!(malformed, 0);
    assert!(!kept.grants.is_empty() && !kept.commits.is_empty());
    let grants = |j: &Journal| {
        j.grants
            .iter()
            .map(|g| (g.flight, g.generation, g.takeover))
            .collect::<Vec<_>>()
    };
    let commits = |j: &Journal| {
        j.commits
            .iter()
            .map(|c| (c.flight, c.generation, c.token.clone(), c.committed))
            .collect::<Vec<_>>()
    };
    assert_eq!(grants(&read), grants(&kept));
    assert_eq!(commits(&read), commits(&kept));
    assert!(
        read.commits.iter().any(|c| c.committed == Some(false)),
        "the fenced commit is in the log"
    );
    // Order survives the wall clock: every commit after its own grant.
    for c in &read.commits {
        let granted = read
            .grants
            .iter()
            .find(|g| g.flight == c.flight && g.generation == c.generation)
            .expect("a commit's generation was granted");
        assert!(granted.at <= c.sent);
    }
    assert_eq!(read.stale_commits(), kept.stale_commits());
    assert_eq!(
        read.max_committed_per_generation(),
        kept.max_committed_per_generation()
    );
    let tokens = |j: &Journal| j.grants.iter().map(|g| g.token.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&read), tokens(&kept), "tokens are logged");
    assert!(read.grants.iter().all(|g| g.sent <= g.at));
    assert!(read.generation_order_violations().is_empty());
}

/// "Generations per flight strictly increase across the whole run": a
/// grant sent after another's reply must have the larger generation; one
/// generation for two tokens is a violation whatever the order; a retry
/// with the same token, and grants in flight at once, are not. And the
/// conformance suite's grants through a recorder keep the rule.
#[tokio::test(start_paused = true)]
async fn generations_must_increase_across_the_run() {
    use flightdeck_harness::recorder::Grant;
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let f = flight_of("k");
    let grant = |generation: u64, token: &str, sent: u64, at: u64| Grant {
        flight: f,
        generation,
        takeover: false,
        token: token.to_owned(),
        sent: ms(sent),
        at: ms(at),
    };
    let journal = |grants: Vec<Grant>| Journal {
        grants,
        ..Journal::default()
    };
    let ok = journal(vec![
        grant(5, "a", 0, 1),
        grant(5, "a", 2, 3),
        grant(9, "b", 4, 5),
        // In flight at once with the next one (sent before its reply).
        grant(20, "c", 6, 9),
        grant(12, "d", 7, 8),
        Grant {
            flight: flight_of("another"),
            ..grant(7, "e", 0, 1)
        },
    ]);
    assert_eq!(ok.generation_order_violations(), Vec::<String>::new());
    let back = journal(vec![grant(5, "a", 0, 1), grant(4, "b", 2, 3)]);
    assert_eq!(back.generation_order_violations().len(), 1);
    let repeat = journal(vec![grant(5, "a", 0, 1), grant(5, "b", 2, 3)]);
    assert_eq!(repeat.generation_order_violations().len(), 1);
    let twice = journal(vec![grant(5, "a", 0, 3), grant(5, "b", 1, 2)]);
    assert_eq!(twice.generation_order_violations().len(), 1);

    let backend = Recorder::new(MemoryBackend::new());
    conformance::run_all(std::sync::Arc::new(backend.clone())).await;
    let j = backend.journal();
    assert!(j.grants.len() > 30, "{} grants", j.grants.len());
    assert_eq!(j.generation_order_violations(), Vec::<String>::new());
    assert!(j.stale_commits().is_empty());
    assert!(j.max_committed_per_generation() <= 1);
}

#[tokio::test]
async fn a_killed_process_ends_its_executions_and_duplicates_name_what_they_replaced() {
    // Process 1 of node 0 starts k (generation 1) and is killed.
    let first = SharedBuffer::default();
    log_exec_start(&EventLog::new(first.clone()), "k", 1);
    let mut torn = first.text();
    torn.push_str("{\"event\":\"exec\",\"key\":\"k\",\"gen");
    let killed_at = Instant::now();
    let clock = WallClock::now();
    let dead = NodeLog::read(&torn, 0, &clock, Some(killed_at));
    assert_eq!(dead.malformed, 1, "the torn last line");
    assert_eq!(dead.executions.len(), 1);
    assert!(dead.executions[0].killed);
    assert_eq!(dead.executions[0].end, Some(killed_at));

    // Node 1 takes over (generation 2) and finishes; its commit fails, so
    // generation 3 runs again on node 1.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = SharedBuffer::default();
    let log = EventLog::new(second.clone());
    log_exec_start(&log, "k", 2);
    log_exec_end(&log, "k", 2);
    tokio::time::sleep(Duration::from_millis(5)).await;
    log_exec_start(&log, "k", 3);
    log_exec_end(&log, "k", 3);
    let alive = NodeLog::read(&second.text(), 1, &WallClock::now(), None);
    assert_eq!(alive.malformed, 0);
    assert!(alive
        .executions
        .iter()
        .all(|e| e.end.is_some() && !e.killed));

    let mut all = dead.executions;
    all.extend(alive.executions);
    let dups = duplicates(&all, &Journal::default(), flight_of, Duration::MAX);
    assert_eq!(dups.by_cause.get(AFTER_KILLED), Some(&1), "{dups:?}");
    assert_eq!(dups.by_cause.get(AFTER_UNCOMMITTED), Some(&1), "{dups:?}");
    assert_eq!(dups.by_cause.values().sum::<u64>(), 2);
}

/// A run after a committed result is a refresh once the newest committed
/// result is past its freshness (counted from its work's end), and a
/// result lost before: with 1 s of freshness, generation 2 starting 1 s
/// after generation 1 ended refreshes it, generation 3 starting 0.5 s
/// after generation 2 ended means generation 2's result was lost.
#[test]
fn a_run_past_the_committed_results_freshness_is_a_refresh() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let exec = |generation, start, end| Exec {
        key: "k".into(),
        generation,
        node: 0,
        start: t0 + ms(start),
        end: Some(t0 + ms(end)),
        killed: false,
    };
    let mut journal = Journal::default();
    for generation in [1, 2] {
        journal.commits.push(CommitRecord {
            flight: flight_of("k"),
            generation,
            token: format!("t{generation}"),
            sent: t0,
            committed: Some(true),
        });
    }
    let all = [exec(1, 0, 100), exec(2, 1100, 1200), exec(3, 1700, 1800)];
    let dups = duplicates(&all, &journal, flight_of, Duration::from_secs(1));
    assert_eq!(dups.by_cause.get(REFRESHED), Some(&1), "{dups:?}");
    assert_eq!(dups.by_cause.get(AFTER_COMMITTED), Some(&1), "{dups:?}");
    assert_eq!(dups.by_cause.values().sum::<u64>(), 2);
}

/// The checks of a stale run's answers: a stale answer older than its
/// freshness plus the window of its reason (by its marker, or on the node
/// that ran its work by that work's end), and an answer of a generation
/// older than one its node had from the store before it began, are each
/// found; the same answers within their bounds, and an older generation
/// answered by the node's own work or to a request that began before the
/// newer one came, are not.
#[test]
fn stale_answers_past_their_bound_or_going_back_are_found() {
    let t0 = Instant::now();
    let (fresh, ms) = (Duration::from_secs(1), Duration::from_millis);
    let stale = |reason, age| Answered::Stale {
        stale: Stale { reason, age },
        work_time: Duration::ZERO,
    };
    let answer = |generation, from, at, how| Answer {
        node: 0,
        key: "k".into(),
        generation,
        from,
        began: t0 + ms(at),
        received: t0 + ms(at + 10),
        how,
    };
    let revalidate = fresh + STALE_WINDOWS.revalidate;
    let error = fresh + STALE_WINDOWS.if_error;
    let fine = [
        answer(1, 1, 0, Answered::Ran),
        answer(1, 1, 100, stale(StaleReason::Revalidate, revalidate)),
        answer(1, 1, 200, stale(StaleReason::Error, error)),
        // Began before generation 2's answer came back.
        answer(2, 1, 300, stale(StaleReason::Revalidate, ms(1100))),
        answer(1, 1, 305, stale(StaleReason::Revalidate, ms(1500))),
        // This node's own work of an older generation: not from the store.
        answer(3, 0, 400, Answered::Ran),
        answer(2, 1, 500, Answered::Ran),
        answer(3, 0, 1000, stale(StaleReason::Revalidate, ms(1500))),
    ];
    let executions = [Exec {
        key: "k".into(),
        generation: 3,
        node: 0,
        start: t0 + ms(400),
        end: Some(t0 + ms(410)),
        killed: false,
    }];
    let checked = check_answers(&fine, &executions, fresh, &STALE_WINDOWS);
    assert!(checked.too_old.is_empty(), "{checked:?}");
    assert!(checked.backwards.is_empty(), "{checked:?}");

    let mut bad = fine.to_vec();
    bad.push(answer(
        3,
        1,
        600,
        stale(StaleReason::Revalidate, revalidate + ms(1)),
    ));
    bad.push(answer(2, 1, 700, stale(StaleReason::Error, ms(1500))));
    // Its marker is within the bound, but its work ended here longer ago.
    let late = 410 + revalidate.as_millis() as u64 + 100;
    bad.push(answer(3, 0, late, stale(StaleReason::Revalidate, ms(2000))));
    let checked = check_answers(&bad, &executions, fresh, &STALE_WINDOWS);
    assert_eq!(checked.too_old.len(), 2, "{checked:?}");
    assert_eq!(checked.backwards.len(), 1, "{checked:?}");
}

/// "No follower waits longer than the lease on a lease no live owner
/// holds": a follower of a journaled, live owner is not counted, however
/// long it waits; a follower of a lease whose grant never reached a node
/// (taken here behind the recorder's back) is, and seeing it live past the
/// lease plus slack (here it is kept alive, as a bug would) is a
/// violation; so is a follower of an owner whose process was killed. The
/// follower answers survive the log.
#[tokio::test(start_paused = true)]
async fn followers_must_not_wait_past_the_lease_on_a_lease_nobody_holds() {
    use flightdeck_distributed::backend::{Acquired, Backend};
    use flightdeck_distributed::OwnerToken;
    use flightdeck_harness::chaos::{ownerless_bound, ownerless_waits};

    let buffer = SharedBuffer::default();
    let mem = MemoryBackend::new();
    let rec = Recorder::new(mem.clone()).logging_to(EventLog::new(buffer.clone()));
    let terms = conformance::terms(true);
    let bound = ownerless_bound(conformance::LEASE, Duration::from_millis(100));
    let owned = |a: Acquired| match a {
        Acquired::Owner { generation, .. } => generation,
        other => panic!("expected OWNER, got {other:?}"),
    };
    // Follows `flight` through the recorder for `secs` of (paused) time,
    // keeping `keep`'s lease alive meanwhile when given.
    let follow = |flight, keep: Option<(OwnerToken, u64)>| {
        let (rec, mem) = (rec.clone(), mem.clone());
        async move {
            let me = OwnerToken::random();
            for _ in 0..20 {
                let a = rec.acquire(&flight, &me, &terms).await.unwrap();
                assert!(matches!(a, Acquired::Follower { .. }), "{a:?}");
                if let Some((t, g)) = &keep {
                    mem.heartbeat(&flight, t, *g, &terms).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };

    // A live owner, journaled and heartbeating: 2 s of following is fine.
    let live = conformance::fresh_flight();
    let owner = OwnerToken::random();
    let g = owned(rec.acquire(&live, &owner, &terms).await.unwrap());
    follow(live, Some((owner, g))).await;
    let j = rec.journal();
    assert_eq!(ownerless_waits(&j, bound).waits, 0, "{:?}", j.followed);

    // A lease whose grant never reached a node, kept alive for 2 s.
    let orphaned = conformance::fresh_flight();
    let orphan = OwnerToken::random();
    let g = owned(mem.acquire(&orphaned, &orphan, &terms).await.unwrap());
    follow(orphaned, Some((orphan, g))).await;
    let j = rec.journal();
    let found = ownerless_waits(&j, bound);
    assert_eq!((found.waits, found.violations.len()), (1, 1), "{found:?}");
    assert!(found.longest > bound);
    let (read, malformed) = Journal::from_log(&buffer.text(), &WallClock::now());
    assert_eq!(malformed, 0);
    // (Logged times are the wall clock's, which paused time does not move:
    // compare what was seen, not how long.)
    let seen = |j: &Journal| {
        let mut v: Vec<_> = j
            .followed
            .values()
            .map(|f| (f.flight.to_hex(), f.generation, f.token.clone(), f.answers))
            .collect();
        v.sort();
        v
    };
    assert_eq!(seen(&read), seen(&j));
    assert_eq!(ownerless_waits(&read, bound).waits, 1);

    // A follower that sees an orphan for less than the bound is counted,
    // not a violation.
    let brief = conformance::fresh_flight();
    owned(
        mem.acquire(&brief, &OwnerToken::random(), &terms)
            .await
            .unwrap(),
    );
    let me = OwnerToken::random();
    for _ in 0..3 {
        rec.acquire(&brief, &me, &terms).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let found = ownerless_waits(&rec.journal(), bound);
    assert_eq!((found.waits, found.violations.len()), (2, 1), "{found:?}");

    // The owner's process killed before the follower came: the log of
    // the killed process marks its grant dead.
    let dead_log = SharedBuffer::default();
    let dead = Recorder::new(mem.clone()).logging_to(EventLog::new(dead_log.clone()));
    let killed = conformance::fresh_flight();
    let victim = OwnerToken::random();
    let g = owned(dead.acquire(&killed, &victim, &terms).await.unwrap());
    let clock = WallClock::now();
    let mut merged = NodeLog::read(&dead_log.text(), 0, &clock, Some(Instant::now())).journal;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let after = Recorder::new(mem.clone());
    let me = OwnerToken::random();
    for _ in 0..20 {
        after.acquire(&killed, &me, &terms).await.unwrap();
        mem.heartbeat(&killed, &victim, g, &terms).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    merged.merge(after.journal());
    let found = ownerless_waits(&merged, bound);
    assert_eq!((found.waits, found.violations.len()), (1, 1), "{found:?}");
}
