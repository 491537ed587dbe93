//! The state shared by every clone: the slots (see `slots`: a count and
//! a FIFO queue), the limit in force, the rate limiters.
//!
//! The limit changes at run time (the degraded switch) without touching
//! running calls: raising it frees slots (for the queue first); lowering
//! it takes free ones away, and those it cannot take yet (held by running
//! calls) become a debt that their releases pay instead of handing them
//! on.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck_core::error::BulkheadFull;
use flightdeck_core::StageName;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::clock::{TokioClock, TokioInstant};
use crate::error::RateLimited;
use crate::metric;
use crate::slots::{slots, Handoff, Slots, Wait};

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

/// Settings of a bulkhead.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
///
/// let layer = BulkheadLayer::from_config(
///     BulkheadConfig::new(32)
///         .queue(64, Duration::from_millis(200))
///         .degraded_limit(8)
///         .rate_limit(NonZeroU32::new(500).unwrap(), NonZeroU32::new(50).unwrap()),
/// );
/// assert_eq!(layer.handle().limit(), 32);
/// ```
#[derive(Debug, Clone)]
pub struct BulkheadConfig {
    limit: usize,
    degraded_limit: Option<usize>,
    queue: Option<(usize, Duration)>,
    rate: Option<(NonZeroU32, NonZeroU32)>,
    degraded_rate: Option<(NonZeroU32, NonZeroU32)>,
    stage: Option<StageName>,
}

impl BulkheadConfig {
    /// At most `limit` concurrent calls; no queue, no rate limit. A limit of
    /// 0 rejects every call.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            degraded_limit: None,
            queue: None,
            rate: None,
            degraded_rate: None,
            stage: None,
        }
    }

    /// Lets up to `max` calls wait, each for at most `timeout`, for a slot
    /// (in arrival order) instead of being rejected at once.
    pub fn queue(mut self, max: usize, timeout: Duration) -> Self {
        self.queue = Some((max, timeout));
        self
    }

    /// The limit while degraded (see [`BulkheadHandle::set_degraded`]);
    /// defaults to the normal limit.
    pub fn degraded_limit(mut self, limit: usize) -> Self {
        self.degraded_limit = Some(limit);
        self
    }

    /// Also limits the call rate: `per_second` permits, bursts of up to
    /// `burst` (through the `governor` crate, on tokio's clock).
    pub fn rate_limit(mut self, per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        self.rate = Some((per_second, burst));
        self
    }

    /// Also limits the call rate while degraded (see
    /// [`BulkheadHandle::set_degraded`]): `per_second` permits, bursts of up
    /// to `burst`, rejecting with [`RateLimited`]. Applies on top of
    /// [`rate_limit`](Self::rate_limit), if any.
    pub fn degraded_rate_limit(mut self, per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        self.degraded_rate = Some((per_second, burst));
        self
    }

    /// Names the stage in errors and metrics.
    pub fn stage(mut self, stage: StageName) -> Self {
        self.stage = Some(stage);
        self
    }
}

/// The `reason` labels of `singleflight_bulkhead_rejected_total`.
pub(crate) const REJECT_REASONS: [&str; 4] = ["full", "queue_timeout", "rate", "degraded_rate"];

pub(crate) struct Shared {
    stage: Option<StageName>,
    stage_label: String,
    normal: AtomicUsize,
    degraded_limit: AtomicUsize,
    degraded: AtomicBool,
    /// The limit in force (as configured; the count holds at most
    /// `slots::MAX_SLOTS`).
    limit: AtomicUsize,
    /// The free slots of the limit (below zero: the debt running calls
    /// pay when they end) and the queue.
    slots: Slots<Permit>,
    pub(crate) queue: Option<(usize, Duration)>,
    /// Calls waiting in the queue.
    queued: AtomicUsize,
    rate: Option<Limiter>,
    degraded_rate: Option<Limiter>,
    /// The degraded rate limit's quota, for the degraded lane.
    degraded_quota: Option<(NonZeroU32, NonZeroU32)>,
    /// The degraded lane, once asked for (see
    /// [`BulkheadHandle::degraded_lane`]).
    lane: OnceLock<Arc<Shared>>,
    // A rate limit applies now (`rate`, or `degraded_rate` while degraded):
    // the fast path is then not taken.
    rated: AtomicBool,
}

pub(crate) enum Admission {
    Now(Permit),
    Queued(Acquire),
}

/// A queued call's wait for a slot (in arrival order), holding its place
/// in the queue's count; `None` only if the queue dropped it, which it
/// never does.
pub(crate) struct Acquire {
    handoff: Handoff<Permit>,
    _place: QueuePlace,
}

impl Future for Acquire {
    type Output = Option<Permit>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Permit>> {
        Pin::new(&mut self.handoff).poll(cx).map(Result::ok)
    }
}

impl Shared {
    pub(crate) fn new(cfg: BulkheadConfig) -> Arc<Self> {
        Self::build(cfg, false)
    }

    /// A bulkhead that is degraded from the start (the degraded lane),
    /// or not.
    fn build(cfg: BulkheadConfig, degraded: bool) -> Arc<Self> {
        let stage_label = cfg
            .stage
            .as_ref()
            .map_or_else(|| "default".to_owned(), |s| s.as_str().to_owned());
        let degraded_limit = cfg.degraded_limit.unwrap_or(cfg.limit);
        let limit = if degraded { degraded_limit } else { cfg.limit };
        Arc::new(Self {
            stage: cfg.stage,
            stage_label,
            normal: AtomicUsize::new(cfg.limit),
            degraded_limit: AtomicUsize::new(degraded_limit),
            degraded: AtomicBool::new(degraded),
            limit: AtomicUsize::new(limit),
            slots: Slots::new(limit),
            queue: cfg.queue,
            queued: AtomicUsize::new(0),
            rated: AtomicBool::new(cfg.rate.is_some() || (degraded && cfg.degraded_rate.is_some())),
            rate: cfg.rate.map(limiter),
            degraded_rate: cfg.degraded_rate.map(limiter),
            degraded_quota: cfg.degraded_rate,
            lane: OnceLock::new(),
        })
    }

    /// The degraded lane: at most the degraded limit at once, at the
    /// degraded rate, with the same queue; always degraded.
    fn lane(&self) -> &Arc<Shared> {
        self.lane.get_or_init(|| {
            let limit = self.degraded_limit.load(Ordering::Acquire);
            let cfg = BulkheadConfig {
                limit,
                degraded_limit: Some(limit),
                queue: self.queue,
                rate: None,
                degraded_rate: self.degraded_quota,
                stage: self.stage.clone(),
            };
            Self::build(cfg, true)
        })
    }

    pub(crate) fn full(&self) -> BulkheadFull {
        BulkheadFull::new(self.stage.clone())
    }

    /// Counts a rejection; `reason` is one of [`REJECT_REASONS`].
    pub(crate) fn reject(&self, reason: &'static str) {
        metrics::counter!(
            metric::BULKHEAD_REJECTED_TOTAL,
            flightdeck_core::metric::LABEL_STAGE => self.stage_label.clone(),
            "reason" => reason
        )
        .increment(1);
    }

    /// A slot now, if one is free (and nobody queues for it).
    #[inline]
    fn try_take(self: &Arc<Self>) -> Option<Permit> {
        self.slots
            .try_take()
            .then(|| Permit::armed(Arc::clone(self)))
    }

    /// The fast path's rule: a slot taken now, when no rate limit applies
    /// (one is checked only by `admit`) and nobody queues for it. The
    /// service's permit and the lent [`Slot`] both take theirs here.
    #[inline]
    fn take_fast(&self) -> bool {
        !self.rated.load(Ordering::Relaxed) && self.slots.try_take()
    }

    /// The fast path: a slot now, with no rate limit to check.
    #[inline]
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        self.take_fast().then(|| Permit::armed(Arc::clone(self)))
    }

    /// Admits a call now, queues it, or says why not.
    #[inline(never)]
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Admission, flightdeck_core::BoxError> {
        if let Some(rate) = &self.rate {
            if rate.check().is_err() {
                self.reject("rate");
                return Err(RateLimited::new(self.full()).into());
            }
        }
        if let Some(rate) = &self.degraded_rate {
            if self.degraded.load(Ordering::Acquire) && rate.check().is_err() {
                self.reject("degraded_rate");
                return Err(RateLimited::new(self.full()).into());
            }
        }
        if let Some(permit) = self.try_take() {
            return Ok(Admission::Now(permit));
        }
        let Some((max, _)) = self.queue else {
            self.reject("full");
            return Err(self.full().into());
        };
        let place = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if place.is_err() {
            self.reject("full");
            return Err(self.full().into());
        }
        let place = QueuePlace(Arc::clone(self));
        match self
            .slots
            .wait(|| Permit::armed(Arc::clone(self)), Permit::defuse)
        {
            // Freed since `try_take`, and nobody queued before.
            Wait::Now => Ok(Admission::Now(Permit::armed(Arc::clone(self)))),
            Wait::Queued(handoff) => Ok(Admission::Queued(Acquire {
                handoff,
                _place: place,
            })),
        }
    }

    /// Gives a slot back: to the debt, the queue, or the free count.
    #[inline]
    fn release(self: &Arc<Self>) {
        if self.slots.give_back_one() {
            self.serve();
        }
    }

    /// Hands free slots to queued calls.
    #[cold]
    #[inline(never)]
    fn serve(self: &Arc<Self>) {
        self.slots
            .serve(|| Permit::armed(Arc::clone(self)), Permit::defuse);
    }

    /// Moves the count from the slots of limit `old` to those of `new`,
    /// sparing running calls.
    fn resize(self: &Arc<Self>, old: usize, new: usize) {
        let (old, new) = (slots(old), slots(new));
        if new > old {
            // Lossless: both are counts of at most `MAX_SLOTS`.
            if self.slots.give_back((new - old) as usize) {
                self.serve();
            }
        } else if new < old {
            self.slots.take_away((old - new) as usize);
        }
    }

    fn apply_limit(self: &Arc<Self>) {
        let degraded = self.degraded.load(Ordering::Acquire);
        self.rated.store(
            self.rate.is_some() || (degraded && self.degraded_rate.is_some()),
            Ordering::Release,
        );
        let limit = if degraded {
            self.degraded_limit.load(Ordering::Acquire)
        } else {
            self.normal.load(Ordering::Acquire)
        };
        let old = self.limit.swap(limit, Ordering::AcqRel);
        self.resize(old, limit);
    }
}

fn limiter((per_second, burst): (NonZeroU32, NonZeroU32)) -> Limiter {
    RateLimiter::direct_with_clock(Quota::per_second(per_second).allow_burst(burst), TokioClock)
}

/// A call's place in the queue, given up when its wait ends (with a slot,
/// or dropped at the queue timeout).
struct QueuePlace(Arc<Shared>);

impl Drop for QueuePlace {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A slot of a bulkhead lent by [`BulkheadLayer::try_slot`](crate::BulkheadLayer::try_slot):
/// given back when dropped. It borrows the bulkhead rather than sharing
/// it, as tokio's `SemaphorePermit` borrows its semaphore: no count on the
/// bulkhead's state to take and give back.
pub struct Slot<'a> {
    shared: &'a Arc<Shared>,
}

impl<'a> Slot<'a> {
    /// A slot now, if one is free, nobody queues for it and no rate limit
    /// applies (see [`BulkheadLayer::try_slot`](crate::BulkheadLayer::try_slot)).
    #[inline]
    pub(crate) fn try_take(shared: &'a Arc<Shared>) -> Option<Self> {
        // Built only once the slot is taken: a `Slot` dropped gives one back.
        if shared.take_fast() {
            Some(Self { shared })
        } else {
            None
        }
    }
}

impl Drop for Slot<'_> {
    #[inline]
    fn drop(&mut self) {
        self.shared.release();
    }
}

impl fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

/// One slot of the bulkhead, released when dropped.
pub(crate) struct Permit {
    shared: Option<Arc<Shared>>,
}

impl Permit {
    #[inline]
    fn armed(shared: Arc<Shared>) -> Self {
        Self {
            shared: Some(shared),
        }
    }

    /// Drops a permit that was never handed out, without giving its slot
    /// back (the queue, which minted it, still counts the slot).
    fn defuse(mut self) {
        self.shared = None;
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release();
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("armed", &self.shared.is_some())
            .finish()
    }
}

/// A handle on a bulkhead's shared state: read the load, switch the
/// degraded limit. Cheap to clone.
#[derive(Clone)]
pub struct BulkheadHandle {
    pub(crate) shared: Arc<Shared>,
}

impl BulkheadHandle {
    /// Switches to (or back from) the degraded limit. New calls see the new
    /// limit at once; calls already running are not touched (when the limit
    /// drops below the running count, slots are simply not handed on until
    /// the count is under it).
    pub fn set_degraded(&self, degraded: bool) {
        let was = self.shared.degraded.swap(degraded, Ordering::AcqRel);
        self.shared.apply_limit();
        if was != degraded {
            let s = &self.shared;
            if degraded {
                tracing::warn!(stage = %s.stage_label, limit = self.limit(), "bulkhead degraded");
            } else {
                tracing::info!(stage = %s.stage_label, limit = self.limit(), "bulkhead back to normal");
            }
            metrics::gauge!(metric::BULKHEAD_DEGRADED, flightdeck_core::metric::LABEL_STAGE => s.stage_label.clone())
                .set(if degraded { 1.0 } else { 0.0 });
        }
    }

    /// Makes sure the recorder in force exports this bulkhead: its
    /// degraded gauge at the current state, its rejection counters at
    /// their values (zero before the first rejection). State changes and
    /// rejections register them anyway; this is for a scrape before the
    /// first one, under a recorder installed after the bulkhead was built.
    pub fn publish_metrics(&self) {
        let s = &self.shared;
        let gauge = metrics::gauge!(metric::BULKHEAD_DEGRADED, flightdeck_core::metric::LABEL_STAGE => s.stage_label.clone());
        let mut degraded = self.is_degraded();
        gauge.set(if degraded { 1.0 } else { 0.0 });
        while self.is_degraded() != degraded {
            degraded = self.is_degraded();
            gauge.set(if degraded { 1.0 } else { 0.0 });
        }
        for reason in REJECT_REASONS {
            let _registered = metrics::counter!(
                metric::BULKHEAD_REJECTED_TOTAL,
                flightdeck_core::metric::LABEL_STAGE => s.stage_label.clone(),
                "reason" => reason
            );
        }
    }

    /// True while the degraded limit applies.
    pub fn is_degraded(&self) -> bool {
        self.shared.degraded.load(Ordering::Acquire)
    }

    /// Changes the normal and degraded limits (the
    /// [degraded lane](Self::degraded_lane)'s too).
    pub fn set_limits(&self, normal: usize, degraded: usize) {
        self.shared.normal.store(normal, Ordering::Release);
        self.shared
            .degraded_limit
            .store(degraded, Ordering::Release);
        self.shared.apply_limit();
        if let Some(lane) = self.shared.lane.get() {
            lane.normal.store(degraded, Ordering::Release);
            lane.degraded_limit.store(degraded, Ordering::Release);
            lane.apply_limit();
        }
    }

    /// The degraded lane: a bulkhead for the calls the degraded limit
    /// applies to while the rest of the traffic is healthy (the facade
    /// sends through it the executions of flights whose shard of the
    /// coordination store is degraded). At most the degraded limit of its
    /// calls run at once, at the degraded rate limit if any, waiting in a
    /// queue of the same size and timeout as this bulkhead's; it is
    /// degraded from the start and never switched. Rejections count under
    /// this bulkhead's stage label (`full`, `queue_timeout`,
    /// `degraded_rate`); it exports no degraded gauge of its own.
    ///
    /// Nest the lane's layer *outside* this bulkhead's, so that a call of
    /// the lane takes a slot of both: the calls of both never exceed this
    /// bulkhead's limit. (Queued in both, such a call waits for at most
    /// twice the queue timeout.) Always the same lane for one bulkhead;
    /// [`set_limits`](Self::set_limits) changes its limit too.
    ///
    /// ```
    /// use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer};
    ///
    /// let main = BulkheadLayer::from_config(BulkheadConfig::new(32).degraded_limit(8));
    /// let lane = main.handle().degraded_lane();
    /// assert_eq!(lane.handle().limit(), 8);
    /// assert_eq!(main.handle().limit(), 32, "the bulkhead itself stays healthy");
    /// main.handle().set_limits(16, 4);
    /// assert_eq!(lane.handle().limit(), 4);
    /// ```
    pub fn degraded_lane(&self) -> crate::BulkheadLayer {
        crate::BulkheadLayer::from_handle(BulkheadHandle {
            shared: Arc::clone(self.shared.lane()),
        })
    }

    /// The limit in force now.
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Acquire)
    }

    /// Calls running now.
    pub fn active(&self) -> usize {
        let s = &self.shared;
        // Every slot of the limit is free or held; a debt is held too.
        let active = slots(s.limit.load(Ordering::Acquire)) - s.slots.free();
        usize::try_from(active).unwrap_or(0)
    }

    /// Calls waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }
}

impl fmt::Debug for BulkheadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadHandle")
            .field("stage", &self.shared.stage_label)
            .field("limit", &self.limit())
            .field("active", &self.active())
            .field("degraded", &self.is_degraded())
            .finish()
    }
}
