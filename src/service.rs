//! The service a [`GenericSingleFlightLayer`](crate::GenericSingleFlightLayer)
//! builds: [`GenericSingleFlight`].
//!
//! It is always ready: it decides in `call` (bypass, coalesce, reject) and
//! drives the inner service to readiness on the path that runs it, which is
//! what axum expects.
//!
//! ```
//! use flightdeck::core::{CloneShare, FlightKey, StageName};
//! use flightdeck::distributed::PostcardCodec;
//! use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("local").unwrap();
//! let layer = GenericSingleFlightLayer::builder(
//!     move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
//!     CloneShare::<usize>::new(),
//!     PostcardCodec::<usize>::new(),
//! )
//! .stage("local", StageConfig::new().mode(Mode::LocalOnly))
//! .build()
//! .unwrap();
//! let mut svc = layer.layer(service_fn(|q: String| async move {
//!     Ok::<_, std::convert::Infallible>(q.len())
//! }));
//! assert_eq!(svc.ready().await.unwrap().call("four".to_owned()).await.unwrap(), 4);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck_budget::Slices;
use flightdeck_core::error::{find, BoxError};
use flightdeck_core::error::{DeadlineExceeded, FlightAbandoned, WaitTimeout, WorkPanicked};
use flightdeck_core::stale::{xfetch, Stale, StaleReason};
use flightdeck_core::{ErrorClass, FlightKey, Serves, Share, Shareable, SharedForm, StageName};
use flightdeck_distributed::{Answered, KeptHere};
use flightdeck_local::future::Run;
use flightdeck_local::{Answer, Caller, FlightWork, OnAbandon};
use tokio::time::Instant;
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use crate::error::UnknownStage;
use crate::future::ResponseFuture;
use crate::kept::{Kept, Look, RefreshClaim};
use crate::layer::Shared;
use crate::layer::StageShare;
use crate::leader::{Leader, Record};
use crate::mode::Mode;
use crate::readers::RequestReaders;
use crate::stage::{Control, Path, RefreshOutcome};
use crate::stale::{Answered as AnswerServed, Answering, MarkAnswer, Served};

/// The service built by
/// [`GenericSingleFlightLayer`](crate::GenericSingleFlightLayer) around
/// `S`: `R` reads its requests, `Sh` shares its responses.
pub struct GenericSingleFlight<S, R, Sh: SharedForm> {
    inner: S,
    shared: Arc<Shared<R, Sh>>,
}

impl<S, R, Sh: SharedForm> GenericSingleFlight<S, R, Sh> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<R, Sh>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, R, Sh: SharedForm> Clone for GenericSingleFlight<S, R, Sh> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, R, Sh: SharedForm> fmt::Debug for GenericSingleFlight<S, R, Sh> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenericSingleFlight")
            .field("inner", &self.inner)
            .field("stages", &self.shared.stages.len())
            .finish_non_exhaustive()
    }
}

impl<S, Req, R, Sh> Service<Req> for GenericSingleFlight<S, R, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    R: RequestReaders<Req>,
    Sh: Share<S::Response> + Serves<Req> + StageShare + MarkAnswer<Sh::Output>,
{
    type Response = Sh::Output;
    type Error = BoxError;
    type Future = ResponseFuture<
        Oneshot<S, Req>,
        Run<Sh::Shared, Leader<S, Req, R, Sh>>,
        Answering<Sh::Shared, Sh::Output>,
        Sh,
    >;

    /// Always ready: the decision (bypass, coalesce, reject) is made in
    /// `call`, and the inner service is driven to readiness by the path
    /// that runs it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &*self.shared;
        let share = shared.share.clone();
        let Some(key) = shared.readers.key(&req) else {
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), None, share);
        };
        let Some(stage) = shared.stages.get(key.stage()) else {
            return ResponseFuture::failed(Box::new(UnknownStage::new(key.stage().clone())), share);
        };
        let share = stage.share.clone();
        let ctl = &stage.ctl;
        ctl.count_request();
        let mode = ctl.mode();
        if mode == Mode::Bypass {
            ctl.count_bypass();
            ctl.count_execution(Path::Bypass);
            let timed = Some(Arc::clone(ctl));
            return ResponseFuture::bypass(self.inner.clone().oneshot(req), timed, share);
        }
        let (at, slices) = match deadline_of(&shared.readers, &req) {
            Ok(d) => d,
            Err(e) => return ResponseFuture::failed(e, share),
        };
        // An outer budget's coordination slice bounds each backend call.
        // The work is every caller's: bounded by the stage's own settings,
        // never by one caller's execution slice (which bounds that
        // caller's own wait, where its budget layer enforces it), or a
        // caller that joins would get another's deadline.
        let coordination = slices.map(|s| s.coordination);
        let bound = ctl.cfg.execution_timeout;
        // The flight's abandon rule comes from the mode in force: other
        // nodes may wait on a distributed flight, so it finishes when its
        // callers leave; a local one is cancelled.
        let on_abandon = if mode.is_distributed() {
            OnAbandon::Finish
        } else {
            OnAbandon::Cancel
        };
        let leader = Leader {
            stage: Arc::clone(stage),
            mode,
            req,
            inner: self.inner.clone(),
            share: share.clone(),
            coordination,
            bound,
            arrival: 0,
        };
        let caller = Caller::new().deadline(at).on_abandon(on_abandon);
        let headers = ctl.cfg.cache_status;
        if stage.stale.is_some() {
            return leader.stale_paths(key, caller, at, share);
        }
        let run = if Sh::INLINE_LOOKUP {
            stage.local.run_inlined(&key, caller, leader)
        } else {
            stage.local.run(&key, caller, leader)
        };
        ResponseFuture::flight(run, headers, share)
    }
}

/// The service's response future, named outside the `Service` impl.
type ServiceFuture<S, Req, R, Sh> = ResponseFuture<
    Oneshot<S, Req>,
    Run<<Sh as SharedForm>::Shared, Leader<S, Req, R, Sh>>,
    Answering<<Sh as SharedForm>::Shared, <Sh as Share<<S as Service<Req>>::Response>>::Output>,
    Sh,
>;

impl<S, Req, R, Sh> Leader<S, Req, R, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    R: RequestReaders<Req>,
    Sh: Share<S::Response> + Serves<Req> + StageShare,
{
    /// A stage that keeps its results (a stale window or hit-for-pass is on):
    /// the key's copy answers while fresh (the replay window), past it within
    /// a window as a stale answer, or when the work fails or is slow; a key
    /// whose last response could not be shared runs its callers at once.
    ///
    /// LOCAL_ONLY uses every window; a distributed stage uses its copy only
    /// while its whole store is degraded (then every stale answer says
    /// `redis_down`), and for a flight that runs in the local fallback (its
    /// failure, its callers still waiting at the soft timeout): otherwise
    /// the store keeps and answers results across nodes (a caller whose
    /// flight it would answer at once, a refresh of the key running
    /// elsewhere, is answered before any flight: `during_refresh`).
    ///
    /// `at` is the caller's own deadline (also in `caller`): a run alone
    /// (hit-for-pass) ends by it, as a flight's callers do.
    fn stale_paths(
        self,
        key: FlightKey,
        caller: Caller,
        at: Option<Instant>,
        share: Sh,
    ) -> ServiceFuture<S, Req, R, Sh> {
        let mut leader = self;
        let stage = &Arc::clone(&leader.stage);
        let ctl = &stage.ctl;
        let cfg = &ctl.cfg;
        let headers = cfg.cache_status;
        let Some(setup) = stage.stale.clone() else {
            return ResponseFuture::flight(stage.local.run(&key, caller, leader), headers, share);
        };
        let kept = &setup.kept;
        // A distributed flight may be answered by the store itself (a
        // stale result, a hit): its callers are told how.
        // `claim`: the key's refresh on this node, when this flight
        // refreshes the copy (see below), held until its leader is
        // answered (its result kept) or leaves.
        let flight =
            |mut leader: Self, caller: Caller, share: Sh, claim: Option<RefreshClaim<_>>| {
                if !leader.mode.is_distributed() {
                    return ResponseFuture::flight(
                        stage.local.run(&key, caller, leader),
                        headers,
                        share,
                    );
                }
                let (kept, key, ctl) = (Arc::clone(&setup.kept), key.clone(), Arc::clone(ctl));
                let arrival = kept.arrival();
                leader.arrival = arrival;
                let run = stage.local.run(&key, caller, leader);
                let arrival = (arrival, kept.now_at());
                let marks = Box::new(move |joined| {
                    drop(claim);
                    stored_answer(&kept, &key, arrival, &ctl, joined)
                });
                ResponseFuture::flight_marked(run, headers, share, marks)
            };
        let found = kept.find(&key);
        if found.is_err() {
            ctl.count_hit_for_pass();
            let alone = leader.alone(&key);
            let stage_name = key.stage().clone();
            let fut = async move {
                let answer = match own_run(alone, at, stage_name).await? {
                    Shareable::Shared(v) => Answer::Led(v),
                    Shareable::Unshared(o, _) => Answer::Own(o),
                };
                Ok((answer, Served::Pass))
            };
            return ResponseFuture::stale(Box::pin(fut), headers, share);
        }
        let mode = leader.mode;
        let answers = match mode {
            Mode::LocalOnly => true,
            m if m.is_distributed() => {
                ctl.sync();
                ctl.whole_degraded()
            }
            _ => false,
        };
        let now = Instant::now();
        let look = found.ok().flatten().filter(|l| leader.serves(&l.value));
        let fresh = cfg.replay_ttl;
        let windows = cfg.stale_windows();
        // With the store up, a refresh of the key that this node knows runs
        // elsewhere answers past the copy's freshness as the flight would at
        // once, without one.
        let copy_fresh = look
            .as_ref()
            .is_some_and(|l| now.saturating_duration_since(l.done) < fresh);
        if !answers && !copy_fresh && !windows.revalidate.is_zero() {
            if let Some(served) = leader.during_refresh(&key, look.as_ref(), now) {
                let fut = std::future::ready(Ok(served));
                return ResponseFuture::stale(Box::pin(fut), headers, share);
            }
        }
        let Some(look) = look else {
            return flight(leader, caller, share, None);
        };
        let age = now.saturating_duration_since(look.done);
        if age < fresh {
            // The replay window. Near its end, one caller may refresh it
            // early: here, or, while the store is up, across the nodes.
            let left = fresh - age;
            let window = within(left, windows.early_refresh);
            let across = window && !answers && leader.during_store_up();
            let early = window && (answers || across) && xfetch(left, look.took);
            match early.then(|| kept.claim_refresh(&key)).flatten() {
                Some(claim) if across => leader.refresh_early(&key, claim, age, left),
                Some(claim) => leader.refresh(&key, claim),
                None => {}
            }
            let served = Served::Hit { age, ttl: left };
            let fut = std::future::ready(Ok((Answer::Shared(look.value), served)));
            return ResponseFuture::stale(Box::pin(fut), headers, share);
        }
        let past = age - fresh;
        let reason = move |r: StaleReason| {
            if mode.is_distributed() {
                StaleReason::RedisDown
            } else {
                r
            }
        };
        // `r` as it is (not mapped to `redis_down`).
        let stale_answer_as = |r: StaleReason, value: Sh::Shared| {
            let stale = Stale { reason: r, age };
            ctl.count_stale(stale);
            let fut =
                std::future::ready(Ok((Answer::Shared(value), Served::Stale { stale, past })));
            ResponseFuture::stale(Box::pin(fut) as Answering<_, _>, headers, share.clone())
        };
        let stale_answer = |r: StaleReason, value: Sh::Shared| stale_answer_as(reason(r), value);
        // While the store is reachable it answers (across nodes); a flight
        // that could not reach it (or was not sent there) runs in the local
        // fallback, and the copy stands by for that run's failure (within
        // `stale-if-error`) and for its callers still waiting at the soft
        // timeout, as while the store is degraded: the breaker opens only
        // after a few such flights.
        let fallback_only = !answers;
        let mut claim = None;
        if fallback_only {
            // Grace while the store is up: the key's flight on this node
            // asks it (the first caller's, which the store may answer with
            // a newer result, its kept one, or the refresh itself); the
            // callers that arrive before that flight ends are answered by
            // the copy at once, not made to wait for the store's answer.
            if within(past, windows.revalidate) && leader.during_store_up() {
                match kept.claim_refresh(&key) {
                    Some(c) => claim = Some(c),
                    None => return stale_answer_as(StaleReason::Revalidate, look.value),
                }
            }
            let soft_on = !windows.soft_timeout.is_zero();
            let stands_by =
                within(past, windows.if_error) || (soft_on && within(past, windows.keep_stale()));
            if !(mode.is_distributed() && stands_by) {
                return flight(leader, caller, share, claim);
            }
        } else {
            // Throttled after a failure: the copy answers, the work waits.
            if within(past, windows.if_error) && look.retry_until.is_some_and(|t| now < t) {
                return stale_answer(StaleReason::Error, look.value);
            }
            if within(past, windows.revalidate) {
                if let Some(claim) = kept.claim_refresh(&key) {
                    leader.refresh(&key, claim);
                }
                return stale_answer(StaleReason::Revalidate, look.value);
            }
            if !within(past, windows.keep_stale()) {
                return flight(leader, caller, share, None);
            }
        }
        // The flight runs; the copy stands by for a failure (within
        // `stale-if-error`) and for callers still waiting at the soft
        // timeout, whose leaving must not cancel the work.
        let soft = windows.soft_timeout;
        let caller = if soft.is_zero() {
            caller
        } else {
            // The work its callers may leave goes on, but not past the
            // longest a caller waits when no execution timeout bounds it.
            leader.bound = leader.bound.or(Some(cfg.wait_timeout));
            caller.on_abandon(OnAbandon::Finish)
        };
        let arrival = kept.arrival();
        leader.arrival = arrival;
        let run = stage.local.run(&key, caller, leader);
        let joined_at = kept.now_at();
        let retry_after = windows.retry_after;
        let ctl = Arc::clone(ctl);
        let copy = look.value;
        let done = look.done;
        let gen = look.gen;
        let fut = async move {
            // Held until this caller is answered (see `flight`).
            let _claim = claim;
            // How far past its freshness the copy is now, if it may still
            // answer in `window`: it never answers past freshness + window,
            // nor once it is no longer the key's copy (purged, or replaced
            // by a newer result that callers may have been given).
            let past_within = |window: Duration| {
                if !setup.kept.holds(&key, gen) {
                    return None;
                }
                let age = Instant::now().saturating_duration_since(done);
                let past = age.saturating_sub(fresh);
                within(past, window).then_some((age, past))
            };
            // `r` as it is, when `as_is` (not mapped to `redis_down`).
            let stale_as = |r: StaleReason, as_is: bool, (age, past): (Duration, Duration)| {
                let stale = Stale {
                    reason: if as_is { r } else { reason(r) },
                    age,
                };
                ctl.count_stale(stale);
                Served::Stale { stale, past }
            };
            let mut run = std::pin::pin!(run);
            let out = if soft.is_zero() {
                run.await
            } else {
                match tokio::time::timeout(soft, &mut run).await {
                    Ok(out) => out,
                    Err(_) => {
                        // While the store is reachable, only while the
                        // flight runs in the local fallback (the store
                        // answers its own flights' soft timeouts, from its
                        // kept result): `redis_down` when it could not
                        // reach the store, else as it is. `Some(down)`:
                        // the copy may answer (LOCAL_ONLY, a degraded
                        // store: always, as `reason` maps it).
                        let here = if fallback_only {
                            setup.kept.falling_back(&key, arrival)
                        } else {
                            Some(true)
                        };
                        match here.zip(past_within(windows.keep_stale())) {
                            Some((down, at)) => {
                                let served = stale_as(StaleReason::SoftTimeout, !down, at);
                                return Ok((Answer::Shared(copy), served));
                            }
                            // The store's to answer, or the copy too old
                            // by now: the caller waits on.
                            None => run.await,
                        }
                    }
                }
            };
            let failed = match &out {
                Ok(Answer::Led(v) | Answer::Shared(v)) => setup.failures.failed(Ok(v)),
                Ok(Answer::Own(_)) => false,
                Err(e) => setup.failures.failed(Err(e)),
            };
            // The caller's own wait ran out (`wait-timeout`): a timeout,
            // as an execution timeout is, whatever the judge of failures
            // says; not a failure of the work.
            let waited_out = out
                .as_ref()
                .is_err_and(|e| find::<WaitTimeout>(e.as_ref()).is_some());
            // While the store is reachable, only a run in the local
            // fallback (its flight could not reach the store: `redis_down`;
            // or a ramp held it back: the failure's own reason), or a
            // caller whose wait ran out while the stage's store is down
            // (it waited on a flight that could not reach it).
            // `Some(down)`: the copy may answer, and whether the store is
            // down (else the failure keeps its own reason).
            let fell_back = if fallback_only {
                setup.kept.fell_back_since(&key, arrival)
            } else {
                Some(true)
            };
            let fell_back = fell_back.or_else(|| {
                let down = waited_out && {
                    ctl.sync();
                    ctl.whole_degraded()
                };
                down.then_some(true)
            });
            let if_error = past_within(windows.if_error)
                .filter(|_| (failed || waited_out) && fell_back.is_some());
            if let Some(at) = if_error {
                // A caller's own deadline says nothing of the work: it
                // throttles nobody else.
                if !retry_after.is_zero() && !waited_out && !out.as_ref().is_err_and(own_deadline) {
                    setup.kept.throttle(&key, Instant::now() + retry_after);
                }
                let store_up = fell_back == Some(false);
                let why = if waited_out {
                    StaleReason::WaitTimeout
                } else {
                    StaleReason::Error
                };
                return Ok((Answer::Shared(copy), stale_as(why, store_up, at)));
            }
            let out = out?;
            let joined = matches!(out, Answer::Shared(_));
            let stored = fallback_only
                .then(|| stored_answer(&setup.kept, &key, (arrival, joined_at), &ctl, joined))
                .flatten();
            let served = stored.unwrap_or(if joined {
                Served::Collapsed
            } else {
                Served::Miss
            });
            Ok((out, served))
        };
        ResponseFuture::stale(Box::pin(fut), headers, share)
    }

    /// The answer a distributed flight of `key` would give at once, without
    /// asking the store, because this node knows that a refresh of the key
    /// runs on another node ([`DistributedFlights::answer_during_refresh`]:
    /// the store's kept result within `stale-while-revalidate`, or `look`,
    /// this node's copy, when its work started later; once the refresh
    /// committed with its result in the notice, that result, fresh, which
    /// becomes this node's copy as a flight's hit would), given without the
    /// flight, as a hit of the copy is: told as that flight's caller is
    /// (the stale marker, `Cache-Status`, `Age`) and counted once, by L2,
    /// as that flight's own answer is. Only while none of the stage's
    /// breakers is open: a flight they refuse runs in the local fallback.
    ///
    /// [`DistributedFlights::answer_during_refresh`]: flightdeck_distributed::DistributedFlights::answer_during_refresh
    fn during_refresh(
        &self,
        key: &FlightKey,
        look: Option<&Look<Sh::Shared>>,
        now: Instant,
    ) -> Option<AnswerServed<Sh::Shared, Sh::Output>> {
        let stage = &self.stage;
        let l2 = stage.distributed.as_ref()?;
        if !self.mode.is_distributed() || stage.ctl.breakers.any_degraded() {
            return None;
        }
        let kept = &stage.stale.as_ref()?.kept;
        let here = match look {
            Some(l) => Some(KeptHere::copy(
                &l.value,
                now.saturating_duration_since(l.done),
                l.took,
            )),
            None => kept
                .floor(key)
                .map(|done| KeptHere::gone(now.saturating_duration_since(done))),
        };
        // Taken before asking: a purge meanwhile fences what is kept.
        let ticket = kept.ticket_at(now);
        let (value, answered) = l2.answer_during_refresh(key, here, |v| self.serves(v))?;
        let served = Served::by_store(answered, stage.ctl.cfg.replay_ttl)?;
        // The refresh's result, committed elsewhere (a hit), or the kept
        // result, which answers only when its work started after the
        // copy's ended (stale): this node's copy from now on, as a
        // flight's answer would make it.
        let kept_as = match answered {
            Answered::Hit { age, work_time, .. } => Some((age, work_time)),
            Answered::Stale { stale, work_time } => Some((stale.age, work_time)),
            _ => None,
        };
        if let Some((age, work_time)) = kept_as {
            // Once: a copy that ended after this result's work started is
            // this result already, or the copy standing in for it.
            let started = now.checked_sub(age.saturating_add(work_time));
            let newer = look.is_none_or(|l| started.is_some_and(|s| l.done <= s));
            if let Some(record) = newer
                .then(|| Record::ticketed(stage, key, ticket))
                .flatten()
            {
                record.keep_shared(&value, age, Some(work_time));
            }
        }
        Some((Answer::Shared(value), served))
    }

    /// Whether this caller's flight would ask the store: a distributed
    /// mode, and none of the stage's breakers open (a flight they refuse
    /// runs in the local fallback).
    fn during_store_up(&self) -> bool {
        self.mode.is_distributed()
            && self.stage.distributed.is_some()
            && !self.stage.ctl.breakers.any_degraded()
    }

    /// Asks the store for an early refresh of `key` (its copy here is
    /// `age` old and fresh for `left` more), in the background: granted,
    /// it runs as the store's refreshes do
    /// ([`DistributedFlights::refresh_early`]), and its result becomes
    /// this node's copy; not granted, another node's runs, or ran (the
    /// node's next flight past the copy's end finds its result). `claim`,
    /// the key's refresh on this node, is held until the granted refresh
    /// ends, or, when none was granted, until the copy's end: this node
    /// asks once per freshness.
    ///
    /// [`DistributedFlights::refresh_early`]: flightdeck_distributed::DistributedFlights::refresh_early
    fn refresh_early(
        self,
        key: &FlightKey,
        claim: RefreshClaim<Sh::Shared>,
        age: Duration,
        left: Duration,
    ) {
        let stage = Arc::clone(&self.stage);
        let Some(l2) = stage.distributed.clone() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Bounded as every refresh is: by the stage's own settings.
        let cfg = &stage.ctl.cfg;
        let bound = Some(cfg.execution_timeout.unwrap_or(cfg.wait_timeout));
        // What it runs becomes this node's copy.
        let flight = Self::sharded_flight(&stage, self.mode, key);
        let mut exec = Self::exec(Arc::clone(&stage), self.inner, self.share, bound, flight);
        exec.key = Some(key.clone());
        let (key, req) = (key.clone(), self.req);
        drop(rt.spawn(async move {
            // Held until the granted refresh ends, or, when none was, the
            // copy's end.
            if !l2.refresh_early(&key, req, exec, age).await {
                tokio::time::sleep(left).await;
            }
            drop(claim);
        }));
    }

    /// Runs one refresh of `key` in the background (grace, early refresh): a
    /// flight of its own that callers arriving meanwhile may join, finished
    /// even when nobody waits, bounded by the execution timeout (and L1's
    /// wait timeout for this caller), never by the triggering caller's
    /// budget. Its result replaces the copy unless a purge came after it
    /// started. `claim`, the key's refresh on this node, is held until it
    /// ends: by the work itself (past L1's wait timeout the work goes on
    /// for nobody, and holds it until it ends), and by this refresh until
    /// its outcome has been judged (a failure throttles the key first).
    fn refresh(self, key: &FlightKey, claim: RefreshClaim<Sh::Shared>) {
        let mut leader = self;
        // The refresh is every caller's: bounded by the stage's own
        // settings, not by the budget of the caller that started it.
        // Without an execution timeout, the longest a caller waits: no
        // work runs on for nobody.
        let cfg = &leader.stage.ctl.cfg;
        let bound = cfg.execution_timeout.unwrap_or(cfg.wait_timeout);
        leader.bound = Some(bound);
        leader.coordination = None;
        let stage = Arc::clone(&leader.stage);
        let key = key.clone();
        let Some(setup) = stage.stale.clone() else {
            return;
        };
        // A request made outside a runtime (and polled in one later) has
        // its copy, and no refresh: nothing panics for want of a runtime.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let caller = Caller::new().on_abandon(OnAbandon::Finish);
        let claim = Arc::new(claim);
        let work = Claimed {
            work: leader,
            claim: Arc::clone(&claim),
        };
        let run = stage.local.run(&key, caller, work);
        let ctl = Arc::clone(&stage.ctl);
        let started = Instant::now();
        let purged = setup.kept.purged(&key);
        let retry_after = stage.ctl.cfg.stale_retry_after;
        drop(rt.spawn(async move {
            let out = run.await;
            // A failing refresh throttles the key as a failing flight does
            // (`stale-retry-after`): the copy answers, the work waits.
            let failed = match &out {
                Ok(Answer::Led(v) | Answer::Shared(v)) => setup.failures.failed(Ok(v)),
                Ok(Answer::Own(_)) => false,
                Err(e) => {
                    !own_deadline(e) && !e.is::<FlightAbandoned>() && setup.failures.failed(Err(e))
                }
            };
            if failed && !retry_after.is_zero() {
                setup.kept.throttle(&key, Instant::now() + retry_after);
            }
            let outcome = match out {
                Ok(Answer::Led(v) | Answer::Shared(v)) => {
                    if setup.failures.failed(Ok(&v)) {
                        RefreshOutcome::Failed
                    } else if setup.kept.purged(&key) == purged
                        && setup.kept.look(&key).is_some_and(|l| l.done >= started)
                    {
                        RefreshOutcome::Committed
                    } else {
                        RefreshOutcome::Fenced
                    }
                }
                // Not shareable: nothing to keep.
                Ok(Answer::Own(_)) => RefreshOutcome::Failed,
                Err(e) if e.is::<WaitTimeout>() || e.is::<FlightAbandoned>() => {
                    RefreshOutcome::Abandoned
                }
                Err(e) if ErrorClass::of(e.as_ref()) == ErrorClass::DeadlineExceeded => {
                    RefreshOutcome::Abandoned
                }
                Err(_) => RefreshOutcome::Failed,
            };
            drop(claim);
            ctl.count_refresh(outcome);
        }));
    }
}

/// A refresh's work, holding the key's refresh claim (see
/// [`Leader::refresh`]) for as long as the work itself runs, wherever it
/// runs: in the refresh's flight, on past the refresh's wait for nobody
/// (its flight abandoned), or as a waiter of another flight of the key.
struct Claimed<W, C> {
    work: W,
    claim: C,
}

impl<V, W, C> FlightWork<V> for Claimed<W, C>
where
    W: FlightWork<V>,
    C: Send + Sync + 'static,
{
    type Output = W::Output;

    fn lead(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, W::Output>, BoxError>> + Send + 'static {
        Holding {
            fut: self.work.lead(key),
            _held: self.claim,
        }
    }

    fn alone(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, W::Output>, BoxError>> + Send + 'static {
        Holding {
            fut: self.work.alone(key),
            _held: self.claim,
        }
    }

    fn waiting(&mut self) {
        self.work.waiting();
    }

    fn replay_here(&self) -> bool {
        self.work.replay_here()
    }

    fn serves(&self, shared: &V) -> bool {
        self.work.serves(shared)
    }
}

pin_project_lite::pin_project! {
    /// A future that holds `_held` until it is dropped.
    struct Holding<F, H> {
        #[pin]
        fut: F,
        _held: H,
    }
}

impl<F: Future, H> Future for Holding<F, H> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().fut.poll(cx)
    }
}

/// How the flight of `key` that answered a caller (`arrival`: before and
/// after it joined its key's flights, see [`Kept::answer_since`])
/// was answered (see [`Kept::answer_since`]), if the store answered it
/// itself (a hit, a stale result) or it ran in the local fallback; a stale
/// answer to a caller that joined the flight is counted here (L2 counted
/// the flight's own).
fn stored_answer<V: Clone>(
    kept: &Kept<V>,
    key: &FlightKey,
    arrival: (u64, u64),
    ctl: &Control,
    joined: bool,
) -> Option<Served> {
    let served = match kept.answer_since(key, arrival, joined) {
        Some(Served::Fallback { .. }) => Some(Served::Fallback { collapsed: joined }),
        served => served,
    };
    // Every caller answered stale is counted: L2 counted the flight's
    // leader, a caller that joined it is counted here.
    if let (true, Some(stale)) = (joined, served.and_then(|s| s.stale())) {
        ctl.count_stale(stale);
    }
    served
}

/// Whether `e` is a caller's own deadline (its wait timeout, its
/// request's budget), not the work's failure.
fn own_deadline(e: &BoxError) -> bool {
    e.is::<WaitTimeout>()
        || e.downcast_ref::<DeadlineExceeded>()
            .is_some_and(|d| d.phase() == "request")
}

/// A caller's run alone (hit-for-pass), as L1 runs a caller's own work:
/// within the caller's deadline (a caller whose deadline has passed runs
/// nothing), and a panic of the work is the caller's `WorkPanicked`.
async fn own_run<T>(
    run: impl Future<Output = Result<T, BoxError>>,
    at: Option<Instant>,
    stage: StageName,
) -> Result<T, BoxError> {
    let out_of_time = || Box::new(DeadlineExceeded::new("request")) as BoxError;
    if at.is_some_and(|at| at <= Instant::now()) {
        return Err(out_of_time());
    }
    let mut run = std::pin::pin!(run);
    let caught = std::future::poll_fn(move |cx| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.as_mut().poll(cx)))
            .unwrap_or_else(|_panic| {
                Poll::Ready(Err(
                    Box::new(WorkPanicked::new(Some(stage.clone()))) as BoxError
                ))
            })
    });
    match at {
        None => caught.await,
        Some(at) => tokio::time::timeout_at(at, caught)
            .await
            .unwrap_or_else(|_| Err(out_of_time())),
    }
}

/// Whether `past` is within `window` (a zero window is off).
fn within(past: Duration, window: Duration) -> bool {
    !window.is_zero() && past <= window
}

/// The caller's own deadline (the earlier of an outer budget's `Deadline`
/// and the request's inbound timeout), and the outer budget's slices, if
/// there is one. A malformed inbound timeout is an error: the request is
/// rejected, never guessed at.
fn deadline_of<Req, R: RequestReaders<Req>>(
    x: &R,
    req: &Req,
) -> Result<(Option<Instant>, Option<Slices>), BoxError> {
    let outer = x.existing(req);
    let inbound = x.inbound(req)?.map(|d| Instant::now().checked_add(d));
    let at = match (outer.map(|d| d.at()), inbound) {
        (outer, None) => outer,
        // A timeout too long to add to the clock is no deadline.
        (outer, Some(None)) => outer,
        (None, Some(Some(at))) => Some(at),
        (Some(a), Some(Some(b))) => Some(a.min(b)),
    };
    Ok((at, outer.map(|d| *d.slices())))
}
