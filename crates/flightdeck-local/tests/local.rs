//! Behaviour of the local single-flight layer (paused tokio time, but for
//! one test that needs a thread blocked in real time).

mod support;
use support::paused_runtime;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::find;
use flightdeck_core::error::{TooManyFlights, TooManyWaiters, WaitTimeout, WorkPanicked};
use flightdeck_core::{BoxError, FlightKey, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer, OnAbandon};
use tokio::time::sleep;
use tower::{service_fn, Layer, Service, ServiceExt};

fn key(s: &str) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(StageName::new("test").unwrap(), s))
}

#[derive(Debug)]
struct Boom(&'static str);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for Boom {}

/// A service whose work takes `work` and counts its executions.
fn counted(
    calls: Arc<AtomicUsize>,
    work: Duration,
) -> impl Service<String, Response = String, Error = Infallible, Future = impl Send> + Clone {
    service_fn(move |q: String| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            sleep(work).await;
            Ok::<_, Infallible>(format!("answer to {q}"))
        }
    })
}

type KeyFn = fn(&String) -> Option<FlightKey>;

fn layer(policy: FlightPolicy) -> LocalFlightLayer<KeyFn, flightdeck_core::CloneShare<String>> {
    layer_of(policy)
}

fn layer_of<T: Clone + Send + Sync + 'static>(
    policy: FlightPolicy,
) -> LocalFlightLayer<KeyFn, flightdeck_core::CloneShare<T>> {
    LocalFlightLayer::with_key(policy, |q: &String| key(q))
}

#[tokio::test(start_paused = true)]
async fn thousand_callers_one_execution_same_value() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new()).layer(counted(calls.clone(), Duration::from_millis(100)));
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let svc = svc.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            svc.oneshot("q".to_owned()).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "answer to q");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_error_is_shared_with_every_waiter() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_q: String| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_millis(50)).await;
            Err::<String, _>(Boom("model unavailable"))
        }
    });
    let svc = layer(FlightPolicy::new()).layer(inner);
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(svc.oneshot("q".to_owned())));
    }
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert_eq!(err.to_string(), "model unavailable");
        assert!(
            find::<Boom>(&*err).is_some(),
            "the original error is in the chain"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn different_keys_run_separately() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new()).layer(counted(calls.clone(), Duration::from_millis(10)));
    let (a, b) = tokio::join!(
        svc.clone().oneshot("a".into()),
        svc.clone().oneshot("b".into())
    );
    assert_eq!(a.unwrap(), "answer to a");
    assert_eq!(b.unwrap(), "answer to b");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_key_bypass() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = LocalFlightLayer::with_key(FlightPolicy::new(), |_q: &String| None)
        .layer(counted(calls.clone(), Duration::from_millis(10)));
    let (a, b) = tokio::join!(
        svc.clone().oneshot("a".into()),
        svc.clone().oneshot("a".into())
    );
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Sets a flag when dropped: observes cancellation of the work.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn guarded(
    calls: Arc<AtomicUsize>,
    dropped: Arc<AtomicBool>,
    completed: Arc<AtomicBool>,
) -> impl Service<String, Response = String, Error = Infallible, Future = impl Send> + Clone {
    service_fn(move |q: String| {
        let (calls, dropped, completed) = (calls.clone(), dropped.clone(), completed.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let _guard = DropFlag(dropped);
            sleep(Duration::from_secs(10)).await;
            completed.store(true, Ordering::SeqCst);
            Ok::<_, Infallible>(format!("answer to {q}"))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn leader_dropped_others_still_get_the_result() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicBool::new(false));
    let l = layer(FlightPolicy::new());
    let svc = l.layer(guarded(calls.clone(), dropped.clone(), completed.clone()));
    let leader = tokio::spawn(svc.clone().oneshot("q".into()));
    tokio::task::yield_now().await;
    let waiter = tokio::spawn(svc.clone().oneshot("q".into()));
    tokio::task::yield_now().await;
    sleep(Duration::from_secs(1)).await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.await.unwrap().unwrap(), "answer to q");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(completed.load(Ordering::SeqCst));
    assert_eq!(l.running_flights(), 0);
}

#[tokio::test(start_paused = true)]
async fn all_callers_dropped_cancels_the_work() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicBool::new(false));
    let l = layer(FlightPolicy::new());
    let svc = l.layer(guarded(calls.clone(), dropped.clone(), completed.clone()));
    let a = tokio::spawn(svc.clone().oneshot("q".into()));
    let b = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(l.running_flights(), 1);
    a.abort();
    b.abort();
    let _ = (a.await, b.await);
    tokio::task::yield_now().await;
    assert!(dropped.load(Ordering::SeqCst), "work future was dropped");
    sleep(Duration::from_secs(20)).await;
    assert!(
        !completed.load(Ordering::SeqCst),
        "work must not run to completion"
    );
    assert_eq!(l.running_flights(), 0);
    assert_eq!(l.map_entries(), 0);
    // The key is free: the next call runs fresh.
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn finish_policy_completes_abandoned_work() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicBool::new(false));
    let l = layer(FlightPolicy::new().on_abandon(OnAbandon::Finish));
    let svc = l.layer(guarded(calls.clone(), dropped.clone(), completed.clone()));
    let a = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_secs(1)).await;
    a.abort();
    let _ = a.await;
    sleep(Duration::from_secs(20)).await;
    assert!(completed.load(Ordering::SeqCst), "work ran to completion");
    assert_eq!(l.running_flights(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_panic_is_an_error_for_every_waiter_and_the_key_is_free_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |q: String| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            sleep(Duration::from_millis(10)).await;
            if n == 0 {
                panic!("model client bug");
            }
            Ok::<_, Infallible>(q)
        }
    });
    let l = layer(FlightPolicy::new());
    let svc = l.layer(inner);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        tasks.push(tokio::spawn(svc.clone().oneshot("q".to_owned())));
    }
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert!(err.is::<WorkPanicked>(), "{err}");
    }
    assert_eq!(svc.clone().oneshot("q".into()).await.unwrap(), "q");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(l.running_flights(), 0);
}

/// A shared value whose `Clone` panics.
#[derive(Debug)]
struct Brittle;
impl Clone for Brittle {
    fn clone(&self) -> Self {
        panic!("the user's Clone panicked");
    }
}

/// A value whose `Clone` panics is a panic of the flight for each caller
/// that needs a copy: a typed error, not a panic of the caller's task (with
/// 1,000 waiters, 1,000 panics), and nobody hangs.
#[tokio::test(start_paused = true)]
async fn a_panicking_clone_of_the_value_is_an_error_for_every_caller() {
    let l = layer_of::<Brittle>(FlightPolicy::new());
    let svc = l.layer(service_fn(|_q: String| async {
        sleep(Duration::from_millis(10)).await;
        Ok::<_, Infallible>(Brittle)
    }));
    let tasks: Vec<_> = (0..4)
        .map(|_| tokio::spawn(svc.clone().oneshot("q".to_owned())))
        .collect();
    for t in tasks {
        let answer = t.await.expect("no caller's task panicked");
        let err = answer.expect_err("a copy could not be made");
        assert!(err.is::<WorkPanicked>(), "{err}");
    }
    assert_eq!(l.running_flights(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_timeout_leaves_the_flight_running() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(1500)));
    let first = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(700)).await;
    let second = tokio::spawn(svc.clone().oneshot("q".into()));
    // The first caller times out at t=1000ms, the work ends at t=1500ms.
    let err = first.await.unwrap().unwrap_err();
    let timeout = err.downcast_ref::<WaitTimeout>().expect("wait timeout");
    assert_eq!(timeout.waited(), Duration::from_secs(1));
    assert_eq!(l.running_flights(), 1, "the flight stays");
    // A later caller still joins the same flight.
    let third = tokio::spawn(svc.clone().oneshot("q".into()));
    assert_eq!(second.await.unwrap().unwrap(), "answer to q");
    assert_eq!(third.await.unwrap().unwrap(), "answer to q");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_only_waiter_timing_out_does_not_cancel_the_work() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    let svc = l.layer(counted(calls.clone(), Duration::from_secs(2)));
    assert!(svc
        .clone()
        .oneshot("q".into())
        .await
        .unwrap_err()
        .is::<WaitTimeout>());
    sleep(Duration::from_millis(500)).await;
    // Joins the flight that is still running (t=1.5s, ends at t=2s).
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn replay_ttl_serves_a_finished_result() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().replay_ttl(Duration::from_secs(5)));
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(10)));
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "replayed");
    sleep(Duration::from_secs(5)).await;
    assert_eq!(l.map_entries(), 0, "replay entry expired and removed");
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "fresh after the window");
}

#[tokio::test(start_paused = true)]
async fn replay_ttl_zero_runs_fresh() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new());
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(10)));
    svc.clone().oneshot("q".into()).await.unwrap();
    svc.clone().oneshot("q".into()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(l.map_entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn errors_are_not_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_q: String| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Err::<String, _>(Boom("nope")) }
    });
    let svc = layer(FlightPolicy::new().replay_ttl(Duration::from_secs(5))).layer(inner);
    assert!(svc.clone().oneshot("q".into()).await.is_err());
    assert!(svc.clone().oneshot("q".into()).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn flight_ttl_bounds_joining() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().flight_ttl(Duration::from_secs(1)));
    let svc = l.layer(counted(calls.clone(), Duration::from_secs(3)));
    let a = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(500)).await;
    let b = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(1000)).await;
    // t=1.5s: the first flight may no longer be joined.
    let c = tokio::spawn(svc.clone().oneshot("q".into()));
    for t in [a, b, c] {
        assert_eq!(t.await.unwrap().unwrap(), "answer to q");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(l.running_flights(), 0);
    assert_eq!(
        l.map_entries(),
        0,
        "the older flight did not leave a stale entry"
    );
}

/// A leader whose future nobody polls (moka #240's way to wedge a key)
/// still gets a flight TTL: the first caller to find it running starts its
/// clock, and after the TTL new callers start a fresh flight.
#[tokio::test(start_paused = true)]
async fn a_leader_never_polled_still_has_a_flight_ttl() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(
        FlightPolicy::new()
            .flight_ttl(Duration::from_secs(1))
            .wait_timeout(Some(Duration::from_secs(10))),
    );
    let mut svc = l.layer(counted(calls.clone(), Duration::from_millis(10)));
    let stuck = svc.ready().await.unwrap().call("q".into());
    sleep(Duration::from_secs(5)).await;
    // t=5s: the leader was never polled; this caller joins it and starts
    // its TTL.
    let joined = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(1500)).await;
    // t=6.5s: past the TTL, so a fresh flight runs and answers.
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The stuck flight finishes once its leader is polled at last, for the
    // caller that joined it.
    assert_eq!(stuck.await.unwrap(), "answer to q");
    assert_eq!(joined.await.unwrap().unwrap(), "answer to q");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(l.map_entries(), 0);
}

/// A flight that outlived its TTL finishes for its own callers, and never
/// takes the key back from the newer flight: neither while that one runs
/// nor as the result replayed after it.
#[tokio::test(start_paused = true)]
async fn a_flight_past_its_ttl_never_displaces_the_newer_one() {
    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let l = layer(
        FlightPolicy::new()
            .flight_ttl(Duration::from_secs(1))
            .replay_ttl(Duration::from_secs(10)),
    );
    let svc = l.layer(service_fn(move |q: String| {
        let run = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            sleep(Duration::from_secs(2)).await;
            Ok::<_, Infallible>(format!("run {run} of {q}"))
        }
    }));
    let old = tokio::spawn(svc.clone().oneshot("q".into()));
    // t=1.5s: the first flight may no longer be joined; a second starts.
    sleep(Duration::from_millis(1500)).await;
    let new = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(700)).await;
    // t=2.2s: the old flight is done (with a value it may not replay); the
    // newer one still runs and may still be joined.
    assert_eq!(old.await.unwrap().unwrap(), "run 1 of q");
    let joiner = tokio::spawn(svc.clone().oneshot("q".into()));
    assert_eq!(new.await.unwrap().unwrap(), "run 2 of q");
    assert_eq!(joiner.await.unwrap().unwrap(), "run 2 of q");
    // The replayed result is the newer flight's.
    assert_eq!(svc.clone().oneshot("q".into()).await.unwrap(), "run 2 of q");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(l.running_flights(), 0);
    assert_eq!(l.map_entries(), 1, "the replay entry");
}

#[tokio::test(start_paused = true)]
async fn max_waiters_rejects_with_a_typed_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new().max_waiters(3))
        .layer(counted(calls.clone(), Duration::from_secs(1)));
    let held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot("q".to_owned())))
        .collect();
    tokio::task::yield_now().await;
    let err = svc.clone().oneshot("q".into()).await.unwrap_err();
    let e = err
        .downcast_ref::<TooManyWaiters>()
        .expect("typed rejection");
    assert_eq!(e.limit(), 3);
    assert!(err.to_string().contains("too many waiters"));
    for t in held {
        t.await.unwrap().unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn max_flights_rejects_with_a_typed_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().max_flights(2));
    let svc = l.layer(counted(calls.clone(), Duration::from_secs(1)));
    let a = tokio::spawn(svc.clone().oneshot("a".to_owned()));
    let b = tokio::spawn(svc.clone().oneshot("b".to_owned()));
    tokio::task::yield_now().await;
    let err = svc.clone().oneshot("c".into()).await.unwrap_err();
    assert_eq!(err.downcast_ref::<TooManyFlights>().unwrap().limit(), 2);
    // Joining a running flight is still fine.
    assert_eq!(
        svc.clone().oneshot("a".into()).await.unwrap(),
        "answer to a"
    );
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    // Room again.
    assert_eq!(
        svc.clone().oneshot("c".into()).await.unwrap(),
        "answer to c"
    );
    assert_eq!(l.running_flights(), 0);
}

/// The bound holds exactly across the map's shards, round after round: each
/// round, a different set of keys (so other shards than before) fills it to
/// the last flight, and the next one is turned away. Shards keep spare room
/// between rounds; a full round needs all of it back.
#[tokio::test(start_paused = true)]
async fn max_flights_is_exact_across_shards_and_rounds() {
    for limit in [1usize, 3, 100, 700] {
        let calls = Arc::new(AtomicUsize::new(0));
        let l = layer(FlightPolicy::new().max_flights(limit));
        let svc = l.layer(counted(calls.clone(), Duration::from_secs(1)));
        for round in 0..4 {
            let flights: Vec<_> = (0..limit)
                .map(|i| tokio::spawn(svc.clone().oneshot(format!("{round}/{i}"))))
                .collect();
            // Every task gets polled (a rejected one would end instead).
            for _ in 0..1000 {
                if l.running_flights() == limit {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(l.running_flights(), limit, "limit {limit}, round {round}");
            for extra in 0..3 {
                let err = svc
                    .clone()
                    .oneshot(format!("{round}/extra{extra}"))
                    .await
                    .unwrap_err();
                assert_eq!(err.downcast_ref::<TooManyFlights>().unwrap().limit(), limit);
            }
            for f in flights {
                f.await.unwrap().unwrap();
            }
            assert_eq!(l.running_flights(), 0);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4 * limit);
    }
}

/// A result whose `Drop` panics once armed.
#[derive(Clone)]
struct Loud(Arc<AtomicBool>);

impl Drop for Loud {
    fn drop(&mut self) {
        if self.0.swap(false, Ordering::SeqCst) {
            panic!("a loud drop");
        }
    }
}

/// The user's `Drop` of an expired result runs when a new flight takes its
/// key; when it panics, the new flight is already armed, so it ends (and
/// gives back its room under `max_flights`) instead of staying behind.
#[test]
fn a_panicking_drop_of_a_replaced_result_frees_its_flight() {
    let armed = Arc::new(AtomicBool::new(false));
    let l = layer_of::<Loud>(
        FlightPolicy::new()
            .replay_ttl(Duration::from_millis(20))
            .max_flights(1),
    );
    let made = armed.clone();
    let svc = l.layer(service_fn(move |_q: String| {
        let made = made.clone();
        async move { Ok::<_, Infallible>(Loud(made)) }
    }));
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    // That runtime ends before the replay's timer fires: the result stays
    // in the map until its key is next looked up.
    drop(rt().block_on(svc.clone().oneshot("q".into())).unwrap());
    std::thread::sleep(Duration::from_millis(40));
    armed.store(true, Ordering::SeqCst);
    let rt = rt();
    let _in = rt.enter();
    let mut caller = svc.clone();
    let call = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(caller.call("q".into()));
    }));
    assert!(call.is_err(), "the user's Drop panicked in call");
    assert_eq!(l.running_flights(), 0);
    assert_eq!(l.map_entries(), 0);
    // The one flight allowed runs again.
    drop(rt.block_on(svc.clone().oneshot("q".into())).unwrap());
    drop(rt.block_on(svc.clone().oneshot("r".into())).unwrap());
}

#[tokio::test(start_paused = true)]
async fn coalesces_across_clones_and_rebuilt_services() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new());
    let inner = counted(calls.clone(), Duration::from_millis(100));
    // axum rebuilds the layered service per request (`layer()` each time)
    // and clones it for `with_state` routers: both must share one map.
    let rebuilt_a = l.layer(inner.clone());
    let rebuilt_b = l.clone().layer(inner.clone());
    let cloned = rebuilt_a.clone();
    let (x, y, z) = tokio::join!(
        rebuilt_a.oneshot("q".into()),
        rebuilt_b.oneshot("q".into()),
        cloned.oneshot("q".into())
    );
    assert_eq!((x.unwrap(), y.unwrap(), z.unwrap()).0, "answer to q");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn readiness_is_passed_through() {
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<String, String, _>(layer(FlightPolicy::new()));
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let fut = svc.call("q".into());
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req, "q");
    send.send_response("a".into());
    assert_eq!(fut.await.unwrap(), "a");
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_waiters_are_all_woken() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().max_waiters(20_000));
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(200)));
    let futs: Vec<_> = (0..10_000)
        .map(|_| svc.clone().oneshot("q".to_owned()))
        .collect();
    let results = futures_join_all(futs).await;
    assert!(results
        .iter()
        .all(|r| r.as_deref().ok() == Some("answer to q")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(l.map_entries(), 0);
}

async fn futures_join_all<F>(futs: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut out = Vec::with_capacity(futs.len());
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn metrics_count_owners_and_waiters() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new()).layer(counted(calls.clone(), Duration::from_millis(50)));
    metrics::with_local_recorder(&recorder, || {
        // Calls are made (and counters recorded) synchronously here.
        let futs: Vec<_> = (0..5)
            .map(|_| {
                let mut s = svc.clone();
                s.call("q".to_owned())
            })
            .collect();
        drop(futs);
    });
    let counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Counter(n) => Some((k.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    let get = |name: &str| counters.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(get("singleflight_local_owner_total"), Some(1));
    assert_eq!(get("singleflight_local_waiter_total"), Some(4));
    let _ = BoxError::from("unused");
}

#[test]
fn metrics_record_execution_wait_and_the_active_gauge() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = paused_runtime();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new()).layer(counted(calls.clone(), Duration::from_millis(50)));
    let out = metrics::with_local_recorder(&recorder, || {
        rt.block_on(futures_join_all(
            (0..5)
                .map(|_| svc.clone().oneshot("q".to_owned()))
                .collect(),
        ))
    });
    assert!(out.iter().all(|r| r.as_deref().ok() == Some("answer to q")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let snapshot = snapshotter.snapshot().into_vec();
    let find = |name: &str| {
        snapshot
            .iter()
            .find(|(k, _, _, _)| k.key().name() == name)
            .map(|(_, _, _, v)| v)
    };
    // One execution of 50 ms (paused time: exactly).
    match find("singleflight_execution_duration") {
        Some(DebugValue::Histogram(h)) => {
            assert_eq!(h.len(), 1, "{h:?}");
            assert!((h[0].into_inner() - 0.05).abs() < 1e-6, "{h:?}");
        }
        other => panic!("execution histogram: {other:?}"),
    }
    match find("singleflight_wait_duration") {
        Some(DebugValue::Histogram(h)) => assert_eq!(h.len(), 4, "{h:?}"),
        other => panic!("wait histogram: {other:?}"),
    }
    // Up by one when the flight started, down by one when it ended.
    match find("singleflight_active_flights") {
        Some(DebugValue::Gauge(g)) => assert_eq!(g.into_inner(), 0.0),
        other => panic!("active gauge: {other:?}"),
    }
}

/// A flight is counted out under the recorder it was counted in under:
/// started while one recorder is in force and finished while another is,
/// the first one's active gauge comes back to 0, and so does the second
/// one's, which first saw the stage while the flight ran. (Recorded under
/// the recorder in force at each event, the first one would stay at 1; a
/// gauge that counted the flights running when it appeared would stay at 1
/// in the second.) A snapshot of the debugging recorder resets
/// gauges, so each is read once, at the end.
#[test]
fn a_flight_is_counted_out_under_the_recorder_it_was_counted_in_under() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    let active = |s: &Snapshotter| {
        s.snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(k, _, _, v)| match v {
                DebugValue::Gauge(g) if k.key().name() == "singleflight_active_flights" => {
                    Some(g.into_inner())
                }
                _ => None,
            })
    };
    let (first, second) = (DebuggingRecorder::new(), DebuggingRecorder::new());
    let (at_start, at_end) = (first.snapshotter(), second.snapshotter());
    let rt = paused_runtime();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(FlightPolicy::new()).layer(counted(calls.clone(), Duration::from_millis(50)));
    let mut call = Box::pin(svc.clone().oneshot("q".to_owned()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // First poll under the first recorder: the flight starts (pending).
    let polled = metrics::with_local_recorder(&first, || {
        rt.block_on(async { std::future::Future::poll(call.as_mut(), &mut cx).is_pending() })
    });
    assert!(polled);
    // The second recorder is first seen while that flight runs (another
    // flight of the stage runs under it), and the first flight finishes
    // under it.
    let out = metrics::with_local_recorder(&second, || {
        rt.block_on(async {
            let other = svc.clone().oneshot("other".to_owned()).await;
            assert_eq!(other.as_deref().ok(), Some("answer to other"));
            call.await
        })
    });
    assert_eq!(out.as_deref().ok(), Some("answer to q"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(active(&at_start), Some(0.0), "counted out where counted in");
    assert_eq!(
        active(&at_end),
        Some(0.0),
        "the second recorder counts only the flights started under it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_after_the_leader_left_reaches_the_waiters() {
    let inner = service_fn(|_q: String| async move {
        sleep(Duration::from_secs(1)).await;
        if true {
            panic!("late bug");
        }
        Ok::<String, Infallible>(String::new())
    });
    let l = layer(FlightPolicy::new());
    let svc = l.layer(inner);
    let leader = tokio::spawn(svc.clone().oneshot("q".into()));
    tokio::task::yield_now().await;
    let waiter = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(100)).await;
    leader.abort();
    let _ = leader.await;
    // The work moved to a task of its own and panics there.
    let err = waiter.await.unwrap().unwrap_err();
    assert!(err.is::<WorkPanicked>(), "{err}");
    assert_eq!(l.running_flights(), 0);
    assert_eq!(l.map_entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn leader_timeout_hands_the_work_over_and_waiters_get_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().wait_timeout(Some(Duration::from_secs(1))));
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(1800)));
    let leader = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(900)).await;
    let waiter = tokio::spawn(svc.clone().oneshot("q".into()));
    assert!(leader.await.unwrap().unwrap_err().is::<WaitTimeout>());
    assert_eq!(waiter.await.unwrap().unwrap(), "answer to q");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// Policies at their extremes, user code that panics, and clocks that must
// not depend on whether metrics are recorded.

/// `Duration::MAX` is a natural "for ever": it must not overflow an
/// instant anywhere (replay window, flight TTL, wait timeout).
#[tokio::test(start_paused = true)]
async fn durations_of_for_ever_do_not_overflow() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(
        FlightPolicy::new()
            .replay_ttl(Duration::MAX)
            .flight_ttl(Duration::MAX)
            .wait_timeout(Some(Duration::MAX)),
    );
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(10)));
    let leader = tokio::spawn(svc.clone().oneshot("q".into()));
    tokio::task::yield_now().await;
    let joiner = tokio::spawn(svc.clone().oneshot("q".into()));
    assert_eq!(leader.await.unwrap().unwrap(), "answer to q");
    assert_eq!(joiner.await.unwrap().unwrap(), "answer to q");
    sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "replayed, for ever");
    assert_eq!(l.running_flights(), 0);
}

static PANIC_ON_CLONE: AtomicBool = AtomicBool::new(false);

/// A value whose `Clone` panics once when told to.
#[derive(Debug)]
struct Touchy(String);

impl Clone for Touchy {
    fn clone(&self) -> Self {
        if PANIC_ON_CLONE.swap(false, Ordering::SeqCst) {
            panic!("a bug in the user's Clone");
        }
        Touchy(self.0.clone())
    }
}

/// The copy kept for replay is made with the user's `Clone`. If that
/// panics, the flight ends like one whose work panicked: its waiter hears
/// of it, and the key is free at once (no slot left behind for later
/// callers to hang on).
#[tokio::test(start_paused = true)]
async fn a_panicking_clone_of_the_result_frees_the_key() {
    let l = layer_of::<Touchy>(
        FlightPolicy::new()
            .replay_ttl(Duration::from_secs(5))
            .wait_timeout(None),
    );
    // Only the first execution's result has the bad clone.
    let first = Arc::new(AtomicBool::new(true));
    let svc = l.layer(service_fn(move |q: String| {
        let first = first.swap(false, Ordering::SeqCst);
        async move {
            sleep(Duration::from_secs(1)).await;
            PANIC_ON_CLONE.store(first, Ordering::SeqCst);
            Ok::<_, Infallible>(Touchy(q))
        }
    }));
    let leader = tokio::spawn(svc.clone().oneshot("q".into()));
    tokio::task::yield_now().await;
    let waiter = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(100)).await;
    // The work moves to a task of its own, where the panic happens.
    leader.abort();
    let _ = leader.await;
    let err = waiter.await.unwrap().unwrap_err();
    assert!(err.is::<flightdeck_core::error::WorkPanicked>(), "{err}");
    assert_eq!(l.running_flights(), 0);
    assert_eq!(l.map_entries(), 0);
    let late = tokio::time::timeout(Duration::from_secs(10), svc.clone().oneshot("q".into()))
        .await
        .expect("a later caller runs a fresh flight");
    assert_eq!(late.unwrap().0, "q");
}

/// A newcomer past the old flight's TTL that `max_flights` turns away does
/// not take the key: the old flight's result is still replayed.
#[tokio::test(start_paused = true)]
async fn a_rejected_newcomer_leaves_the_key_to_the_old_flight() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(
        FlightPolicy::new()
            .max_flights(1)
            .flight_ttl(Duration::from_secs(1))
            .replay_ttl(Duration::from_secs(10)),
    );
    let svc = l.layer(counted(calls.clone(), Duration::from_secs(2)));
    let old = tokio::spawn(svc.clone().oneshot("q".into()));
    sleep(Duration::from_millis(1500)).await;
    let err = svc.clone().oneshot("q".into()).await.unwrap_err();
    assert!(err.is::<TooManyFlights>(), "{err}");
    assert_eq!(old.await.unwrap().unwrap(), "answer to q");
    assert_eq!(
        svc.clone().oneshot("q".into()).await.unwrap(),
        "answer to q"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the old result, replayed");
}

/// "A bound of 0 rejects every call", the leader's too.
#[tokio::test(start_paused = true)]
async fn zero_waiters_rejects_every_call() {
    let calls = Arc::new(AtomicUsize::new(0));
    let l = layer(FlightPolicy::new().max_waiters(0));
    let svc = l.layer(counted(calls.clone(), Duration::from_millis(10)));
    let err = svc.clone().oneshot("q".into()).await.unwrap_err();
    assert!(err.is::<TooManyWaiters>(), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(l.running_flights(), 0);
}

/// The leader's wait (and the flight TTL) must count from the same instant
/// whether or not a metrics recorder makes the layer time executions. Real
/// time: the work blocks its thread 400 ms before its first await (as a
/// synchronous parse would), then sleeps 400 ms, with a 600 ms wait
/// timeout. Only the sameness of the two outcomes is asserted, which a slow
/// machine does not change.
#[test]
fn the_leaders_wait_does_not_depend_on_a_recorder() {
    fn lead() -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let l = layer(FlightPolicy::new().wait_timeout(Some(Duration::from_millis(600))));
        let svc = l.layer(service_fn(|q: String| async move {
            std::thread::sleep(Duration::from_millis(400));
            sleep(Duration::from_millis(400)).await;
            Ok::<_, Infallible>(q)
        }));
        rt.block_on(svc.oneshot("q".into()))
            .map_err(|e| e.to_string())
    }
    let without = lead();
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let with = metrics::with_local_recorder(&recorder, lead);
    assert_eq!(
        without.is_ok(),
        with.is_ok(),
        "without a recorder: {without:?}; with one: {with:?}"
    );
}
