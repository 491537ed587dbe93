//! A follower's wait for another node's flight: with a subscription that
//! was in force before its first call, nothing more; without, subscribe
//! and re-check. Then wait
//! for the completion notice (small results come inline) or poll with
//! jitter; take the flight over when the owner's lease expires.
//!
//! A follower never runs the work while another node may hold the lease:
//! failed re-checks go to the fallback's `while_following` (answer now, or
//! keep following), and only once following has ended (the wait timed out,
//! the owner's lease ran out where takeover is not allowed, a re-check
//! answered garbage) may the fallback say "run here".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::error::{BoxError, ErrorClass, OwnerGone, RemoteFailure, WaitTimeout};
use flightdeck_core::time::jittered;
use flightdeck_core::Shareable;
use tokio::time::{sleep_until, Instant};

use crate::backend::{Acquired, Ask, Backend, BackendErrorKind, Notice, Subscription};
use crate::cached_failure;
use crate::codec::ResultCodec;
use crate::fallback::{FailureClass, Fallback, WaitEnded};
use crate::flights::{wait_deadline, Cx, State};
use crate::lease_release::TokenGuard;
use crate::metrics::Op;
use crate::stale::{Answered, Reply};
use crate::work::{Execute, Role};

/// What a caller gets when the store throttles the key's work after a
/// failed refresh (it answers `STALE` and grants nothing) and no kept
/// result may answer it here: that failure, which a copy standing by
/// answers in turn (`stale-if-error`).
pub(crate) fn throttled() -> BoxError {
    Box::new(RemoteFailure::new(
        ErrorClass::Unavailable,
        "the refresh failed; the store throttles the next one",
    ))
}

/// The shortest pause between two re-checks of a follower.
const MIN_POLL: Duration = Duration::from_millis(5);

/// What the flight's first call answered, and what it shared.
pub(crate) struct Following {
    /// The generation followed.
    pub(crate) generation: u64,
    /// How long the owner's lease had left; `None` when it had run out
    /// and takeover is not allowed (nothing to wait for).
    pub(crate) lease_remaining: Option<Duration>,
    /// A subscription in force before the first call
    /// ([`Backend::join_subscription`]): no notice sent after that call
    /// ran can be missed, so no re-check is needed.
    pub(crate) joined: Option<Subscription>,
    /// A kept result stands by for this follower (it was answered beside
    /// the first call): its re-checks ask for stale results, so that the
    /// store's throttle after the followed refresh failed holds for it
    /// too (it is answered STALE, runs nothing), and a grant after the
    /// throttle is a refresh whose failure throttles the next.
    pub(crate) stale: bool,
}

/// Follows the flight another node owns until its result comes (or the
/// wait ends): how this caller was answered says so when the result is
/// another node's ([`Answered::Followed`]: how old, of how long a work).
// An async block, as `follow_until`: see `State::decided`.
#[allow(clippy::manual_async_fn)]
pub(crate) fn follow<'a, B, C, Req, E, P>(
    st: &'a Arc<State<B, C>>,
    cx: &'a Cx,
    guard: TokenGuard<'a, B, C>,
    first: Following,
    req: Req,
    exec: E,
    fallback: &'a P,
) -> impl Future<Output = Reply<E::Shared, E::Output>> + 'a
where
    B: Backend,
    C: ResultCodec<E::Shared> + Send + Sync + 'static,
    Req: Send + 'a,
    E: Execute<Req> + 'a,
    P: Fallback<Req>,
{
    async move {
        let mut came = None;
        let out = follow_until(st, cx, guard, first, req, exec, fallback, &mut came).await;
        out.map(|s| (s, came.unwrap_or(Answered::Ran)))
    }
}

#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
fn follow_until<'a, B, C, Req, E, P>(
    st: &'a Arc<State<B, C>>,
    cx: &'a Cx,
    mut guard: TokenGuard<'a, B, C>,
    first: Following,
    req: Req,
    exec: E,
    fallback: &'a P,
    came: &'a mut Option<Answered>,
) -> impl Future<Output = Result<Shareable<E::Shared, E::Output>, BoxError>> + 'a
where
    B: Backend,
    C: ResultCodec<E::Shared> + Send + Sync + 'static,
    Req: Send + 'a,
    E: Execute<Req> + 'a,
    P: Fallback<Req>,
{
    async move {
        let policy = &st.policy;
        let started = Instant::now();
        let deadline = wait_deadline(policy, started);
        let record_wait = || {
            let waited = started.elapsed().as_secs_f64();
            cx.metrics.with(|m| m.wait.record(waited));
        };
        let owner_gone = |generation| -> BoxError {
            Box::new(OwnerGone::new(Some(cx.stage().clone()), generation))
        };
        let Following {
            generation,
            lease_remaining: first_lease,
            joined,
            stale,
        } = first;
        let Some(first_lease) = first_lease else {
            // The owner's lease ran out without a result, and takeover is not
            // allowed: nothing to wait for.
            return st
                .wait_ended(
                    WaitEnded::OwnerGone,
                    owner_gone(generation),
                    req,
                    exec,
                    fallback,
                )
                .await;
        };
        let mut recheck_now = joined.is_none();
        // Otherwise, subscribe first, then re-check: a completion published
        // before the subscription is then seen by the re-check.
        let mut sub: Option<Subscription> = match joined {
            Some(s) => Some(s),
            None => match st
                .timed(cx, Op::Subscribe, st.backend.subscribe(&cx.flight))
                .await
            {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(stage = %cx.stage(), error = %e, "subscribe failed; following by polling");
                    None
                }
            },
        };
        // What this follower waits for: a result of this generation or a
        // later one (committed after it arrived), which the store keeps for
        // it even when new requests are not replayed.
        let follows = generation;
        let mut observed = generation;
        let mut lease_remaining = first_lease;
        loop {
            if !recheck_now {
                let poll = policy
                    .poll_interval_duration()
                    .min(lease_remaining)
                    .max(MIN_POLL);
                let wake_at = (Instant::now() + jittered(poll, 0.5, 1.0)).min(deadline);
                match wait(&mut sub, wake_at, observed).await {
                    Wake::Inline(committed, payload, work_time, age) => {
                        record_wait();
                        tracing::debug!(stage = %cx.stage(), flight = %cx.flight, role = "follower", "result arrived inline");
                        // Committed after this follower's first call. With
                        // `commit_replicas`, only the owner learns whether
                        // the commit was acknowledged, so only it remembers.
                        if policy.commit_replica_count() == 0 {
                            st.seen_commits.remember(
                                cx.flight,
                                committed,
                                cx.started,
                                policy.replay_ttl_duration(),
                            );
                        }
                        return match st.decode::<E::Shared>(cx.named(), &payload) {
                            Ok(v) if exec.serves(&v, &req) => {
                                st.hit_here(cx, committed);
                                *came = Some(Answered::Followed { age, work_time });
                                Ok(Shareable::Shared(v))
                            }
                            Ok(_) => exec.execute(req, Role::Unserved).await,
                            Err(e) => {
                                drop(guard);
                                st.wait_ended(
                                    WaitEnded::Failed(FailureClass::Protocol),
                                    e.into_core(),
                                    req,
                                    exec,
                                    fallback,
                                )
                                .await
                            }
                        };
                    }
                    Wake::Recheck => {}
                    Wake::Timer if Instant::now() >= deadline => {
                        cx.metrics.with(|m| m.wait_timeout.increment(1));
                        let err = Box::new(WaitTimeout::new(
                            Some(cx.stage().clone()),
                            started.elapsed(),
                        ));
                        return {
                            drop(guard);
                            st.wait_ended(WaitEnded::TimedOut, err, req, exec, fallback)
                                .await
                        };
                    }
                    Wake::Timer => {}
                }
            }
            recheck_now = false;
            let ask = Ask {
                stale,
                ..Ask::rechecking(Some(follows))
            };
            let answer = st.acquire(cx, Op::Recheck, &mut guard, ask).await;
            match answer {
                // The refresh followed failed and the store throttles the
                // next one: a failure, answered by the result standing by.
                Ok(Acquired::Stale(_)) if stale => {
                    record_wait();
                    return Err(throttled());
                }
                // Not asked for stale results: a backend answers no Stale.
                Ok(Acquired::Hit(stored) | Acquired::Stale(stored)) => {
                    record_wait();
                    cx.metrics.with(|m| m.hit.increment(1));
                    return match st.replay::<E::Shared>(cx.named(), &stored) {
                        Ok(Some(v)) if exec.serves(&v, &req) => {
                            st.hit_here(cx, stored.generation);
                            *came = Some(Answered::Followed {
                                age: st.age_here(&cx.flight, stored.generation, stored.age),
                                work_time: Some(stored.work_time),
                            });
                            Ok(Shareable::Shared(v))
                        }
                        Ok(Some(_)) => exec.execute(req, Role::Unserved).await,
                        // The owner's failure, cached: an answer, not a wait
                        // failure.
                        Ok(None) => Err(Box::new(cached_failure::decode(&stored.payload))),
                        Err(e) => {
                            drop(guard);
                            st.wait_ended(
                                WaitEnded::Failed(FailureClass::Protocol),
                                e.into_core(),
                                req,
                                exec,
                                fallback,
                            )
                            .await
                        }
                    };
                }
                Ok(Acquired::Owner {
                    generation,
                    takeover,
                    ..
                }) => {
                    cx.metrics.with(|m| {
                        m.owner.increment(1);
                        if takeover {
                            m.takeover.increment(1);
                        }
                    });
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, takeover, role = "owner", "took the flight over");
                    guard.owned();
                    drop(sub);
                    if stale {
                        // A refresh: its failure throttles the next one.
                        let judge = exec.failures();
                        return st
                            .own_judged(cx, generation, req, exec, Some(&judge), None)
                            .await;
                    }
                    return st.own(cx, generation, req, exec).await;
                }
                Ok(Acquired::Follower {
                    generation,
                    lease_remaining: left,
                    ..
                }) => {
                    observed = observed.max(generation);
                    lease_remaining = left;
                }
                Ok(Acquired::Expired { generation }) => {
                    return {
                        drop(guard);
                        st.wait_ended(
                            WaitEnded::OwnerGone,
                            owner_gone(generation),
                            req,
                            exec,
                            fallback,
                        )
                        .await
                    };
                }
                Err(e) => {
                    let class = FailureClass::of(e.kind(), e.is_rejected());
                    if e.kind() == BackendErrorKind::Protocol {
                        return {
                            drop(guard);
                            st.wait_ended(
                                WaitEnded::Failed(class),
                                e.into_core(),
                                req,
                                exec,
                                fallback,
                            )
                            .await
                        };
                    }
                    let err = e.into_core();
                    if let Some(answer) = fallback.while_following(class, err, &req) {
                        return Err(answer);
                    }
                    // Never run the work while another node may hold the lease:
                    // keep polling until the wait deadline.
                    if Instant::now() >= deadline {
                        cx.metrics.with(|m| m.wait_timeout.increment(1));
                        let err = Box::new(WaitTimeout::new(
                            Some(cx.stage().clone()),
                            started.elapsed(),
                        ));
                        return {
                            drop(guard);
                            st.wait_ended(WaitEnded::TimedOut, err, req, exec, fallback)
                                .await
                        };
                    }
                    lease_remaining = policy.poll_interval_duration();
                }
            }
        }
    }
}

enum Wake {
    /// The generation that committed, its payload, how long its work took
    /// (when the store told) and how old it was when the notice was sent.
    Inline(u64, Bytes, Option<Duration>, Duration),
    Recheck,
    Timer,
}

/// Waits for a notice about a generation at least `observed`, or the timer.
async fn wait(sub: &mut Option<Subscription>, until: Instant, observed: u64) -> Wake {
    loop {
        let notice = {
            let recv = async {
                match sub.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            // Biased: a notice that came with the timer wins, and the
            // order is fixed (tokio picks at random otherwise), so a
            // simulation replays from its seed.
            tokio::select! {
                biased;
                n = recv => Some(n),
                () = sleep_until(until) => None,
            }
        };
        match notice {
            None => return Wake::Timer,
            Some(None) => *sub = None,
            Some(Some(Notice::Committed {
                generation,
                inline,
                work_time,
                age,
            })) if generation >= observed => {
                return match inline {
                    Some(p) => Wake::Inline(generation, p, work_time, age),
                    None => Wake::Recheck,
                }
            }
            Some(Some(Notice::Abandoned { generation })) if generation >= observed => {
                return Wake::Recheck
            }
            Some(Some(Notice::Resync)) => return Wake::Recheck,
            // A notice about an older generation is not about this flight.
            Some(Some(_)) => {}
        }
    }
}
