//! State machine, windows, probes, jitter, ramp, handle and registry, all
//! on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_breaker::{
    Breaker, BreakerConfig, BreakerRegistry, CircuitState, Outcome, Ramp, TransientErrors,
    TransitionReason,
};
use flightdeck_core::error::CircuitOpen;
use flightdeck_core::BoxError;
use tokio::time::{advance, Instant};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

fn no_jitter() -> BreakerConfig {
    BreakerConfig::default().jitter(0.0, 0.0)
}

/// A breaker that opens on the first failure and waits `wait` in open.
fn opens_on_one_failure(wait: Duration) -> Breaker {
    Breaker::new("t", no_jitter().consecutive_failures(1).wait_in_open(wait)).unwrap()
}

fn fail(b: &Breaker, n: usize) {
    for _ in 0..n {
        b.try_acquire().expect("admitted").record(Outcome::Failure);
    }
}

fn succeed(b: &Breaker, n: usize) {
    for _ in 0..n {
        b.try_acquire().expect("admitted").record(Outcome::Success);
    }
}

#[tokio::test(start_paused = true)]
async fn opens_on_failure_rate_once_min_calls_are_in_the_window() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .count_window(100)
            .min_calls(10)
            .failure_rate(0.5),
    )
    .unwrap();
    succeed(&b, 5);
    fail(&b, 4);
    assert_eq!(b.state(), CircuitState::Closed, "9 calls < min_calls");
    let mut events = b.subscribe();
    fail(&b, 1); // 10 calls, 5 failures: 50 %, long before the window is full
    assert_eq!(b.state(), CircuitState::Open);
    let t = events.recv().await.unwrap();
    assert_eq!((t.from, t.to), (CircuitState::Closed, CircuitState::Open));
    assert!(matches!(
        t.reason,
        TransitionReason::FailureRate { calls: 10, .. }
    ));
    let err = b.try_acquire().unwrap_err();
    assert_eq!(err.name(), "t");
}

#[tokio::test(start_paused = true)]
async fn opens_on_consecutive_failures_and_a_success_resets_the_run() {
    let b = Breaker::new("t", no_jitter().min_calls(1000).consecutive_failures(3)).unwrap();
    fail(&b, 2);
    succeed(&b, 1);
    fail(&b, 2);
    assert_eq!(b.state(), CircuitState::Closed);
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn slow_successes_count_as_failures() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .min_calls(1000)
            .consecutive_failures(2)
            .slow_call(Duration::from_millis(100)),
    )
    .unwrap();
    let mut svc =
        ServiceBuilder::new()
            .layer(b.layer())
            .service(service_fn(|ms: u64| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, BoxError>(ms)
            }));
    svc.ready().await.unwrap().call(10).await.unwrap();
    svc.ready().await.unwrap().call(150).await.unwrap();
    assert_eq!(b.state(), CircuitState::Closed);
    svc.ready().await.unwrap().call(150).await.unwrap();
    assert_eq!(b.state(), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn every_transition_closed_open_half_open_closed_and_reopen() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .wait_in_open(Duration::from_secs(5))
            .half_open_probes(2),
    )
    .unwrap();
    let mut events = b.subscribe();
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Open);
    advance(Duration::from_millis(4_999)).await;
    assert_eq!(b.state(), CircuitState::Open);
    assert!(b.try_acquire().is_err());
    advance(Duration::from_millis(1)).await;
    assert_eq!(b.state(), CircuitState::HalfOpen);

    // A failed probe reopens.
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), CircuitState::Open);
    advance(Duration::from_secs(5)).await;

    // Two successful probes close.
    let p1 = b.try_acquire().unwrap();
    let p2 = b.try_acquire().unwrap();
    assert!(p1.is_probe() && p2.is_probe());
    assert!(b.try_acquire().is_err(), "only 2 probes at once");
    p1.record(Outcome::Success);
    assert_eq!(b.state(), CircuitState::HalfOpen);
    p2.record(Outcome::Success);
    assert_eq!(b.state(), CircuitState::Closed);

    let seen: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|t| (t.from, t.to))
        .collect();
    use CircuitState::*;
    assert_eq!(
        seen,
        [
            (Closed, Open),
            (Open, HalfOpen),
            (HalfOpen, Open),
            (Open, HalfOpen),
            (HalfOpen, Closed)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn open_wait_grows_on_reopening_and_resets_after_closing() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(1)
            .wait_in_open(Duration::from_secs(1))
            .wait_growth(2.0, Duration::from_secs(3)),
    )
    .unwrap();
    let mut events = b.subscribe();
    fail(&b, 1);
    for expected in [1, 2, 3, 3] {
        let t = events.recv().await.unwrap();
        assert_eq!(t.open_for, Some(Duration::from_secs(expected)));
        advance(Duration::from_secs(expected)).await;
        assert_eq!(b.state(), CircuitState::HalfOpen);
        let _half = events.recv().await.unwrap();
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    let _open = events.recv().await.unwrap();
    advance(Duration::from_secs(3)).await;
    succeed(&b, 1);
    assert_eq!(b.state(), CircuitState::Closed);
    fail(&b, 1);
    let t = std::iter::from_fn(|| events.try_recv().ok())
        .last()
        .unwrap();
    assert_eq!(
        t.open_for,
        Some(Duration::from_secs(1)),
        "growth resets after closing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hundred_breakers_opened_together_reopen_spread_over_the_jitter_window() {
    let wait = Duration::from_secs(10);
    let breakers: Vec<_> = (0..100)
        .map(|i| {
            let cfg = BreakerConfig::default()
                .consecutive_failures(1)
                .wait_in_open(wait)
                .jitter(0.0, 0.5);
            Breaker::new(format!("node-{i}"), cfg).unwrap()
        })
        .collect();
    let opened = Instant::now();
    for b in &breakers {
        fail(b, 1);
    }
    let mut reopen: Vec<Duration> = breakers
        .iter()
        .map(|b| b.open_until().unwrap() - opened)
        .collect();
    reopen.sort();
    // Every wait lies in [10 s, 15 s] ...
    assert!(
        reopen[0] >= wait && reopen[99] <= wait.mul_f64(1.5),
        "{reopen:?}"
    );
    // ... and they are spread over it, not bunched in one instant.
    let mut distinct = reopen.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
    distinct.dedup();
    assert!(distinct.len() >= 90, "only {} distinct ms", distinct.len());
    assert!(
        reopen[99] - reopen[0] >= Duration::from_secs(4),
        "spread {:?}",
        reopen[99] - reopen[0]
    );
    // Each moves to half-open at its own time: at 12.5 s some have, some not.
    advance(Duration::from_millis(12_500)).await;
    let half = breakers
        .iter()
        .filter(|b| b.state() == CircuitState::HalfOpen)
        .count();
    assert!(
        (20..=80).contains(&half),
        "{half} of 100 half-open at the midpoint"
    );
    advance(Duration::from_millis(2_500)).await;
    assert!(breakers.iter().all(|b| b.state() == CircuitState::HalfOpen));
}

#[tokio::test(start_paused = true)]
async fn half_open_under_1000_concurrent_calls_admits_exactly_the_probes() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(3)
            .success_threshold(3)
            .wait_in_open(Duration::from_secs(1)),
    )
    .unwrap();
    fail(&b, 1);
    advance(Duration::from_secs(1)).await;

    let ran = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let svc = ServiceBuilder::new().layer(b.layer()).service(service_fn({
        let ran = ran.clone();
        let release = release.clone();
        move |_: ()| {
            let ran = ran.clone();
            let release = release.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                Ok::<_, std::convert::Infallible>(())
            }
        }
    }));
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot(()).await
            })
        })
        .collect();
    // Let every task reach the breaker.
    while ran.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    release.notify_waiters();
    let mut rejected = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => {}
            Err(e) => {
                assert!(e.is::<CircuitOpen>());
                rejected += 1;
            }
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 3, "exactly 3 probes ran");
    assert_eq!(rejected, 997);
    assert_eq!(b.state(), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_hung_probe_frees_its_slot_after_the_probe_timeout() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(1)
            .wait_in_open(Duration::from_secs(1))
            .probe_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    fail(&b, 1);
    advance(Duration::from_secs(1)).await;
    let hung = b.try_acquire().unwrap();
    assert!(b.try_acquire().is_err());
    advance(Duration::from_millis(1_999)).await;
    assert!(
        b.try_acquire().is_err(),
        "slot still held before the timeout"
    );
    advance(Duration::from_millis(1)).await;
    let fresh = b.try_acquire().expect("slot freed after the probe timeout");
    // The hung probe's late failure is ignored; the fresh one decides.
    hung.record(Outcome::Failure);
    assert_eq!(b.state(), CircuitState::HalfOpen);
    fresh.record(Outcome::Success);
    assert_eq!(b.state(), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_frees_its_slot_at_once() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(1)
            .wait_in_open(Duration::from_secs(1)),
    )
    .unwrap();
    fail(&b, 1);
    advance(Duration::from_secs(1)).await;
    let mut svc = ServiceBuilder::new()
        .layer(b.layer())
        .service(service_fn(|_: ()| {
            std::future::pending::<Result<(), BoxError>>()
        }));
    let fut = svc.ready().await.unwrap().call(());
    assert!(b.try_acquire().is_err());
    drop(fut); // client went away
    assert!(b.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn count_window_forgets_old_failures() {
    let b = Breaker::new(
        "t",
        no_jitter().count_window(10).min_calls(10).failure_rate(0.5),
    )
    .unwrap();
    fail(&b, 4);
    succeed(&b, 6);
    assert_eq!(b.stats().failures, 4);
    // Ten more successes push all four failures out of the window.
    succeed(&b, 10);
    let s = b.stats();
    assert_eq!((s.calls, s.failures), (10, 0));
    // A cumulative counter would now hold 4 failures out of 20 and open on
    // the next 6; the sliding window needs 5 of the last 10.
    fail(&b, 4);
    assert_eq!(b.state(), CircuitState::Closed);
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Open);
    // Memory does not grow with calls.
    b.reset();
    succeed(&b, 50_000);
    assert_eq!(b.stats().calls, 10);
}

#[tokio::test(start_paused = true)]
async fn time_window_buckets_expire() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .time_window(Duration::from_secs(10), 10)
            .min_calls(4)
            .failure_rate(0.5),
    )
    .unwrap();
    fail(&b, 3);
    advance(Duration::from_secs(10)).await;
    assert_eq!(b.stats().calls, 0, "the failures' bucket expired");
    fail(&b, 1);
    succeed(&b, 2);
    assert_eq!(b.state(), CircuitState::Closed, "1 of 3 fresh calls failed");
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Open, "2 of 4 fresh calls failed");
}

#[tokio::test(start_paused = true)]
async fn ramp_lets_through_the_configured_share_per_step() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(1)
            .wait_in_open(Duration::from_secs(1))
            .ramp(Ramp::new([0.1, 0.25, 0.5], Duration::from_secs(10))),
    )
    .unwrap();
    fail(&b, 1);
    advance(Duration::from_secs(1)).await;
    succeed(&b, 1);
    assert_eq!(b.state(), CircuitState::Closed);
    for share in [0.1, 0.25, 0.5] {
        assert_eq!(b.ramp_share(), Some(share));
        let admitted = (0..1000)
            .filter(|_| match b.try_acquire() {
                Ok(p) => {
                    p.record(Outcome::Success);
                    true
                }
                Err(_) => false,
            })
            .count();
        let expected = (1000.0 * share) as usize;
        assert!(
            admitted.abs_diff(expected) <= 2,
            "share {share}: {admitted} of 1000"
        );
        advance(Duration::from_secs(10)).await;
    }
    assert!(
        (0..100).all(|_| b.try_acquire().is_ok()),
        "full traffic after the ramp"
    );
    assert_eq!(b.ramp_share(), None);
}

#[tokio::test(start_paused = true)]
async fn handle_forces_resets_and_reports() {
    let b = Breaker::new("t", no_jitter()).unwrap();
    let mut events = b.subscribe();
    b.force_open();
    assert_eq!(b.state(), CircuitState::ForcedOpen);
    assert!(b.try_acquire().is_err());
    advance(Duration::from_secs(3600)).await;
    assert_eq!(
        b.state(),
        CircuitState::ForcedOpen,
        "forced open stays open"
    );
    b.force_closed();
    fail(&b, 1000);
    assert_eq!(b.state(), CircuitState::ForcedClosed);
    assert_eq!(b.stats().calls, 0, "nothing recorded while forced closed");
    b.reset();
    assert_eq!(b.state(), CircuitState::Closed);
    let reasons: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|t| t.reason)
        .collect();
    assert_eq!(
        reasons,
        [
            TransitionReason::Manual,
            TransitionReason::Manual,
            TransitionReason::Manual
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn outcomes_of_calls_admitted_before_a_transition_are_ignored() {
    let b = Breaker::new("t", no_jitter().consecutive_failures(2)).unwrap();
    let old = b.try_acquire().unwrap();
    b.reset();
    old.record(Outcome::Failure);
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Closed);
}

#[test]
fn invalid_settings_are_named() {
    let err = Breaker::new("t", BreakerConfig::default().failure_rate(1.5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid breaker config: failure rate must be in (0, 1]"
    );
    assert!(Breaker::new("t", BreakerConfig::default().count_window(0)).is_err());
    assert!(Breaker::new("t", BreakerConfig::default().half_open_probes(0)).is_err());
    assert!(Breaker::new("t", BreakerConfig::default().jitter(0.5, 0.1)).is_err());
    assert!(Breaker::new(
        "t",
        BreakerConfig::default().ramp(Ramp::new([0.0], Duration::from_secs(1)))
    )
    .is_err());
}

/// Each half-open probe holds a slot allocated when the breaker is built:
/// a count past the bound is a named error, not an allocation that aborts
/// the process.
#[test]
fn a_huge_probe_count_is_refused_not_allocated() {
    let cfg = BreakerConfig::default().half_open_probes(u32::MAX);
    let err = cfg.validate().unwrap_err();
    assert!(err.to_string().contains("half-open probes"), "{err}");
    assert!(Breaker::new("t", cfg).is_err());
    assert!(Breaker::new("t", BreakerConfig::default().half_open_probes(10_000)).is_ok());
}

#[tokio::test(start_paused = true)]
async fn business_errors_do_not_open_with_the_transient_classifier() {
    let b = Breaker::new("redis", no_jitter().consecutive_failures(3)).unwrap();
    let svc = ServiceBuilder::new()
        .layer(b.layer().classifier(TransientErrors))
        .service(service_fn(|kind: &'static str| async move {
            match kind {
                "business" => Err::<(), BoxError>("WRONGTYPE Operation against a key".into()),
                _ => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()),
            }
        }));
    for _ in 0..10 {
        let _ = svc.clone().oneshot("business").await;
    }
    assert_eq!(b.state(), CircuitState::Closed);
    for _ in 0..3 {
        let _ = svc.clone().oneshot("outage").await;
    }
    assert_eq!(b.state(), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services() {
    let b = Breaker::new("t", no_jitter()).unwrap();
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<(), (), _>(b.layer());
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    b.force_open();
    let err = svc.call(()).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
}

#[tokio::test(start_paused = true)]
async fn registry_is_bounded_and_never_evicts_open_or_busy_breakers() {
    let reg = BreakerRegistry::new(no_jitter().consecutive_failures(1), 2).unwrap();
    let a = reg.get_or_insert("a").unwrap();
    fail(&a, 1);
    drop(a);
    let b = reg.get_or_insert("b").unwrap(); // held: busy
    let err = reg.get_or_insert("c").unwrap_err();
    assert_eq!(err.to_string(), "breaker registry full (limit 2)");
    drop(b);
    let _c = reg.get_or_insert("c").unwrap(); // evicts the idle closed "b"
    assert_eq!(reg.len(), 2);
    assert!(reg.get("b").is_none());
    assert_eq!(reg.get("a").unwrap().state(), CircuitState::Open);
    assert_eq!(
        reg.states(),
        vec![
            ("a".to_owned(), CircuitState::Open),
            ("c".to_owned(), CircuitState::Closed)
        ]
    );
}

#[test]
fn metrics_record_opens_rejections_and_state() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let b = Breaker::new("redis", no_jitter().consecutive_failures(1)).unwrap();
            fail(&b, 1);
            assert!(b.try_acquire().is_err());
            assert!(b.try_acquire().is_err());
        });
    });
    let snap = snapshotter.snapshot().into_vec();
    let find = |name: &str| {
        snap.iter()
            .find(|(k, _, _, _)| {
                k.key().name() == name
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "breaker" && l.value() == "redis")
            })
            .map(|(_, _, _, v)| v)
    };
    assert_eq!(
        find("singleflight_circuit_open_total"),
        Some(&DebugValue::Counter(1))
    );
    assert_eq!(
        find("singleflight_circuit_rejected_total"),
        Some(&DebugValue::Counter(2))
    );
    assert!(
        matches!(find("singleflight_circuit_state"), Some(DebugValue::Gauge(v)) if v.into_inner() == 1.0)
    );
}

/// Real threads racing for half-open probe slots: exactly the configured
/// number get one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_racing_in_half_open_get_exactly_the_probes() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .consecutive_failures(1)
            .half_open_probes(5)
            .wait_in_open(Duration::from_millis(1)),
    )
    .unwrap();
    fail(&b, 1);
    while b.state() != CircuitState::HalfOpen {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let b = b.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                // Hold the permits so no slot is freed during the race.
                (0..125)
                    .filter_map(|_| b.try_acquire().ok())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let permits: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(permits.len(), 5);
    assert!(permits.iter().all(|p| p.is_probe()));
}

/// While the breaker is open, `try_reject` rejects; the timer ends the
/// wait on time (its transition comes without any caller asking), and
/// probing starts as with the clock.
#[tokio::test(start_paused = true)]
async fn try_reject_rejects_while_a_timer_times_the_open_wait() {
    let b = opens_on_one_failure(Duration::from_secs(5));
    assert!(!b.try_reject(), "closed");
    let mut events = b.subscribe();
    fail(&b, 1);
    assert!(b.try_reject());
    assert!(b.try_acquire().is_err());
    let until = b.open_until().unwrap();
    tokio::time::sleep_until(until - Duration::from_millis(1)).await;
    assert!(b.try_reject(), "still open");
    // The timer fires at the deadline: the transition happens without any
    // caller asking.
    let _open = events.recv().await.unwrap();
    let t = events.recv().await.unwrap();
    assert_eq!(
        (t.from, t.to, t.reason),
        (
            CircuitState::Open,
            CircuitState::HalfOpen,
            TransitionReason::WaitElapsed
        )
    );
    assert!(t.at >= until);
    assert!(!b.try_reject(), "half-open: ask try_acquire");
    assert!(b.try_acquire().unwrap().is_probe());

    // Forced open rejects the same way; reset ends it.
    b.force_open();
    assert!(b.try_reject());
    b.reset();
    assert!(!b.try_reject());
}

/// Without a runtime (or once the runtime that timed the wait is gone), the
/// clock decides, for `try_reject` as for `try_acquire`: both reject until
/// the wait has passed.
#[test]
fn without_a_timer_the_clock_decides() {
    let cfg = || {
        no_jitter()
            .consecutive_failures(1)
            .wait_in_open(Duration::from_secs(3600))
    };
    let b = Breaker::new("t", cfg()).unwrap();
    fail(&b, 1);
    assert_eq!(b.state(), CircuitState::Open);
    assert!(b.try_reject(), "the clock says open, no timer needed");
    assert!(b.try_acquire().is_err(), "the clock says open");

    let b = Breaker::new("t", cfg()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async { fail(&b, 1) });
    assert!(b.try_reject(), "timed");
    drop(rt);
    assert!(
        b.try_reject(),
        "the timer went with its runtime; the clock says open"
    );
    assert!(b.try_acquire().is_err(), "still open by the clock");
    assert_eq!(b.state(), CircuitState::Open);
}

/// `trip` opens a closed breaker as a tripped window would (rejections,
/// then a half-open probe decides); it leaves an open or forced state alone.
#[tokio::test(start_paused = true)]
async fn trip_opens_now_and_probes_after_the_wait() {
    let b = Breaker::new(
        "t",
        no_jitter()
            .wait_in_open(Duration::from_secs(1))
            .half_open_probes(1)
            .success_threshold(1),
    )
    .unwrap();
    b.trip();
    assert_eq!(b.state(), CircuitState::Open);
    assert!(b.try_acquire().is_err(), "rejected while open");
    advance(Duration::from_millis(1001)).await;
    let probe = b.try_acquire().expect("half-open after the wait");
    assert!(probe.is_probe());
    probe.record(Outcome::Success);
    assert_eq!(b.state(), CircuitState::Closed);

    b.force_open();
    b.trip();
    assert_eq!(b.state(), CircuitState::ForcedOpen, "a forced state stays");
}

/// A breaker opened on a runtime that is still there but no longer driven
/// (its `block_on` returned), then asked on another runtime once the wait
/// is over: it does not reject (the first runtime's timer never runs, so
/// it cannot be what ends the wait).
#[test]
fn the_wait_ends_on_time_while_the_runtime_that_opened_it_idles() {
    let b = opens_on_one_failure(Duration::from_secs(5));
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let first = paused();
    let until = first.block_on(async {
        fail(&b, 1);
        assert!(b.try_reject(), "open");
        b.open_until().unwrap()
    });
    paused().block_on(async {
        assert!(b.try_reject(), "still open");
        tokio::time::sleep_until(until + Duration::from_millis(1)).await;
        assert!(!b.try_reject(), "the wait is over");
        assert!(b.try_acquire().unwrap().is_probe());
    });
    drop(first);
}
