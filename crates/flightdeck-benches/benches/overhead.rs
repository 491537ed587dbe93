//! Per-call overhead on a fresh key (no contention): the bare service,
//! `LocalFlight`, and the peers tower-resilience-coalesce, async_singleflight
//! and moka's `get_with`, in one criterion group.
//!
//! `cargo bench -p flightdeck-benches --bench overhead`

// criterion_group! generates an undocumented public fn.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use flightdeck_benches::{PeerError, KEYS};
use flightdeck_core::{KeyEncoder, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fresh_key_call");
    let next = Arc::new(AtomicU64::new(0));
    let fresh = move || next.fetch_add(1, Ordering::Relaxed);

    let bare = service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    // What the required `singleflight_execution_duration` histogram costs
    // at the least: a flight's start and end read the (tokio) clock.
    group.bench_function("two_clock_reads", |b| {
        b.to_async(&rt)
            .iter(|| async { std::hint::black_box(tokio::time::Instant::now().elapsed()) })
    });
    group.bench_function("bare_service", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let mut svc = bare;
            let n = f();
            async move { svc.ready().await.unwrap().call(n).await.unwrap() }
        })
    });

    // Ours, with the key computed per call (BLAKE3 of the request): what a
    // user pays.
    let stage = StageName::new("bench").unwrap();
    let ours = LocalFlightLayer::with_key(FlightPolicy::new(), move |n: &u64| {
        Some(
            KeyEncoder::new()
                .field(&n.to_le_bytes())
                .finish_key(stage.clone(), None),
        )
    })
    .layer(bare);
    group.bench_function("flightdeck_local", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let mut svc = ours.clone();
            let n = f();
            async move { svc.ready().await.unwrap().call(n).await.unwrap() }
        })
    });

    // Ours with a prebuilt key (as when KeyLayer computed it upstream): the
    // coalescing machinery alone.
    let prebuilt = flightdeck_benches::local_prebuilt();
    let keys = flightdeck_benches::prebuilt_keys();
    group.bench_function("flightdeck_local_prebuilt_key", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let mut svc = prebuilt.clone();
            // Keys repeat only every 4096 calls, long after each finished.
            let n = f();
            let k = keys[n as usize % KEYS].clone();
            async move { svc.ready().await.unwrap().call((k, n)).await.unwrap() }
        })
    });

    let coalesce = tower_resilience_coalesce::CoalesceLayer::new(|n: &u64| *n)
        .layer(service_fn(|n: u64| async move { Ok::<_, PeerError>(n) }));
    group.bench_function("tower_resilience_coalesce", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let mut svc = coalesce.clone();
            let n = f();
            async move { svc.ready().await.unwrap().call(n).await.unwrap() }
        })
    });

    let sf: Arc<async_singleflight::Group<u64, u64, PeerError>> =
        Arc::new(async_singleflight::Group::new());
    group.bench_function("async_singleflight", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let sf = sf.clone();
            let n = f();
            async move { sf.work(&n, async move { Ok(n) }).await.unwrap() }
        })
    });

    let cache: moka::future::Cache<u64, u64> = moka::future::Cache::new(100_000);
    group.bench_function("moka_get_with", |b| {
        let f = fresh.clone();
        b.to_async(&rt).iter(|| {
            let cache = cache.clone();
            let n = f();
            async move { cache.get_with(n, async move { n }).await }
        })
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
