//! L1 as a library (`LocalFlights::run`): each caller's own deadline, the
//! per-flight abandon rule, results that do not serve a waiter, and
//! flights nobody waits for any more.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::{DeadlineExceeded, TooManyFlights, WaitTimeout};
use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
use flightdeck_local::{Caller, FlightPolicy, FlightWork, LocalFlights, OnAbandon};
use tokio::time::{sleep, Instant};

fn key(s: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new("lib").unwrap(), s)
}

type Answer = Result<Shareable<String, String>, BoxError>;

fn value(a: Result<flightdeck_local::Answer<String, String>, BoxError>) -> String {
    match a.expect("an answer") {
        flightdeck_local::Answer::Led(v) | flightdeck_local::Answer::Shared(v) => v,
        flightdeck_local::Answer::Own(o) => format!("own:{o}"),
    }
}

/// Work that counts its runs, sleeps, then answers `value`.
fn slow(
    runs: &Arc<AtomicUsize>,
    delay: Duration,
    value: &'static str,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>> + Send + 'static
{
    let runs = runs.clone();
    move || {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            sleep(delay).await;
            Ok(Shareable::Shared(value.to_owned()))
        })
    }
}

/// The first caller is impatient (500 ms), nine more without a deadline
/// join 100 ms later: the first leaves at its deadline, the work goes on,
/// the nine get the result, and it ran once.
#[tokio::test(start_paused = true)]
async fn one_impatient_caller_never_fails_the_flight() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key("q");
    let impatient = {
        let f = flights.run(
            &k,
            Caller::new().deadline(Some(Instant::now() + Duration::from_millis(500))),
            slow(&runs, Duration::from_secs(2), "answer"),
        );
        tokio::spawn(f)
    };
    sleep(Duration::from_millis(100)).await;
    let patient: Vec<_> = (0..9)
        .map(|_| tokio::spawn(flights.run(&k, Caller::new(), slow(&runs, Duration::ZERO, "x"))))
        .collect();
    let started = Instant::now();
    let err = impatient.await.unwrap().unwrap_err();
    let dl = err
        .downcast_ref::<DeadlineExceeded>()
        .expect("the caller's own deadline");
    assert_eq!(dl.phase(), "request");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(400),
        "left at its own deadline"
    );
    for p in patient {
        assert_eq!(value(p.await.unwrap()), "answer");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A waiter's deadline before the flight ends: it leaves alone.
#[tokio::test(start_paused = true)]
async fn a_waiters_deadline_is_its_own() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key("q");
    let leader =
        tokio::spawn(flights.run(&k, Caller::new(), slow(&runs, Duration::from_secs(1), "a")));
    tokio::task::yield_now().await;
    let hurried = flights.run(
        &k,
        Caller::new().deadline(Some(Instant::now() + Duration::from_millis(100))),
        slow(&runs, Duration::ZERO, "b"),
    );
    assert!(hurried.await.unwrap_err().is::<DeadlineExceeded>());
    assert_eq!(value(leader.await.unwrap()), "a");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A caller whose time is already up neither joins nor starts a flight.
#[tokio::test(start_paused = true)]
async fn a_caller_out_of_time_starts_nothing() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let err = flights
        .run(
            &key("q"),
            Caller::new().deadline(Some(Instant::now())),
            slow(&runs, Duration::ZERO, "a"),
        )
        .await
        .unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(flights.entries(), 0);
}

/// The abandon rule is the leader's: the policy says cancel, the leader
/// asked to finish, and the work finishes after every caller left.
#[tokio::test(start_paused = true)]
async fn the_abandon_rule_is_decided_per_flight_by_its_leader() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new().on_abandon(OnAbandon::Cancel));
    let done = Arc::new(AtomicUsize::new(0));
    let work = |done: &Arc<AtomicUsize>| {
        let done = done.clone();
        move || async move {
            sleep(Duration::from_secs(1)).await;
            done.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(Shareable::<String, String>::Shared("v".to_owned()))
        }
    };
    let finishing = tokio::spawn(flights.run(
        &key("finish"),
        Caller::new().on_abandon(OnAbandon::Finish),
        work(&done),
    ));
    let cancelled = tokio::spawn(flights.run(&key("cancel"), Caller::new(), work(&done)));
    sleep(Duration::from_millis(100)).await;
    finishing.abort();
    cancelled.abort();
    sleep(Duration::from_secs(2)).await;
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "only the flight asked to finish did"
    );
    assert_eq!(flights.running(), 0);
}

/// Work that answers `value` and whose shared results serve only callers
/// that carry the same `tag` (a stand-in for HTTP's `Vary`).
struct Tagged {
    tag: &'static str,
    runs: Arc<AtomicUsize>,
    alone: Arc<AtomicUsize>,
}

// An `async fn` would hold the lent key: the work's future must not.
#[allow(clippy::manual_async_fn)]
impl FlightWork<String> for Tagged {
    type Output = String;

    fn lead(self, _: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_millis(100)).await;
            Ok(Shareable::Shared(format!("for {}", self.tag)))
        }
    }

    fn alone(self, _: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        async move {
            self.alone.fetch_add(1, Ordering::SeqCst);
            Ok(Shareable::Unshared(
                format!("for {}", self.tag),
                flightdeck_core::Unshareable::Vary,
            ))
        }
    }

    fn serves(&self, shared: &String) -> bool {
        shared.ends_with(self.tag)
    }
}

/// A waiter that the leader's result does not serve runs its own; the
/// ones it serves share it. A replay serves the same callers; one it does
/// not serve leads its own run (no flight is under way: in HYBRID that
/// run asks the store, which may hold a result that serves it).
#[tokio::test(start_paused = true)]
async fn a_result_is_handed_only_to_the_callers_it_serves() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().replay_ttl(Duration::from_secs(5)));
    let runs = Arc::new(AtomicUsize::new(0));
    let alone = Arc::new(AtomicUsize::new(0));
    let call = |tag| {
        flights.run(
            &key("v"),
            Caller::new(),
            Tagged {
                tag,
                runs: runs.clone(),
                alone: alone.clone(),
            },
        )
    };
    let (a, b, c) = tokio::join!(call("vanilla"), call("vanilla"), call("mint"));
    assert_eq!(value(a), "for vanilla");
    assert_eq!(value(b), "for vanilla");
    assert_eq!(value(c), "own:for mint");
    // Replayed: served to vanilla, not to mint.
    assert_eq!(value(call("vanilla").await), "for vanilla");
    assert_eq!(value(call("mint").await), "for mint");
    assert_eq!(
        (runs.load(Ordering::SeqCst), alone.load(Ordering::SeqCst)),
        (2, 1)
    );
}

/// Work that answers with the key it was lent, and whose shared result
/// serves nobody but its leader.
struct Echo;

impl FlightWork<String> for Echo {
    type Output = String;

    fn lead(self, key: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        let key = key.digest().to_hex();
        async move {
            sleep(Duration::from_millis(100)).await;
            Ok(Shareable::Shared(format!("led {key}")))
        }
    }

    fn alone(self, key: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        let own = format!("alone {}", key.digest().to_hex());
        std::future::ready(Ok(Shareable::Unshared(
            own,
            flightdeck_core::Unshareable::Vary,
        )))
    }

    fn serves(&self, _: &String) -> bool {
        false
    }
}

/// The leader's work is lent the flight's key, and so is the work of a
/// waiter that runs its own (the result did not serve it), after the
/// flight ended.
#[tokio::test(start_paused = true)]
async fn the_work_is_lent_the_key() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let k = key("lent");
    let hex = k.digest().to_hex();
    let (a, b) = tokio::join!(
        flights.run(&key("lent"), Caller::new(), Echo),
        flights.run(&key("lent"), Caller::new(), Echo)
    );
    assert_eq!(value(a), format!("led {hex}"));
    assert_eq!(value(b), format!("own:alone {hex}"));
}

/// Under the cancel rule, hung work whose callers all timed out is
/// cancelled once its flight TTL has passed, and its token is free: two
/// hung keys do not lock a layer with `max_flights = 2` for ever.
#[tokio::test(start_paused = true)]
async fn flights_nobody_waits_for_free_their_token_after_the_flight_ttl() {
    let flights = LocalFlights::<String>::new(
        FlightPolicy::new()
            .max_flights(2)
            .wait_timeout(Some(Duration::from_secs(1)))
            .flight_ttl(Duration::from_secs(5))
            .on_abandon(OnAbandon::Cancel),
    );
    let hung = || {
        move || async move {
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Shareable::<String, String>::Shared(String::new()))
        }
    };
    for k in ["hung-1", "hung-2"] {
        let err = flights
            .run(&key(k), Caller::new(), hung())
            .await
            .unwrap_err();
        assert!(err.is::<WaitTimeout>(), "{err}");
    }
    assert_eq!(
        flights.running(),
        2,
        "a wait timeout never removes the flight at once"
    );
    let err = flights
        .run(&key("new"), Caller::new(), hung())
        .await
        .unwrap_err();
    assert!(err.is::<TooManyFlights>(), "{err}");
    sleep(Duration::from_secs(5)).await;
    assert_eq!(flights.running(), 0, "cancelled once the flight TTL passed");
    let runs = Arc::new(AtomicUsize::new(0));
    let got = flights
        .run(
            &key("new"),
            Caller::new(),
            slow(&runs, Duration::ZERO, "in"),
        )
        .await;
    assert_eq!(value(got), "in");
}

/// Sets its flag when dropped.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The flight's deadline is the latest of its callers' deadlines: with the
/// leader out at 300 ms and a waiter at 600 ms, the work goes on until
/// 600 ms, then is dropped (nobody wants it), even under the finish rule;
/// a caller without a deadline lifts the bound.
#[tokio::test(start_paused = true)]
async fn a_flight_ends_at_the_latest_of_its_callers_deadlines() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let hung = |dropped: &Arc<std::sync::atomic::AtomicBool>| {
        let flag = DropFlag(dropped.clone());
        move || async move {
            let _flag = flag;
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Shareable::<String, String>::Shared(String::new()))
        }
    };
    let start = Instant::now();
    let at = |ms| Caller::new().deadline(Some(start + Duration::from_millis(ms)));
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let leader = tokio::spawn(flights.run(
        &key("d"),
        at(300).on_abandon(OnAbandon::Finish),
        hung(&dropped),
    ));
    tokio::task::yield_now().await;
    let waiter = tokio::spawn(flights.run(&key("d"), at(600), hung(&dropped)));
    assert!(leader.await.unwrap().unwrap_err().is::<DeadlineExceeded>());
    assert!(!dropped.load(Ordering::SeqCst), "a caller still waits");
    assert!(waiter.await.unwrap().unwrap_err().is::<DeadlineExceeded>());
    sleep(Duration::from_millis(1)).await;
    assert!(
        dropped.load(Ordering::SeqCst),
        "nobody waits: the work was dropped"
    );
    assert_eq!(start.elapsed(), Duration::from_millis(601));
    assert_eq!(flights.running(), 0);

    // A caller without a deadline lifts the bound.
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let _leader = tokio::spawn(flights.run(
        &key("e"),
        Caller::new().deadline(Some(start + Duration::from_millis(300))),
        hung(&dropped),
    ));
    tokio::task::yield_now().await;
    let patient = tokio::spawn(flights.run(&key("e"), Caller::new(), hung(&dropped)));
    sleep(Duration::from_secs(5)).await;
    assert!(!dropped.load(Ordering::SeqCst));
    assert_eq!(flights.running(), 1);
    patient.abort();
}

/// Starts a one-second flight of `k` and purges it 10 ms later, running.
async fn purged_while_running(
    flights: &LocalFlights<String>,
    k: &FlightKey,
    runs: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Result<flightdeck_local::Answer<String, String>, BoxError>> {
    let work = slow(runs, Duration::from_secs(1), "before");
    let before = tokio::spawn(flights.run(k, Caller::new(), work));
    sleep(Duration::from_millis(10)).await;
    assert!(flights.forget(k));
    before
}

/// A purge (`forget`): the replayed result goes at once; a flight running
/// when it happened finishes for its own callers, but a caller arriving
/// after it starts another flight, and the older result is not replayed.
#[tokio::test(start_paused = true)]
async fn forget_drops_the_replay_and_passes_the_running_flight_by() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().replay_ttl(Duration::from_secs(60)));
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key("purged");
    let run = |d: u64, v: &'static str| {
        flights.run(&k, Caller::new(), slow(&runs, Duration::from_secs(d), v))
    };
    assert_eq!(value(run(0, "old").await), "old");
    assert_eq!(value(run(0, "x").await), "old", "replayed");
    assert!(flights.forget(&k));
    assert!(!flights.forget(&k), "nothing left to forget");

    // It finishes for its caller, and is not replayed.
    let before = purged_while_running(&flights, &k, &runs).await;
    assert_eq!(
        value(before.await.unwrap()),
        "before",
        "its caller keeps it"
    );
    assert_eq!(value(run(0, "next").await), "next", "not replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // A caller arriving after the purge does not join it.
    assert!(flights.forget(&k), "next's replay");
    let before = purged_while_running(&flights, &k, &runs).await;
    assert_eq!(value(run(1, "after").await), "after", "a flight of its own");
    assert_eq!(value(before.await.unwrap()), "before");
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// Work whose leader says whether its result may be replayed here.
struct Replayable {
    here: bool,
    runs: Arc<AtomicUsize>,
}

// An `async fn` would hold the lent key: the work's future must not.
#[allow(clippy::manual_async_fn)]
impl FlightWork<String> for Replayable {
    type Output = String;

    fn lead(self, _: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_millis(100)).await;
            Ok(Shareable::Shared(format!("here:{}", self.here)))
        }
    }

    fn alone(self, key: &FlightKey) -> impl Future<Output = Answer> + Send + 'static {
        self.lead(key)
    }

    fn replay_here(&self) -> bool {
        self.here
    }
}

/// The leader decides whether its flight's result is kept for replay: one
/// replayed elsewhere (`replay_here` false) answers its waiters only, and
/// the next caller runs; one kept here is replayed for the replay TTL.
#[tokio::test(start_paused = true)]
async fn the_leader_decides_whether_its_result_is_replayed_here() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().replay_ttl(Duration::from_secs(5)));
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |here| {
        flights.run(
            &key("r"),
            Caller::new(),
            Replayable {
                here,
                runs: runs.clone(),
            },
        )
    };
    // A waiter's own hint does not matter: the leader's does.
    let (a, b) = tokio::join!(call(false), call(true));
    assert_eq!(
        (value(a), value(b)),
        ("here:false".into(), "here:false".into())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the waiter joined");
    assert_eq!(flights.entries(), 0, "nothing kept for replay");
    assert_eq!(value(call(true).await), "here:true", "ran again");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    sleep(Duration::from_secs(4)).await;
    assert_eq!(value(call(false).await), "here:true", "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(value(call(false).await), "here:false", "the replay ended");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// `run_inlined` is `run` with another code layout: its callers and
/// `run`'s join one flight, which runs once, and a caller whose time is up
/// is refused before the map as by `run`.
#[tokio::test(start_paused = true)]
async fn run_inlined_joins_the_same_flights_as_run() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key("q");
    let leader = tokio::spawn(flights.run_inlined(
        &k,
        Caller::new(),
        slow(&runs, Duration::from_secs(1), "a"),
    ));
    tokio::task::yield_now().await;
    let by_run = tokio::spawn(flights.run(&k, Caller::new(), slow(&runs, Duration::ZERO, "b")));
    let inlined =
        tokio::spawn(flights.run_inlined(&k, Caller::new(), slow(&runs, Duration::ZERO, "c")));
    assert_eq!(value(leader.await.unwrap()), "a");
    assert_eq!(value(by_run.await.unwrap()), "a");
    assert_eq!(value(inlined.await.unwrap()), "a");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let late = flights
        .run_inlined(
            &key("late"),
            Caller::new().deadline(Some(Instant::now())),
            slow(&runs, Duration::ZERO, "d"),
        )
        .await;
    let err = late.unwrap_err();
    assert_eq!(
        err.downcast_ref::<DeadlineExceeded>().unwrap().phase(),
        "request"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a late caller runs nothing");
}
