//! The fencing rules: generations that never repeat or go back, commits
//! and abandons checked by token and generation, releases by token, and a
//! dead owner's flight without takeover.

use super::*;

/// Rule 1: the generations handed out for a flight never repeat and never
/// decrease, whatever expired in between: a result, a lease, an abandoned
/// grant, the flight's whole record, an invalidation.
pub async fn generations_never_repeat_or_decrease<B: Backend>(b: &B) {
    conclusive("generations_never_repeat_or_decrease", || {
        generations_never_repeat_or_decrease_once(b)
    })
    .await
}

async fn generations_never_repeat_or_decrease_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let t = short_terms(true);
    let mut seen: Vec<u64> = Vec::new();
    let mut next = |what: &str, g: u64| {
        if let Some(&last) = seen.last() {
            assert!(
                g > last,
                "{what}: generation {g} after {last}: the generations of a flight must never \
                 repeat or decrease, whatever expired in between (so far: {seen:?})"
            );
        }
        seen.push(g);
    };
    let tok = OwnerToken::random;

    let a = tok();
    let record = Window::record(&t);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "a fresh flight");
    next("the first grant", g);
    let committed = b.commit(&f, &a, g, &short_commit(b"r")).await.unwrap();
    record.kept()?;
    assert_eq!(committed, Committed::Committed);
    tokio::time::sleep(LEASE).await;

    let c = tok();
    let record = Window::record(&t);
    let g = owned(b.acquire(&f, &c, &t).await.unwrap(), "the result expired");
    next("after the result expired", g);
    let abandoned = b.abandon(&f, &c, g, &abandon_args(None)).await.unwrap();
    record.kept()?;
    assert_eq!(abandoned, Released::Released);
    let g = owned(b.acquire(&f, &tok(), &t).await.unwrap(), "abandoned");
    next("after an abandon", g);
    tokio::time::sleep(PAST_LEASE).await;
    let g = owned(b.acquire(&f, &tok(), &t).await.unwrap(), "lease ran out");
    next("a takeover", g);

    tokio::time::sleep(PAST_RECORD).await;
    let g = owned(b.acquire(&f, &tok(), &t).await.unwrap(), "all expired");
    next("after the flight's whole record expired", g);

    let g = b.invalidate(&f, SHORT_STATE).await.unwrap();
    next("an invalidation", g);
    tokio::time::sleep(PAST_RECORD).await;
    let g = owned(b.acquire(&f, &tok(), &t).await.unwrap(), "invalidated");
    next("after an invalidation expired", g);
    Ok(())
}

/// Rule 2 for COMMIT: only (token, generation) of the last grant commits,
/// also once its lease ran out with nobody granted since; a token that was
/// never granted the flight, or the owner with another generation, is
/// FENCED; a retry of a done commit answers COMMITTED.
pub async fn commit_checks_token_and_generation<B: Backend>(b: &B) {
    conclusive("commit_checks_token_and_generation", || {
        commit_checks_token_and_generation_once(b)
    })
    .await
}

async fn commit_checks_token_and_generation_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (a, s) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let record = Window::record(&t);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mine = commit_args(b"mine", 1024);
    let theirs = commit_args(b"theirs", 1024);
    assert_eq!(
        b.commit(&f, &s, g, &theirs).await.unwrap(),
        Committed::Fenced,
        "a commit by a token never granted the flight must be fenced"
    );
    for other in [g + 1, g.saturating_sub(1)] {
        assert_eq!(
            b.commit(&f, &a, other, &theirs).await.unwrap(),
            Committed::Fenced,
            "a commit of generation {other} when {g} was granted must be fenced"
        );
    }
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.commit(&f, &s, g, &theirs).await.unwrap(),
        Committed::Fenced,
        "after the owner's lease ran out (nobody granted since), a commit by a token never \
         granted the flight, with the right generation, must be fenced"
    );
    assert_eq!(
        b.commit(&f, &a, g + 1, &theirs).await.unwrap(),
        Committed::Fenced
    );
    let late = b.commit(&f, &a, g, &mine).await.unwrap();
    record.kept()?;
    assert_eq!(late, Committed::Committed, "the last grant commits late");
    assert_eq!(
        b.commit(&f, &a, g, &mine).await.unwrap(),
        Committed::Committed,
        "a retried commit answers COMMITTED"
    );
    assert_eq!(
        b.commit(&f, &s, g, &theirs).await.unwrap(),
        Committed::Fenced
    );
    expect_hit(b.acquire(&f, &s, &t).await.unwrap(), g, b"mine");
    Ok(())
}

/// Rules 1 and 2: an owner paused until the flight's whole record expired
/// cannot commit over the next owner, even when that owner's lease ran
/// out too: the stale commit is FENCED, the new one COMMITTED, and the new
/// generation is larger.
pub async fn stale_owner_of_an_expired_record_is_fenced<B: Backend>(b: &B) {
    conclusive("stale_owner_of_an_expired_record_is_fenced", || {
        stale_owner_of_an_expired_record_is_fenced_once(b)
    })
    .await
}

async fn stale_owner_of_an_expired_record_is_fenced_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (stale, fresh) = (OwnerToken::random(), OwnerToken::random());
    let t = short_terms(true);
    let gs = owned(b.acquire(&f, &stale, &t).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_RECORD).await;
    let record = Window::record(&t);
    let gf = owned(b.acquire(&f, &fresh, &t).await.unwrap(), "all expired");
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.heartbeat(&f, &stale, gs, &t).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        b.commit(&f, &stale, gs, &commit_args(b"stale", 1024))
            .await
            .unwrap(),
        Committed::Fenced,
        "the stale owner (generation {gs}) must be fenced: the flight was granted again since \
         (generation {gf})"
    );
    let committed = b.commit(&f, &fresh, gf, &commit_args(b"fresh", 1024)).await;
    record.kept()?;
    assert_eq!(
        committed.unwrap(),
        Committed::Committed,
        "the last grant commits"
    );
    assert!(gf > gs, "generation {gf} granted after {gs}");
    expect_hit(b.acquire(&f, &stale, &t).await.unwrap(), gf, b"fresh");
    Ok(())
}

/// Rule 2 for ABANDON: only (token, generation) of the last grant
/// releases, while its lease lives or after it ran out (which frees a
/// flight that may not be taken over at once); anyone else gets NOT_OWNER
/// and changes nothing.
pub async fn abandon_checks_token_and_generation<B: Backend>(b: &B) {
    conclusive("abandon_checks_token_and_generation", || {
        abandon_checks_token_and_generation_once(b)
    })
    .await
}

async fn abandon_checks_token_and_generation_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (a, s, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(false);
    let (lease, record) = (Window::lease(&t), Window::record(&t));
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    // A follower while the lease lives: the late abandon wakes it.
    let (mut sub, followed) = follow_within(b, &f, &t).await;
    lease.kept()?;
    assert!(followed, "a live lease is followed");
    for (who, generation) in [(&s, g), (&a, g + 1), (&a, g.saturating_sub(1))] {
        assert_eq!(
            b.abandon(&f, who, generation, &abandon_args(None))
                .await
                .unwrap(),
            Released::NotOwner
        );
    }
    let retried = b.acquire(&f, &a, &t).await.unwrap();
    lease.kept()?;
    assert_eq!(
        retried,
        Acquired::Owner {
            generation: g,
            takeover: false,
            stale: None
        },
        "the lease is untouched"
    );
    tokio::time::sleep(PAST_LEASE).await;
    let expired = b.acquire(&f, &c, &t).await.unwrap();
    record.kept()?;
    assert_eq!(expired, Acquired::Expired { generation: g });
    assert_eq!(
        b.abandon(&f, &s, g, &abandon_args(None)).await.unwrap(),
        Released::NotOwner
    );
    let abandoned = b.abandon(&f, &a, g, &abandon_args(None)).await.unwrap();
    record.kept()?;
    assert_eq!(
        abandoned,
        Released::Released,
        "the last grant's owner may abandon after its lease ran out, which frees the flight"
    );
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: g }
    );
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => assert!(generation > g),
        other => panic!("an abandoned flight is free: expected OWNER, got {other:?}"),
    }
    Ok(())
}

/// Rule 3: RELEASE frees the lease held by a token whatever its generation
/// (its caller may never have learned it) and wakes followers; the token
/// is never granted the flight again, so a late duplicate of its ACQUIRE
/// grants nothing, also when the RELEASE ran first; anyone else's RELEASE
/// is NOT_OWNER and changes nothing; a stored result is untouched.
pub async fn release_frees_the_tokens_lease_whatever_its_generation<B: Backend>(b: &B) {
    conclusive(
        "release_frees_the_tokens_lease_whatever_its_generation",
        || release_frees_the_tokens_lease_whatever_its_generation_once(b),
    )
    .await
}

async fn release_frees_the_tokens_lease_whatever_its_generation_once<B: Backend>(
    b: &B,
) -> Result<(), Stalled> {
    let f = fresh_flight();
    let tok = OwnerToken::random;
    let (a, c, s) = (tok(), tok(), tok());
    let t = terms(false);
    let state = Duration::from_secs(30);
    let (lease, record) = (Window::lease(&t), Window::record(&t));
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = b.subscribe(&f).await.unwrap();
    assert_eq!(b.release(&f, &s, state).await.unwrap(), Released::NotOwner);
    // `c` follows: the release wakes it.
    let follower = b.acquire(&f, &c, &t).await.unwrap();
    lease.kept()?;
    assert!(matches!(
        follower,
        Acquired::Follower { generation, .. } if generation == g
    ));
    let released = b.release(&f, &a, state).await.unwrap();
    record.kept()?;
    assert_eq!(released, Released::Released);
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: g }
    );
    assert_eq!(b.release(&f, &a, state).await.unwrap(), Released::NotOwner);
    let late = b.acquire(&f, &a, &t).await.unwrap();
    assert!(
        !matches!(late, Acquired::Owner { .. }),
        "a late ACQUIRE of a released token must grant nothing: {late:?}"
    );
    let gc = match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => generation,
        other => panic!("a released flight is free at once: expected OWNER, got {other:?}"),
    };
    assert!(gc > g);

    // The RELEASE ran before the ACQUIRE it gave up on.
    let f = fresh_flight();
    let (early, u, v, w) = (tok(), tok(), tok(), tok());
    assert_eq!(
        b.release(&f, &early, state).await.unwrap(),
        Released::NotOwner
    );
    let late = b.acquire(&f, &early, &t).await.unwrap();
    assert!(
        !matches!(late, Acquired::Owner { .. }),
        "an ACQUIRE that runs after its token's RELEASE must grant nothing: {late:?}"
    );
    let record = Window::record(&t);
    let gu = owned(b.acquire(&f, &u, &t).await.unwrap(), "not blocked");
    // Released after its lease ran out: frees a flight without takeover.
    tokio::time::sleep(PAST_LEASE).await;
    let expired = b.acquire(&f, &v, &t).await.unwrap();
    let released = b.release(&f, &u, state).await.unwrap();
    record.kept()?;
    assert_eq!(expired, Acquired::Expired { generation: gu });
    assert_eq!(released, Released::Released);
    let record = Window::record(&t);
    let gv = owned(b.acquire(&f, &v, &t).await.unwrap(), "released");
    assert!(gv > gu);
    // A stored result is untouched.
    let committed = b.commit(&f, &v, gv, &commit_args(b"kept", 1024)).await;
    record.kept()?;
    assert_eq!(committed.unwrap(), Committed::Committed);
    assert_eq!(b.release(&f, &v, state).await.unwrap(), Released::NotOwner);
    expect_hit(b.acquire(&f, &w, &t).await.unwrap(), gv, b"kept");
    Ok(())
}

/// Rule 4: with takeover disallowed, a dead owner's flight (its lease ran
/// out, no commit or abandon) answers EXPIRED with the dead generation
/// until the grant's record expires ([`LeaseTerms::record_ttl`] after the
/// grant), and the next grant then has a fresh, larger generation.
pub async fn dead_owner_without_takeover_blocks_until_its_record_expires<B: Backend>(b: &B) {
    conclusive(
        "dead_owner_without_takeover_blocks_until_its_record_expires",
        || dead_owner_without_takeover_blocks_until_its_record_expires_once(b),
    )
    .await
}

async fn dead_owner_without_takeover_blocks_until_its_record_expires_once<B: Backend>(
    b: &B,
) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (dead, c) = (OwnerToken::random(), OwnerToken::random());
    let t = short_terms(false);
    let blocked = t.record_ttl();
    let lease = Window::lease(&t);
    let sent = Instant::now();
    let g = owned(b.acquire(&f, &dead, &t).await.unwrap(), "fresh");
    // The record was written between `sent` and `granted`, so it expires
    // between `sent + blocked` and `granted + blocked`.
    let granted = Instant::now();
    tokio::time::sleep(LEASE / 2).await;
    let follower = b.acquire(&f, &c, &t).await.unwrap();
    lease.kept()?;
    assert!(matches!(
        follower,
        Acquired::Follower { generation, .. } if generation == g
    ));
    tokio::time::sleep(PAST_LEASE - LEASE / 2).await;
    let mut expired = 0;
    loop {
        let asked = Instant::now();
        let answer = b.acquire(&f, &c, &t).await.unwrap();
        let answered = Instant::now();
        match answer {
            Acquired::Expired { generation } => {
                assert_eq!(generation, g);
                assert!(
                    asked < granted + blocked + CLOCK_MARGIN,
                    "an ACQUIRE sent {:?} after the grant had come back still answered EXPIRED: \
                     the dead owner blocks the flight longer than its record's {blocked:?}",
                    asked - granted
                );
                expired += 1;
            }
            Acquired::Owner {
                generation,
                takeover,
                ..
            } => {
                assert!(
                    answered + CLOCK_MARGIN >= sent + blocked,
                    "granted again {:?} after the dead owner's grant was sent, before its \
                     record's {blocked:?} ran out",
                    answered - sent
                );
                assert!(
                    generation > g,
                    "the grant after a dead owner's record expired must have a fresh, larger \
                     generation: {generation} after the dead owner's {g}"
                );
                assert!(!takeover, "the dead owner's record is gone");
                break;
            }
            other => panic!("expected EXPIRED or OWNER, got {other:?}"),
        }
        tokio::time::sleep(LEASE / 8).await;
    }
    // Without a stall at least the first ACQUIRE past the lease lands while
    // the record lives: it is the one that shows EXPIRED.
    if expired == 0 {
        return Err(Stalled("the flight's record"));
    }
    Ok(())
}
