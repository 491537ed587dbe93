//! L2 as a library: [`DistributedFlights::run`] coordinates one flight
//! across the nodes of a deployment, and decides, through a
//! [`Fallback`], what happens when coordination fails.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::{BoxError, LeaseLost};
use flightdeck_core::stale::StaleReason;
use flightdeck_core::{FlightKey, Shareable, StageName};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::backend::{
    Acquired, Ask, Backend, BackendError, BackendErrorKind, BackendFuture, FlightId, LeaseTerms,
    OwnerToken, ResultStatus, Shard, StoredResult,
};
use crate::cached_failure;
use crate::codec::{Envelope, ResultCodec};
use crate::error::CallTimedOut;
use crate::fallback::{FailureClass, Fallback, Verdict, WaitEnded};
use crate::follow;
use crate::lease_release::{LeaseReleases, TokenGuard};
use crate::lost_results::SeenCommits;
use crate::metrics::{Bundle, Op, Registry, StageMetrics};
use crate::owner::{Finish, Lease, Settled};
use crate::policy::{DistributedPolicy, PolicyError};
use crate::stale::{
    owned, within, Answered, EndedHere, PurgeMark, Purges, RefreshesElsewhere, Reply,
};
use crate::start::{Admitted, FlightFuture};
use crate::work::{Execute, KeptHere, Role};

/// An answer the work (or another node's) gave, not a kept one.
fn ran<T, O>(out: Result<Shareable<T, O>, BoxError>) -> Reply<T, O> {
    out.map(|s| (s, Answered::Ran))
}

/// An answer from a kept result (a stale one, or this node's copy).
pub(crate) fn kept_reply<T, O>((value, answered): (T, Answered)) -> Reply<T, O> {
    Ok((Shareable::Shared(value), answered))
}

/// Which outcomes of the work a stale result answers for (see
/// [`Execute::failures`]).
pub(crate) type Judge<T> = Arc<dyn flightdeck_core::stale::Failures<T>>;

/// The flights of one deployment's stage(s) on this node: a backend, a
/// policy and a result codec, shared by every flight (cheap to clone).
///
/// For each key, [`run`](Self::run) asks the backend for the flight and
/// becomes its **owner** (runs the request under a lease renewed by
/// heartbeats until its commit or abandon has returned, sends the commit
/// and hands the value to its callers at once, and waits for the commit's
/// answer, retrying, in the background), a **follower**
/// (waits for the owner's result: a push, and polls; takes the flight over
/// when the owner's lease expires) or a **hit** (replays the stored
/// result). Coordination failures go to the [`Fallback`].
///
/// ```
/// use std::time::Duration;
/// use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
/// use flightdeck_distributed::{DistributedFlights, DistributedPolicy, Execute, PostcardCodec, Propagate, Role};
/// use flightdeck_test::MemoryBackend;
///
/// struct Upper;
/// impl Execute<String> for Upper {
///     type Shared = String;
///     type Output = String;
///     async fn execute(self, req: String, _role: Role) -> Result<Shareable<String, String>, BoxError> {
///         Ok(Shareable::Shared(req.to_uppercase()))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let flights = DistributedFlights::new(
///     MemoryBackend::new(),
///     DistributedPolicy::new().lease(Duration::from_secs(3)).heartbeat(Duration::from_secs(1)),
///     PostcardCodec::<String>::new(),
/// )
/// .unwrap();
/// let key = FlightKey::from_bytes(StageName::new("score").unwrap(), "hi");
/// let first = flights.run(&key, "hi".to_owned(), Upper, &Propagate).await.unwrap();
/// assert!(matches!(first, Shareable::Shared(v) if v == "HI"));
/// flights.idle().await; // the commit went on in the background
/// let replayed = flights.run(&key, "hi".to_owned(), Upper, &Propagate).await.unwrap();
/// assert!(matches!(replayed, Shareable::Shared(v) if v == "HI"));
/// # }
/// ```
pub struct DistributedFlights<B, C> {
    pub(crate) st: Arc<State<B, C>>,
}

/// What every flight of one [`DistributedFlights`] shares.
pub(crate) struct State<B, C> {
    pub(crate) backend: B,
    pub(crate) policy: DistributedPolicy,
    pub(crate) codec: C,
    pub(crate) envelope: Envelope,
    pub(crate) metrics: Registry,
    pub(crate) releases: LeaseReleases,
    /// Results this node saw committed, to tell when one was lost.
    pub(crate) seen_commits: SeenCommits,
    /// This node's purges, which no stale result fetched before answers
    /// after.
    pub(crate) purges: Purges,
    /// The results this node's owners committed with stale windows on,
    /// and when their work ended.
    pub(crate) ended_here: EndedHere,
    /// Refreshes running elsewhere that this node was told of, whose kept
    /// result answers its callers meanwhile.
    pub(crate) elsewhere: RefreshesElsewhere,
    /// Background work (commits, abandons, releases), for [`DistributedFlights::idle`].
    pub(crate) tasks: TaskTracker,
}

impl<B, C> Clone for DistributedFlights<B, C> {
    fn clone(&self) -> Self {
        Self {
            st: Arc::clone(&self.st),
        }
    }
}

impl<B, C> fmt::Debug for DistributedFlights<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedFlights")
            .field("policy", &self.st.policy)
            .finish_non_exhaustive()
    }
}

/// Everything one flight's coordination needs to name things.
#[derive(Clone)]
pub(crate) struct Cx {
    /// The callers' key (what this node's watches of a refresh elsewhere
    /// are found by), and so the flight's stage.
    pub(crate) key: FlightKey,
    pub(crate) flight: FlightId,
    pub(crate) token: OwnerToken,
    pub(crate) terms: LeaseTerms,
    /// The deadline of each backend call of this flight.
    pub(crate) call_timeout: Duration,
    pub(crate) metrics: Arc<StageMetrics>,
    /// When the flight's first call was sent.
    pub(crate) started: Instant,
    /// Where the flight stood among this node's purges of its key when it
    /// first asked the store.
    pub(crate) purge_mark: PurgeMark,
}

/// What a flight's counts and logs name: its stage and id, and its
/// metrics.
#[derive(Clone, Copy)]
pub(crate) struct Named<'a> {
    pub(crate) stage: &'a StageName,
    pub(crate) flight: &'a FlightId,
    metrics: &'a StageMetrics,
}

impl<'a> Named<'a> {
    /// `flight` of `stage`, counted in `metrics`.
    pub(crate) fn with(
        stage: &'a StageName,
        flight: &'a FlightId,
        metrics: &'a StageMetrics,
    ) -> Self {
        Self {
            stage,
            flight,
            metrics,
        }
    }
}

impl Cx {
    /// The flight's stage.
    pub(crate) fn stage(&self) -> &StageName {
        self.key.stage()
    }

    /// What this flight's counts and logs name.
    pub(crate) fn named(&self) -> Named<'_> {
        Named {
            stage: self.key.stage(),
            flight: &self.flight,
            metrics: &self.metrics,
        }
    }
}

impl<B: Backend, C: Send + Sync + 'static> DistributedFlights<B, C> {
    /// Flights over `backend`, under a validated `policy`, storing results
    /// with `codec` (`PostcardCodec`, `HttpCodec`).
    pub fn new(backend: B, policy: DistributedPolicy, codec: C) -> Result<Self, PolicyError> {
        let policy = policy.validate()?;
        // So that it answers "unavailable" for a call it never sent before
        // this layer cuts the call off as "outcome unknown".
        backend.call_timeout_hint(policy.call_timeout_duration());
        let envelope = Envelope::new(policy.compress_above_bytes(), policy.max_result_size());
        Ok(Self {
            st: Arc::new(State {
                backend,
                policy,
                codec,
                envelope,
                metrics: Registry::default(),
                releases: LeaseReleases::default(),
                seen_commits: SeenCommits::default(),
                purges: Purges::default(),
                ended_here: EndedHere::default(),
                elsewhere: RefreshesElsewhere::default(),
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// Makes sure the recorder in force exports `stage`'s coordination
    /// counters (at zero before any flight): events register them anyway;
    /// this is for a scrape before the first one, under a recorder
    /// installed after the flights were built.
    pub fn publish_metrics(&self, stage: &StageName) {
        self.st.metrics.get(stage).with(|_| ());
    }

    /// The validated policy.
    pub fn policy(&self) -> &DistributedPolicy {
        &self.st.policy
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.st.backend
    }

    /// Tokens this node gave up on while they may hold a lease, not yet
    /// released (see `singleflight_orphan_release_total`).
    pub fn releasing(&self) -> usize {
        self.st.releases.len()
    }

    /// Resolves once no background coordination is left: owners still at
    /// work (their leases are counted from the grant), their commits and
    /// abandons (with their heartbeats), and the release of leases this
    /// node gave up on. For graceful shutdown, and tests.
    pub async fn idle(&self) {
        loop {
            self.st.tasks.close();
            self.st.tasks.wait().await;
            self.st.tasks.reopen();
            if self.st.tasks.is_empty() {
                return;
            }
        }
    }

    /// Coordinates `req`, whose key is `key`: see the type's docs. `exec`
    /// runs the request when this node owns the flight (or the fallback
    /// says run here); `fallback` decides on coordination failures.
    ///
    /// Resolves to the shared result (this node's, or another node's), or
    /// an output that was not shared. Errors are answers: the owner's
    /// business error (here, or cached by another node: `RemoteFailure`),
    /// or what the fallback decided.
    pub async fn run<Req, E, P>(
        &self,
        key: &FlightKey,
        req: Req,
        exec: E,
        fallback: &P,
    ) -> Result<Shareable<E::Shared, E::Output>, BoxError>
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
        P: Fallback<Req>,
    {
        self.run_within(key, req, exec, fallback, None).await
    }

    /// Asks the backend's breaker, once, whether `key`'s flight goes to
    /// the backend, with the request borrowed: before the caller builds or
    /// moves anything for it. A flight the breaker refuses (open, or held
    /// back by a ramp after closing when [`Fallback::ramped`]) is decided by
    /// `fallback` at once, and the caller acts on the [`Verdict`] itself
    /// (on [`Verdict::RunHere`], its request's own execution as
    /// [`Role::Fallback`], not boxed); any other is [`Admitted`], for
    /// [`launch`](Self::launch). For callers that keep the degraded path as
    /// cheap as a local one (the facade's HYBRID stages); [`run`](Self::run)
    /// does both steps.
    #[inline]
    pub fn admit<Req, P: Fallback<Req>>(
        &self,
        key: &FlightKey,
        req: &Req,
        fallback: &P,
    ) -> Result<Admitted, Verdict> {
        self.st
            .admit(key, req, fallback)
            .map(|flight| Admitted { flight })
    }

    /// The flight `admit` let through, boxed with what it needs (a copy of
    /// the state, the key, the fallback) so that it outlives this call.
    /// `key` is the one `admitted` was asked for.
    pub fn launch<Req, E, P>(
        &self,
        admitted: Admitted,
        key: FlightKey,
        req: Req,
        exec: E,
        fallback: P,
        call_timeout: Option<Duration>,
    ) -> FlightFuture<E::Shared, E::Output>
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
        P: Fallback<Req> + 'static,
    {
        let st = Arc::clone(&self.st);
        Box::pin(async move {
            st.fly(&key, admitted.flight, req, exec, &fallback, call_timeout)
                .await
        })
    }

    /// [`run`](Self::run), with each backend call of this flight bounded by
    /// `call_timeout` too (the coordination slice of a caller's budget), if
    /// it is shorter than the policy's.
    pub async fn run_within<Req, E, P>(
        &self,
        key: &FlightKey,
        req: Req,
        exec: E,
        fallback: &P,
        call_timeout: Option<Duration>,
    ) -> Result<Shareable<E::Shared, E::Output>, BoxError>
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
        P: Fallback<Req>,
    {
        self.run_answered(key, req, exec, fallback, call_timeout)
            .await
            .map(|(out, _)| out)
    }

    /// [`run_within`](Self::run_within), saying how the caller was
    /// answered: by the work (here or on another node), by a fresh stored
    /// result (its age by the store's clock, for an `Age` header), or by
    /// a result past its freshness (the policy's
    /// [`stale_windows`](DistributedPolicy::stale_windows): why, and how
    /// old).
    pub async fn run_answered<Req, E, P>(
        &self,
        key: &FlightKey,
        req: Req,
        exec: E,
        fallback: &P,
        call_timeout: Option<Duration>,
    ) -> Result<(Shareable<E::Shared, E::Output>, Answered), BoxError>
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
        P: Fallback<Req>,
    {
        match self.st.admit(key, &req, fallback) {
            Err(verdict) => ran(self.st.decided(verdict, req, exec).await),
            Ok(flight) => {
                self.st
                    .fly(key, flight, req, exec, fallback, call_timeout)
                    .await
            }
        }
    }

    /// The answer a flight of `key` would give at once, without asking
    /// the store, because this node knows a refresh of `key` runs on
    /// another node (the store answered a flight of it FOLLOWER with the
    /// kept result beside, and the refresh has not ended since): that
    /// kept result within `stale-while-revalidate` (as old as it is now),
    /// unless this node purged `key` since or answered a newer result of
    /// it; this node's own copy instead when its work started later; once
    /// the refresh committed and its notice brought the result inline,
    /// that result, fresh ([`Answered::Hit`]), while it is.
    /// Counted as [`run_answered`](Self::run_answered) counts it
    /// (`singleflight_stale_served_total`, the age histogram). `None`
    /// when a flight is needed: then [`run_answered`](Self::run_answered)
    /// (which asks the same first) goes on from there.
    ///
    /// For callers that answer at a hit's cost what a flight would answer
    /// without its cost (the facade, before it starts one): no flight, no
    /// flight id computed (the watches are found by `key`), no store
    /// call, and the kept result decoded once per refresh, not once
    /// per caller. `kept_here` and `serves` are what the flight's
    /// [`Execute::kept_here`] and [`Execute::serves`] (for the caller's
    /// request) would say, the copy lent (cloned only when it answers).
    pub fn answer_during_refresh<T>(
        &self,
        key: &FlightKey,
        kept_here: Option<KeptHere<&T>>,
        serves: impl Fn(&T) -> bool,
    ) -> Option<(T, Answered)>
    where
        C: ResultCodec<T>,
        T: Clone + Send + Sync + 'static,
    {
        let kept_here = || {
            kept_here.map(|h| {
                let (value, ended, took) = h.into_parts();
                (ended, took, value.map(|v| || v.clone()))
            })
        };
        self.st.during_refresh(key, kept_here, serves)
    }

    /// Asks the store for an early refresh of `key`'s result, which is
    /// still fresh (`early-refresh`: a caller answered by this node's
    /// fresh copy of it was chosen, by XFetch, to refresh it): the store
    /// grants one when no lease of the key runs, and the granted refresh
    /// runs `exec` for `req` in the background as any refresh does (a
    /// fenced lease, its result committed in the fresh one's place,
    /// counted in `singleflight_refresh_total`), while every caller keeps
    /// its hit. `copy_age`: how old the caller's copy is; when the store
    /// holds a newer result (its work started after the copy's ended:
    /// another node refreshed it already), the grant is given back and
    /// nothing runs. The ask and the refresh run on their own, in the
    /// background ([`idle`](Self::idle) waits for them); the returned
    /// future resolves once the granted refresh has ended (`true`), or
    /// once none was granted (`false`): nothing runs then, nor when the
    /// store cannot be asked (or there is no runtime). Dropping it stops
    /// nothing.
    pub fn refresh_early<Req, E>(
        &self,
        key: &FlightKey,
        req: Req,
        exec: E,
        copy_age: Duration,
    ) -> impl Future<Output = bool> + Send + 'static
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
    {
        let cx = self.st.cx(key, FlightId::of(key), None);
        let st = Arc::clone(&self.st);
        let task = async move {
            match st.early_grant(cx, req, exec, Some(copy_age)).await {
                Some(refresh) => {
                    // Its end, however it ended (counted by its task).
                    let _ = refresh.await;
                    true
                }
                None => false,
            }
        };
        let asked = tokio::runtime::Handle::try_current()
            .ok()
            .map(|rt| self.st.tasks.spawn_on(task, &rt));
        async move {
            match asked {
                Some(asked) => asked.await.unwrap_or(false),
                None => false,
            }
        }
    }

    /// Forgets `key`'s stored result and fences its running owner, if any
    /// (its commit will be rejected): the next request runs the work again.
    /// Returns the new generation.
    pub async fn invalidate(&self, key: &FlightKey) -> Result<u64, BoxError> {
        let limit = self.st.policy.call_timeout_duration();
        let flight = FlightId::of(key);
        // From now on, no stale result fetched before this purge reached
        // the store answers on this node.
        let _purging = self.st.purges.begin(&flight);
        self.st.seen_commits.forget(&flight);
        let call = self
            .st
            .backend
            .invalidate(&flight, self.st.policy.state_ttl());
        match tokio::time::timeout(limit, call).await {
            Ok(res) => res.map_err(BackendError::into_core),
            Err(_) => Err(
                BackendError::outcome_unknown(CallTimedOut::new("invalidate", limit)).into_core(),
            ),
        }
    }
}

impl<B: Backend, C: Send + Sync + 'static> State<B, C> {
    /// The context of a flight of `key` (its id `flight`) that asks the
    /// store now: a fresh owner token, each call bounded by the policy's
    /// call timeout (or `call_timeout`, when shorter).
    fn cx(&self, key: &FlightKey, flight: FlightId, call_timeout: Option<Duration>) -> Cx {
        let policy = &self.policy;
        Cx {
            key: key.clone(),
            flight,
            token: OwnerToken::random(),
            terms: LeaseTerms {
                lease: policy.lease_duration(),
                state_ttl: policy.state_ttl(),
                allow_takeover: policy.takeover_allowed(),
            },
            call_timeout: call_timeout.map_or(policy.call_timeout_duration(), |d| {
                d.min(policy.call_timeout_duration())
            }),
            metrics: self.metrics.get(key.stage()),
            started: Instant::now(),
            purge_mark: self.purges.mark(&flight),
        }
    }

    /// The one question a flight asks before anything is built: whether
    /// the backend refuses it ([`Backend::reject_early`] for its shard,
    /// and [`Backend::held_back`] when the fallback can run it elsewhere:
    /// then [`Fallback::held_back`] decides).
    /// `Err`: the fallback's verdict on the refusal; `Ok`: the flight goes
    /// on, with its id when naming its shard needed it (a backend that is
    /// not sharded is asked without: the degraded path hashes nothing
    /// more).
    #[inline(always)]
    fn admit<Req, P: Fallback<Req>>(
        &self,
        key: &FlightKey,
        req: &Req,
        fallback: &P,
    ) -> Result<Option<FlightId>, Verdict> {
        let (flight, shard) = if self.backend.sharded() {
            let flight = FlightId::of(key);
            let shard = self.backend.shard(&flight);
            (Some(flight), shard)
        } else {
            (None, Shard::WHOLE)
        };
        let refused = match self.backend.reject_early(&shard) {
            Some(refused) => refused,
            None if fallback.ramped() => match self.backend.held_back(&shard) {
                Some(held) => return Err(fallback.held_back(held, req)),
                None => return Ok(flight),
            },
            None => return Ok(flight),
        };
        let class = FailureClass::of(refused.kind(), refused.is_rejected());
        Err(fallback.before_acquire(class, refused, req))
    }

    /// What the fallback decided before any call (or when a wait ended).
    // An async block, as every future here that takes the request and its
    // execution by value: an `async fn` moves its arguments from the
    // future's captures into locals of their own when first polled, so its
    // future holds them twice (an HTTP request and its execution are 552
    // bytes) and copies them once more; a block uses its captures in place.
    #[allow(clippy::manual_async_fn)]
    fn decided<Req, E: Execute<Req>>(
        &self,
        verdict: Verdict,
        req: Req,
        exec: E,
    ) -> impl Future<Output = Result<Shareable<E::Shared, E::Output>, BoxError>> {
        async move {
            match verdict {
                Verdict::RunHere => exec.execute(req, Role::Fallback).await,
                Verdict::Fail(e) => Err(e),
            }
        }
    }

    /// The flight of `key`, admitted: its calls to the backend, then its
    /// role (owner, follower, hit).
    // An async block: see `decided`.
    #[allow(clippy::manual_async_fn)]
    fn fly<'a, Req, E, P>(
        self: &'a Arc<Self>,
        key: &'a FlightKey,
        flight: Option<FlightId>,
        req: Req,
        exec: E,
        fallback: &'a P,
        call_timeout: Option<Duration>,
    ) -> impl Future<Output = Reply<E::Shared, E::Output>> + 'a
    where
        Req: Send + 'static,
        C: ResultCodec<E::Shared>,
        E: Execute<Req> + 'static,
        P: Fallback<Req>,
    {
        async move {
            let st = self;
            // A refresh of the key runs elsewhere, as the store told this node:
            // its kept result answers without asking again (nothing of the
            // flight is built for it).
            let kept_here = || owned(exec.kept_here());
            if let Some(answered) = st.during_refresh(key, kept_here, |v| exec.serves(v, &req)) {
                return kept_reply(answered);
            }
            let flight = flight.unwrap_or_else(|| FlightId::of(key));
            let cx = st.cx(key, flight, call_timeout);
            // Until the token is known to hold no lease (or the owner's lease
            // takes it over), dropping this flight releases it.
            let mut guard = TokenGuard::new(st, &cx);
            // A subscription in force before the first call: if this flight
            // follows, it needs no subscribe and no re-check.
            let mut joined = st.backend.join_subscription(&cx.flight);
            // A stage with stale windows also asks for a result kept past its
            // freshness.
            let ask = st.ask();
            let mut first = st.acquire(&cx, Op::Acquire, &mut guard, ask).await;
            // Every flight whose first call went out is counted (a refusal by
            // a local guard sent nothing).
            if !matches!(&first, Err(e) if e.is_rejected()) {
                cx.metrics.with(|m| m.request.increment(1));
            }
            // An ambiguous first try is resolved by a retry with the same
            // token (the backend answers OWNER with the same generation if the
            // first one ran).
            if matches!(&first, Err(e) if e.kind() == BackendErrorKind::OutcomeUnknown) {
                let ask = Ask {
                    recheck: true,
                    ..ask
                };
                first = st.acquire(&cx, Op::Recheck, &mut guard, ask).await;
            }
            let acquired = match first {
                Ok(a) => a,
                Err(e) => {
                    drop(joined);
                    // Given up: a lease this token may hold is released.
                    drop(guard);
                    return ran(st.before_acquire(e, req, exec, fallback).await);
                }
            };
            if !matches!(acquired, Acquired::Hit(_) | Acquired::Stale(_)) {
                st.missing(&cx);
            }
            if !matches!(acquired, Acquired::Follower { .. }) {
                joined = None;
            }
            match acquired {
                Acquired::Hit(stored) => {
                    guard.settled();
                    st.seen_commits.forget_other(&cx.flight, stored.generation);
                    cx.metrics.with(|m| m.hit.increment(1));
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation = stored.generation, role = "hit", "replaying stored result");
                    match st.replay(cx.named(), &stored) {
                        Ok(Some(v)) if exec.serves(&v, &req) => {
                            st.hit_here(&cx, stored.generation);
                            // As old as the store says, or, when it ran here,
                            // since its work ended (a commit may land late).
                            let age = st.age_here(&cx.flight, stored.generation, stored.age);
                            st.refresh_early(&cx, &stored, req, exec);
                            let hit = Answered::Hit {
                                age,
                                fresh_for: stored.fresh_for().min(stored.ttl.saturating_sub(age)),
                                work_time: stored.work_time,
                            };
                            Ok((Shareable::Shared(v), hit))
                        }
                        Ok(Some(_)) => ran(exec.execute(req, Role::Unserved).await),
                        Ok(None) => Err(Box::new(cached_failure::decode(&stored.payload))),
                        // A stored value this node cannot read (a foreign or
                        // newer format) is a protocol failure before acquire.
                        Err(e) => ran(st.before_acquire(e, req, exec, fallback).await),
                    }
                }
                // A refresh failed a moment ago (the store throttles the next
                // one) or the store refuses writes: it grants no refresh and
                // answers the kept result, as `error` within
                // `stale-if-error`, else as `revalidate` within that window
                // (the store keeps it for the longest window of the node that
                // committed it); past this stage's windows it is no answer.
                Acquired::Stale(stored) => {
                    guard.settled();
                    let windows = st.policy.stale();
                    let reason = |kept: &StoredResult| {
                        if within(kept.stale_for(), windows.if_error) {
                            Some(StaleReason::Error)
                        } else if within(kept.stale_for(), windows.revalidate) {
                            Some(StaleReason::Revalidate)
                        } else {
                            None
                        }
                    };
                    let usable = st.usable(&cx, Some(stored.clone()), &exec, &req);
                    match usable.and_then(|(v, kept)| Some((v, reason(&kept)?, kept))) {
                        Some((v, reason, kept)) => {
                            kept_reply(st.kept_answer(cx.named(), v, &kept, reason))
                        }
                        // A result that does not serve this request (HTTP's
                        // `Vary`): it runs its own, as at a hit.
                        None if st
                            .replay::<E::Shared>(cx.named(), &stored)
                            .is_ok_and(|v| v.is_some_and(|v| !exec.serves(&v, &req))) =>
                        {
                            ran(exec.execute(req, Role::Unserved).await)
                        }
                        // Nothing this node may answer (past its windows,
                        // or older than a result it gave): as a follower
                        // told so, the caller gets the failure the store
                        // throttles, and runs nothing beside it.
                        None => Err(follow::throttled()),
                    }
                }
                Acquired::Owner {
                    generation,
                    takeover,
                    stale,
                } => {
                    cx.metrics.with(|m| {
                        m.owner.increment(1);
                        m.miss.increment(1);
                        if takeover {
                            m.takeover.increment(1);
                        }
                    });
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, takeover, role = "owner", "owning flight");
                    guard.owned();
                    match st.usable(&cx, stale, &exec, &req) {
                        // Boxed, as the follower's paths below: this future
                        // is as large as its largest path, and its caller
                        // moves it (a boxed launch copies all of it).
                        Some(kept) => {
                            Box::pin(st.refresh_stale(&cx, generation, req, exec, kept)).await
                        }
                        None => ran(st.own(&cx, generation, req, exec).await),
                    }
                }
                Acquired::Follower { generation, .. } | Acquired::Expired { generation } => {
                    guard.settled();
                    cx.metrics.with(|m| {
                        m.follower.increment(1);
                        m.miss.increment(1);
                    });
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, generation, role = "follower", "following flight");
                    let (lease_remaining, stale) = match acquired {
                        Acquired::Follower {
                            lease_remaining,
                            stale,
                            ..
                        } => (Some(lease_remaining), stale),
                        _ => (None, None),
                    };
                    // Kept, for this node's next callers while the refresh runs.
                    let watch = match (&stale, lease_remaining, &joined) {
                        (Some(raw), Some(lease), Some(_)) => Some((raw.clone(), lease)),
                        _ => None,
                    };
                    let kept = st.usable(&cx, stale, &exec, &req);
                    let revalidate = st.policy.stale().revalidate;
                    let kept = match kept {
                        Some((value, kept)) if within(kept.stale_for(), revalidate) => {
                            if let (Some((raw, lease)), Some(notices)) = (watch, joined) {
                                st.watch_refresh(&cx, raw, lease, notices);
                            }
                            return kept_reply(st.kept_answer(
                                cx.named(),
                                value,
                                &kept,
                                StaleReason::Revalidate,
                            ));
                        }
                        other => other,
                    };
                    let first = follow::Following {
                        generation,
                        lease_remaining,
                        joined,
                        stale: kept.is_some(),
                    };
                    match kept {
                        Some(kept) => {
                            let judge = exec.failures();
                            let end = exec.kept_end();
                            // Boxed apart: `follow_stale` moves what it
                            // follows into the block that notes how it came,
                            // and a follow's future is kilobytes.
                            let following = Box::pin(follow::follow(
                                st, &cx, guard, first, req, exec, fallback,
                            ));
                            Box::pin(st.follow_stale(&cx, judge, kept, end, following)).await
                        }
                        None => {
                            Box::pin(follow::follow(st, &cx, guard, first, req, exec, fallback))
                                .await
                        }
                    }
                }
            }
        }
    }

    /// The flight's result is not stored (the acquire was granted, or found
    /// the flight running): if this node saw it committed and its TTL has
    /// not run out, ask the backend (in the background) whether it was
    /// invalidated since; if not, the result was lost, counted and logged.
    fn missing(self: &Arc<Self>, cx: &Cx) {
        let Some(generation) = self.seen_commits.take(&cx.flight) else {
            return;
        };
        let st = Arc::clone(self);
        let stage = cx.stage().clone();
        let cx = cx.clone();
        let check = async move {
            let asked = st.backend.invalidated_since(&cx.flight, generation);
            match tokio::time::timeout(cx.call_timeout, asked).await {
                Ok(Ok(Some(false))) => {
                    cx.metrics.with(|m| m.result_lost.increment(1));
                    tracing::warn!(stage = %cx.stage(), flight = %cx.flight, generation, "a committed result is gone before its TTL ran out (the store lost writes: a failover, a flush); the flight runs again");
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, error = %e, "could not tell whether a missing result was lost");
                }
                Err(_) => {
                    tracing::debug!(stage = %cx.stage(), flight = %cx.flight, "could not tell whether a missing result was lost: timed out");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(self.tasks.spawn_on(check, &rt)),
            Err(_) => tracing::debug!(%stage, "no runtime to check a missing result"),
        }
    }

    /// Runs one backend call under the flight's call deadline, counting
    /// failures. While it runs, the token is suspected of holding a lease
    /// (a drop mid-call, or an answer of unknown outcome, leaves it so).
    pub(crate) async fn call<'a, T>(
        &'a self,
        cx: &'a Cx,
        op: Op,
        guard: &mut TokenGuard<'_, B, C>,
        start: impl FnOnce(&'a B) -> BackendFuture<'a, T>,
    ) -> Result<T, BackendError> {
        guard.suspect();
        let res = self.timed(cx, op, start(&self.backend)).await;
        match &res {
            Err(e) if e.kind() == BackendErrorKind::OutcomeUnknown => guard.ambiguous(),
            _ => guard.settled(),
        }
        res
    }

    /// One ACQUIRE (or re-check) of the flight under its call deadline,
    /// carrying that deadline as its not-after: an ACQUIRE that reaches the
    /// store after this node gave it up (queued on a frozen server, resent
    /// after its reply was lost) grants nothing, whatever the backend.
    pub(crate) async fn acquire(
        &self,
        cx: &Cx,
        op: Op,
        guard: &mut TokenGuard<'_, B, C>,
        ask: Ask,
    ) -> Result<Acquired, BackendError> {
        self.call(cx, op, guard, |b| {
            let not_after = Some(Instant::now() + cx.call_timeout);
            b.acquire_with(&cx.flight, &cx.token, Ask { not_after, ..ask }, &cx.terms)
        })
        .await
    }

    /// One backend call under the flight's call deadline, counting failures
    /// (a refusal by a local guard is not a backend failure).
    pub(crate) async fn timed<T>(
        &self,
        cx: &Cx,
        op: Op,
        fut: BackendFuture<'_, T>,
    ) -> Result<T, BackendError> {
        let limit = cx.call_timeout;
        let res = match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::outcome_unknown(CallTimedOut::new(
                op.as_str(),
                limit,
            ))),
        };
        if let Err(e) = &res {
            if !e.is_rejected() {
                cx.metrics.with(|m| m.coordination_error(e.kind(), op));
                tracing::debug!(stage = %cx.stage(), op = op.as_str(), error = %e, "coordination call failed");
            }
        }
        res
    }

    /// Coordination failed before this node acquired the flight: the
    /// fallback decides.
    fn before_acquire<Req, E, P>(
        &self,
        error: BackendError,
        req: Req,
        exec: E,
        fallback: &P,
    ) -> impl Future<Output = Result<Shareable<E::Shared, E::Output>, BoxError>>
    where
        E: Execute<Req>,
        P: Fallback<Req>,
    {
        let class = FailureClass::of(error.kind(), error.is_rejected());
        let verdict = fallback.before_acquire(class, error, &req);
        self.decided(verdict, req, exec)
    }

    /// Following ended without a result: the fallback decides.
    pub(crate) fn wait_ended<Req, E, P>(
        &self,
        end: WaitEnded,
        error: BoxError,
        req: Req,
        exec: E,
        fallback: &P,
    ) -> impl Future<Output = Result<Shareable<E::Shared, E::Output>, BoxError>>
    where
        E: Execute<Req>,
        P: Fallback<Req>,
    {
        let verdict = fallback.wait_ended(end, error, &req);
        self.decided(verdict, req, exec)
    }

    /// Counts for `named`'s stage.
    pub(crate) fn count(&self, named: Named<'_>, f: impl FnOnce(&Bundle)) {
        named.metrics.with(f);
    }

    /// A stored result, decoded: `Some` value, or `None` for a cached
    /// failure of the owner.
    pub(crate) fn replay<T>(
        &self,
        named: Named<'_>,
        stored: &StoredResult,
    ) -> Result<Option<T>, BackendError>
    where
        C: ResultCodec<T>,
    {
        match stored.status {
            ResultStatus::Ok => self.decode(named, &stored.payload).map(Some),
            ResultStatus::Failed => Ok(None),
        }
    }

    /// Decodes a stored (or inline) result; one that does not decode is a
    /// protocol failure (a foreign or newer format), counted and logged.
    pub(crate) fn decode<T>(&self, named: Named<'_>, payload: &[u8]) -> Result<T, BackendError>
    where
        C: ResultCodec<T>,
    {
        self.envelope.open(&self.codec, payload).map_err(|e| {
            self.count(named, |m| m.undecodable());
            tracing::warn!(stage = %named.stage, error = %e, "stored result does not decode");
            BackendError::protocol(e)
        })
    }

    /// Runs the request as the owner: the lease is kept (heartbeats) from
    /// here until its commit or abandon has returned, by this future while
    /// the work runs, then in the background; the commit is sent as the
    /// value goes to the callers.
    pub(crate) async fn own<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        generation: u64,
        req: Req,
        exec: E,
    ) -> Result<Shareable<E::Shared, E::Output>, BoxError>
    where
        B: Backend,
        C: ResultCodec<E::Shared> + Send + Sync + 'static,
        E: Execute<Req>,
    {
        self.own_judged(cx, generation, req, exec, None, None).await
    }

    /// [`own`](Self::own), refreshing a kept result: with `judge`, an
    /// outcome it calls failed is neither committed nor replayed by the
    /// store, which answers the kept result stale instead and throttles
    /// the next refresh for `stale-retry-after`. With `told`, it is told
    /// how the flight's settling ended (a refresh counts its outcome by
    /// it: a fenced commit replaced nothing).
    pub(crate) async fn own_judged<Req, E>(
        self: &Arc<Self>,
        cx: &Cx,
        generation: u64,
        req: Req,
        exec: E,
        judge: Option<&Judge<E::Shared>>,
        told: Option<oneshot::Sender<Settled>>,
    ) -> Result<Shareable<E::Shared, E::Output>, BoxError>
    where
        B: Backend,
        C: ResultCodec<E::Shared> + Send + Sync + 'static,
        E: Execute<Req>,
    {
        let mut lease = Lease::new(self, cx, generation);
        if let Some(to) = told {
            lease.tell(to);
        }
        let token = crate::backend::FencingToken {
            generation,
            owner: cx.token.clone(),
        };
        let started = Instant::now();
        let work = exec.execute(req, Role::Owner(token));
        let Some(result) = lease.run(work).await else {
            // Dropping the lease abandons it (it is gone anyway).
            return Err(Box::new(LeaseLost::new(
                Some(cx.stage().clone()),
                generation,
            )));
        };
        let took = started.elapsed();
        let failed = |outcome| judge.is_some_and(|j| j.failed(outcome));
        let retry_after = self.policy.stale().retry_after;
        match result {
            Ok(Shareable::Shared(v)) if failed(Ok(&v)) => {
                lease.finish(Finish::Throttle(None, retry_after));
                Ok(Shareable::Shared(v))
            }
            Ok(Shareable::Shared(v)) => {
                lease.finish(self.seal(cx, &v, took));
                Ok(Shareable::Shared(v))
            }
            Ok(unshared @ Shareable::Unshared(..)) => {
                lease.finish(Finish::Abandon(None));
                Ok(unshared)
            }
            Err(e) => {
                cx.metrics.with(|m| m.owner_failure.increment(1));
                let cached = !self.policy.failure_ttl_duration().is_zero();
                let failure = cached.then(|| cached_failure::encode(&*e));
                if failed(Err(&e)) {
                    lease.finish(Finish::Throttle(failure, retry_after));
                } else {
                    lease.finish(Finish::Abandon(failure));
                }
                Err(e)
            }
        }
    }

    /// What the owner does with its value: commit it, or, when it cannot
    /// be stored (too large, does not encode), release the flight.
    fn seal<T>(&self, cx: &Cx, value: &T, took: Duration) -> Finish
    where
        C: ResultCodec<T>,
    {
        match self.envelope.seal(&self.codec, value) {
            Ok(payload) if payload.len() <= self.policy.max_result_size() => {
                Finish::Commit(payload, took)
            }
            Ok(payload) => {
                tracing::debug!(stage = %cx.stage(), size = payload.len(), "result too large to store");
                Finish::Abandon(None)
            }
            Err(e) => {
                cx.metrics.with(|m| m.result_write_failure.increment(1));
                tracing::warn!(stage = %cx.stage(), error = %e, "result does not encode; not stored");
                Finish::Abandon(None)
            }
        }
    }
}

/// A follower's deadline: the policy's wait timeout from `started`.
pub(crate) fn wait_deadline(policy: &DistributedPolicy, started: Instant) -> Instant {
    started
        .checked_add(policy.wait_timeout_duration())
        .unwrap_or(started)
}
