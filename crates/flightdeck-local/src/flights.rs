//! L1 as a library: [`LocalFlights::run`] runs a piece of work once per key
//! for all of its concurrent callers, like Go's `Group.Do` or moka's
//! `try_get_with`, without a `Service` in sight.
//! [`LocalFlightLayer`](crate::LocalFlightLayer) is a thin `tower` shell
//! around it, and the `flightdeck` facade calls it directly.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
//! use flightdeck_local::{Answer, Caller, FlightPolicy, LocalFlights};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let flights = LocalFlights::<String>::new(FlightPolicy::new());
//! let key = FlightKey::from_bytes(StageName::new("report").unwrap(), "q3");
//! let runs = Arc::new(AtomicUsize::new(0));
//! let call = || {
//!     let runs = runs.clone();
//!     // The work: any `FnOnce() -> Future` (or a type implementing `FlightWork`).
//!     flights.run(&key, Caller::new(), move || async move {
//!         runs.fetch_add(1, Ordering::SeqCst);
//!         tokio::time::sleep(std::time::Duration::from_millis(20)).await;
//!         Ok::<_, BoxError>(Shareable::<String, String>::Shared("the report".to_owned()))
//!     })
//! };
//! let (a, b) = tokio::join!(call(), call());
//! // The leader gets its own copy, the other caller the shared one.
//! let (a, b) = (a.unwrap(), b.unwrap());
//! assert!(matches!(a, Answer::Led(r) if r == "the report"));
//! assert!(matches!(b, Answer::Shared(r) if r == "the report"));
//! assert_eq!(runs.load(Ordering::SeqCst), 1);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
use tokio::time::Instant;

use crate::group::Group;
use crate::policy::{FlightPolicy, OnAbandon};
use crate::run::Run;

/// The work of a flight, as its callers bring it: every caller brings one,
/// the leader's runs, the waiters' are kept in case they must run their own
/// (the leader's result could not be shared, or does not serve them).
///
/// Implemented for closures `FnOnce() -> impl Future<Output =
/// Result<Shareable<V, O>, BoxError>>` (where `lead` and `alone` are the
/// same call); implement it for your own type to do something else when a
/// caller runs alone, to release what a waiter holds while it waits, or to
/// refuse a shared result that does not fit (HTTP's `Vary`).
pub trait FlightWork<V>: Send + 'static {
    /// What a caller gets when a result is not shared (the leader's own
    /// output, or a waiter's own run).
    type Output: Send + 'static;

    /// Runs the work as the flight's leader: a shared result goes to every
    /// caller (and is kept for replay, if the policy says so). `key` is
    /// the flight's, lent: work that needs it past this call clones it,
    /// and work that does not carries none.
    fn lead(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, Self::Output>, BoxError>> + Send + 'static;

    /// Runs the work for this caller alone: the leader's result could not
    /// be shared, or does not [`serve`](Self::serves) this caller. `key`
    /// is the caller's, lent as to [`lead`](Self::lead).
    fn alone(
        self,
        key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, Self::Output>, BoxError>> + Send + 'static;

    /// This caller joined another caller's flight and is about to wait:
    /// release what it holds that others may need meanwhile (the `tower`
    /// shell swaps a ready service for an unready clone, so a waiter holds
    /// no reservation).
    fn waiting(&mut self) {}

    /// Whether the result of the flight this caller leads may be kept for
    /// replay here (for the policy's replay TTL), asked before it leads.
    /// `false` when its result is replayed elsewhere: the facade's leader
    /// says so for a flight it leads through a shared store, which replays
    /// it from the commit (a copy kept here too would outlive the store's).
    fn replay_here(&self) -> bool {
        true
    }

    /// Whether the flight's shared result may be handed to this caller.
    fn serves(&self, shared: &V) -> bool {
        let _ = shared;
        true
    }
}

impl<V, O, F, Fut> FlightWork<V> for F
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<Shareable<V, O>, BoxError>> + Send + 'static,
    O: Send + 'static,
{
    type Output = O;

    fn lead(
        self,
        _key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, O>, BoxError>> + Send + 'static {
        self()
    }

    fn alone(
        self,
        _key: &FlightKey,
    ) -> impl Future<Output = Result<Shareable<V, O>, BoxError>> + Send + 'static {
        self()
    }
}

/// One caller's terms: its own deadline, and, should it start the flight,
/// what happens to the flight when its last caller is gone.
///
/// A caller leaves at its own deadline (`DeadlineExceeded`, phase
/// `request`), or at the policy's wait timeout (`WaitTimeout`), whichever
/// comes first; the flight goes on for the others, so no caller's deadline
/// decides another caller's outcome. A caller whose deadline has already
/// passed neither joins nor starts a flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    pub(crate) deadline: Option<Instant>,
    pub(crate) on_abandon: Option<OnAbandon>,
}

impl Caller {
    /// No deadline of its own; a flight it starts follows the policy's
    /// [`OnAbandon`].
    pub const fn new() -> Self {
        Self {
            deadline: None,
            on_abandon: None,
        }
    }

    /// Leaves at `at` (`None`: no deadline of its own).
    pub const fn deadline(mut self, at: Option<Instant>) -> Self {
        self.deadline = at;
        self
    }

    /// What happens to a flight this caller starts once its last caller is
    /// gone, instead of the policy's.
    pub const fn on_abandon(mut self, on_abandon: OnAbandon) -> Self {
        self.on_abandon = Some(on_abandon);
        self
    }
}

/// The flights of one process (one layer, or one stage of the facade): one
/// execution per key at a time, its outcome shared with every caller. See
/// the [crate docs](crate) and [`FlightPolicy`] for the clocks and bounds.
///
/// Cheap to clone: clones share the in-flight map.
pub struct LocalFlights<V> {
    pub(crate) group: Arc<Group<V>>,
}

impl<V: Clone + Send + Sync + 'static> LocalFlights<V> {
    /// An empty map with this policy.
    pub fn new(policy: FlightPolicy) -> Self {
        Self {
            group: Group::new(policy, false),
        }
    }

    /// Runs `work` for `key`: joins the flight of `key` if one is running
    /// (or replays its result while the replay window lasts), or starts one
    /// with `work`. Resolves to this caller's [`Answer`](crate::Answer):
    /// the shared result (as its leader, or handed to it), or an output of
    /// its own (the leader's result that could not be shared, or a
    /// waiter's own run).
    ///
    /// Errors: the work's error (shared with every caller, as a
    /// `SharedError`), `WorkPanicked`, `FlightAbandoned`, `WaitTimeout`,
    /// `DeadlineExceeded`, `TooManyFlights` / `TooManyWaiters`.
    #[inline]
    pub fn run<W: FlightWork<V>>(&self, key: &FlightKey, caller: Caller, work: W) -> Run<V, W> {
        if caller.deadline.is_some_and(|at| at <= Instant::now()) {
            return Run::ready(Err(Box::new(DeadlineExceeded::new("request"))));
        }
        Run::start::<false>(&self.group, key, caller, work)
    }

    /// [`run`](Self::run), with the map's lookup inlined into the caller's
    /// code: a call less per request, for more code where it is used. The
    /// same behaviour; a choice of code layout for a caller whose own path
    /// is short (the facade's, for services other than HTTP: inlined into
    /// HTTP's longer path, it cost more than it saved).
    // Hidden: a code-layout variant for the facade, not a choice users
    // should have to make; `run` is the API.
    #[doc(hidden)]
    #[inline]
    pub fn run_inlined<W: FlightWork<V>>(
        &self,
        key: &FlightKey,
        caller: Caller,
        work: W,
    ) -> Run<V, W> {
        if caller.deadline.is_some_and(|at| at <= Instant::now()) {
            return Run::ready(Err(Box::new(DeadlineExceeded::new("request"))));
        }
        Run::start::<true>(&self.group, key, caller, work)
    }

    /// Forgets `key` (a purge): its result kept for replay goes, and a
    /// flight of it still running finishes for the callers it has, but
    /// new callers start another flight and its result is not kept for
    /// replay. Returns whether there was anything to forget.
    pub fn forget(&self, key: &FlightKey) -> bool {
        self.group.forget(key)
    }

    /// The policy.
    pub fn policy(&self) -> &FlightPolicy {
        &self.group.policy
    }

    /// Flights running right now (approximate while flights start and end:
    /// a sum over the map's shards, each read under its own lock).
    pub fn running(&self) -> usize {
        self.group.running()
    }

    /// Entries in the map: running flights plus results kept for replay.
    pub fn entries(&self) -> usize {
        self.group.entries()
    }

    /// Makes sure the recorder in force exports `stage`'s metrics: its
    /// counters (zero before any flight) and the active flights' gauge
    /// (this layer adds nothing to it until a flight starts). Events register them
    /// anyway; this is for a scrape before the first event, under a
    /// recorder installed after the flights were built.
    pub fn publish_metrics(&self, stage: &StageName) {
        self.group.metrics.get(stage).publish();
    }
}

impl<V> Clone for LocalFlights<V> {
    fn clone(&self) -> Self {
        Self {
            group: Arc::clone(&self.group),
        }
    }
}

impl<V> fmt::Debug for LocalFlights<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFlights")
            .field("policy", &self.group.policy)
            .finish_non_exhaustive()
    }
}
