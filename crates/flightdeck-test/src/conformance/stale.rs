//! Results kept past their freshness to answer stale ([`Ask::stale`],
//! [`CommitArgs::stale_for`]), early refreshes ([`Ask::early`]), the
//! throttle after a failed refresh ([`AbandonArgs::retry_after`]), and
//! what a stored result says about itself (age, ttl, work time).
//!
//! The leases that must still run when a later call lands are long
//! ([`REFRESH_LEASE`]), and the stale windows too, so that a stalled
//! machine cannot change a verdict; only the throttle's end is measured
//! (a [`Window`]-like check around it).

use super::*;

/// A lease no stall outlives: the refreshes' and the followers'.
const REFRESH_LEASE: Duration = Duration::from_secs(20);

/// How long the results of these checks are fresh.
const SHORT_TTL: Duration = Duration::from_millis(200);

/// Past [`SHORT_TTL`].
const PAST_TTL: Duration = Duration::from_millis(300);

/// How long the checks' results are kept to answer stale, past their ttl.
const STALE_FOR: Duration = Duration::from_secs(30);

/// The work time the checks' commits carry.
const WORK_TIME: Duration = Duration::from_millis(40);

fn long_terms() -> LeaseTerms {
    LeaseTerms {
        lease: REFRESH_LEASE,
        ..terms(true)
    }
}

/// A commit fresh for `ttl`, kept `stale_for` past it, retained for
/// waiters no longer than it is fresh.
fn stale_commit(payload: &'static [u8], ttl: Duration, stale_for: Duration) -> CommitArgs {
    CommitArgs {
        ttl,
        retain: ttl,
        stale_for,
        work_time: WORK_TIME,
        state_ttl: SHORT_STATE,
        ..commit_args(payload, 1024)
    }
}

const STALE: Ask = Ask::STALE;
const EARLY: Ask = Ask::EARLY;

/// An acquire asking for stale results, with a fresh token.
async fn ask_stale<B: Backend>(b: &B, f: &FlightId) -> Acquired {
    b.acquire_with(f, &OwnerToken::random(), STALE, &long_terms())
        .await
        .unwrap()
}

/// Panics unless `answer` grants the flight with nothing stale beside.
fn expect_granted_alone(answer: Acquired, what: &str) {
    match answer {
        Acquired::Owner { stale: None, .. } => {}
        other => panic!("{what}: expected OWNER and nothing stale, got {other:?}"),
    }
}

/// Panics unless `stale` is the result `payload` of `generation`, with
/// the checks' ttl and work time.
fn expect_kept(stale: Option<&StoredResult>, generation: u64, payload: &[u8], what: &str) {
    let Some(r) = stale else {
        panic!("{what}: expected the kept result beside, got none");
    };
    assert_eq!(r.generation, generation, "{what}: {r:?}");
    assert_eq!(&r.payload[..], payload, "{what}: {r:?}");
    assert_eq!(r.status, ResultStatus::Ok, "{what}: {r:?}");
    assert_eq!(r.work_time, WORK_TIME, "{what}: {r:?}");
}

/// A flight whose result `v1` (generation returned) is past its
/// freshness and kept `stale_for` past it to answer stale.
async fn stale_flight<B: Backend>(b: &B, stale_for: Duration) -> (FlightId, u64) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let g = owned(b.acquire(&f, &a, &long_terms()).await.unwrap(), "fresh");
    let args = stale_commit(b"v1", SHORT_TTL, stale_for);
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(PAST_TTL).await;
    (f, g)
}

/// Past its freshness, a result kept to answer stale is answered beside
/// OWNER to the acquire that asks for it (this caller refreshes it), and
/// beside FOLLOWER to the others while the refresh runs; never to an
/// acquire that does not ask; the refresh's commit replaces it.
pub async fn stale_results_are_answered_beside_the_refresh<B: Backend>(b: &B) {
    let (f, g1) = stale_flight(b, STALE_FOR).await;
    let t = long_terms();
    let (owner, plain, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let g2 = match b.acquire_with(&f, &owner, STALE, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            stale,
        } => {
            expect_kept(stale.as_ref(), g1, b"v1", "the refresh's grant");
            let r = stale.unwrap();
            assert_eq!(r.ttl, SHORT_TTL, "{r:?}");
            assert!(r.age >= PAST_TTL - CLOCK_MARGIN, "age by the store: {r:?}");
            assert!(r.stale_for() > Duration::ZERO, "{r:?}");
            generation
        }
        other => panic!("past its freshness: expected OWNER with the stale result, got {other:?}"),
    };
    assert!(g2 > g1);
    match b.acquire_with(&f, &owner, STALE, &t).await.unwrap() {
        Acquired::Owner {
            generation, stale, ..
        } => {
            assert_eq!(generation, g2, "a retry of the refresh's grant");
            expect_kept(stale.as_ref(), g1, b"v1", "the refresh's retried grant");
        }
        other => panic!("a retried grant: expected OWNER, got {other:?}"),
    }
    match b.acquire(&f, &plain, &t).await.unwrap() {
        Acquired::Follower {
            generation,
            stale: None,
            ..
        } => assert_eq!(generation, g2),
        other => panic!("without ask.stale: expected FOLLOWER and nothing stale, got {other:?}"),
    }
    match b.acquire_with(&f, &other, STALE, &t).await.unwrap() {
        Acquired::Follower {
            generation, stale, ..
        } => {
            assert_eq!(generation, g2);
            expect_kept(stale.as_ref(), g1, b"v1", "a follower of the refresh");
        }
        other => {
            panic!("while a refresh runs: expected FOLLOWER with the stale result, got {other:?}")
        }
    }
    let args = stale_commit(b"v2", Duration::from_secs(30), STALE_FOR);
    assert_eq!(
        b.commit(&f, &owner, g2, &args).await.unwrap(),
        Committed::Committed,
        "the refresh is the last grant: its commit replaces the kept result"
    );
    expect_hit(ask_stale(b, &f).await, g2, b"v2");
}

/// Without `ask.stale` a result past its freshness is not answered: the
/// flight is granted as if nothing were kept.
pub async fn stale_results_need_ask_stale<B: Backend>(b: &B) {
    let (f, _) = stale_flight(b, STALE_FOR).await;
    expect_granted_alone(
        b.acquire(&f, &OwnerToken::random(), &long_terms())
            .await
            .unwrap(),
        "without ask.stale",
    );
}

/// A follower's re-check (naming the generation it followed) is replayed
/// the result as long as the record keeps it (`ku`: the later of
/// `retain` and `ttl + stale_for`), stale or not, as the Redis scripts
/// do: the follower waited for that very result.
pub async fn rechecks_are_replayed_what_the_record_keeps<B: Backend>(b: &B) {
    let (f, g1) = stale_flight(b, STALE_FOR).await;
    expect_hit(
        b.recheck(&f, &OwnerToken::random(), Some(g1), &long_terms())
            .await
            .unwrap(),
        g1,
        b"v1",
    );
}

/// A result is answered stale for `stale_for` past its ttl, no longer;
/// and the flight's record lives that long (past `retain`).
pub async fn stale_results_end_with_their_window<B: Backend>(b: &B) {
    // Kept past ttl and retain: the record lives for ttl + stale_for.
    let (f, g1) = stale_flight(b, STALE_FOR).await;
    tokio::time::sleep(SHORT_STATE).await;
    match ask_stale(b, &f).await {
        Acquired::Owner { stale, .. } => {
            expect_kept(stale.as_ref(), g1, b"v1", "past retain and the state ttl")
        }
        other => panic!("within stale_for: expected OWNER with the stale result, got {other:?}"),
    }

    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = long_terms();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let args = stale_commit(b"v1", SHORT_TTL, SHORT_TTL);
    b.commit(&f, &a, g, &args).await.unwrap();
    tokio::time::sleep(SHORT_TTL * 2 + PAST_TTL).await;
    expect_granted_alone(ask_stale(b, &f).await, "past ttl + stale_for");
}

/// A refresh whose grant is no longer the last one (its lease ran out and
/// another caller took the flight over) is fenced: its commit does not
/// replace the kept result, which the new refresh's followers still get.
pub async fn a_fenced_refresh_does_not_replace_the_kept_result<B: Backend>(b: &B) {
    let (f, g1) = stale_flight(b, STALE_FOR).await;
    let (late, next) = (OwnerToken::random(), OwnerToken::random());
    let g2 = owned(
        b.acquire_with(&f, &late, STALE, &terms(true))
            .await
            .unwrap(),
        "the first refresh",
    );
    tokio::time::sleep(PAST_LEASE).await;
    let g3 = match b
        .acquire_with(&f, &next, STALE, &long_terms())
        .await
        .unwrap()
    {
        Acquired::Owner {
            generation,
            takeover: true,
            stale,
        } => {
            expect_kept(stale.as_ref(), g1, b"v1", "the takeover of a refresh");
            generation
        }
        other => panic!("the first refresh's lease ran out: expected a takeover, got {other:?}"),
    };
    assert!(g3 > g2);
    let args = stale_commit(b"late", Duration::from_secs(30), STALE_FOR);
    assert_eq!(
        b.commit(&f, &late, g2, &args).await.unwrap(),
        Committed::Fenced
    );
    match ask_stale(b, &f).await {
        Acquired::Follower {
            generation, stale, ..
        } => {
            assert_eq!(generation, g3);
            expect_kept(stale.as_ref(), g1, b"v1", "after a fenced refresh");
        }
        other => panic!("expected FOLLOWER of the takeover with the stale result, got {other:?}"),
    }
}

/// INVALIDATE during a refresh drops the kept result: the refresh's
/// commit is fenced and nothing stale is answered after.
pub async fn invalidate_drops_the_kept_result<B: Backend>(b: &B) {
    let (f, _) = stale_flight(b, STALE_FOR).await;
    let t = long_terms();
    let refresh = OwnerToken::random();
    let g2 = owned(
        b.acquire_with(&f, &refresh, STALE, &t).await.unwrap(),
        "the refresh",
    );
    let gi = b.invalidate(&f, SHORT_STATE).await.unwrap();
    assert!(gi > g2);
    let args = stale_commit(b"purged", Duration::from_secs(30), STALE_FOR);
    assert_eq!(
        b.commit(&f, &refresh, g2, &args).await.unwrap(),
        Committed::Fenced,
        "an invalidation fences the running refresh"
    );
    match ask_stale(b, &f).await {
        Acquired::Owner {
            generation,
            takeover: false,
            stale: None,
        } => assert!(generation > gi),
        other => panic!("after INVALIDATE: expected OWNER and nothing stale, got {other:?}"),
    }
}

/// How long the throttle after a failed refresh lasts in these checks.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// An abandon with `retry_after` while a result is kept: until it ends,
/// an acquire asking for stale answers STALE with the kept result and
/// grants nothing (an acquire that does not ask still gets the cached
/// failure); after it, one caller is granted the next refresh and the
/// others follow it with the stale result beside. Without a kept result
/// `retry_after` changes nothing.
pub async fn a_failed_refresh_throttles_the_next<B: Backend>(b: &B) {
    conclusive("a_failed_refresh_throttles_the_next", || {
        a_failed_refresh_throttles_the_next_once(b)
    })
    .await;

    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = long_terms();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let args = AbandonArgs {
        retry_after: RETRY_AFTER,
        ..abandon_args(None)
    };
    b.abandon(&f, &a, g, &args).await.unwrap();
    expect_granted_alone(
        ask_stale(b, &f).await,
        "nothing kept: retry_after throttles nothing",
    );
}

async fn a_failed_refresh_throttles_the_next_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let (f, g1) = stale_flight(b, STALE_FOR).await;
    let t = long_terms();
    let refresh = OwnerToken::random();
    let g2 = owned(
        b.acquire_with(&f, &refresh, STALE, &t).await.unwrap(),
        "the refresh",
    );
    let args = AbandonArgs {
        retry_after: RETRY_AFTER,
        ..abandon_args(Some("boom"))
    };
    let throttle = Window {
        opened: Instant::now(),
        len: RETRY_AFTER.saturating_sub(CLOCK_MARGIN),
        what: "the throttle after a failed refresh",
    };
    assert_eq!(
        b.abandon(&f, &refresh, g2, &args).await.unwrap(),
        Released::Released
    );
    let throttled = ask_stale(b, &f).await;
    let plain = b.acquire(&f, &OwnerToken::random(), &t).await.unwrap();
    throttle.kept()?;
    match throttled {
        Acquired::Stale(r) => expect_kept(Some(&r), g1, b"v1", "inside the throttle"),
        other => panic!("inside the throttle: expected STALE, got {other:?}"),
    }
    match plain {
        Acquired::Hit(r) => {
            assert_eq!(r.status, ResultStatus::Failed, "{r:?}");
            assert_eq!(&r.payload[..], b"boom");
        }
        other => panic!("without ask.stale: expected the cached failure, got {other:?}"),
    }
    tokio::time::sleep(RETRY_AFTER + CLOCK_MARGIN * 2).await;
    let g3 = match ask_stale(b, &f).await {
        Acquired::Owner {
            generation, stale, ..
        } => {
            expect_kept(stale.as_ref(), g1, b"v1", "after the throttle");
            generation
        }
        other => panic!("after the throttle: expected one grant, got {other:?}"),
    };
    assert!(g3 > g2);
    match ask_stale(b, &f).await {
        Acquired::Follower {
            generation, stale, ..
        } => {
            assert_eq!(generation, g3);
            expect_kept(stale.as_ref(), g1, b"v1", "a follower of the retry");
        }
        other => panic!("after the throttle: expected FOLLOWER of the one retry, got {other:?}"),
    }
    Ok(())
}

/// An early refresh of a fresh result is granted with the fresh result
/// beside; while its lease runs, another early acquire is a HIT (someone
/// refreshes already), and so is any plain acquire; its commit replaces
/// the result.
pub async fn early_refreshes_are_granted_once<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, early, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = long_terms();
    let g1 = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let args = stale_commit(b"v1", Duration::from_secs(30), Duration::ZERO);
    b.commit(&f, &a, g1, &args).await.unwrap();
    let g2 = match b.acquire_with(&f, &early, EARLY, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            stale,
        } => {
            expect_kept(stale.as_ref(), g1, b"v1", "an early refresh");
            let r = stale.unwrap();
            assert!(r.fresh_for() > Duration::ZERO, "still fresh: {r:?}");
            generation
        }
        other => panic!("an early refresh: expected OWNER with the fresh result, got {other:?}"),
    };
    assert!(g2 > g1);
    expect_hit(
        b.acquire_with(&f, &other, EARLY, &t).await.unwrap(),
        g1,
        b"v1",
    );
    expect_hit(b.acquire(&f, &other, &t).await.unwrap(), g1, b"v1");
    let args = stale_commit(b"v2", Duration::from_secs(30), Duration::ZERO);
    assert_eq!(
        b.commit(&f, &early, g2, &args).await.unwrap(),
        Committed::Committed
    );
    expect_hit(b.acquire(&f, &other, &t).await.unwrap(), g2, b"v2");
}

/// The token that holds the live lease is answered OWNER with its
/// generation on every retry of its ACQUIRE, whatever the record says by
/// then: here a refresh granted beside a stale result while the last
/// refresh's failure is cached, retried after the result's stale window
/// ended (the first attempt's reply lost, the command sent again late),
/// then past the retry's not-after. A HIT with the cached failure or a
/// refusal would leave the lease held by a token nobody works for.
pub async fn a_retry_of_the_leases_holder_is_answered_owner<B: Backend>(b: &B) {
    conclusive("a_retry_of_the_leases_holder_is_answered_owner", || {
        a_retry_of_the_leases_holder_is_answered_owner_once(b)
    })
    .await
}

async fn a_retry_of_the_leases_holder_is_answered_owner_once<B: Backend>(
    b: &B,
) -> Result<(), Stalled> {
    let t = long_terms();
    let stale_for = Duration::from_secs(1);
    let kept = Window {
        opened: Instant::now(),
        len: (SHORT_TTL + stale_for).saturating_sub(CLOCK_MARGIN),
        what: "the stale window of the result the grant is answered beside",
    };
    let (f, g1) = stale_flight(b, stale_for).await;
    let failed = OwnerToken::random();
    let g2 = owned(
        b.acquire_with(&f, &failed, STALE, &t).await.unwrap(),
        "a refresh",
    );
    assert_eq!(
        b.abandon(&f, &failed, g2, &abandon_args(Some("boom")))
            .await
            .unwrap(),
        Released::Released
    );
    let holder = OwnerToken::random();
    let sent = Instant::now();
    let ask = Ask {
        not_after: Some(sent + REFRESH_LEASE),
        ..STALE
    };
    let granted = b.acquire_with(&f, &holder, ask, &t).await.unwrap();
    kept.kept()?;
    let g3 = match granted {
        Acquired::Owner {
            generation, stale, ..
        } => {
            expect_kept(stale.as_ref(), g1, b"v1", "the refresh after a failed one");
            generation
        }
        other => panic!("a refresh beside a stale result: expected OWNER, got {other:?}"),
    };
    tokio::time::sleep(stale_for + CLOCK_MARGIN * 2).await;
    let holds = Acquired::Owner {
        generation: g3,
        takeover: false,
        stale: None,
    };
    assert_eq!(
        b.acquire_with(&f, &holder, ask, &t).await.unwrap(),
        holds,
        "a retry after the stale window, the failure still cached"
    );
    let late = Ask {
        not_after: Some(sent),
        ..STALE
    };
    match b.acquire_with(&f, &holder, late, &t).await {
        Ok(answer) => assert_eq!(answer, holds, "a retry past its not-after"),
        Err(e) => panic!("a retry past its not-after, the lease held: {e}"),
    }
    match b.acquire_with(&f, &OwnerToken::random(), late, &t).await {
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}"),
        Ok(a) => panic!("another token's acquire past its not-after was answered {a:?}"),
    }
    Ok(())
}

/// A HIT carries the result's age by the store's clock, its ttl and its
/// owner's work time.
pub async fn stored_results_carry_age_ttl_and_work_time<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = long_terms();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let ttl = Duration::from_secs(30);
    b.commit(&f, &a, g, &stale_commit(b"v", ttl, Duration::ZERO))
        .await
        .unwrap();
    let waited = Duration::from_millis(150);
    tokio::time::sleep(waited).await;
    match b.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.ttl, ttl, "{r:?}");
            assert_eq!(r.work_time, WORK_TIME, "{r:?}");
            assert!(
                r.age >= waited - CLOCK_MARGIN && r.age < ttl,
                "age by the store's clock: {r:?}"
            );
            assert_eq!(r.fresh_for(), ttl - r.age);
        }
        other => panic!("expected HIT, got {other:?}"),
    }
}

/// A commit that says when it was sent ([`CommitArgs::sent`]) is dated
/// from then, not from its arrival: one held up on its way (here 400 ms,
/// as by a frozen store) is as old as it is, and fresh no longer for it.
pub async fn a_commit_is_dated_from_its_sending<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = long_terms();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let held = Duration::from_millis(400);
    let sent = Instant::now();
    tokio::time::sleep(held).await;
    let ttl = Duration::from_secs(30);
    let args = CommitArgs {
        sent: Some(sent),
        ..stale_commit(b"v", ttl, Duration::ZERO)
    };
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
    match b.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert!(
                r.age >= held - CLOCK_MARGIN && r.age < ttl,
                "dated from its sending, by the store's clock: {r:?}"
            );
            assert_eq!(r.fresh_for(), ttl - r.age, "{r:?}");
        }
        other => panic!("expected HIT, got {other:?}"),
    }
}

/// Durations past any deployment's (`Duration::MAX`) are taken as
/// [`MAX_DURATION`]: a commit, an early refresh's grant and an abandon
/// caching a failure with a throttle all take effect, none panics nor is
/// refused, and the result is kept.
pub async fn huge_durations_are_capped<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, early) = (OwnerToken::random(), OwnerToken::random());
    let t = long_terms();
    let g1 = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let args = CommitArgs {
        ttl: Duration::MAX,
        retain: Duration::MAX,
        stale_for: Duration::MAX,
        work_time: Duration::MAX,
        state_ttl: Duration::MAX,
        ..commit_args(b"v1", 1024)
    };
    assert_eq!(
        b.commit(&f, &a, g1, &args).await.unwrap(),
        Committed::Committed
    );
    let g2 = match b.acquire_with(&f, &early, EARLY, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            stale: Some(r),
            ..
        } => {
            assert_eq!((r.ttl, r.work_time), (MAX_DURATION, MAX_DURATION), "{r:?}");
            generation
        }
        other => panic!("an early refresh: expected OWNER with the fresh result, got {other:?}"),
    };
    let args = AbandonArgs {
        failure: Some(Bytes::from_static(b"boom")),
        failure_ttl: Duration::MAX,
        retry_after: Duration::MAX,
        state_ttl: Duration::MAX,
    };
    assert_eq!(
        b.abandon(&f, &early, g2, &args).await.unwrap(),
        Released::Released
    );
    expect_hit(ask_stale(b, &f).await, g1, b"v1");
}

/// Every check of this file, side by side (independent flights).
pub async fn stale_checks<B: Backend>(b: &B) {
    tokio::join!(
        stale_results_are_answered_beside_the_refresh(b),
        stale_results_need_ask_stale(b),
        rechecks_are_replayed_what_the_record_keeps(b),
        stale_results_end_with_their_window(b),
        a_fenced_refresh_does_not_replace_the_kept_result(b),
        invalidate_drops_the_kept_result(b),
        a_failed_refresh_throttles_the_next(b),
        early_refreshes_are_granted_once(b),
        a_retry_of_the_leases_holder_is_answered_owner(b),
        stored_results_carry_age_ttl_and_work_time(b),
        a_commit_is_dated_from_its_sending(b),
        huge_durations_are_capped(b),
    );
}
