//! The callers' clocks without a timer per caller: every caller still
//! leaves at its own time (wait timeout or deadline, in any order of
//! arrival), a leader polled from another task is woken there, and a
//! layer that outlives a runtime keeps its clocks on the next one.

mod support;
use support::paused_runtime;

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use flightdeck_core::error::{DeadlineExceeded, WaitTimeout};
use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
use flightdeck_local::{Caller, FlightPolicy, LocalFlights};
use tokio::time::{sleep, Instant};

fn key(s: &str) -> FlightKey {
    FlightKey::from_bytes(StageName::new("timers").unwrap(), s)
}

type Answer = Result<Shareable<String, String>, BoxError>;

/// Work that never ends.
fn hung() -> impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send>> + Send + 'static
{
    || Box::pin(std::future::pending())
}

/// What a leader of hung work gets on a new paused runtime (`Err`: it
/// was still waiting after 10 s).
fn hung_on_a_new_runtime(
    flights: &LocalFlights<String>,
    name: &str,
) -> Result<(&'static str, u128, Option<Duration>), tokio::time::error::Elapsed> {
    paused_runtime().block_on(async move {
        let start = Instant::now();
        let run = flights.run(&key(name), Caller::new(), hung());
        tokio::time::timeout(Duration::from_secs(10), outcome(start, run)).await
    })
}

/// What a caller got, and when (ms after `start`).
async fn outcome<F>(start: Instant, f: F) -> (&'static str, u128, Option<Duration>)
where
    F: Future<Output = Result<flightdeck_local::Answer<String, String>, BoxError>>,
{
    let err = match f.await {
        Ok(_) => return ("value", start.elapsed().as_millis(), None),
        Err(e) => e,
    };
    let at = start.elapsed().as_millis();
    if let Some(t) = err.downcast_ref::<WaitTimeout>() {
        ("wait timeout", at, Some(t.waited()))
    } else if err.is::<DeadlineExceeded>() {
        ("deadline", at, None)
    } else {
        panic!("unexpected error: {err}")
    }
}

/// A leader and five waiters on hung work, with deadlines in no order
/// and a wait timeout of 1 s: each leaves exactly at the earlier of its
/// deadline and its own wait timeout (counted from when it started
/// waiting), with the error that says which.
#[tokio::test(start_paused = true)]
async fn every_caller_leaves_at_its_own_time() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    let start = Instant::now();
    let at = |ms| Some(start + Duration::from_millis(ms));
    let call =
        |caller: Caller| tokio::spawn(outcome(start, flights.run(&key("k"), caller, hung())));
    let leader = call(Caller::new());
    tokio::task::yield_now().await;
    let a = call(Caller::new().deadline(at(900)));
    let b = call(Caller::new().deadline(at(300)));
    let c = call(Caller::new().deadline(at(600)));
    sleep(Duration::from_millis(100)).await;
    let d = call(Caller::new());
    let e = call(Caller::new().deadline(at(5000)));
    let second = Some(Duration::from_secs(1));
    assert_eq!(leader.await.unwrap(), ("wait timeout", 1000, second));
    assert_eq!(a.await.unwrap(), ("deadline", 900, None));
    assert_eq!(b.await.unwrap(), ("deadline", 300, None));
    assert_eq!(c.await.unwrap(), ("deadline", 600, None));
    assert_eq!(d.await.unwrap(), ("wait timeout", 1100, second));
    assert_eq!(e.await.unwrap(), ("wait timeout", 1100, second));
    assert_eq!(flights.running(), 1, "timeouts leave the flight running");
}

/// A leader's future polled once in one task and then moved to another:
/// its time is up in the task that polls it now (the clock follows the
/// waker), instead of it hanging there.
#[tokio::test(start_paused = true)]
async fn a_leader_moved_to_another_task_still_times_out() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    let start = Instant::now();
    let mut run = Box::pin(outcome(
        start,
        flights.run(&key("m"), Caller::new(), hung()),
    ));
    let first = tokio::spawn(async move {
        // One poll here (the work is pending, the clock armed), then away.
        std::future::poll_fn(|cx| {
            assert!(run.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        // Handed back, to be awaited elsewhere.
        Some(run)
    });
    let run = first.await.unwrap().unwrap();
    let moved = tokio::spawn(run);
    let got = tokio::time::timeout(Duration::from_secs(10), moved).await;
    let got = got.expect("the moved leader hangs").unwrap();
    assert_eq!(got, ("wait timeout", 1000, Some(Duration::from_secs(1))));
}

/// Flights one after the other on one key (so one shard), each hung: a
/// leader, then a leader and a waiter. Each leaves at its own time,
/// though the group's timer task already fired (and went idle) for the
/// flights before: what a shard knew to be armed is not taken to hold
/// after a fire.
#[tokio::test(start_paused = true)]
async fn clocks_are_armed_again_after_each_fire() {
    let flights =
        LocalFlights::<String>::new(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    for round in 0..3 {
        let start = Instant::now();
        let run = flights.run(&key("again"), Caller::new(), hung());
        let got = tokio::time::timeout(Duration::from_secs(10), outcome(start, run)).await;
        let got = got.unwrap_or_else(|_| panic!("round {round}: the leader hangs"));
        assert_eq!(got, ("wait timeout", 1000, Some(Duration::from_secs(1))));
        // Later than anything armed before, and after a fire.
        sleep(Duration::from_millis(500)).await;
        let start = Instant::now();
        let leader = tokio::spawn(outcome(
            start,
            flights.run(&key("again"), Caller::new(), hung()),
        ));
        tokio::task::yield_now().await;
        let waiter = flights.run(
            &key("again"),
            Caller::new().deadline(Some(start + Duration::from_millis(700))),
            hung(),
        );
        let got = tokio::time::timeout(Duration::from_secs(10), outcome(start, waiter)).await;
        assert_eq!(
            got.unwrap_or_else(|_| panic!("round {round}: the waiter hangs")),
            ("deadline", 700, None)
        );
        let got = tokio::time::timeout(Duration::from_secs(10), leader).await;
        let got = got.unwrap_or_else(|_| panic!("round {round}: the second leader hangs"));
        assert_eq!(
            got.unwrap(),
            ("wait timeout", 1000, Some(Duration::from_secs(1)))
        );
    }
}

/// Flights of one map on a runtime that is shut down while a caller still
/// waits (its expiry armed), then on a new runtime: the callers there
/// still leave on time, though their expiries come after the one the
/// first runtime's timer task was armed for.
#[test]
fn clocks_survive_their_runtime() {
    let flights = Arc::new(LocalFlights::<String>::new(
        FlightPolicy::new().wait_timeout(Some(Duration::from_secs(3))),
    ));
    let f = flights.clone();
    let got = paused_runtime().block_on(async move {
        let start = Instant::now();
        let at = |ms| Some(start + Duration::from_millis(ms));
        // Still waiting when the runtime goes (its expiry at 2 s).
        let run = f.run(
            &key("left behind"),
            Caller::new().deadline(at(2000)),
            hung(),
        );
        drop(tokio::spawn(run));
        tokio::task::yield_now().await;
        let run = f.run(&key("first"), Caller::new().deadline(at(1000)), hung());
        tokio::time::timeout(Duration::from_secs(10), outcome(start, run)).await
    });
    assert_eq!(
        got.expect("no deadline on the first runtime"),
        ("deadline", 1000, None)
    );
    let got = hung_on_a_new_runtime(&flights, "second");
    let got = got.expect("no wait timeout on the second runtime");
    assert_eq!(got, ("wait timeout", 3000, Some(Duration::from_secs(3))));
}

/// A runtime shut down while a caller's expiry is armed and before its
/// timer task ever fired, then a flight on the same key on a new runtime,
/// with a later expiry: it leaves on time (the armed timer went with the
/// first runtime).
#[test]
fn clocks_are_armed_again_after_their_runtime_went() {
    let flights = Arc::new(LocalFlights::<String>::new(
        FlightPolicy::new().wait_timeout(Some(Duration::from_secs(3))),
    ));
    let f = flights.clone();
    paused_runtime().block_on(async move {
        drop(tokio::spawn(f.run(&key("same"), Caller::new(), hung())));
        tokio::task::yield_now().await;
    });
    let got = hung_on_a_new_runtime(&flights, "same");
    let got = got.expect("no wait timeout on the second runtime");
    assert_eq!(got, ("wait timeout", 3000, Some(Duration::from_secs(3))));
}

/// A flight whose leader was first polled outside any runtime (nothing
/// can fire there), then flights on a runtime: their clocks still fire.
/// The first expiry must not be taken for a timer that somebody armed.
#[test]
fn clocks_fire_after_a_poll_outside_any_runtime() {
    let flights = Arc::new(LocalFlights::<String>::new(
        FlightPolicy::new().wait_timeout(Some(Duration::from_secs(3))),
    ));
    let mut outside = Box::pin(flights.run(&key("outside"), Caller::new(), hung()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(outside.as_mut().poll(&mut cx).is_pending());
    drop(outside);
    let got = hung_on_a_new_runtime(&flights, "inside");
    let got = got.expect("the leader's wait timeout never fired");
    assert_eq!(got, ("wait timeout", 3000, Some(Duration::from_secs(3))));
}

/// A caller with a deadline, polled outside any runtime: no panic (there
/// is just no clock to leave on until a runtime polls it).
#[test]
fn a_deadline_outside_any_runtime_does_not_panic() {
    let flights = LocalFlights::<String>::new(FlightPolicy::new());
    let at = Some(Instant::now() + Duration::from_secs(1));
    let mut outside = Box::pin(flights.run(&key("outside"), Caller::new().deadline(at), hung()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(outside.as_mut().poll(&mut cx).is_pending());
}

/// The group's timer task started on a runtime that is still there but
/// no longer driven (its `block_on` returned): flights on another runtime
/// still leave on time.
#[test]
fn clocks_fire_while_the_first_runtime_idles() {
    let flights = Arc::new(LocalFlights::<String>::new(
        FlightPolicy::new().wait_timeout(Some(Duration::from_secs(3))),
    ));
    let first = paused_runtime();
    let f = flights.clone();
    let got = first.block_on(async move {
        let start = Instant::now();
        let run = f.run(&key("first"), Caller::new(), hung());
        tokio::time::timeout(Duration::from_secs(10), outcome(start, run)).await
    });
    assert_eq!(
        got.unwrap(),
        ("wait timeout", 3000, Some(Duration::from_secs(3)))
    );
    // A leader and a waiter of one flight on the second runtime.
    let got = paused_runtime().block_on(async move {
        let start = Instant::now();
        let leader = flights.run(&key("second"), Caller::new(), hung());
        let leader = tokio::spawn(outcome(start, leader));
        tokio::task::yield_now().await;
        let deadline = Some(start + Duration::from_millis(1000));
        let waiter = flights.run(&key("second"), Caller::new().deadline(deadline), hung());
        let waiter = tokio::time::timeout(Duration::from_secs(10), outcome(start, waiter)).await;
        let leader = tokio::time::timeout(Duration::from_secs(10), leader).await;
        (waiter, leader.map(Result::unwrap))
    });
    assert_eq!(
        got.0.expect("the waiter's deadline never fired"),
        ("deadline", 1000, None)
    );
    assert_eq!(
        got.1.expect("the leader's wait timeout never fired"),
        ("wait timeout", 3000, Some(Duration::from_secs(3)))
    );
    drop(first);
}
