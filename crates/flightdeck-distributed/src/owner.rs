//! The owner's lease, kept in the background from the grant until the
//! flight is settled.
//!
//! An owner renews its lease every heartbeat interval **until its commit or
//! abandon has returned**, not only while the work runs: reading and
//! sharing the response, encoding it and the commit attempts all happen
//! under a live lease, so a slow body or a slow commit never lets a
//! follower take over (and run the work a second time). The value goes to
//! the owner's callers as soon as it exists; the commit (with its retries)
//! goes on here. A lease whose owner is dropped mid-work (its caller left
//! and nobody asked the flight to finish) is abandoned at once, so
//! followers race again without waiting for it to expire.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, Notify};
use tokio::time::{sleep, sleep_until, Instant};

use crate::backend::{
    AbandonArgs, Backend, BackendError, BackendErrorKind, CommitArgs, Committed, Renewal,
};
use crate::flights::{Cx, State};
use crate::metrics::{Op, Replicas};

/// How the owner settles its flight.
pub(crate) enum Finish {
    /// Store this (encoded) result.
    Commit(Bytes),
    /// Release the flight, caching this failure message when the stage
    /// caches failures.
    Abandon(Option<Bytes>),
}

/// The owner's hold on its lease: the keeper task renews it until
/// [`finish`](Self::finish) settled the flight (dropped unfinished, it
/// abandons it).
pub(crate) struct Lease {
    finish: Option<oneshot::Sender<Finish>>,
    lost: Arc<Lost>,
}

/// Set when a heartbeat finds the lease gone.
#[derive(Default)]
pub(crate) struct Lost {
    flag: AtomicBool,
    notify: Notify,
}

impl Lost {
    fn set(&self) {
        self.flag.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

impl Lease {
    /// Starts keeping the lease of `generation` (granted just now).
    pub(crate) fn keep<B, C>(st: &Arc<State<B, C>>, cx: &Cx, generation: u64) -> Self
    where
        B: Backend,
        C: Send + Sync + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let lost = Arc::new(Lost::default());
        let keeper = keeper(
            Arc::clone(st),
            cx.clone(),
            generation,
            rx,
            Arc::clone(&lost),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(st.tasks.spawn_on(keeper, &rt)),
            // No runtime (it is shutting down): the lease expires on its own.
            Err(_) => tracing::debug!(stage = %cx.stage, "no runtime to keep the lease"),
        }
        Self {
            finish: Some(tx),
            lost,
        }
    }

    /// Settles the flight in the background.
    pub(crate) fn finish(mut self, how: Finish) {
        if let Some(tx) = self.finish.take() {
            let _ = tx.send(how);
        }
    }

    /// Resolves once a heartbeat found the lease gone.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost.notify.notified();
            if self.lost.flag.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Dropping the sender tells the keeper to abandon.
        drop(self.finish.take());
    }
}

/// Renews the lease until the flight is settled, then settles it (with
/// heartbeats still running until the settling call has returned).
async fn keeper<B, C>(
    st: Arc<State<B, C>>,
    cx: Cx,
    generation: u64,
    finish: oneshot::Receiver<Finish>,
    lost: Arc<Lost>,
) where
    B: Backend,
    C: Send + Sync + 'static,
{
    let heartbeats = heartbeat(&st, &cx, generation, &lost);
    tokio::pin!(heartbeats);
    let settle = async {
        // Dropped without a word: the owner's future went away mid-work.
        let how = finish.await.unwrap_or(Finish::Abandon(None));
        settle(&st, &cx, generation, how).await
    };
    let committed = tokio::select! {
        // A settled flight needs no more heartbeats (and must not count a
        // heartbeat answered after its commit as a lost lease).
        biased;
        committed = settle => committed,
        () = &mut heartbeats => false,
    };
    // Remembered as a result the store must keep (its later absence
    // counts as lost) once it is as durable as the stage asks.
    if committed && wait_replicas(&st, &cx, generation).await {
        st.seen.remember(
            cx.flight,
            generation,
            cx.started,
            st.policy.result_ttl_duration(),
        );
    }
}

/// Renews the lease every heartbeat interval. Never resolves: once the
/// lease is lost it stops renewing (and says so) and waits.
async fn heartbeat<B: Backend, C: Send + Sync + 'static>(
    st: &State<B, C>,
    cx: &Cx,
    generation: u64,
    lost: &Lost,
) {
    let every = st.policy.heartbeat_interval();
    let mut next = Instant::now() + every;
    loop {
        sleep_until(next).await;
        next += every;
        let res = st
            .timed(
                cx,
                Op::Heartbeat,
                st.backend
                    .heartbeat(&cx.flight, &cx.token, generation, &cx.terms),
            )
            .await;
        match res {
            Ok(Renewal::Renewed) => {}
            Ok(Renewal::Lost) => {
                cx.metrics.with(|m| m.heartbeat_lost.increment(1));
                tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, "lease lost while the owner still holds its flight; its commit will be fenced");
                lost.set();
                std::future::pending::<()>().await;
            }
            // Transient: the lease may still be ours; try at the next tick.
            Err(_) => {}
        }
    }
}

/// Commits or abandons, with retries. A commit is tried
/// `commit_attempts` times; when the last attempt failed for want of the
/// backend it is counted and logged, and tried on (backing off from 100 ms
/// to 2 s) until one lease has passed: followers on other nodes wait that
/// long before one of them runs the work again, and a result stored in the
/// meantime reaches them instead. Safe to repeat: a commit is idempotent
/// for (token, generation), and fenced once a newer owner holds the flight.
/// An abandon is retried the same way, so followers race again as soon as
/// the backend answers. Whether the result was stored.
async fn settle<B: Backend, C: Send + Sync + 'static>(
    st: &State<B, C>,
    cx: &Cx,
    generation: u64,
    how: Finish,
) -> bool {
    let until = Instant::now() + st.policy.lease_duration();
    match how {
        Finish::Commit(payload) => {
            let args = CommitArgs {
                payload,
                ttl: st.policy.result_ttl_duration(),
                inline_below: st.policy.inline_below_bytes(),
                state_ttl: cx.terms.state_ttl,
            };
            let attempts = st.policy.commit_attempt_count();
            let mut attempt = 0;
            let mut pause = Duration::from_millis(20);
            loop {
                attempt += 1;
                let res = st
                    .timed(
                        cx,
                        Op::Commit,
                        st.backend.commit(&cx.flight, &cx.token, generation, &args),
                    )
                    .await;
                let err = match res {
                    Ok(Committed::Committed) => {
                        if attempt > attempts {
                            tracing::info!(stage = %cx.stage, flight = %cx.flight, generation, "commit settled in the background");
                        }
                        return true;
                    }
                    Ok(Committed::Fenced) => {
                        cx.metrics.with(|m| m.fenced.increment(1));
                        tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, "commit fenced: a newer owner holds the flight; the value served this node's callers");
                        return false;
                    }
                    Err(e) => e,
                };
                if attempt == attempts || err.kind() == BackendErrorKind::Protocol {
                    cx.metrics.with(|m| m.result_write_failure.increment(1));
                    tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, error = %err, "result write failed; the value served this node's callers");
                }
                if !retry(&err, &mut pause, until).await {
                    tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation, "result never stored; the lease ends and followers take over");
                    return false;
                }
            }
        }
        Finish::Abandon(failure) => {
            let failure_ttl = st.policy.failure_ttl_duration();
            let args = AbandonArgs {
                failure: failure.filter(|_| !failure_ttl.is_zero()),
                failure_ttl,
                state_ttl: cx.terms.state_ttl,
            };
            let mut pause = Duration::from_millis(20);
            loop {
                let res = st
                    .timed(
                        cx,
                        Op::Abandon,
                        st.backend.abandon(&cx.flight, &cx.token, generation, &args),
                    )
                    .await;
                match res {
                    Ok(_) => return false,
                    Err(e) => {
                        if !retry(&e, &mut pause, until).await {
                            // The lease expires on its own; followers then
                            // take over.
                            tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, error = %e, "abandon failed");
                            return false;
                        }
                    }
                }
            }
        }
    }
}

/// After a commit: waits for the policy's `commit_replicas` replicas to
/// acknowledge it (nothing when it is 0), counts and logs the outcome.
/// Whether the commit is as durable as the stage asks (always, without a
/// wait): only then is it remembered as a result the store must keep. One
/// acknowledged by fewer replicas was counted `short` (or `failed`) here,
/// at the commit, and a failover may drop it without a second count.
async fn wait_replicas<B: Backend, C: Send + Sync + 'static>(
    st: &State<B, C>,
    cx: &Cx,
    generation: u64,
) -> bool {
    let wanted = st.policy.commit_replica_count();
    if wanted == 0 {
        return true;
    }
    let timeout = st.policy.commit_replicas_timeout_duration();
    let res = st
        .timed(
            cx,
            Op::WaitReplicas,
            st.backend.wait_replicas(&cx.flight, wanted, timeout),
        )
        .await;
    match res {
        Ok(Some(acked)) if acked >= wanted => {
            cx.metrics.with(|m| m.replicas(Replicas::Acked));
            return true;
        }
        Ok(Some(acked)) => {
            cx.metrics.with(|m| m.replicas(Replicas::Short));
            tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, acked, wanted, "commit acknowledged by fewer replicas than asked; a failover now may lose it");
        }
        Ok(None) => {
            cx.metrics.with(|m| m.replicas(Replicas::Failed));
            tracing::debug!(stage = %cx.stage, "commit-replicas is set but the backend has no replicas to ask");
        }
        Err(e) => {
            cx.metrics.with(|m| m.replicas(Replicas::Failed));
            tracing::warn!(stage = %cx.stage, flight = %cx.flight, generation, error = %e, "waiting for replicas after a commit failed");
        }
    }
    false
}

/// Waits before another try of a call that failed with `err`: `false` when
/// it is not worth one (a protocol error, or no time left before `until`).
async fn retry(err: &BackendError, pause: &mut Duration, until: Instant) -> bool {
    if err.kind() == BackendErrorKind::Protocol || Instant::now() + *pause >= until {
        return false;
    }
    sleep(*pause).await;
    *pause = (*pause * 2).clamp(Duration::from_millis(100), Duration::from_secs(2));
    true
}
