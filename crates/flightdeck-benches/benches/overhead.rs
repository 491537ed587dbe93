//! Per-call overhead on a fresh key (no contention): the bare service,
//! `LocalFlight`, and the peers tower-resilience-coalesce, async_singleflight
//! and moka's `get_with`, in one criterion group; then the ratios, from
//! criterion's estimates and from paired, interleaved batches (see
//! `flightdeck_benches::harness`).
//!
//! Each of those rows comes twice: with work that is ready at its first
//! poll, and with work that yields once (`tokio::task::yield_now`) before
//! it completes, the usual case of real work (a socket read, a lock): then
//! the layer's leader goes through its pending path (clocks, timers, a
//! wake-up) and every peer through its own.
//!
//! Our rows run without a metrics recorder (as the peers, which have no
//! metrics), and once more with a Prometheus recorder behind the layer's
//! handles (as the examples install it): then every flight also reads the
//! clock twice for `singleflight_execution_duration` and updates four
//! metrics.
//!
//! Two reference rows say what part of the cost no design can avoid on this
//! machine: `two clock reads` (what the execution-time histogram costs at
//! the least), and the [`Floor`](flightdeck_benches::Floor): a sharded
//! mutex map insert and remove around a boxed, detachable work, with
//! nothing else, without and with those two clock reads.
//!
//! ```text
//! cargo bench -p flightdeck-benches --bench overhead
//! scripts/instructions      # the same rows, in instructions (callgrind)
//! ```

// A bench: no public API to document.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::sync::Arc;

use flightdeck_benches::harness::{self, Report, Row};
use flightdeck_benches::{Floor, PeerError, KEYS};
use flightdeck_core::{BoxError, FlightKey, KeyEncoder, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use std::future::Future;

use tower::{service_fn, Layer, Service};

const BARE: &str = "bare service";
const CLOCKS: &str = "two clock reads";
const FLOOR: &str = "floor: sharded map + boxed work";
const FLOOR_CLOCKS: &str = "floor + two clock reads";
const OURS_HASHED: &str = "flightdeck_local, key hashed per call";
const OURS: &str = "flightdeck_local, prebuilt key";
const OURS_RECORDED: &str = "flightdeck_local, prebuilt key, Prometheus recorder";
const COALESCE: &str = "tower_resilience_coalesce";
const SINGLEFLIGHT: &str = "async_singleflight";
const MOKA: &str = "moka get_with";
const BARE_PENDING: &str = "bare service, pending work";
const OURS_PENDING: &str = "flightdeck_local, prebuilt key, pending work";
const OURS_PENDING_NO_TIMEOUT: &str =
    "flightdeck_local, prebuilt key, pending work, no wait timeout";
const COALESCE_PENDING: &str = "tower_resilience_coalesce, pending work";
const COALESCE_PENDING_TIMER: &str =
    "tower_resilience_coalesce, pending work, an idle timer in the runtime";
const SINGLEFLIGHT_PENDING: &str = "async_singleflight, pending work";
const MOKA_PENDING: &str = "moka get_with, pending work";

/// Work that is pending at its first poll: it yields once to the runtime,
/// then returns `n`.
async fn pending(n: u64) -> u64 {
    tokio::task::yield_now().await;
    n
}

/// Our layer over a service whose work yields once, with this policy.
fn ours_pending(
    policy: FlightPolicy,
) -> impl Service<(FlightKey, u64), Response = u64, Error = BoxError> + Clone + 'static {
    LocalFlightLayer::with_key(policy, |r: &(FlightKey, u64)| Some(r.0.clone())).layer(service_fn(
        |r: (FlightKey, u64)| async move { Ok::<_, Infallible>(pending(r.1).await) },
    ))
}

fn rows() -> Vec<Row> {
    let bare = service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });

    // Ours, with the key computed per call (BLAKE3 of the request): what a
    // user pays.
    let stage = StageName::new("bench").expect("a valid stage name");
    let hashed = LocalFlightLayer::with_key(FlightPolicy::new(), move |n: &u64| {
        Some(
            KeyEncoder::new()
                .field(&n.to_le_bytes())
                .finish_key(stage.clone(), None),
        )
    })
    .layer(bare);
    // Ours with a prebuilt key (as when KeyLayer computed it upstream): the
    // coalescing machinery alone. Keys repeat every 4096 calls, long after
    // each flight finished.
    let keys = Arc::new(flightdeck_benches::prebuilt_keys());
    let prebuilt = move |n: u64| (keys[n as usize % KEYS].clone(), n);
    // The same, in a layer whose first call registered its handles with a
    // Prometheus recorder (histogram buckets as in the examples). The
    // handles are registered in `call`, which is synchronous; that first
    // flight is dropped at once (and so cancelled). Done when the row first
    // runs, so that no other row shares the machine with the recorder's
    // upkeep thread.
    let recorded = flightdeck_benches::local_prebuilt();
    let registered = std::sync::Once::new();
    let recorded_row = {
        let (recorded, prebuilt) = (recorded.clone(), prebuilt.clone());
        let row = Row::service_cloned(OURS_RECORDED, recorded.clone(), prebuilt.clone());
        Row::new(OURS_RECORDED, move |iters| {
            registered.call_once(|| {
                let recorder = prometheus();
                drop(metrics::with_local_recorder(&recorder, || {
                    recorded.clone().call(prebuilt(0))
                }));
            });
            let run = row.run(iters);
            async move {
                run.await;
            }
        })
    };

    let floor = Arc::new(Floor::default());
    let floor_row = |name, clocks| {
        let floor = Arc::clone(&floor);
        Row::new(name, move |iters| {
            let floor = Arc::clone(&floor);
            async move {
                for n in 0..iters {
                    std::hint::black_box(floor.call(n, async move { n }, clocks).await);
                }
            }
        })
    };

    let sf: Arc<async_singleflight::Group<u64, u64, PeerError>> =
        Arc::new(async_singleflight::Group::new());
    let sf_pending = Arc::clone(&sf);
    let cache: moka::future::Cache<u64, u64> = moka::future::Cache::new(100_000);
    let cache_pending = cache.clone();

    vec![
        Row::service_cloned(BARE, bare, |n| n),
        Row::new(CLOCKS, |iters| async move {
            for _ in 0..iters {
                std::hint::black_box(tokio::time::Instant::now().elapsed());
            }
        }),
        floor_row(FLOOR, false),
        floor_row(FLOOR_CLOCKS, true),
        Row::service_cloned(OURS_HASHED, hashed, |n| n),
        Row::service_cloned(OURS, flightdeck_benches::local_prebuilt(), prebuilt.clone()),
        recorded_row,
        Row::service_cloned(
            COALESCE,
            tower_resilience_coalesce::CoalesceLayer::new(|n: &u64| *n)
                .layer(service_fn(|n: u64| async move { Ok::<_, PeerError>(n) })),
            |n| n,
        ),
        Row::new(SINGLEFLIGHT, move |iters| {
            let sf = Arc::clone(&sf);
            async move {
                for n in 0..iters {
                    std::hint::black_box(sf.work(&n, async move { Ok(n) }).await.unwrap());
                }
            }
        }),
        Row::new(MOKA, move |iters| {
            let cache = cache.clone();
            async move {
                // Fresh keys: a moka entry is a cached result, not a flight.
                let base = rand_base();
                for n in base..base + iters {
                    std::hint::black_box(cache.get_with(n, async move { n }).await);
                }
            }
        }),
        // The same layers and peers, over work that yields once.
        Row::service_cloned(
            BARE_PENDING,
            service_fn(|n: u64| async move { Ok::<_, Infallible>(pending(n).await) }),
            |n| n,
        ),
        Row::service_cloned(
            OURS_PENDING,
            ours_pending(FlightPolicy::new()),
            prebuilt.clone(),
        ),
        Row::service_cloned(
            OURS_PENDING_NO_TIMEOUT,
            ours_pending(FlightPolicy::new().wait_timeout(None)),
            prebuilt.clone(),
        ),
        Row::service_cloned(
            COALESCE_PENDING,
            tower_resilience_coalesce::CoalesceLayer::new(|n: &u64| *n).layer(service_fn(
                |n: u64| async move { Ok::<_, PeerError>(pending(n).await) },
            )),
            |n| n,
        ),
        // The same, in a runtime that has a timer registered (as a server
        // has: keep-alive and read timeouts): then each park of the runtime
        // consults its timer wheel, which our layer's timer task (sleeping
        // until the earliest wait timeout) also makes it do.
        {
            let svc = tower_resilience_coalesce::CoalesceLayer::new(|n: &u64| *n).layer(
                service_fn(|n: u64| async move { Ok::<_, PeerError>(pending(n).await) }),
            );
            let row = Row::service_cloned(COALESCE_PENDING_TIMER, svc, |n| n);
            Row::new(COALESCE_PENDING_TIMER, move |iters| {
                let run = row.run(iters);
                async move {
                    let idle = tokio::time::sleep(std::time::Duration::from_secs(3600));
                    tokio::pin!(idle);
                    // Registered by its first poll.
                    std::future::poll_fn(|cx| {
                        let _ = idle.as_mut().poll(cx);
                        std::task::Poll::Ready(())
                    })
                    .await;
                    run.await;
                }
            })
        },
        Row::new(SINGLEFLIGHT_PENDING, move |iters| {
            let sf = Arc::clone(&sf_pending);
            async move {
                for n in 0..iters {
                    let out = sf.work(&n, async move { Ok(pending(n).await) }).await;
                    std::hint::black_box(out.unwrap());
                }
            }
        }),
        Row::new(MOKA_PENDING, move |iters| {
            let cache = cache_pending.clone();
            async move {
                let base = rand_base();
                for n in base..base + iters {
                    std::hint::black_box(cache.get_with(n, pending(n)).await);
                }
            }
        }),
    ]
}

/// A Prometheus recorder as the examples build it (histogram buckets for
/// the `_duration` metrics), its buffers drained by a thread of its own as
/// the exporter's HTTP listener would.
fn prometheus() -> metrics_exporter_prometheus::PrometheusRecorder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const BUCKETS: [f64; 14] = [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
    ];
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_duration".to_owned()), &BUCKETS)
        .expect("valid buckets")
        .build_recorder();
    let handle = recorder.handle();
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        handle.run_upkeep();
    });
    recorder
}

/// A start for moka's keys that no earlier batch used.
fn rand_base() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1 << 40, Ordering::Relaxed)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _guard = rt.enter();
    harness::run(
        "fresh_key_call",
        &rt,
        rows(),
        Report {
            baseline: Some(BARE),
            ratios: &[
                (OURS, COALESCE),
                (OURS_RECORDED, COALESCE),
                (OURS_RECORDED, OURS),
                (OURS, SINGLEFLIGHT),
                (OURS, MOKA),
                (OURS_HASHED, COALESCE),
                (FLOOR, COALESCE),
                (FLOOR_CLOCKS, COALESCE),
                (OURS, FLOOR_CLOCKS),
                (OURS_PENDING, COALESCE_PENDING),
                (OURS_PENDING_NO_TIMEOUT, COALESCE_PENDING),
                (OURS_PENDING, COALESCE_PENDING_TIMER),
                (OURS_PENDING, SINGLEFLIGHT_PENDING),
                (OURS_PENDING, MOKA_PENDING),
            ],
        },
    );
}
