//! One flight's coordination: acquire, then own, follow or replay.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::error::{BoxError, LeaseLost, WaitTimeout};
use flightdeck_core::metric;
use flightdeck_core::share::{Share, Shareable, SharedForm};
use flightdeck_core::{FlightKey, StageName};
use tokio::time::{sleep_until, Instant};
use tower_service::Service;

use crate::backend::{
    AbandonArgs, Acquired, Backend, BackendError, BackendErrorKind, BackendFuture, CommitArgs,
    Committed, FencingToken, FlightId, LeaseTerms, Notice, OwnerToken, Renewal, ResultStatus,
    StoredResult, Subscription,
};
use crate::codec::ResultCodec;
use crate::error::{CallTimedOut, RemoteFailure};
use crate::layer::Flights;
use crate::request::FlightRequest;

/// The shortest pause between two re-checks of a follower.
const MIN_POLL: Duration = Duration::from_millis(5);

/// Everything one flight's coordination needs to name things.
#[derive(Clone)]
struct Ctx {
    stage: StageName,
    flight: FlightId,
    token: OwnerToken,
    terms: LeaseTerms,
}

fn record(name: &'static str, stage: &StageName, since: Instant) {
    metrics::histogram!(name, metric::LABEL_STAGE => stage.as_str().to_owned())
        .record(since.elapsed().as_secs_f64());
}

fn count(name: &'static str, stage: &StageName) {
    metrics::counter!(name, metric::LABEL_STAGE => stage.as_str().to_owned()).increment(1);
}

impl<B: Backend, Sh, C, K> Flights<B, Sh, C, K> {
    /// Runs one backend call under the policy's deadline, counting failures.
    async fn call<T>(
        &self,
        op: &'static str,
        stage: &StageName,
        fut: BackendFuture<'_, T>,
    ) -> Result<T, BackendError> {
        let limit = self.policy.call_timeout_duration();
        let res = match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::outcome_unknown(CallTimedOut::new(op, limit))),
        };
        if let Err(e) = &res {
            metrics::counter!(
                metric::COORDINATION_ERROR_TOTAL,
                metric::LABEL_STAGE => stage.as_str().to_owned(),
                "kind" => e.kind().as_str(),
                "op" => op,
            )
            .increment(1);
            if e.kind() == BackendErrorKind::Protocol {
                metrics::counter!(
                    metric::UNKNOWN_ACTION_TOTAL,
                    metric::LABEL_STAGE => stage.as_str().to_owned(),
                    "reason" => "backend",
                )
                .increment(1);
            }
            tracing::debug!(stage = %stage, op, error = %e, "coordination call failed");
        }
        res
    }

    async fn acquire(&self, cx: &Ctx) -> Result<Acquired, BackendError> {
        self.call(
            "acquire",
            &cx.stage,
            self.backend.acquire(&cx.flight, &cx.token, &cx.terms),
        )
        .await
    }

    async fn abandon(&self, cx: &Ctx, generation: u64, failure: Option<String>) {
        let failure_ttl = self.policy.failure_ttl_duration();
        let args = AbandonArgs {
            failure: failure.filter(|_| !failure_ttl.is_zero()).map(Bytes::from),
            failure_ttl,
            state_ttl: cx.terms.state_ttl,
        };
        let res = self
            .call(
                "abandon",
                &cx.stage,
                self.backend
                    .abandon(&cx.flight, &cx.token, generation, &args),
            )
            .await;
        if let Err(e) = res {
            // The lease expires on its own; followers then take over.
            tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, error = %e, "abandon failed");
        }
    }

    /// Replays a stored result.
    fn replay<T>(&self, stage: &StageName, stored: &StoredResult) -> Result<Sh::Output, BoxError>
    where
        Sh: Share<T>,
        C: ResultCodec<<Sh as SharedForm>::Shared>,
    {
        match stored.status {
            ResultStatus::Ok => self.decode(stage, &stored.payload),
            ResultStatus::Failed => Err(Box::new(RemoteFailure::new(
                String::from_utf8_lossy(&stored.payload).into_owned(),
            ))),
        }
    }

    fn decode<T>(&self, stage: &StageName, payload: &[u8]) -> Result<Sh::Output, BoxError>
    where
        Sh: Share<T>,
        C: ResultCodec<<Sh as SharedForm>::Shared>,
    {
        match self.envelope.open(&self.codec, payload) {
            Ok(shared) => Ok(self.share.restore(&shared)),
            Err(e) => {
                metrics::counter!(
                    metric::UNKNOWN_ACTION_TOTAL,
                    metric::LABEL_STAGE => stage.as_str().to_owned(),
                    "reason" => "codec",
                )
                .increment(1);
                tracing::warn!(stage = %stage, error = %e, "stored result does not decode");
                Err(Box::new(e))
            }
        }
    }
}

/// Coordinates one request whose key is `key`.
pub(crate) async fn run<S, Req, B, Sh, C, K>(
    st: Arc<Flights<B, Sh, C, K>>,
    inner: S,
    req: Req,
    key: FlightKey,
) -> Result<Sh::Output, BoxError>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    B: Backend,
    Sh: Share<S::Response>,
    C: ResultCodec<<Sh as SharedForm>::Shared>,
    K: FlightRequest<Req>,
{
    let policy = &st.policy;
    let cx = Ctx {
        stage: key.stage().clone(),
        flight: FlightId::of(&key),
        token: OwnerToken::random(),
        terms: LeaseTerms {
            lease: policy.lease_duration(),
            state_ttl: policy.state_ttl(),
            allow_takeover: policy.takeover_allowed(),
        },
    };
    count(metric::DISTRIBUTED_REQUEST_TOTAL, &cx.stage);
    let started = Instant::now();
    let deadline = started + policy.wait_timeout_duration();

    // Before acquiring: one retry with the same token resolves an ambiguous
    // first try (the scripts answer OWNER with the same generation).
    let mut acquired = match st.acquire(&cx).await {
        Ok(a) => a,
        Err(e) if e.kind() == BackendErrorKind::OutcomeUnknown => {
            st.acquire(&cx).await.map_err(BackendError::into_core)?
        }
        Err(e) => return Err(e.into_core()),
    };

    let mut sub: Option<Subscription> = None;
    let mut subscribe_tried = false;
    let mut followed = false;
    let mut observed = 0u64;
    loop {
        let (generation, lease_remaining) = match acquired {
            Acquired::Hit(stored) => {
                count(metric::HIT_TOTAL, &cx.stage);
                if followed {
                    record(metric::WAIT_DURATION, &cx.stage, started);
                }
                tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation = stored.generation, role = "hit", "replaying stored result");
                return st.replay(&cx.stage, &stored);
            }
            Acquired::Owner {
                generation,
                takeover,
            } => {
                count(metric::OWNER_TOTAL, &cx.stage);
                if takeover {
                    count(metric::TAKEOVER_TOTAL, &cx.stage);
                }
                tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation, takeover, role = "owner", "owning flight");
                drop(sub);
                return own(&st, &cx, generation, inner, req).await;
            }
            Acquired::Follower {
                generation,
                lease_remaining,
            } => (generation, lease_remaining),
            Acquired::Expired { generation } => (generation, policy.poll_interval_duration()),
        };
        if !followed {
            followed = true;
            count(metric::FOLLOWER_TOTAL, &cx.stage);
            tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation, role = "follower", "following flight");
        }
        observed = observed.max(generation);

        if !subscribe_tried {
            // Subscribe first, then re-check: a completion published before
            // the subscription is then seen by the re-check.
            subscribe_tried = true;
            match st
                .call("subscribe", &cx.stage, st.backend.subscribe(&cx.flight))
                .await
            {
                Ok(s) => sub = Some(s),
                Err(e) => {
                    tracing::warn!(stage = %cx.stage, error = %e, "subscribe failed; following by polling")
                }
            }
        } else {
            let poll = policy
                .poll_interval_duration()
                .min(lease_remaining)
                .max(MIN_POLL);
            let jittered = poll.mul_f64(rand::random_range(0.5..=1.0));
            let wake_at = (Instant::now() + jittered).min(deadline);
            match wait(&mut sub, wake_at, observed).await {
                Wake::Inline(payload) => {
                    record(metric::WAIT_DURATION, &cx.stage, started);
                    tracing::debug!(stage = %cx.stage, flight = %cx.flight, role = "follower", "result arrived inline");
                    return st.decode(&cx.stage, &payload);
                }
                Wake::Recheck => {}
                Wake::Timer => {
                    if Instant::now() >= deadline {
                        count(metric::WAIT_TIMEOUT_TOTAL, &cx.stage);
                        return Err(Box::new(WaitTimeout::new(
                            Some(cx.stage.clone()),
                            started.elapsed(),
                        )));
                    }
                }
            }
        }

        acquired = match st.acquire(&cx).await {
            Ok(a) => a,
            Err(e) if e.kind() == BackendErrorKind::Protocol => return Err(e.into_core()),
            // The stage answers at once instead of waiting (the caller gets
            // "in progress" or "unavailable"; nobody runs the work here).
            Err(e) if policy.gives_up_on_wait_failure() => return Err(e.into_core()),
            Err(_) => {
                // Never run the work while another node may hold the lease:
                // keep polling until the wait deadline.
                if Instant::now() >= deadline {
                    count(metric::WAIT_TIMEOUT_TOTAL, &cx.stage);
                    return Err(Box::new(WaitTimeout::new(
                        Some(cx.stage.clone()),
                        started.elapsed(),
                    )));
                }
                Acquired::Follower {
                    generation: observed,
                    lease_remaining: policy.poll_interval_duration(),
                }
            }
        };
    }
}

enum Wake {
    Inline(Bytes),
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
            tokio::select! {
                n = recv => Some(n),
                () = sleep_until(until) => None,
            }
        };
        match notice {
            None => return Wake::Timer,
            Some(None) => *sub = None,
            Some(Some(Notice::Committed { generation, inline })) if generation >= observed => {
                return match inline {
                    Some(p) => Wake::Inline(p),
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

/// Releases the lease if the owner's future is dropped before it finished
/// (the caller went away): followers then race at once instead of waiting
/// for the lease to expire. A release after the commit is a no-op.
struct AbandonOnDrop<B, Sh, C, K>
where
    B: Backend,
    Sh: Send + Sync + 'static,
    C: Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    armed: Option<Armed<B, Sh, C, K>>,
}

/// What [`AbandonOnDrop`] needs to release a lease.
struct Armed<B, Sh, C, K> {
    st: Arc<Flights<B, Sh, C, K>>,
    flight: FlightId,
    token: OwnerToken,
    generation: u64,
    state_ttl: Duration,
}

impl<B, Sh, C, K> Drop for AbandonOnDrop<B, Sh, C, K>
where
    B: Backend,
    Sh: Send + Sync + 'static,
    C: Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    fn drop(&mut self) {
        let Some(Armed {
            st,
            flight,
            token,
            generation,
            state_ttl,
        }) = self.armed.take()
        else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        handle.spawn(async move {
            let args = AbandonArgs {
                failure: None,
                failure_ttl: Duration::ZERO,
                state_ttl,
            };
            let limit = st.policy.call_timeout_duration();
            let _ = tokio::time::timeout(
                limit,
                st.backend.abandon(&flight, &token, generation, &args),
            )
            .await;
        });
    }
}

/// Runs the work as the owner, releasing the lease if this future is dropped.
async fn own<S, Req, B, Sh, C, K>(
    st: &Arc<Flights<B, Sh, C, K>>,
    cx: &Ctx,
    generation: u64,
    inner: S,
    req: Req,
) -> Result<Sh::Output, BoxError>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    B: Backend,
    Sh: Share<S::Response>,
    C: ResultCodec<<Sh as SharedForm>::Shared>,
    K: FlightRequest<Req>,
{
    let mut guard = AbandonOnDrop {
        armed: Some(Armed {
            st: st.clone(),
            flight: cx.flight,
            token: cx.token.clone(),
            generation,
            state_ttl: cx.terms.state_ttl,
        }),
    };
    let out = own_inner(st, cx, generation, inner, req).await;
    guard.armed = None;
    out
}

/// Runs the work as the owner: heartbeat while it runs, then commit.
async fn own_inner<S, Req, B, Sh, C, K>(
    st: &Arc<Flights<B, Sh, C, K>>,
    cx: &Ctx,
    generation: u64,
    mut inner: S,
    mut req: Req,
) -> Result<Sh::Output, BoxError>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    B: Backend,
    Sh: Share<S::Response>,
    C: ResultCodec<<Sh as SharedForm>::Shared>,
    K: FlightRequest<Req>,
{
    st.keys.fence(
        &mut req,
        FencingToken {
            generation,
            owner: cx.token.clone(),
        },
    );
    let work = inner.call(req);
    let executing = Instant::now();
    let result = {
        let heartbeat = heartbeat(st, cx, generation);
        tokio::pin!(heartbeat);
        tokio::select! {
            biased;
            r = work => r.map_err(Into::into),
            () = &mut heartbeat => {
                // Only returns when the stage cancels work on lease loss.
                return Err(Box::new(LeaseLost::new(Some(cx.stage.clone()), generation)));
            }
        }
    };
    record(metric::EXECUTION_DURATION, &cx.stage, executing);
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => {
            st.abandon(cx, generation, Some(e.to_string())).await;
            return Err(e);
        }
    };
    let shared = match st.share.share(resp).await {
        Ok(Shareable::Shared(s)) => s,
        Ok(Shareable::Unshared(out, _)) => {
            st.abandon(cx, generation, None).await;
            return Ok(out);
        }
        Err(e) => {
            st.abandon(cx, generation, Some(e.to_string())).await;
            return Err(e);
        }
    };
    match st.envelope.seal(&st.codec, &shared) {
        Ok(payload) if payload.len() <= st.policy.max_result_size() => {
            commit(st, cx, generation, payload).await;
        }
        Ok(payload) => {
            tracing::debug!(stage = %cx.stage, size = payload.len(), "result too large to store");
            st.abandon(cx, generation, None).await;
        }
        Err(e) => {
            count(metric::RESULT_WRITE_FAILURE_TOTAL, &cx.stage);
            tracing::warn!(stage = %cx.stage, error = %e, "result does not encode; not stored");
            st.abandon(cx, generation, None).await;
        }
    }
    Ok(st.share.restore(&shared))
}

/// Renews the lease every heartbeat interval. Resolves only when the lease
/// is lost and the stage cancels work on lease loss.
async fn heartbeat<B: Backend, Sh, C, K>(st: &Flights<B, Sh, C, K>, cx: &Ctx, generation: u64) {
    let every = st.policy.heartbeat_interval();
    let mut next = Instant::now() + every;
    loop {
        sleep_until(next).await;
        next += every;
        let res = st
            .call(
                "heartbeat",
                &cx.stage,
                st.backend
                    .heartbeat(&cx.flight, &cx.token, generation, &cx.terms),
            )
            .await;
        match res {
            Ok(Renewal::Renewed) => {}
            Ok(Renewal::Lost) => {
                count(metric::HEARTBEAT_LOST_TOTAL, &cx.stage);
                tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, "lease lost while the work runs");
                if st.policy.cancels_on_lease_loss() {
                    return;
                }
                // The commit will be fenced; the value still serves local
                // callers.
                std::future::pending::<()>().await;
            }
            // Transient: the lease may still be ours; try at the next tick.
            Err(_) => {}
        }
    }
}

/// Commits with idempotent retries. Failures never fail the request: the
/// value is returned to local callers either way. When the last attempt
/// failed for want of Redis, the commit goes on in the background until the
/// lease would have ended (see [`commit_later`]).
async fn commit<B, Sh, C, K>(
    st: &Arc<Flights<B, Sh, C, K>>,
    cx: &Ctx,
    generation: u64,
    payload: Bytes,
) where
    B: Backend,
    Sh: Send + Sync + 'static,
    C: Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    let args = CommitArgs {
        payload,
        ttl: st.policy.result_ttl_duration(),
        inline_below: st.policy.inline_below_bytes(),
        state_ttl: cx.terms.state_ttl,
    };
    let attempts = st.policy.commit_attempt_count();
    for attempt in 1..=attempts {
        match commit_once(st, cx, generation, &args).await {
            Ok(()) => return,
            Err(e) if e.kind() != BackendErrorKind::Protocol && attempt < attempts => {
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
            }
            Err(e) => {
                count(metric::RESULT_WRITE_FAILURE_TOTAL, &cx.stage);
                tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, error = %e, "result write failed; value returned to local callers");
                if e.kind() != BackendErrorKind::Protocol {
                    commit_later(Arc::clone(st), cx.clone(), generation, args);
                }
                return;
            }
        }
    }
}

/// One commit. `Ok` once the flight is settled: the result is stored, or
/// the commit was fenced (a newer owner holds the flight; counted, logged).
async fn commit_once<B: Backend, Sh, C, K>(
    st: &Flights<B, Sh, C, K>,
    cx: &Ctx,
    generation: u64,
    args: &CommitArgs,
) -> Result<(), BackendError> {
    let answer = st
        .call(
            "commit",
            &cx.stage,
            st.backend.commit(&cx.flight, &cx.token, generation, args),
        )
        .await?;
    if answer == Committed::Fenced {
        count(metric::FENCED_TOTAL, &cx.stage);
        tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, "commit fenced: a newer owner holds the flight; serving locally");
    }
    Ok(())
}

/// Keeps trying a commit that failed for want of Redis, in the background,
/// backing off from 100 ms to 2 s, until the lease would have ended.
///
/// Followers on other nodes wait for this flight until its lease ends and
/// then one of them runs the work again; a result stored in the meantime
/// reaches them instead (the notice, or their next poll). Safe to repeat:
/// the commit is idempotent for (token, generation), and fenced once a
/// takeover started a newer generation. At most one such task per flight
/// whose commit failed, for at most one lease.
fn commit_later<B, Sh, C, K>(
    st: Arc<Flights<B, Sh, C, K>>,
    cx: Ctx,
    generation: u64,
    args: CommitArgs,
) where
    B: Backend,
    Sh: Send + Sync + 'static,
    C: Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let until = Instant::now() + st.policy.lease_duration();
    rt.spawn(async move {
        let mut pause = Duration::from_millis(100);
        while Instant::now() + pause < until {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            match commit_once(&st, &cx, generation, &args).await {
                Ok(()) => {
                    tracing::info!(stage = %cx.stage, flight = %cx.flight, generation, "commit settled in the background");
                    return;
                }
                Err(e) if e.kind() == BackendErrorKind::Protocol => return,
                Err(_) => {}
            }
        }
        tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation, "result never stored; the lease ends and followers take over");
    });
}
