//! The conformance suite every [`Backend`] must pass: the rules of the
//! coordination contract (see [`flightdeck_distributed::backend`]) that a
//! backend alone is responsible for.
//!
//! Each check uses fresh flights, so one backend (one Redis) serves them
//! all. Checks panic with a message on violation, like `assert!`. Leases
//! are short ([`LEASE`]) so the expiry checks run in a few seconds of real
//! time; with the memory backend they also run under paused time.
//!
//! By file: `grants` (owners, followers, hits, leases, takeovers),
//! `results` (abandons, notices, cached failures, invalidation),
//! `fencing` (generations, token-checked commit and abandon, release by
//! token, a dead owner without takeover), `stale` (results kept past
//! their freshness, early refreshes, the throttle after a failed
//! refresh) and `layer` (the rules the L2
//! layer keeps over the backend: no lease left behind after an unknown
//! outcome, heartbeats until the commit has returned).
//!
//! The checks run in real time against a real server, so a loaded machine
//! may stall between two calls for longer than a lease. A verdict that
//! needs a lease or a record still alive when a call lands is only drawn
//! when that call's answer came back inside the window measured from
//! before the call that granted or renewed it was sent (a [`Window`]);
//! otherwise the check says nothing and runs again on a fresh flight, and
//! fails, naming the window, if the machine stalls every time. A verdict
//! that needs a window to have passed always holds: the checks sleep past
//! it after the answer came back.
//!
//! Generations are compared with each other, never with fixed numbers: a
//! backend may start a flight anywhere (the Redis backend starts from the
//! server's clock) as long as it never repeats or goes back.
//!
//! ```
//! use std::sync::Arc;
//! use flightdeck_test::{conformance, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! conformance::run_all(Arc::new(MemoryBackend::new())).await;
//! # }
//! ```

mod fencing;
mod grants;
mod layer;
mod results;
mod stale;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendErrorKind, CommitArgs, Committed, FlightId,
    LeaseTerms, Notice, OwnerToken, Released, Renewal, ResultStatus, StoredResult, Subscription,
    MAX_DURATION,
};
use tokio::time::Instant;

pub use fencing::*;
pub use grants::*;
pub use layer::*;
pub use results::*;
pub use stale::*;

/// The lease used by the expiry checks.
pub const LEASE: Duration = Duration::from_millis(400);

/// The state TTL of the checks that let a flight's whole record expire.
pub const SHORT_STATE: Duration = Duration::from_millis(1200);

/// Past the lease, well within the record that outlives it
/// ([`LeaseTerms::record_ttl`] is two leases with [`terms`]).
const PAST_LEASE: Duration = Duration::from_millis(500);

/// Past everything a flight granted with [`SHORT_STATE`] keeps.
const PAST_RECORD: Duration = Duration::from_millis(1600);

/// How often a check runs on a fresh flight before a stall every time
/// fails it.
pub const ATTEMPTS: usize = 5;

/// Taken off every window: the server's clock counts in milliseconds.
const CLOCK_MARGIN: Duration = Duration::from_millis(5);

/// The machine stalled past the window a verdict needed (named): the
/// attempt shows nothing either way (see [`conclusive`]).
#[derive(Debug)]
pub struct Stalled(pub &'static str);

/// A lease's or a record's life, measured from before the call that
/// granted or renewed it was sent: an answer that came back inside it
/// reached the server inside it. For checks in real time that need a
/// lease or a record still alive when a later call lands: open it right
/// before the granting call, and draw the verdict only if it
/// [`held`](Self::held) once the later call's answer came back.
///
/// ```
/// use flightdeck_test::conformance::{terms, Window};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let record = Window::record(&terms(true));
/// // ... grant, sleep past the lease, ask again ...
/// assert!(record.held());
/// tokio::time::sleep(terms(true).record_ttl()).await;
/// assert!(!record.held());
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Window {
    opened: Instant,
    len: Duration,
    what: &'static str,
}

impl Window {
    /// The lease a call about to be sent grants or renews.
    pub fn lease(t: &LeaseTerms) -> Self {
        Self::open(t.lease, "the lease")
    }

    /// The record a call about to be sent grants or renews.
    pub fn record(t: &LeaseTerms) -> Self {
        Self::open(t.record_ttl(), "the flight's record")
    }

    fn open(len: Duration, what: &'static str) -> Self {
        Window {
            opened: Instant::now(),
            len: len.saturating_sub(CLOCK_MARGIN),
            what,
        }
    }

    /// Whether the answers received so far all landed inside the window
    /// (less a few milliseconds for the server's clock).
    pub fn held(&self) -> bool {
        self.opened.elapsed() < self.len
    }

    /// [`held`](Self::held), for an attempt run by [`conclusive`].
    pub fn kept(&self) -> Result<(), Stalled> {
        if self.held() {
            Ok(())
        } else {
            Err(Stalled(self.what))
        }
    }
}

/// Runs `attempt` until it draws its verdict (a violation panics inside
/// it), on a fresh flight each time; panics, naming `check` and the
/// windows, after [`ATTEMPTS`] stalls in a row.
pub async fn conclusive<F, Fut>(check: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Stalled>>,
{
    let mut stalls = Vec::with_capacity(ATTEMPTS);
    for _ in 0..ATTEMPTS {
        match attempt().await {
            Ok(()) => return,
            Err(Stalled(what)) => stalls.push(what),
        }
    }
    panic!(
        "{check}: no verdict in {ATTEMPTS} attempts: each time the machine stalled past the \
         window a verdict needs ({stalls:?}); no rule was seen broken, none was checked"
    );
}

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

/// Commit arguments with a 30 s TTL (fresh and kept for waiters).
pub fn commit_args(payload: &'static [u8], inline_below: usize) -> CommitArgs {
    CommitArgs {
        payload: Bytes::from_static(payload),
        ttl: Duration::from_secs(30),
        retain: Duration::from_secs(30),
        inline_below,
        state_ttl: Duration::from_secs(30),
        stale_for: Duration::ZERO,
        work_time: Duration::ZERO,
        sent: None,
    }
}

/// A result kept for half a lease, with [`SHORT_STATE`].
fn short_commit(payload: &'static [u8]) -> CommitArgs {
    CommitArgs {
        ttl: LEASE / 2,
        retain: LEASE / 2,
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
        retry_after: Duration::ZERO,
    }
}

/// Follows `f` from this node, as a follower does when the backend has no
/// subscription in force: subscribes, then an ACQUIRE with a fresh token
/// that answers FOLLOWER (a backend may deliver notices only for flights
/// this node's ACQUIRE followed: the Redis backend's inbox). Panics on
/// any other answer.
async fn follow<B: Backend>(b: &B, f: &FlightId, t: &LeaseTerms) -> Subscription {
    let (sub, followed) = follow_within(b, f, t).await;
    assert!(followed, "the ACQUIRE after subscribing must follow");
    sub
}

/// [`follow`], saying whether the ACQUIRE followed instead of panicking
/// (a check that needs the lease alive decides by its window first).
async fn follow_within<B: Backend>(b: &B, f: &FlightId, t: &LeaseTerms) -> (Subscription, bool) {
    let sub = b.subscribe(f).await.unwrap();
    let answer = b.acquire(f, &OwnerToken::random(), t).await.unwrap();
    (sub, matches!(answer, Acquired::Follower { .. }))
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
/// A notice about a grant that ends after a subscribed node's ACQUIRE
/// followed it must arrive: a backend whose subscription is not yet in
/// force when `subscribe` returns fails here (the Redis backend puts a
/// barrier behind the `SUBSCRIBE` of its inbox, see `flightdeck-redis`'s
/// tests/pubsub.rs).
pub async fn run_all<B: Backend>(backend: Arc<B>) {
    let b = &*backend;
    owner_follower_hit(b).await;
    heartbeat_never_resurrects(b).await;
    takeover_fences_the_stale_owner(b).await;
    expired_without_takeover(b).await;
    late_commit_without_rival_succeeds(b).await;
    an_acquire_past_its_not_after_grants_nothing(b).await;
    abandon_wakes_followers(b).await;
    notices_carry_small_payloads_inline(b).await;
    failures_can_be_cached(b).await;
    results_are_kept_for_waiters_not_replayed(b).await;
    fresh_results_are_replayed_until_their_ttl(b).await;
    invalidate_fences_the_running_owner(b).await;
    exactly_one_takeover(backend.clone(), 20).await;
    stale_checks(b).await;
    // The fencing rules; independent flights, so they run side by side.
    tokio::join!(
        generations_never_repeat_or_decrease(b),
        commit_checks_token_and_generation(b),
        stale_owner_of_an_expired_record_is_fenced(b),
        abandon_checks_token_and_generation(b),
        release_frees_the_tokens_lease_whatever_its_generation(b),
        dead_owner_without_takeover_blocks_until_its_record_expires(b),
        // The layer's rules over this backend.
        an_unknown_outcome_leaves_no_lease(backend.clone()),
        the_owner_heartbeats_until_its_commit_has_returned(backend.clone()),
    );
}
