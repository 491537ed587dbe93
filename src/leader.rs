//! What a caller brings to its flight: the request and the stage's way of
//! running it, in the mode the caller found on arrival. The flight's leader
//! runs it (locally, or through L2 with the stage's failure matrix); a
//! caller that a shared result does not serve runs its own, locally.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, Serves, Share, Shareable, SharedForm};
use flightdeck_distributed::{Admitted, Answered, FlightFuture, FlightId, Verdict};
use flightdeck_local::FlightWork;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::fallback::{Here, ModeFallback, Why, WhyHere};
use crate::inner_call::InnerCall;
use crate::kept::Ticket;
use crate::layer::StageShare;
use crate::mode::Mode;
use crate::readers::DynCodec;
use crate::readers::RequestReaders;
use crate::stage::{Coordination, Path, Stage};
use crate::stale::{Served, StaleSetup};

/// What L2's breaker said of a leader's flight.
enum Route {
    /// Run it here, on the local fallback path, for the reason told.
    Here(Here),
    /// Fail it.
    Failed(BoxError),
    /// Launch it, coordinated.
    Launch(Admitted, ModeFallback),
}

pin_project! {
    /// A leader's (or a lone caller's) work, as small as the path it
    /// takes: a local execution carries nothing of L2, and only a flight
    /// that goes to the backend carries (boxed) the flight's coordination
    /// state. When the stage keeps results, what the work produced is
    /// recorded (see [`Record`]); what it records with is boxed: a stage
    /// that keeps nothing (the common case) carries a null pointer, not
    /// the record's room, in every leader's future.
    #[project = LeadProj]
    pub(crate) enum Lead<L, T, O, Sh: SharedForm> {
        /// Runs here (LOCAL_ONLY, a stage without backend, or the local
        /// fallback path of a flight the breaker refused). Its output is
        /// handed on as it is: nothing to say of how the store answered.
        Here {
            #[pin]
            fut: L,
            record: Option<Box<Record<Sh>>>,
        },
        /// Refused before the flight was named: nothing to record.
        Failed { error: Option<BoxError> },
        /// Coordinated through L2, which says how it answered (a stale
        /// answer, a hit's age, by the store).
        Flight {
            fut: FlightFuture<T, O>,
            record: Option<Box<Record<Sh>>>,
        },
    }
}

/// What a stage that keeps its results records of a leader's work: a
/// shared result that is no failure becomes the key's copy (unless a purge
/// came after the work started) in the form kept for others
/// ([`StageShare::kept_form`]: never the leader's own cookies), an
/// unshared one starts the key's hit-for-pass.
pub(crate) struct Record<Sh: SharedForm> {
    setup: StaleSetup<Sh::Shared>,
    key: FlightKey,
    ticket: Ticket,
    share: Sh,
    pass_for: Duration,
    /// The stage's `replay-ttl`: how far past freshness a stale answer is.
    fresh: Duration,
    /// A caller's own flight (or run alone): its leader's arrival, under
    /// which it notes how it was answered for its callers
    /// ([`Kept::note_answer`](crate::kept::Kept::note_answer)) when it
    /// could ask the store; 0 for a run within a flight, which notes
    /// nothing.
    tag: u64,
    /// Whether it ran in the local fallback (told late by a flight
    /// launched to the store).
    fell_back: FellBack,
}

/// Whether a flight ran in the local fallback (see [`Record`]).
enum FellBack {
    No,
    Yes,
    Told(Arc<WhyHere>),
}

impl<Sh: StageShare> Record<Sh> {
    /// The record of work that starts now: `tag`, see [`Record`].
    pub(crate) fn start<R>(stage: &Stage<R, Sh>, key: &FlightKey, tag: u64) -> Option<Box<Self>> {
        let ticket = stage.stale.as_ref()?.kept.ticket();
        let mut record = Self::ticketed(stage, key, ticket)?;
        record.tag = tag;
        Some(record)
    }

    /// The record of work that took `ticket`.
    pub(crate) fn ticketed<R>(
        stage: &Stage<R, Sh>,
        key: &FlightKey,
        ticket: Ticket,
    ) -> Option<Box<Self>> {
        let setup = stage.stale.clone()?;
        Some(Box::new(Self {
            setup,
            key: key.clone(),
            ticket,
            share: stage.share.clone(),
            pass_for: stage.ctl.cfg.hit_for_pass,
            fresh: stage.ctl.cfg.replay_ttl,
            tag: 0,
            fell_back: FellBack::No,
        }))
    }

    /// Notes how the store answered (or that the work ran in the local
    /// fallback), for every caller of this flight.
    #[inline(never)]
    fn note(&self, answered: Answered) {
        if self.tag == 0 {
            return;
        }
        let fell_back = match &self.fell_back {
            FellBack::No => false,
            FellBack::Yes => true,
            FellBack::Told(why) => why.ran(),
        };
        let served = Served::by_store(answered, self.fresh)
            .or(fell_back.then_some(Served::Fallback { collapsed: false }));
        self.setup.kept.note_answer(&self.key, self.tag, served);
    }

    /// Keeps a shared result `age` old, unless it is a failure: of work
    /// that took `work_time` when it came from the store (ordered among the
    /// node's results by that work's start, not this flight's).
    pub(crate) fn keep_shared(&self, v: &Sh::Shared, age: Duration, work_time: Option<Duration>) {
        if self.setup.failures.failed(Ok(v)) {
            return;
        }
        let size = match &self.setup.weigh {
            Some(weigh) => weigh(v),
            None => self.share.kept_size(v),
        };
        let copy = self.share.kept_form(v);
        let ticket = match work_time {
            Some(took) => self.ticket.began_before(age.saturating_add(took)),
            None => self.ticket,
        };
        self.setup.kept.put(&self.key, ticket, copy, size, age);
    }

    /// Keeps what the work produced, `age` old (a hit is as old as the
    /// store says: never a fresh copy here). Out of line: the common
    /// leader records nothing.
    #[inline(never)]
    fn keep<O>(
        self: Box<Self>,
        out: &Result<Shareable<Sh::Shared, O>, BoxError>,
        age: Duration,
        work_time: Option<Duration>,
    ) {
        let r = self;
        match out {
            Ok(Shareable::Shared(v)) => r.keep_shared(v, age, work_time),
            Ok(Shareable::Unshared(..)) if !r.pass_for.is_zero() => {
                let until = tokio::time::Instant::now() + r.pass_for;
                r.setup.kept.pass(&r.key, r.ticket, until);
            }
            _ => {}
        }
    }
}

impl<L, O, Sh> Future for Lead<L, Sh::Shared, O, Sh>
where
    L: Future<Output = Result<Shareable<Sh::Shared, O>, BoxError>>,
    Sh: StageShare,
{
    type Output = Result<Shareable<Sh::Shared, O>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            LeadProj::Here { fut, record } => {
                let out = ready!(fut.poll(cx));
                if let Some(r) = record.take() {
                    // Only a run in the local fallback has something to
                    // say; a local one never asked the store.
                    if !matches!(r.fell_back, FellBack::No) {
                        r.note(Answered::Ran);
                    }
                    r.keep(&out, Duration::ZERO, None);
                }
                Poll::Ready(out)
            }
            LeadProj::Failed { error } => {
                Poll::Ready(Err(error.take().expect("a refused lead is polled once")))
            }
            LeadProj::Flight { fut, record } => {
                let (out, answered) = match ready!(fut.as_mut().poll(cx)) {
                    Ok((out, answered)) => (Ok(out), answered),
                    Err(e) => (Err(e), Answered::Ran),
                };
                if let Some(r) = record.take() {
                    r.note(answered);
                    // A result from the store is kept ordered by its
                    // work's start. A stale one too: the store's kept result
                    // answers only when its work started after this node's
                    // copy ended (else the copy answers in its place), so it
                    // is the newest result the node gave, and a copy older
                    // than it must not answer after it (a refresh that runs
                    // meanwhile started later, and replaces it).
                    match answered {
                        Answered::Stale { stale, work_time } => {
                            r.keep(&out, stale.age, Some(work_time));
                        }
                        Answered::Hit { age, work_time, .. } => r.keep(&out, age, Some(work_time)),
                        Answered::Followed { age, work_time } => r.keep(&out, age, work_time),
                        _ => r.keep(&out, Duration::ZERO, None),
                    }
                }
                Poll::Ready(out)
            }
        }
    }
}

/// One caller's work. (Public in a private module: it names the
/// service's response future, and nothing of it can be reached.)
#[allow(unreachable_pub)]
pub struct Leader<S, Req, R, Sh: SharedForm> {
    pub(crate) stage: Arc<Stage<R, Sh>>,
    pub(crate) mode: Mode,
    pub(crate) req: Req,
    pub(crate) inner: S,
    pub(crate) share: Sh,
    /// An outer budget's coordination slice (each backend call's bound).
    pub(crate) coordination: Option<Duration>,
    /// The execution bound (see [`InnerCall::bound`]).
    pub(crate) bound: Option<Duration>,
    /// Where the caller stands among its key's flights on this node
    /// ([`Kept::arrival`](crate::kept::Kept::arrival)), when the stage
    /// keeps results; 0 otherwise. The flight it leads notes how it was
    /// answered under it (a run here, only from the local fallback).
    pub(crate) arrival: u64,
}

impl<S, Req, R, Sh: SharedForm> std::fmt::Debug for Leader<S, Req, R, Sh> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("stage", &self.stage.ctl.name)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<S, Req, R, Sh: SharedForm> Leader<S, Req, R, Sh> {
    pub(crate) fn exec(
        stage: Arc<Stage<R, Sh>>,
        inner: S,
        share: Sh,
        bound: Option<Duration>,
        flight: Option<FlightId>,
    ) -> InnerCall<S, R, Sh> {
        InnerCall {
            stage,
            inner,
            share,
            bound,
            flight,
            key: None,
            why: Why::default(),
        }
    }

    /// Asks L2 whether the flight goes to the backend. The breaker is
    /// asked once, with the request and key borrowed: nothing moves until
    /// the answer is known, and a refusal (open, or held back by a ramp
    /// after closing, which only HYBRID takes) is decided by the stage's
    /// failure matrix. (Out of line, as measured with `mode_overhead`.)
    #[inline(never)]
    fn admit(
        l2: &Coordination<DynCodec<Sh::Shared>>,
        stage: &Stage<R, Sh>,
        mode: Mode,
        key: &FlightKey,
        req: &Req,
        flight: Option<FlightId>,
    ) -> Route {
        let fallback = ModeFallback::admitting(&*stage.ctl, mode);
        let admitted = l2.admit(key, req, &fallback);
        if flight.is_some() {
            // A shard seen for the first time has a breaker now: its
            // gauge is shown at once.
            stage.ctl.sync();
        }
        match admitted {
            Err(Verdict::RunHere) => Route::Here(fallback.refused_as()),
            Err(Verdict::Fail(error)) => Route::Failed(error),
            Ok(admitted) => Route::Launch(admitted, fallback.owned(Arc::clone(&stage.ctl))),
        }
    }

    /// The flight's id when it is coordinated over a sharded backend (the
    /// points that judge it by shard need it); `None` otherwise, which
    /// costs nothing.
    pub(crate) fn sharded_flight(
        stage: &Stage<R, Sh>,
        mode: Mode,
        key: &FlightKey,
    ) -> Option<FlightId> {
        (mode.is_distributed() && stage.distributed.is_some() && stage.ctl.sharded())
            .then(|| FlightId::of(key))
    }
}

impl<S, Req, R, Sh> FlightWork<Sh::Shared> for Leader<S, Req, R, Sh>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    Req: Send + 'static,
    R: RequestReaders<Req>,
    Sh: Share<S::Response> + Serves<Req> + StageShare,
{
    type Output = Sh::Output;

    fn lead(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let mut record = Record::start(&self.stage, key, self.arrival);
        let Self {
            stage,
            mode,
            req,
            inner,
            share,
            coordination,
            bound,
            ..
        } = self;
        let flight = Self::sharded_flight(&stage, mode, key);
        let mut why = None;
        let path = match stage.distributed.as_ref().filter(|_| mode.is_distributed()) {
            // LOCAL_ONLY, or a stage without backend.
            None => Path::Local,
            Some(l2) => match Self::admit(l2, &stage, mode, key, &req, flight) {
                Route::Here(here) => {
                    why = Some(here);
                    Path::Fallback
                }
                Route::Failed(error) => {
                    // Nothing to record.
                    drop(record);
                    return Lead::Failed { error: Some(error) };
                }
                Route::Launch(admitted, mut fallback) => {
                    // What it runs as the owner becomes this node's copy,
                    // also in the background (a refresh L2 runs while its
                    // caller was answered a stale result).
                    let mut exec = Self::exec(Arc::clone(&stage), inner, share, bound, flight);
                    if stage.stale.is_some() {
                        exec.key = Some(key.clone());
                    }
                    exec.why = fallback.launched();
                    if let (Some(r), Why::Later(why)) = (&mut record, &exec.why) {
                        r.fell_back = FellBack::Told(Arc::clone(why));
                    }
                    let fut = l2.launch(admitted, key.clone(), req, exec, fallback, coordination);
                    return Lead::Flight { fut, record };
                }
            },
        };
        // One place builds the future of a request that runs here, and its
        // execution only now: built before the breaker's answer, it was
        // copied into that future twice on every path, LOCAL_ONLY's too
        // (callgrind, `mode_overhead`).
        // The local fallback path answers from, and keeps, this node's
        // copy of the key (see `InnerCall`), as why it runs here allows.
        let keeps = path == Path::Fallback && stage.stale.is_some();
        if let (true, Some(r)) = (keeps, &mut record) {
            r.fell_back = FellBack::Yes;
        }
        let mut exec = Self::exec(stage, inner, share, bound, flight);
        if keeps {
            exec.key = Some(key.clone());
            if let Some(why) = why {
                exec.why = Why::Now(why);
            }
        }
        Lead::Here {
            fut: exec.run(req, path),
            record,
        }
    }

    fn alone(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<Sh::Shared, Sh::Output>, BoxError>> + Send + 'static
    {
        let record = Record::start(&self.stage, key, self.arrival);
        let flight = Self::sharded_flight(&self.stage, self.mode, key);
        let exec = Self::exec(self.stage, self.inner, self.share, self.bound, flight);
        Lead::Here {
            fut: exec.run(self.req, Path::Local),
            record,
        }
    }

    /// A flight led through the store is replayed from it (from its
    /// commit, for `replay-ttl`): kept here too, a result the store
    /// replayed would be replayed again, up to twice as old. A flight led
    /// in a local mode (or by a stage without backend) is replayed here.
    fn replay_here(&self) -> bool {
        !(self.mode.is_distributed() && self.stage.distributed.is_some())
    }

    fn serves(&self, shared: &Sh::Shared) -> bool {
        self.share.serves(shared, &self.req)
    }
}
