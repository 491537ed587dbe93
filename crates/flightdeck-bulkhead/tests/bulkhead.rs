//! Limits, queue, degraded switch and rate limit, on tokio's paused clock.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_bulkhead::{BulkheadConfig, BulkheadLayer, QueueTimeout, RateLimited};
use flightdeck_core::error::BulkheadFull;
use flightdeck_core::{ErrorClass, StageName};
use tokio::sync::{Barrier, Notify};
use tokio::time::advance;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// An inner service that counts running calls and keeps an atomic
/// high-water mark, and waits for `release` (or `ms` of time).
#[derive(Clone, Default)]
struct Probe {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Probe {
    /// This probe's service behind `layer`.
    fn behind(
        &self,
        layer: &BulkheadLayer,
    ) -> impl Service<u64, Response = (), Error = flightdeck_core::BoxError, Future = impl Send>
           + Clone
           + Send
           + 'static {
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(self.service())
    }

    fn service(
        &self,
    ) -> impl Service<u64, Response = (), Error = std::convert::Infallible, Future = impl Send>
           + Clone
           + Send
           + 'static {
        let p = self.clone();
        service_fn(move |ms: u64| {
            let p = p.clone();
            async move {
                let now = p.running.fetch_add(1, Ordering::SeqCst) + 1;
                p.peak.fetch_max(now, Ordering::SeqCst);
                if ms == 0 {
                    p.release.notified().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                p.running.fetch_sub(1, Ordering::SeqCst);
                p.done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_concurrent_callers_never_exceed_the_limit() {
    let layer = BulkheadLayer::new(8);
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let barrier = Arc::new(Barrier::new(1000));
    let tasks: Vec<_> = (0..1000u64)
        .map(|i| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot(1 + i % 7).await
            })
        })
        .collect();
    let mut ok = 0;
    let mut full = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(e.is::<BulkheadFull>());
                assert_eq!(ErrorClass::of(&*e).http_status(), 429);
                full += 1;
            }
        }
    }
    assert_eq!(ok + full, 1000);
    assert_eq!(probe.peak.load(Ordering::SeqCst), 8, "high-water mark");
    assert!(ok >= 8);
    assert_eq!(layer.handle().active(), 0, "every slot released");
}

#[tokio::test(start_paused = true)]
async fn a_thousand_callers_through_a_queue_never_exceed_the_limit() {
    let layer =
        BulkheadLayer::from_config(BulkheadConfig::new(4).queue(1000, Duration::from_secs(60)));
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let tasks: Vec<_> = (0..1000u64)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(10).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(probe.done.load(Ordering::SeqCst), 1000);
    assert_eq!(probe.peak.load(Ordering::SeqCst), 4);
    assert_eq!((layer.handle().active(), layer.handle().queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn rejects_in_call_without_waiting_on_poll_ready() {
    let layer = BulkheadLayer::new(1);
    let probe = Probe::default();
    let mut svc = ServiceBuilder::new().layer(layer).service(probe.service());
    // poll_ready stays Ready when full: the decision is made in call.
    let first = svc.ready().await.unwrap().call(0);
    let first = tokio::spawn(first);
    tokio::task::yield_now().await;
    let err = svc.ready().await.unwrap().call(0).await.unwrap_err();
    assert!(err.is::<BulkheadFull>());
    probe.release.notify_waiters();
    first.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn queue_waits_in_order_then_times_out() {
    let layer = BulkheadLayer::from_config(
        BulkheadConfig::new(1)
            .queue(1, Duration::from_millis(100))
            .stage(StageName::new("score").unwrap()),
    );
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let running = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    let queued = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    assert_eq!(layer.handle().queued(), 1);
    // The queue (1) is full too: immediate rejection.
    let err = svc.clone().oneshot(0).await.unwrap_err();
    assert_eq!(err.to_string(), "bulkhead full (stage score)");
    advance(Duration::from_millis(100)).await;
    let err = queued.await.unwrap().unwrap_err();
    let timeout = err.downcast_ref::<QueueTimeout>().expect("queue timeout");
    assert_eq!(timeout.waited(), Duration::from_millis(100));
    assert_eq!(ErrorClass::of(&*err).http_status(), 429);
    assert_eq!(layer.handle().queued(), 0);
    // A queued call gets the slot when the running one finishes.
    let queued = tokio::spawn(svc.clone().oneshot(5));
    tokio::task::yield_now().await;
    probe.release.notify_waiters();
    running.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    assert_eq!(probe.peak.load(Ordering::SeqCst), 1);
    assert_eq!(layer.handle().active(), 0);
}

/// A queue timeout too long to add to the clock (`Duration::MAX`: "wait
/// for ever") queues the call instead of panicking.
#[tokio::test(start_paused = true)]
async fn a_queue_timeout_of_duration_max_queues_without_panicking() {
    let layer = BulkheadLayer::from_config(BulkheadConfig::new(1).queue(1, Duration::MAX));
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let running = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    let queued = tokio::spawn(svc.clone().oneshot(5));
    tokio::task::yield_now().await;
    assert_eq!(layer.handle().queued(), 1);
    advance(Duration::from_secs(3600)).await;
    assert_eq!(layer.handle().queued(), 1, "still waiting for its slot");
    probe.release.notify_waiters();
    running.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    assert_eq!(layer.handle().active(), 0);
}

#[tokio::test(start_paused = true)]
async fn degraded_limit_applies_to_new_calls_and_spares_running_ones() {
    let layer = BulkheadLayer::from_config(BulkheadConfig::new(4).degraded_limit(1));
    let handle = layer.handle();
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let running: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot(0)))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(probe.running.load(Ordering::SeqCst), 3);

    handle.set_degraded(true);
    assert!(handle.is_degraded());
    assert_eq!(handle.limit(), 1);
    let err = svc.clone().oneshot(0).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "new calls see the degraded limit");
    assert_eq!(
        probe.running.load(Ordering::SeqCst),
        3,
        "running calls untouched"
    );

    probe.release.notify_waiters();
    for r in running {
        r.await.unwrap().unwrap();
    }
    // Under the degraded limit once the running calls are done.
    let one = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    assert!(svc.clone().oneshot(0).await.is_err());
    handle.set_degraded(false);
    let two = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    assert_eq!(probe.running.load(Ordering::SeqCst), 2);
    probe.release.notify_waiters();
    one.await.unwrap().unwrap();
    two.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_degraded_lane_holds_its_calls_to_the_degraded_limit_and_the_others_keep_the_normal_one(
) {
    let main = BulkheadLayer::from_config(
        BulkheadConfig::new(4)
            .degraded_limit(1)
            .degraded_rate_limit(NonZeroU32::new(1).unwrap(), NonZeroU32::new(5).unwrap()),
    );
    let lane = main.handle().degraded_lane();
    let probe = Probe::default();
    let healthy = ServiceBuilder::new()
        .layer(main.clone())
        .service(probe.service());
    let degraded = ServiceBuilder::new()
        .layer(lane.clone())
        .layer(main.clone())
        .service(probe.service());

    // One call of the lane runs; the next one is refused by the lane.
    let first = tokio::spawn(degraded.clone().oneshot(0));
    tokio::task::yield_now().await;
    let err = degraded.clone().oneshot(0).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "{err}");
    // The healthy calls still get the normal limit: 3 more slots.
    let others: Vec<_> = (0..3)
        .map(|_| tokio::spawn(healthy.clone().oneshot(0)))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(probe.running.load(Ordering::SeqCst), 4);
    assert_eq!(
        main.handle().active(),
        4,
        "a lane call holds a main slot too"
    );
    assert!(!main.handle().is_degraded());
    assert!(healthy.clone().oneshot(0).await.is_err(), "main is full");
    probe.release.notify_waiters();
    first.await.unwrap().unwrap();
    for r in others {
        r.await.unwrap().unwrap();
    }

    // A lane call cannot take a slot that the healthy calls fill.
    let fill: Vec<_> = (0..4)
        .map(|_| tokio::spawn(healthy.clone().oneshot(0)))
        .collect();
    tokio::task::yield_now().await;
    assert!(degraded.clone().oneshot(0).await.is_err());
    assert_eq!(lane.handle().active(), 0, "its lane slot was given back");
    probe.release.notify_waiters();
    for r in fill {
        r.await.unwrap().unwrap();
    }

    // The degraded rate limit applies to the lane only: its burst (5) is
    // spent by the lane calls above and these, while the healthy calls
    // are not rate limited at all.
    for _ in 0..2 {
        degraded.clone().oneshot(1).await.unwrap();
    }
    let err = degraded.clone().oneshot(1).await.unwrap_err();
    assert!(err.is::<RateLimited>(), "{err}");
    for _ in 0..10 {
        healthy.clone().oneshot(1).await.unwrap();
    }

    // Limits changed through the main handle change the lane's too.
    main.handle().set_limits(8, 2);
    assert_eq!(lane.handle().limit(), 2);
    assert_eq!(main.handle().limit(), 8);
}

#[tokio::test(start_paused = true)]
async fn raising_the_limit_hands_slots_to_queued_calls() {
    let layer = BulkheadLayer::from_config(
        BulkheadConfig::new(2)
            .degraded_limit(1)
            .queue(10, Duration::from_secs(10)),
    );
    let handle = layer.handle();
    handle.set_degraded(true);
    let probe = Probe::default();
    let svc = ServiceBuilder::new().layer(layer).service(probe.service());
    let a = tokio::spawn(svc.clone().oneshot(0));
    let b = tokio::spawn(svc.clone().oneshot(0));
    tokio::task::yield_now().await;
    assert_eq!((handle.active(), handle.queued()), (1, 1));
    handle.set_degraded(false);
    tokio::task::yield_now().await;
    assert_eq!(
        probe.running.load(Ordering::SeqCst),
        2,
        "queued call got the new slot"
    );
    probe.release.notify_waiters();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn rate_limit_through_governor_on_tokio_time() {
    let layer = BulkheadLayer::from_config(
        BulkheadConfig::new(100)
            .rate_limit(NonZeroU32::new(10).unwrap(), NonZeroU32::new(2).unwrap()),
    );
    let probe = Probe::default();
    let svc = ServiceBuilder::new().layer(layer).service(probe.service());
    svc.clone().oneshot(1).await.unwrap();
    svc.clone().oneshot(1).await.unwrap();
    let err = svc.clone().oneshot(1).await.unwrap_err();
    assert!(err.is::<RateLimited>());
    assert_eq!(err.to_string(), "rate limited");
    assert_eq!(ErrorClass::of(&*err).grpc_code(), 8);
    // 10/s: one permit back every 100 ms of (paused) tokio time.
    advance(Duration::from_millis(100)).await;
    svc.clone().oneshot(1).await.unwrap();
    assert!(svc.clone().oneshot(1).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn dropping_a_call_releases_its_slot() {
    let layer = BulkheadLayer::new(1);
    let probe = Probe::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(probe.service());
    let fut = svc.ready().await.unwrap().call(0);
    assert_eq!(layer.handle().active(), 1);
    drop(fut);
    assert_eq!(layer.handle().active(), 0);
}

#[test]
fn rejections_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let layer = BulkheadLayer::from_config(
                BulkheadConfig::new(0).stage(StageName::new("s").unwrap()),
            );
            let svc = ServiceBuilder::new()
                .layer(layer)
                .service(Probe::default().service());
            assert!(svc.oneshot(1).await.is_err());
        });
    });
    let snap = snapshotter.snapshot().into_vec();
    let hit = snap.iter().any(|(k, _, _, v)| {
        k.key().name() == "singleflight_bulkhead_rejected_total"
            && k.key()
                .labels()
                .any(|l| l.key() == "stage" && l.value() == "s")
            && *v == DebugValue::Counter(1)
    });
    assert!(hit, "{snap:?}");
}

/// Real threads racing admission, queue hand-off and limit switches: the
/// high-water mark stays under the normal limit, no slot is lost, and every
/// queued call completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_racing_the_queue_and_the_degraded_switch_lose_no_slot() {
    let layer = BulkheadLayer::from_config(
        BulkheadConfig::new(4)
            .degraded_limit(2)
            .queue(10_000, Duration::from_secs(600)),
    );
    let handle = layer.handle();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new().layer(layer).service(service_fn({
        let running = running.clone();
        let peak = peak.clone();
        move |_: u32| {
            let running = running.clone();
            let peak = peak.clone();
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(())
            }
        }
    }));
    let toggler = tokio::spawn({
        let handle = handle.clone();
        async move {
            for i in 0..200 {
                handle.set_degraded(i % 2 == 0);
                tokio::task::yield_now().await;
            }
            handle.set_degraded(false);
        }
    });
    let tasks: Vec<_> = (0..2_000)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(i).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("queued calls all get a slot");
    }
    toggler.await.unwrap();
    assert!(peak.load(Ordering::SeqCst) <= 4);
    assert_eq!((handle.active(), handle.queued()), (0, 0));
}

/// A bulkhead (with or without a queue) over a service whose calls never
/// end: a call holds its slot until its future is dropped.
fn held_calls(
    cfg: BulkheadConfig,
) -> (
    flightdeck_bulkhead::BulkheadHandle,
    impl Service<
            u32,
            Response = (),
            Error = flightdeck_core::BoxError,
            Future = impl std::future::Future<Output = Result<(), flightdeck_core::BoxError>>
                         + Send
                         + Unpin,
        > + Clone,
) {
    let layer = BulkheadLayer::from_config(cfg);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: u32| {
            std::future::pending::<Result<(), std::convert::Infallible>>()
        }));
    (layer.handle(), svc)
}

/// Lowering the limit under running calls spares them and leaves a debt:
/// their releases pay it before any new call gets in, with a queue
/// configured (new calls then wait) or not (they are rejected).
#[tokio::test(start_paused = true)]
async fn releases_pay_a_lowered_limit_before_new_calls_get_in() {
    for queue in [false, true] {
        let mut cfg = BulkheadConfig::new(4).degraded_limit(1);
        if queue {
            cfg = cfg.queue(8, Duration::from_secs(60));
        }
        let (handle, mut svc) = held_calls(cfg);
        let mut running: Vec<_> = (0..3).map(|i| svc.call(i)).collect();
        assert_eq!(handle.active(), 3);
        handle.set_degraded(true);
        assert_eq!((handle.limit(), handle.active()), (1, 3), "queue {queue}");

        let mut late = svc.call(9);
        if queue {
            assert!(
                tokio::time::timeout(Duration::from_millis(1), &mut late)
                    .await
                    .is_err(),
                "it waits"
            );
            assert_eq!(handle.queued(), 1);
        } else {
            let err = late.await.unwrap_err();
            assert!(err.is::<BulkheadFull>(), "{err}");
        }
        // Two releases pay the debt of two; the last running call holds
        // the limit's one slot.
        for left in [2, 1] {
            drop(running.pop());
            assert_eq!(handle.active(), left, "queue {queue}");
            if !queue {
                let err = svc.call(9).await.unwrap_err();
                assert!(err.is::<BulkheadFull>(), "still in debt: {err}");
            }
        }
        assert_eq!(handle.queued(), u32::from(queue) as usize);
        // The third release frees the slot: for the waiting call, or for
        // the next one.
        drop(running.pop());
        let _next = if queue {
            assert_eq!(handle.active(), 1, "handed to the queued call");
            None
        } else {
            assert_eq!(handle.active(), 0);
            let next = svc.call(9);
            assert_eq!(handle.active(), 1);
            Some(next)
        };
        let err = svc.call(10).await.unwrap_err();
        assert!(err.is::<BulkheadFull>() || queue, "{err}");
    }
}

/// Raising the limit while running calls still owe a lowering pays the
/// debt first: only the slots above the running calls are free.
#[tokio::test(start_paused = true)]
async fn a_raise_during_a_debt_frees_only_the_slots_above_the_running_calls() {
    let (handle, mut svc) = held_calls(BulkheadConfig::new(4).degraded_limit(1));
    let mut running: Vec<_> = (0..3).map(|i| svc.call(i)).collect();
    handle.set_degraded(true);
    handle.set_degraded(false);
    assert_eq!((handle.limit(), handle.active()), (4, 3));
    running.push(svc.call(3));
    assert_eq!(handle.active(), 4, "one slot was free");
    assert!(svc.call(4).await.unwrap_err().is::<BulkheadFull>());

    // A lowering to zero with four running: each release pays, none frees.
    handle.set_limits(4, 0);
    handle.set_degraded(true);
    while running.len() > 1 {
        drop(running.pop());
        assert!(svc.call(5).await.unwrap_err().is::<BulkheadFull>());
    }
    drop(running.pop());
    assert_eq!(handle.active(), 0);
    assert!(
        svc.call(5).await.unwrap_err().is::<BulkheadFull>(),
        "limit 0"
    );
    handle.set_limits(2, 0);
    handle.set_degraded(false);
    let _two = [svc.call(6), svc.call(7)];
    assert_eq!(handle.active(), 2);
    assert!(svc.call(8).await.unwrap_err().is::<BulkheadFull>());
}

/// A slot freed while calls wait goes to the first of them, even when a
/// new call arrives before that one is polled again: no call overtakes
/// the queue.
#[tokio::test(start_paused = true)]
async fn a_new_call_does_not_overtake_the_queue() {
    let layer =
        BulkheadLayer::from_config(BulkheadConfig::new(1).queue(8, Duration::from_secs(60)));
    let started = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn({
            let started = started.clone();
            move |id: u32| {
                started.lock().unwrap().push(id);
                std::future::pending::<Result<(), std::convert::Infallible>>()
            }
        }));
    let first = svc.call(1);
    let second = tokio::spawn(svc.clone().oneshot(2));
    tokio::task::yield_now().await;
    assert_eq!((layer.handle().active(), layer.handle().queued()), (1, 1));

    drop(first);
    // Called before the queued call is polled again.
    let third = tokio::spawn(svc.call(3));
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*started.lock().unwrap(), [1, 2]);
    assert_eq!((layer.handle().active(), layer.handle().queued()), (1, 1));
    second.abort();
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*started.lock().unwrap(), [1, 2, 3]);
    third.abort();
}

/// A lent slot counts as a running call against the service's callers,
/// and the fast path lends none where the service would queue, limit the
/// rate or wait: a queued call keeps its turn, a rate limit its budget.
#[tokio::test(start_paused = true)]
async fn a_lent_slot_holds_its_place_and_gives_way_to_the_queue_and_the_rates() {
    let layer = BulkheadLayer::from_config(
        BulkheadConfig::new(1)
            .queue(1, Duration::from_secs(1))
            .degraded_limit(1)
            .degraded_rate_limit(NonZeroU32::new(10).unwrap(), NonZeroU32::new(1).unwrap()),
    );
    let probe = Probe::default();
    let svc = probe.behind(&layer);
    let slot = layer.try_slot().expect("the one slot is free");
    assert_eq!(layer.handle().active(), 1);
    // Asked again while full (and again): the slot lent stays lent.
    assert!(layer.try_slot().is_none(), "full: no second slot");
    assert!(layer.try_slot().is_none(), "full: no second slot");
    assert_eq!(layer.handle().active(), 1);
    // A call through the service queues behind the lent slot, and the
    // fast path does not overtake it once the slot is back.
    let queued = tokio::spawn(svc.clone().oneshot(5));
    tokio::task::yield_now().await;
    assert_eq!(layer.handle().queued(), 1);
    drop(slot);
    assert!(
        layer.try_slot().is_none(),
        "the freed slot is the queued call's"
    );
    queued.await.unwrap().unwrap();
    assert_eq!((layer.handle().active(), layer.handle().queued()), (0, 0));
    // A rate limit that applies (the degraded one, while degraded): the
    // fast path lends nothing; the service's own admission decides.
    layer.handle().set_degraded(true);
    assert!(layer.try_slot().is_none(), "a rate limit applies");
    svc.clone().oneshot(1).await.unwrap();
    let err = svc.clone().oneshot(1).await.unwrap_err();
    assert!(err.is::<RateLimited>());
    layer.handle().set_degraded(false);
    let slot = layer.try_slot().expect("no rate limit applies again");
    drop(slot);
    assert_eq!(layer.handle().active(), 0);
}
