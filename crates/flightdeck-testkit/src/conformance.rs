//! The conformance suite every [`Backend`] must pass: the invariants of
//! anchors-distributed §6 that a backend alone is responsible for.
//!
//! Each check uses fresh flights, so one backend (one Redis) serves them
//! all. Checks panic with a message on violation, like `assert!`. Leases
//! are short ([`LEASE`]) so the expiry checks run in well under a second of
//! real time; with the memory backend they also run under paused time.
//!
//! ```
//! use std::sync::Arc;
//! use flightdeck_testkit::{conformance, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! conformance::run_all(Arc::new(MemoryBackend::new())).await;
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, CommitArgs, Committed, FlightId, LeaseTerms, Notice,
    OwnerToken, Released, Renewal, ResultStatus, Subscription,
};

/// The lease used by the expiry checks.
pub const LEASE: Duration = Duration::from_millis(400);

/// A fresh flight id.
pub fn fresh_flight() -> FlightId {
    let n: u128 = rand::random();
    FlightId::of(&FlightKey::from_bytes(
        StageName::new("conformance").expect("valid stage name"),
        n.to_le_bytes(),
    ))
}

/// Lease terms with [`LEASE`] and takeover as given.
pub fn terms(allow_takeover: bool) -> LeaseTerms {
    LeaseTerms {
        lease: LEASE,
        state_ttl: Duration::from_secs(30),
        allow_takeover,
    }
}

/// Commit arguments with a 30 s TTL.
pub fn commit_args(payload: &'static [u8], inline_below: usize) -> CommitArgs {
    CommitArgs {
        payload: Bytes::from_static(payload),
        ttl: Duration::from_secs(30),
        inline_below,
        state_ttl: Duration::from_secs(30),
    }
}

fn abandon_args(failure: Option<&'static str>) -> AbandonArgs {
    AbandonArgs {
        failure: failure.map(|s| Bytes::from_static(s.as_bytes())),
        failure_ttl: if failure.is_some() {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        },
        state_ttl: Duration::from_secs(30),
    }
}

async fn next_notice(sub: &mut Subscription) -> Notice {
    tokio::time::timeout(Duration::from_secs(5), sub.recv())
        .await
        .expect("no notice within 5s")
        .expect("subscription open")
}

/// Runs every check.
///
/// A notice published after `subscribe` returned must arrive: a backend
/// whose subscription is not yet in force when `subscribe` returns fails
/// here (the Redis backend puts a barrier behind its `SUBSCRIBE`, see
/// `flightdeck-redis`'s tests/pubsub.rs).
pub async fn run_all<B: Backend>(backend: Arc<B>) {
    owner_follower_hit(&*backend).await;
    heartbeat_never_resurrects(&*backend).await;
    takeover_fences_the_stale_owner(&*backend).await;
    expired_without_takeover(&*backend).await;
    late_commit_without_rival_succeeds(&*backend).await;
    abandon_wakes_followers(&*backend).await;
    notices_carry_small_payloads_inline(&*backend).await;
    failures_can_be_cached(&*backend).await;
    invalidate_fences_the_running_owner(&*backend).await;
    exactly_one_takeover(backend.clone(), 20).await;
}

/// ACQUIRE answers OWNER, then FOLLOWER to others, OWNER with the same
/// generation to a retry of the same token (invariant 8); COMMIT is
/// idempotent (7); later acquires HIT.
pub async fn owner_follower_hit<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    assert_eq!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Owner {
            generation: 1,
            takeover: false
        }
    );
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Follower {
            generation,
            lease_remaining,
        } => {
            assert_eq!(generation, 1);
            assert!(lease_remaining <= LEASE && !lease_remaining.is_zero());
        }
        other => panic!("expected FOLLOWER, got {other:?}"),
    }
    assert_eq!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Owner {
            generation: 1,
            takeover: false
        },
        "a retried acquire with the same token must answer OWNER, same generation"
    );
    let args = commit_args(b"\x00result\xff", 1024);
    assert_eq!(
        b.commit(&f, &a, 1, &args).await.unwrap(),
        Committed::Committed
    );
    assert_eq!(
        b.commit(&f, &a, 1, &args).await.unwrap(),
        Committed::Committed,
        "a retried commit must be idempotent"
    );
    assert_eq!(
        b.commit(&f, &c, 1, &args).await.unwrap(),
        Committed::Fenced,
        "a commit from another token must be fenced"
    );
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.generation, 1);
            assert_eq!(r.status, ResultStatus::Ok);
            assert_eq!(&r.payload[..], b"\x00result\xff");
        }
        other => panic!("expected HIT, got {other:?}"),
    }
}

/// HEARTBEAT extends only the holder's lease and never re-creates a lost
/// one (invariant 3).
pub async fn heartbeat_never_resurrects<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    b.acquire(&f, &a, &t).await.unwrap();
    // Renewing keeps the lease past its first expiry.
    for _ in 0..6 {
        tokio::time::sleep(LEASE / 4).await;
        assert_eq!(b.heartbeat(&f, &a, 1, &t).await.unwrap(), Renewal::Renewed);
    }
    assert!(matches!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Follower { .. }
    ));
    assert_eq!(b.heartbeat(&f, &c, 1, &t).await.unwrap(), Renewal::Lost);
    assert_eq!(b.heartbeat(&f, &a, 2, &t).await.unwrap(), Renewal::Lost);
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        b.heartbeat(&f, &a, 1, &t).await.unwrap(),
        Renewal::Lost,
        "an expired lease must not be re-created by a heartbeat"
    );
    assert_eq!(b.heartbeat(&f, &a, 1, &t).await.unwrap(), Renewal::Lost);
}

/// After expiry a follower takes over with generation + 1 (invariant 1);
/// the stale owner's commit is FENCED and the new result stands (2).
pub async fn takeover_fences_the_stale_owner<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (stale, fresh, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(true);
    b.acquire(&f, &stale, &t).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        b.acquire(&f, &fresh, &t).await.unwrap(),
        Acquired::Owner {
            generation: 2,
            takeover: true
        }
    );
    assert!(matches!(
        b.acquire(&f, &other, &t).await.unwrap(),
        Acquired::Follower { generation: 2, .. }
    ));
    assert_eq!(b.heartbeat(&f, &stale, 1, &t).await.unwrap(), Renewal::Lost);
    let old = commit_args(b"old", 1024);
    assert_eq!(
        b.commit(&f, &stale, 1, &old).await.unwrap(),
        Committed::Fenced
    );
    let new = commit_args(b"new", 1024);
    assert_eq!(
        b.commit(&f, &fresh, 2, &new).await.unwrap(),
        Committed::Committed
    );
    assert_eq!(
        b.commit(&f, &stale, 1, &old).await.unwrap(),
        Committed::Fenced
    );
    match b.acquire(&f, &other, &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.generation, 2);
            assert_eq!(&r.payload[..], b"new");
        }
        other => panic!("expected HIT, got {other:?}"),
    }
}

/// Without takeover an expired flight answers EXPIRED, and nothing changes.
pub async fn expired_without_takeover<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    b.acquire(&f, &a, &terms(true)).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        b.acquire(&f, &c, &terms(false)).await.unwrap(),
        Acquired::Expired { generation: 1 }
    );
    assert_eq!(
        b.acquire(&f, &c, &terms(true)).await.unwrap(),
        Acquired::Owner {
            generation: 2,
            takeover: true
        }
    );
}

/// An owner whose lease expired may still commit if nobody was granted the
/// flight since (§5 commit rule).
pub async fn late_commit_without_rival_succeeds<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    b.acquire(&f, &a, &terms(true)).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        b.commit(&f, &a, 1, &commit_args(b"late", 1024))
            .await
            .unwrap(),
        Committed::Committed
    );
}

/// ABANDON releases at once and wakes subscribers; the next acquire owns
/// generation + 1 without a takeover.
pub async fn abandon_wakes_followers<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    b.acquire(&f, &a, &t).await.unwrap();
    let mut sub = b.subscribe(&f).await.unwrap();
    assert_eq!(
        b.abandon(&f, &a, 1, &abandon_args(None)).await.unwrap(),
        Released::Released
    );
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: 1 }
    );
    assert_eq!(
        b.abandon(&f, &a, 1, &abandon_args(None)).await.unwrap(),
        Released::NotOwner
    );
    assert_eq!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Owner {
            generation: 2,
            takeover: false
        }
    );
    assert_eq!(
        b.commit(&f, &a, 1, &commit_args(b"x", 0)).await.unwrap(),
        Committed::Fenced
    );
}

/// Completion notices carry payloads up to the inline limit.
pub async fn notices_carry_small_payloads_inline<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let t = terms(true);
    let mut sub = b.subscribe(&f).await.unwrap();
    b.acquire(&f, &a, &t).await.unwrap();
    b.commit(&f, &a, 1, &commit_args(b"\x01small\xfe|x", 64))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: 1,
            inline: Some(Bytes::from_static(b"\x01small\xfe|x"))
        }
    );
    drop(sub);

    let g = fresh_flight();
    let mut sub = b.subscribe(&g).await.unwrap();
    b.acquire(&g, &a, &t).await.unwrap();
    b.commit(&g, &a, 1, &commit_args(b"too large to inline", 4))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: 1,
            inline: None
        }
    );
}

/// An abandon with a failure and a TTL is replayed as a failed HIT.
pub async fn failures_can_be_cached<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    b.acquire(&f, &a, &t).await.unwrap();
    b.abandon(&f, &a, 1, &abandon_args(Some("boom")))
        .await
        .unwrap();
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Hit(r) => {
            assert_eq!(r.status, ResultStatus::Failed);
            assert_eq!(&r.payload[..], b"boom");
        }
        other => panic!("expected a failed HIT, got {other:?}"),
    }
}

/// INVALIDATE drops the result and the lease and fences the running owner
/// (invariant 11); the next acquire owns a new generation.
pub async fn invalidate_fences_the_running_owner<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    b.acquire(&f, &a, &t).await.unwrap();
    let mut sub = b.subscribe(&f).await.unwrap();
    assert_eq!(b.invalidate(&f, Duration::from_secs(30)).await.unwrap(), 2);
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Abandoned { generation: 2 }
    );
    assert_eq!(b.heartbeat(&f, &a, 1, &t).await.unwrap(), Renewal::Lost);
    assert_eq!(
        b.commit(&f, &a, 1, &commit_args(b"stale", 1024))
            .await
            .unwrap(),
        Committed::Fenced
    );
    assert_eq!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Owner {
            generation: 3,
            takeover: false
        }
    );
    b.commit(&f, &c, 3, &commit_args(b"fresh", 1024))
        .await
        .unwrap();
    assert!(matches!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Hit(_)
    ));
    assert_eq!(b.invalidate(&f, Duration::from_secs(30)).await.unwrap(), 4);
    assert_eq!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Owner {
            generation: 5,
            takeover: false
        },
        "the stored result is gone"
    );
}

/// N concurrent acquirers after a dead owner's lease expired: exactly one
/// takes over (invariant 4).
pub async fn exactly_one_takeover<B: Backend>(b: Arc<B>, n: usize) {
    let f = fresh_flight();
    let dead = OwnerToken::random();
    b.acquire(&f, &dead, &terms(true)).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    let mut tasks = Vec::new();
    for _ in 0..n {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let tok = OwnerToken::random();
            b.acquire(&f, &tok, &terms(true)).await.unwrap()
        }));
    }
    let mut owners = 0;
    for t in tasks {
        match t.await.unwrap() {
            Acquired::Owner {
                generation: 2,
                takeover: true,
            } => owners += 1,
            Acquired::Follower { generation: 2, .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(owners, 1, "exactly one takeover");
}
