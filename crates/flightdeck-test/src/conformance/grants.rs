//! Grants, leases and takeovers: who owns a flight, how long, and who
//! takes it over when its owner's lease runs out.

use super::*;

/// ACQUIRE answers OWNER, then FOLLOWER to others, OWNER with the same
/// generation to a retry of the same token (invariant 8); COMMIT is
/// idempotent (7); later acquires HIT.
pub async fn owner_follower_hit<B: Backend>(b: &B) {
    conclusive("owner_follower_hit", || owner_follower_hit_once(b)).await
}

async fn owner_follower_hit_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let lease = Window::lease(&t);
    let g = match b.acquire(&f, &a, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => generation,
        other => panic!("a fresh flight: expected OWNER without takeover, got {other:?}"),
    };
    assert!(g >= 1, "generations start at 1 or later");
    let follower = b.acquire(&f, &c, &t).await.unwrap();
    lease.kept()?;
    match follower {
        Acquired::Follower {
            generation,
            lease_remaining,
            ..
        } => {
            assert_eq!(generation, g);
            assert!(lease_remaining <= LEASE && !lease_remaining.is_zero());
        }
        other => panic!("expected FOLLOWER, got {other:?}"),
    }
    let retried = b.acquire(&f, &a, &t).await.unwrap();
    let args = commit_args(b"\x00result\xff", 1024);
    let committed = b.commit(&f, &a, g, &args).await.unwrap();
    lease.kept()?;
    assert_eq!(
        retried,
        Acquired::Owner {
            generation: g,
            takeover: false,
            stale: None
        },
        "a retried acquire with the same token must answer OWNER, same generation"
    );
    assert_eq!(committed, Committed::Committed);
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed,
        "a retried commit must be idempotent"
    );
    assert_eq!(
        b.commit(&f, &c, g, &args).await.unwrap(),
        Committed::Fenced,
        "a commit from another token must be fenced"
    );
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.generation, g);
            assert_eq!(r.status, ResultStatus::Ok);
            assert_eq!(&r.payload[..], b"\x00result\xff");
        }
        other => panic!("expected HIT, got {other:?}"),
    }
    Ok(())
}

/// HEARTBEAT extends only the holder's lease and never re-creates a lost
/// one, not even when nobody took the flight over (invariant 3).
pub async fn heartbeat_never_resurrects<B: Backend>(b: &B) {
    conclusive("heartbeat_never_resurrects", || {
        heartbeat_never_resurrects_once(b)
    })
    .await
}

async fn heartbeat_never_resurrects_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let (mut lease, mut record) = (Window::lease(&t), Window::record(&t));
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "a fresh flight");
    // Renewing keeps the lease past its first expiry.
    for _ in 0..6 {
        tokio::time::sleep(LEASE / 4).await;
        let renewed = (Window::lease(&t), Window::record(&t));
        let renewal = b.heartbeat(&f, &a, g, &t).await.unwrap();
        lease.kept()?;
        assert_eq!(renewal, Renewal::Renewed);
        (lease, record) = renewed;
    }
    let follower = b.acquire(&f, &c, &t).await.unwrap();
    lease.kept()?;
    assert!(matches!(follower, Acquired::Follower { .. }));
    assert_eq!(b.heartbeat(&f, &c, g, &t).await.unwrap(), Renewal::Lost);
    assert_eq!(b.heartbeat(&f, &a, g + 1, &t).await.unwrap(), Renewal::Lost);
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.heartbeat(&f, &a, g, &t).await.unwrap(),
        Renewal::Lost,
        "an expired lease must not be renewed by a heartbeat"
    );
    assert_eq!(b.heartbeat(&f, &a, g, &t).await.unwrap(), Renewal::Lost);
    let taken = b.acquire(&f, &c, &t).await.unwrap();
    record.kept()?;
    let gc = match taken {
        Acquired::Owner {
            generation,
            takeover: true,
            ..
        } => generation,
        other => panic!("the lease stayed expired: expected a takeover, got {other:?}"),
    };
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        b.heartbeat(&f, &c, gc, &t).await.unwrap(),
        Renewal::Lost,
        "a heartbeat after everything expired must not re-create the lease"
    );
    Ok(())
}

/// After expiry a follower takes over with a newer generation (invariant
/// 1); the stale owner's commit is FENCED and the new result stands (2).
pub async fn takeover_fences_the_stale_owner<B: Backend>(b: &B) {
    conclusive("takeover_fences_the_stale_owner", || {
        takeover_fences_the_stale_owner_once(b)
    })
    .await
}

async fn takeover_fences_the_stale_owner_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (stale, fresh, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(true);
    let first = Window::record(&t);
    let g1 = owned(b.acquire(&f, &stale, &t).await.unwrap(), "a fresh flight");
    tokio::time::sleep(PAST_LEASE).await;
    let (lease, record) = (Window::lease(&t), Window::record(&t));
    let taken = b.acquire(&f, &fresh, &t).await.unwrap();
    first.kept()?;
    let g2 = match taken {
        Acquired::Owner {
            generation,
            takeover: true,
            ..
        } => generation,
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert!(g2 > g1, "a takeover's generation {g2} must exceed {g1}");
    let follower = b.acquire(&f, &other, &t).await.unwrap();
    lease.kept()?;
    match follower {
        Acquired::Follower { generation, .. } => assert_eq!(generation, g2),
        other => panic!("expected FOLLOWER, got {other:?}"),
    }
    assert_eq!(
        b.heartbeat(&f, &stale, g1, &t).await.unwrap(),
        Renewal::Lost
    );
    let old = commit_args(b"old", 1024);
    assert_eq!(
        b.commit(&f, &stale, g1, &old).await.unwrap(),
        Committed::Fenced
    );
    let new = commit_args(b"new", 1024);
    let committed = b.commit(&f, &fresh, g2, &new).await.unwrap();
    record.kept()?;
    assert_eq!(committed, Committed::Committed);
    assert_eq!(
        b.commit(&f, &stale, g1, &old).await.unwrap(),
        Committed::Fenced
    );
    expect_hit(b.acquire(&f, &other, &t).await.unwrap(), g2, b"new");
    Ok(())
}

/// Without takeover an expired flight answers EXPIRED, and nothing changes.
pub async fn expired_without_takeover<B: Backend>(b: &B) {
    conclusive("expired_without_takeover", || {
        expired_without_takeover_once(b)
    })
    .await
}

async fn expired_without_takeover_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let record = Window::record(&terms(true));
    let g1 = owned(b.acquire(&f, &a, &terms(true)).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_LEASE).await;
    let expired = b.acquire(&f, &c, &terms(false)).await.unwrap();
    let taken = b.acquire(&f, &c, &terms(true)).await.unwrap();
    record.kept()?;
    assert_eq!(expired, Acquired::Expired { generation: g1 });
    match taken {
        Acquired::Owner {
            generation,
            takeover: true,
            ..
        } => assert!(generation > g1),
        other => panic!("expected a takeover, got {other:?}"),
    }
    Ok(())
}

/// An owner whose lease expired may still commit if nobody was granted the
/// flight since (the commit rule).
pub async fn late_commit_without_rival_succeeds<B: Backend>(b: &B) {
    conclusive("late_commit_without_rival_succeeds", || {
        late_commit_without_rival_succeeds_once(b)
    })
    .await
}

async fn late_commit_without_rival_succeeds_once<B: Backend>(b: &B) -> Result<(), Stalled> {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let record = Window::record(&terms(true));
    let g = owned(b.acquire(&f, &a, &terms(true)).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_LEASE).await;
    let late = b.commit(&f, &a, g, &commit_args(b"late", 1024)).await;
    record.kept()?;
    assert_eq!(late.unwrap(), Committed::Committed);
    Ok(())
}

/// N concurrent acquirers after a dead owner's lease expired: exactly one
/// takes over (invariant 4), the others follow its generation.
pub async fn exactly_one_takeover<B: Backend>(b: Arc<B>, n: usize) {
    conclusive("exactly_one_takeover", || {
        exactly_one_takeover_once(b.clone(), n)
    })
    .await
}

async fn exactly_one_takeover_once<B: Backend>(b: Arc<B>, n: usize) -> Result<(), Stalled> {
    let f = fresh_flight();
    let dead = OwnerToken::random();
    let record = Window::record(&terms(true));
    let g1 = owned(b.acquire(&f, &dead, &terms(true)).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_LEASE).await;
    let mut tasks = Vec::new();
    for _ in 0..n {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let tok = OwnerToken::random();
            b.acquire(&f, &tok, &terms(true)).await.unwrap()
        }));
    }
    let mut answers = Vec::with_capacity(n);
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    // Every acquire landed before the dead owner's record expired, so
    // none of them may find the flight free (a grant without takeover).
    record.kept()?;
    let mut owners = Vec::new();
    let mut followed = Vec::new();
    for answer in answers {
        match answer {
            Acquired::Owner {
                generation,
                takeover: true,
                ..
            } => owners.push(generation),
            Acquired::Follower { generation, .. } => followed.push(generation),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(owners.len(), 1, "exactly one takeover: {owners:?}");
    assert!(owners[0] > g1);
    assert!(
        followed.iter().all(|g| *g == owners[0]),
        "followers follow the new owner's generation {}: {followed:?}",
        owners[0]
    );
    Ok(())
}

/// An ACQUIRE that reaches the store after its caller gave it up
/// ([`Ask::not_after`] past) grants nothing and answers *unavailable*: a
/// late ACQUIRE (queued on a frozen server, resent after its caller
/// walked away) leaves no lease nobody works on. One whose caller still
/// waits is answered as always. The flight is granted and ended first,
/// so that a backend that learns the store's clock from its answers (the
/// Redis backend) has heard from the flight's node.
pub async fn an_acquire_past_its_not_after_grants_nothing<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, late, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let g = owned(b.acquire(&f, &a, &terms(true)).await.unwrap(), "fresh");
    let ended = b.abandon(&f, &a, g, &abandon_args(None)).await.unwrap();
    assert_eq!(ended, Released::Released);
    let gave_up = Instant::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let past = Ask {
        not_after: Some(gave_up),
        ..Ask::default()
    };
    match b.acquire_with(&f, &late, past, &terms(true)).await {
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}"),
        Ok(a) => panic!("an acquire past its not-after was answered {a:?}"),
    }
    let waiting = Ask {
        not_after: Some(Instant::now() + Duration::from_secs(30)),
        ..Ask::default()
    };
    match b
        .acquire_with(&f, &c, waiting, &terms(false))
        .await
        .unwrap()
    {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => assert!(generation > g),
        other => panic!("the late acquire left a grant behind: {other:?}"),
    }
}
