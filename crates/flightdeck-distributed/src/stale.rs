//! Answering anyway across nodes: what a flight does with a result the
//! store kept past its freshness ([`Acquired::Owner`] or
//! [`Acquired::Follower`] with a stale result beside, [`Acquired::Stale`])
//! under the stage's [`StaleWindows`], and early refreshes of fresh hits.
//!
//! The store grants one refresh per key across the deployment (the
//! flight's lease) and throttles it after a failure; this module decides,
//! on each node, whether a caller answers the kept result at once
//! (`stale-while-revalidate`, the throttle), waits for the work with the
//! result standing by (`stale-if-error`, `soft-timeout`), and runs the
//! refreshes it was granted in the background, on the flights'
//! [`TaskTracker`](tokio_util::task::TaskTracker), bounded by the wait
//! timeout (the longest anyone waits for a result): a refresh cut there
//! drops its lease, which abandons it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::{BoxError, LeaseLost};
use flightdeck_core::stale::{xfetch, Stale, StaleReason};
use flightdeck_core::Shareable;
use tokio::time::Instant;

use crate::backend::{Acquired, Ask, Backend, StoredResult};
use crate::codec::ResultCodec;
use crate::flights::{Cx, Judge, State};
use crate::lease_release::TokenGuard;
use crate::metrics::{Op, Refresh};
use crate::work::Execute;

/// How a caller of [`DistributedFlights::run_answered`] was answered.
///
/// [`DistributedFlights::run_answered`]: crate::DistributedFlights::run_answered
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answered {
    /// By the work this flight ran, or another node's result it waited
    /// for.
    Ran,
    /// By a stored result, fresh: `age` old by the store's clock, fresh
    /// for `fresh_for` more.
    Hit {
        /// How old the result is (since its commit, by the store's clock).
        age: Duration,
        /// How long it stays fresh.
        fresh_for: Duration,
    },
    /// By a result past its freshness: why, and how old (by the store's
    /// clock).
    Stale(Stale),
}

impl Answered {
    /// The [`Stale`] marker of a stale answer.
    pub fn stale(&self) -> Option<Stale> {
        match self {
            Answered::Stale(s) => Some(*s),
            _ => None,
        }
    }
}

/// A flight's answer, with how it was given.
pub(crate) type Reply<T, O> = Result<(Shareable<T, O>, Answered), BoxError>;

/// A refresh's work, owning all it needs, to finish in the background.
type Refreshing<T, O> = Pin<Box<dyn Future<Output = Result<Shareable<T, O>, BoxError>> + Send>>;

/// Whether `past` is within `window` (a zero window is off).
pub(crate) fn within(past: Duration, window: Duration) -> bool {
    !window.is_zero() && past <= window
}

/// `r` as it is `since` later (its age grows by this node's clock between
/// the store's answer and now).
fn aged(r: &StoredResult, since: Instant) -> StoredResult {
    StoredResult {
        age: r.age.saturating_add(since.elapsed()),
        ..r.clone()
    }
}

impl<B: Backend, C: Send + Sync + 'static> State<B, C> {
    /// What a stage with stale windows asks of its first acquire.
    pub(crate) fn ask(&self) -> Ask {
        Ask {
            stale: !self.policy.stale().keep_stale().is_zero(),
            ..Ask::default()
        }
    }

    /// A kept result this caller may be answered: decoded, and serving
    /// its request.
    pub(crate) fn usable<Req, E>(
        &self,
        cx: &Cx,
        kept: Option<StoredResult>,
        exec: &E,
        req: &Req,
    ) -> Option<(E::Shared, StoredResult)>
    where
        C: ResultCodec<E::Shared>,
        E: Execute<Req>,
    {
        let kept = kept?;
        let value = self.replay::<E::Shared>(cx, &kept).ok()??;
        exec.serves(&value, req).then_some((value, kept))
    }

    /// The answer from `kept`, counted.
    pub(crate) fn stale_answer<T, O>(
        &self,
        cx: &Cx,
        value: T,
        kept: &StoredResult,
        reason: StaleReason,
    ) -> (Shareable<T, O>, Answered) {
        let stale = Stale {
            reason,
            age: kept.age,
        };
        cx.metrics.with(|m| m.stale(stale));
        tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation = kept.generation, reason = reason.as_str(), "answering a stale result");
        (Shareable::Shared(value), Answered::Stale(stale))
    }

    /// This caller was granted the refresh of `kept` (past its
    /// freshness): within `stale-while-revalidate` it answers `kept` at
    /// once and the refresh runs in the background; otherwise the refresh
    /// runs here with `kept` standing by, answered if the work fails
    /// (within `stale-if-error`, the store then throttles the next
    /// refresh) or is still running at the soft timeout (the work goes
    /// on in the background).
    pub(crate) async fn refresh_stale<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        generation: u64,
        req: Req,
        exec: E,
        (value, kept): (E::Shared, StoredResult),
    ) -> Reply<E::Shared, E::Output>
    where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        let windows = self.policy.stale();
        let judge = exec.failures();
        if within(kept.stale_for(), windows.revalidate) {
            let work = self.refreshing(cx, generation, req, exec, Arc::clone(&judge));
            self.detach(cx, work, judge);
            return Ok(self.stale_answer(cx, value, &kept, StaleReason::Revalidate));
        }
        let work = self.refreshing(cx, generation, req, exec, Arc::clone(&judge));
        let detach = |work| self.detach(cx, work, Arc::clone(&judge));
        self.stand_by(cx, &judge, (value, kept), work, detach).await
    }

    /// Another node refreshes `kept`: within `stale-while-revalidate`
    /// this caller answers it at once; otherwise it follows
    /// (`following`), and `kept` answers if that fails (within
    /// `stale-if-error`) or is still waiting at the soft timeout.
    pub(crate) async fn follow_stale<T: 'static, O, F>(
        &self,
        cx: &Cx,
        judge: Judge<T>,
        (value, kept): (T, StoredResult),
        following: F,
    ) -> Reply<T, O>
    where
        F: Future<Output = Result<Shareable<T, O>, BoxError>>,
    {
        if within(kept.stale_for(), self.policy.stale().revalidate) {
            return Ok(self.stale_answer(cx, value, &kept, StaleReason::Revalidate));
        }
        let following = std::pin::pin!(following);
        self.stand_by(cx, &judge, (value, kept), following, drop)
            .await
    }

    /// Waits for `work` with `kept` standing by: answered instead once the
    /// soft timeout passes (`work` then goes to `on_soft`), or when `work`
    /// fails within `stale-if-error`; never past its freshness plus the
    /// window that answers.
    async fn stand_by<T: 'static, O, F>(
        &self,
        cx: &Cx,
        judge: &Judge<T>,
        (value, kept): (T, StoredResult),
        mut work: F,
        on_soft: impl FnOnce(F),
    ) -> Reply<T, O>
    where
        F: Future<Output = Result<Shareable<T, O>, BoxError>> + Unpin,
    {
        let windows = self.policy.stale();
        let received = Instant::now();
        let out = if windows.soft_timeout.is_zero() {
            (&mut work).await
        } else {
            match tokio::time::timeout(windows.soft_timeout, &mut work).await {
                Ok(out) => out,
                Err(_) => {
                    let now = aged(&kept, received);
                    if within(now.stale_for(), windows.keep_stale()) {
                        on_soft(work);
                        return Ok(self.stale_answer(cx, value, &now, StaleReason::SoftTimeout));
                    }
                    // Too old by now: the caller waits on.
                    (&mut work).await
                }
            }
        };
        let now = aged(&kept, received);
        if within(now.stale_for(), windows.if_error) && failed(&**judge, &out) {
            return Ok(self.stale_answer(cx, value, &now, StaleReason::Error));
        }
        out.map(|s| (s, Answered::Ran))
    }

    /// A hit near the end of its freshness: with `early-refresh` on, XFetch
    /// decides whether this caller refreshes it, and the store grants one
    /// such refresh (a lease: the others keep their hit). The caller is
    /// answered the hit at once: the grant is asked, and a granted refresh
    /// runs, in the background.
    pub(crate) fn refresh_early<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        hit: &StoredResult,
        req: Req,
        exec: E,
    ) where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        let early = self.policy.stale().early_refresh;
        let left = hit.fresh_for();
        if !within(left, early) || left.is_zero() || !xfetch(left, hit.work_time) {
            return;
        }
        let ask = Ask {
            early: true,
            ..self.ask()
        };
        let stage = cx.stage.clone();
        let (st, cx) = (Arc::clone(self), cx.clone());
        let task = async move {
            // Dropped mid-call (a runtime shutting down), it releases what
            // the token may hold.
            let mut guard = TokenGuard::new(&st, &cx);
            let granted = st
                .call(&cx, Op::Acquire, &mut guard, |b| {
                    b.acquire_with(&cx.flight, &cx.token, ask, &cx.terms)
                })
                .await;
            if let Ok(Acquired::Owner { generation, .. }) = granted {
                guard.owned();
                cx.metrics.with(|m| m.owner.increment(1));
                tracing::debug!(stage = %cx.stage, flight = %cx.flight, generation, "refreshing a hit early");
                let judge = exec.failures();
                let work = st.refreshing(&cx, generation, req, exec, Arc::clone(&judge));
                st.detach(&cx, work, judge);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(self.tasks.spawn_on(task, &rt)),
            Err(_) => tracing::debug!(%stage, "no runtime for an early refresh"),
        }
    }

    /// The refresh of `generation` (granted to this caller), owning all it
    /// needs; its lease lives from now on.
    fn refreshing<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        generation: u64,
        req: Req,
        exec: E,
        judge: Judge<E::Shared>,
    ) -> Refreshing<E::Shared, E::Output>
    where
        C: ResultCodec<E::Shared>,
        Req: Send + 'static,
        E: Execute<Req> + 'static,
    {
        let (st, cx) = (Arc::clone(self), cx.clone());
        Box::pin(async move {
            st.own_judged(&cx, generation, req, exec, Some(&judge))
                .await
        })
    }

    /// Finishes a refresh in the background (see the module docs), and
    /// counts how it ended. Without a runtime (it is shutting down), it
    /// is dropped: its lease is abandoned.
    fn detach<T, O>(&self, cx: &Cx, work: Refreshing<T, O>, judge: Judge<T>)
    where
        T: Send + 'static,
        O: Send + 'static,
    {
        let bound = self.policy.wait_timeout_duration();
        let stage = cx.stage.clone();
        let cx = cx.clone();
        let task = async move {
            let how = match tokio::time::timeout(bound, work).await {
                Err(_) => Refresh::Abandoned,
                Ok(out) if failed(&*judge, &out) => Refresh::Failed,
                Ok(Ok(Shareable::Shared(_))) => Refresh::Committed,
                Ok(Ok(Shareable::Unshared(..))) => Refresh::Abandoned,
                Ok(Err(e)) if e.is::<LeaseLost>() => Refresh::Fenced,
                Ok(Err(_)) => Refresh::Failed,
            };
            tracing::debug!(stage = %cx.stage, flight = %cx.flight, outcome = ?how, "background refresh ended");
            cx.metrics.with(|m| m.refresh(how));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(self.tasks.spawn_on(task, &rt)),
            Err(_) => tracing::debug!(%stage, "no runtime for a background refresh"),
        }
    }
}

/// Whether `out` failed as `judge` says (an unshared output is an
/// answer).
fn failed<T: 'static, O>(
    judge: &dyn flightdeck_core::stale::Failures<T>,
    out: &Result<Shareable<T, O>, BoxError>,
) -> bool {
    match out {
        Ok(Shareable::Shared(v)) => judge.failed(Ok(v)),
        Ok(Shareable::Unshared(..)) => false,
        Err(e) => judge.failed(Err(e)),
    }
}
