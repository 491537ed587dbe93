//! What ends a grant with an answer for the followers: abandons, notices
//! (with small payloads inline), cached failures, invalidation.

use super::*;

/// ABANDON releases at once and wakes the followers; the next acquire
/// owns a newer generation without a takeover.
pub async fn abandon_wakes_followers<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = follow(b, &f, &t).await;
    assert_eq!(
        b.abandon(&f, &a, g, &abandon_args(None)).await.unwrap(),
        Released::Released
    );
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: g }
    );
    assert_eq!(
        b.abandon(&f, &a, g, &abandon_args(None)).await.unwrap(),
        Released::NotOwner
    );
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => assert!(generation > g),
        other => panic!("expected OWNER without takeover, got {other:?}"),
    }
    assert_eq!(
        b.commit(&f, &a, g, &commit_args(b"x", 0)).await.unwrap(),
        Committed::Fenced
    );
}

/// Completion notices carry payloads up to the inline limit.
pub async fn notices_carry_small_payloads_inline<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = follow(b, &f, &t).await;
    b.commit(&f, &a, g, &commit_args(b"\x01small\xfe|x", 64))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: g,
            inline: Some(Bytes::from_static(b"\x01small\xfe|x")),
            work_time: Some(Duration::ZERO),
            age: Duration::ZERO,
        }
    );
    drop(sub);

    let f = fresh_flight();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = follow(b, &f, &t).await;
    b.commit(&f, &a, g, &commit_args(b"too large to inline", 4))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: g,
            inline: None,
            work_time: Some(Duration::ZERO),
            age: Duration::ZERO,
        }
    );
}

/// An abandon with a failure and a TTL is replayed as a failed HIT.
pub async fn failures_can_be_cached<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    b.abandon(&f, &a, g, &abandon_args(Some("boom")))
        .await
        .unwrap();
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.generation, g);
            assert_eq!(r.status, ResultStatus::Failed);
            assert_eq!(&r.payload[..], b"boom");
        }
        other => panic!("expected a failed HIT, got {other:?}"),
    }
}

/// INVALIDATE drops the result and the lease and fences the running owner
/// (invariant 11); the next acquire owns a newer generation.
pub async fn invalidate_fences_the_running_owner<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g1 = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = follow(b, &f, &t).await;
    let gi = b.invalidate(&f, Duration::from_secs(30)).await.unwrap();
    assert!(gi > g1, "INVALIDATE starts a newer generation");
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: gi }
    );
    assert_eq!(b.heartbeat(&f, &a, g1, &t).await.unwrap(), Renewal::Lost);
    assert_eq!(
        b.commit(&f, &a, g1, &commit_args(b"stale", 1024))
            .await
            .unwrap(),
        Committed::Fenced
    );
    let g3 = match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => generation,
        other => panic!("expected OWNER without takeover, got {other:?}"),
    };
    assert!(g3 > gi);
    b.commit(&f, &c, g3, &commit_args(b"fresh", 1024))
        .await
        .unwrap();
    assert!(matches!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Hit(_)
    ));
    let gi2 = b.invalidate(&f, Duration::from_secs(30)).await.unwrap();
    assert!(gi2 > g3);
    match b.acquire(&f, &a, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => assert!(generation > gi2, "the stored result is gone"),
        other => panic!("the stored result is gone: expected OWNER, got {other:?}"),
    }
}

/// A result committed with no replay (a zero `ttl`) is not a HIT to a new
/// acquire (it is granted a newer generation), but it is to the followers
/// already waiting: a re-check naming the generation it followed, or an
/// older one, gets it for `retain`, also while a later grant runs; a
/// re-check that followed the later grant does not. A later commit
/// replaces it, and once `retain` has passed nobody gets it.
pub async fn results_are_kept_for_waiters_not_replayed<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c, d) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(true);
    let keep = |payload: &'static [u8], retain| CommitArgs {
        ttl: Duration::ZERO,
        retain,
        ..commit_args(payload, 0)
    };
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let follows = match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Follower { generation, .. } => generation,
        other => panic!("expected FOLLOWER, got {other:?}"),
    };
    assert_eq!(follows, g);
    let retain = Duration::from_secs(10);
    assert_eq!(
        b.commit(&f, &a, g, &keep(b"first", retain)).await.unwrap(),
        Committed::Committed
    );
    // A retry of the commit is still recognised as one.
    assert_eq!(
        b.commit(&f, &a, g, &keep(b"first", retain)).await.unwrap(),
        Committed::Committed
    );
    // A new request is not replayed the result: it owns a newer grant.
    let g2 = owned(b.acquire(&f, &d, &t).await.unwrap(), "not replayed");
    assert!(g2 > g);
    // The follower of `g` gets `g`'s result, the new grant running or not.
    expect_hit(b.recheck(&f, &c, Some(g), &t).await.unwrap(), g, b"first");
    // One that followed the later grant waits for it.
    let e = OwnerToken::random();
    assert!(matches!(
        b.recheck(&f, &e, Some(g2), &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g2
    ));
    // The later commit replaces the kept result, for both.
    assert_eq!(
        b.commit(&f, &d, g2, &keep(b"second", retain))
            .await
            .unwrap(),
        Committed::Committed
    );
    expect_hit(b.recheck(&f, &c, Some(g), &t).await.unwrap(), g2, b"second");
    expect_hit(
        b.recheck(&f, &e, Some(g2), &t).await.unwrap(),
        g2,
        b"second",
    );

    // Once the retention has passed, nobody gets it.
    let f = fresh_flight();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let short = Duration::from_millis(200);
    assert_eq!(
        b.commit(&f, &a, g, &keep(b"gone", short)).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(short * 3).await;
    owned(
        b.recheck(&f, &OwnerToken::random(), Some(g), &t)
            .await
            .unwrap(),
        "the retention has passed",
    );
}

/// A result committed with a `ttl` is a HIT to new acquires until it runs
/// out, and not after.
pub async fn fresh_results_are_replayed_until_their_ttl<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let ttl = Duration::from_millis(300);
    let args = CommitArgs {
        ttl,
        retain: ttl,
        ..commit_args(b"fresh", 0)
    };
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
    let sent = Instant::now();
    let answer = b.acquire(&f, &OwnerToken::random(), &t).await.unwrap();
    if sent.elapsed() < ttl {
        expect_hit(answer, g, b"fresh");
    }
    tokio::time::sleep(ttl * 2).await;
    owned(
        b.acquire(&f, &OwnerToken::random(), &t).await.unwrap(),
        "the ttl has passed",
    );
}
