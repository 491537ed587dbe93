//! The conformance suite every [`Backend`] must pass: the rules of the
//! coordination contract (see [`flightdeck_distributed::backend`]) that a
//! backend alone is responsible for.
//!
//! Each check uses fresh flights, so one backend (one Redis) serves them
//! all. Checks panic with a message on violation, like `assert!`. Leases
//! are short ([`LEASE`]) so the expiry checks run in a few seconds of real
//! time; with the memory backend they also run under paused time.
//!
//! Generations are compared with each other, never with fixed numbers: a
//! backend may start a flight anywhere (the Redis backend starts from the
//! server's clock) as long as it never repeats or goes back.
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
use tokio::time::Instant;

/// The lease used by the expiry checks.
pub const LEASE: Duration = Duration::from_millis(400);

/// The state TTL of the checks that let a flight's whole record expire.
pub const SHORT_STATE: Duration = Duration::from_millis(1200);

/// Past the lease, well within the record that outlives it
/// ([`LeaseTerms::record_ttl`] is two leases with [`terms`]).
const PAST_LEASE: Duration = Duration::from_millis(500);

/// Past everything a flight granted with [`SHORT_STATE`] keeps.
const PAST_RECORD: Duration = Duration::from_millis(1600);

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

/// Like [`terms`], with [`SHORT_STATE`].
fn short_terms(allow_takeover: bool) -> LeaseTerms {
    LeaseTerms {
        state_ttl: SHORT_STATE,
        ..terms(allow_takeover)
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

/// A result kept for half a lease, with [`SHORT_STATE`].
fn short_commit(payload: &'static [u8]) -> CommitArgs {
    CommitArgs {
        ttl: LEASE / 2,
        state_ttl: SHORT_STATE,
        ..commit_args(payload, 1024)
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

/// Panics unless `answer` replays the result `payload` of `generation`.
fn expect_hit(answer: Acquired, generation: u64, payload: &[u8]) {
    match answer {
        Acquired::Hit(r) => {
            assert_eq!(r.generation, generation);
            assert_eq!(&r.payload[..], payload);
        }
        other => panic!("expected HIT, got {other:?}"),
    }
}

/// The generation of an OWNER answer; panics on anything else.
fn owned(answer: Acquired, what: &str) -> u64 {
    match answer {
        Acquired::Owner { generation, .. } => generation,
        other => panic!("{what}: expected OWNER, got {other:?}"),
    }
}

/// Runs every check.
///
/// A notice published after `subscribe` returned must arrive: a backend
/// whose subscription is not yet in force when `subscribe` returns fails
/// here (the Redis backend puts a barrier behind its `SUBSCRIBE`, see
/// `flightdeck-redis`'s tests/pubsub.rs).
pub async fn run_all<B: Backend>(backend: Arc<B>) {
    let b = &*backend;
    owner_follower_hit(b).await;
    heartbeat_never_resurrects(b).await;
    takeover_fences_the_stale_owner(b).await;
    expired_without_takeover(b).await;
    late_commit_without_rival_succeeds(b).await;
    abandon_wakes_followers(b).await;
    notices_carry_small_payloads_inline(b).await;
    failures_can_be_cached(b).await;
    invalidate_fences_the_running_owner(b).await;
    exactly_one_takeover(backend.clone(), 20).await;
    // The fencing rules; independent flights, so they run side by side.
    tokio::join!(
        generations_never_repeat_or_decrease(b),
        commit_checks_token_and_generation(b),
        stale_owner_of_an_expired_record_is_fenced(b),
        abandon_checks_token_and_generation(b),
        release_frees_the_tokens_lease_whatever_its_generation(b),
        dead_owner_without_takeover_blocks_until_its_record_expires(b),
    );
}

/// ACQUIRE answers OWNER, then FOLLOWER to others, OWNER with the same
/// generation to a retry of the same token (invariant 8); COMMIT is
/// idempotent (7); later acquires HIT.
pub async fn owner_follower_hit<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g = match b.acquire(&f, &a, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
        } => generation,
        other => panic!("a fresh flight: expected OWNER without takeover, got {other:?}"),
    };
    assert!(g >= 1, "generations start at 1 or later");
    match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Follower {
            generation,
            lease_remaining,
        } => {
            assert_eq!(generation, g);
            assert!(lease_remaining <= LEASE && !lease_remaining.is_zero());
        }
        other => panic!("expected FOLLOWER, got {other:?}"),
    }
    assert_eq!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Owner {
            generation: g,
            takeover: false
        },
        "a retried acquire with the same token must answer OWNER, same generation"
    );
    let args = commit_args(b"\x00result\xff", 1024);
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
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
}

/// HEARTBEAT extends only the holder's lease and never re-creates a lost
/// one, not even when nobody took the flight over (invariant 3).
pub async fn heartbeat_never_resurrects<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "a fresh flight");
    // Renewing keeps the lease past its first expiry.
    for _ in 0..6 {
        tokio::time::sleep(LEASE / 4).await;
        assert_eq!(b.heartbeat(&f, &a, g, &t).await.unwrap(), Renewal::Renewed);
    }
    assert!(matches!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Follower { .. }
    ));
    assert_eq!(b.heartbeat(&f, &c, g, &t).await.unwrap(), Renewal::Lost);
    assert_eq!(b.heartbeat(&f, &a, g + 1, &t).await.unwrap(), Renewal::Lost);
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.heartbeat(&f, &a, g, &t).await.unwrap(),
        Renewal::Lost,
        "an expired lease must not be renewed by a heartbeat"
    );
    assert_eq!(b.heartbeat(&f, &a, g, &t).await.unwrap(), Renewal::Lost);
    let gc = match b.acquire(&f, &c, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: true,
        } => generation,
        other => panic!("the lease stayed expired: expected a takeover, got {other:?}"),
    };
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        b.heartbeat(&f, &c, gc, &t).await.unwrap(),
        Renewal::Lost,
        "a heartbeat after everything expired must not re-create the lease"
    );
}

/// After expiry a follower takes over with a newer generation (invariant
/// 1); the stale owner's commit is FENCED and the new result stands (2).
pub async fn takeover_fences_the_stale_owner<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (stale, fresh, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(true);
    let g1 = owned(b.acquire(&f, &stale, &t).await.unwrap(), "a fresh flight");
    tokio::time::sleep(PAST_LEASE).await;
    let g2 = match b.acquire(&f, &fresh, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: true,
        } => generation,
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert!(g2 > g1, "a takeover's generation {g2} must exceed {g1}");
    match b.acquire(&f, &other, &t).await.unwrap() {
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
    assert_eq!(
        b.commit(&f, &fresh, g2, &new).await.unwrap(),
        Committed::Committed
    );
    assert_eq!(
        b.commit(&f, &stale, g1, &old).await.unwrap(),
        Committed::Fenced
    );
    expect_hit(b.acquire(&f, &other, &t).await.unwrap(), g2, b"new");
}

/// Without takeover an expired flight answers EXPIRED, and nothing changes.
pub async fn expired_without_takeover<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let g1 = owned(b.acquire(&f, &a, &terms(true)).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.acquire(&f, &c, &terms(false)).await.unwrap(),
        Acquired::Expired { generation: g1 }
    );
    match b.acquire(&f, &c, &terms(true)).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: true,
        } => assert!(generation > g1),
        other => panic!("expected a takeover, got {other:?}"),
    }
}

/// An owner whose lease expired may still commit if nobody was granted the
/// flight since (the commit rule).
pub async fn late_commit_without_rival_succeeds<B: Backend>(b: &B) {
    let f = fresh_flight();
    let a = OwnerToken::random();
    let g = owned(b.acquire(&f, &a, &terms(true)).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.commit(&f, &a, g, &commit_args(b"late", 1024))
            .await
            .unwrap(),
        Committed::Committed
    );
}

/// ABANDON releases at once and wakes subscribers; the next acquire owns
/// a newer generation without a takeover.
pub async fn abandon_wakes_followers<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = b.subscribe(&f).await.unwrap();
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
    let mut sub = b.subscribe(&f).await.unwrap();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    b.commit(&f, &a, g, &commit_args(b"\x01small\xfe|x", 64))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: g,
            inline: Some(Bytes::from_static(b"\x01small\xfe|x"))
        }
    );
    drop(sub);

    let f = fresh_flight();
    let mut sub = b.subscribe(&f).await.unwrap();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    b.commit(&f, &a, g, &commit_args(b"too large to inline", 4))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut sub).await,
        Notice::Committed {
            generation: g,
            inline: None
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
    let mut sub = b.subscribe(&f).await.unwrap();
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
        } => assert!(generation > gi2, "the stored result is gone"),
        other => panic!("the stored result is gone: expected OWNER, got {other:?}"),
    }
}

/// N concurrent acquirers after a dead owner's lease expired: exactly one
/// takes over (invariant 4), the others follow its generation.
pub async fn exactly_one_takeover<B: Backend>(b: Arc<B>, n: usize) {
    let f = fresh_flight();
    let dead = OwnerToken::random();
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
    let mut owners = Vec::new();
    let mut followed = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Acquired::Owner {
                generation,
                takeover: true,
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
}

/// Rule 1: the generations handed out for a flight never repeat and never
/// decrease, whatever expired in between: a result, a lease, an abandoned
/// grant, the flight's whole record, an invalidation.
pub async fn generations_never_repeat_or_decrease<B: Backend>(b: &B) {
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
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "a fresh flight");
    next("the first grant", g);
    assert_eq!(
        b.commit(&f, &a, g, &short_commit(b"r")).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(LEASE).await;

    let c = tok();
    let g = owned(b.acquire(&f, &c, &t).await.unwrap(), "the result expired");
    next("after the result expired", g);
    assert_eq!(
        b.abandon(&f, &c, g, &abandon_args(None)).await.unwrap(),
        Released::Released
    );
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
}

/// Rule 2 for COMMIT: only (token, generation) of the last grant commits,
/// also once its lease ran out with nobody granted since; a token that was
/// never granted the flight, or the owner with another generation, is
/// FENCED; a retry of a done commit answers COMMITTED.
pub async fn commit_checks_token_and_generation<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, s) = (OwnerToken::random(), OwnerToken::random());
    let t = terms(true);
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
    assert_eq!(
        b.commit(&f, &a, g, &mine).await.unwrap(),
        Committed::Committed,
        "the last grant commits late"
    );
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
}

/// Rules 1 and 2: an owner paused until the flight's whole record expired
/// cannot commit over the next owner, even when that owner's lease ran
/// out too: the stale commit is FENCED, the new one COMMITTED, and the new
/// generation is larger.
pub async fn stale_owner_of_an_expired_record_is_fenced<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (stale, fresh) = (OwnerToken::random(), OwnerToken::random());
    let t = short_terms(true);
    let gs = owned(b.acquire(&f, &stale, &t).await.unwrap(), "fresh");
    tokio::time::sleep(PAST_RECORD).await;
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
    assert_eq!(
        b.commit(&f, &fresh, gf, &commit_args(b"fresh", 1024))
            .await
            .unwrap(),
        Committed::Committed,
        "the last grant commits"
    );
    assert!(gf > gs, "generation {gf} granted after {gs}");
    expect_hit(b.acquire(&f, &stale, &t).await.unwrap(), gf, b"fresh");
}

/// Rule 2 for ABANDON: only (token, generation) of the last grant
/// releases, while its lease lives or after it ran out (which frees a
/// flight that may not be taken over at once); anyone else gets NOT_OWNER
/// and changes nothing.
pub async fn abandon_checks_token_and_generation<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (a, s, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t = terms(false);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    for (who, generation) in [(&s, g), (&a, g + 1), (&a, g.saturating_sub(1))] {
        assert_eq!(
            b.abandon(&f, who, generation, &abandon_args(None))
                .await
                .unwrap(),
            Released::NotOwner
        );
    }
    assert_eq!(
        b.acquire(&f, &a, &t).await.unwrap(),
        Acquired::Owner {
            generation: g,
            takeover: false
        },
        "the lease is untouched"
    );
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Expired { generation: g }
    );
    let mut sub = b.subscribe(&f).await.unwrap();
    assert_eq!(
        b.abandon(&f, &s, g, &abandon_args(None)).await.unwrap(),
        Released::NotOwner
    );
    assert_eq!(
        b.abandon(&f, &a, g, &abandon_args(None)).await.unwrap(),
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
        } => assert!(generation > g),
        other => panic!("an abandoned flight is free: expected OWNER, got {other:?}"),
    }
}

/// Rule 3: RELEASE frees the lease held by a token whatever its generation
/// (its caller may never have learned it) and wakes followers; the token
/// is never granted the flight again, so a late duplicate of its ACQUIRE
/// grants nothing, also when the RELEASE ran first; anyone else's RELEASE
/// is NOT_OWNER and changes nothing; a stored result is untouched.
pub async fn release_frees_the_tokens_lease_whatever_its_generation<B: Backend>(b: &B) {
    let f = fresh_flight();
    let tok = OwnerToken::random;
    let (a, c, s) = (tok(), tok(), tok());
    let t = terms(false);
    let state = Duration::from_secs(30);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap(), "fresh");
    let mut sub = b.subscribe(&f).await.unwrap();
    assert_eq!(b.release(&f, &s, state).await.unwrap(), Released::NotOwner);
    assert!(matches!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g
    ));
    assert_eq!(b.release(&f, &a, state).await.unwrap(), Released::Released);
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
    let gu = owned(b.acquire(&f, &u, &t).await.unwrap(), "not blocked");
    // Released after its lease ran out: frees a flight without takeover.
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        b.acquire(&f, &v, &t).await.unwrap(),
        Acquired::Expired { generation: gu }
    );
    assert_eq!(b.release(&f, &u, state).await.unwrap(), Released::Released);
    let gv = owned(b.acquire(&f, &v, &t).await.unwrap(), "released");
    assert!(gv > gu);
    // A stored result is untouched.
    assert_eq!(
        b.commit(&f, &v, gv, &commit_args(b"kept", 1024))
            .await
            .unwrap(),
        Committed::Committed
    );
    assert_eq!(b.release(&f, &v, state).await.unwrap(), Released::NotOwner);
    expect_hit(b.acquire(&f, &w, &t).await.unwrap(), gv, b"kept");
}

/// Rule 4: with takeover disallowed, a dead owner's flight (its lease ran
/// out, no commit or abandon) answers EXPIRED with the dead generation
/// until the grant's record expires ([`LeaseTerms::record_ttl`] after the
/// grant), and the next grant then has a fresh, larger generation.
pub async fn dead_owner_without_takeover_blocks_until_its_record_expires<B: Backend>(b: &B) {
    let f = fresh_flight();
    let (dead, c) = (OwnerToken::random(), OwnerToken::random());
    let t = short_terms(false);
    let granted = Instant::now();
    let g = owned(b.acquire(&f, &dead, &t).await.unwrap(), "fresh");
    tokio::time::sleep(LEASE / 2).await;
    assert!(matches!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g
    ));
    tokio::time::sleep(PAST_LEASE - LEASE / 2).await;
    assert_eq!(
        b.acquire(&f, &c, &t).await.unwrap(),
        Acquired::Expired { generation: g },
        "a dead owner's flight without takeover answers EXPIRED"
    );
    let blocked = t.record_ttl();
    loop {
        tokio::time::sleep(LEASE / 8).await;
        match b.acquire(&f, &c, &t).await.unwrap() {
            Acquired::Expired { generation } => assert_eq!(generation, g),
            Acquired::Owner {
                generation,
                takeover,
            } => {
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
        assert!(
            granted.elapsed() <= blocked + LEASE / 2,
            "blocked for {:?}, longer than the record's {blocked:?}",
            granted.elapsed()
        );
    }
    assert!(
        granted.elapsed() >= blocked,
        "blocked for {:?}, less than the record's {blocked:?}",
        granted.elapsed()
    );
}
