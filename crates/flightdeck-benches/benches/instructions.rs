//! Per-call cost on a fresh key, in instructions: the same calls as the
//! `overhead` bench, without criterion, so that `valgrind --tool=callgrind`
//! can count them. Instruction counts do not depend on what else the
//! machine is doing, unlike nanoseconds on a shared 2-core box.
//!
//! ```text
//! cargo bench -p flightdeck-benches --bench instructions --no-run
//! scripts/instructions   # runs each variant under callgrind, prints the table
//! ```
//!
//! Run directly, `instructions <variant> <calls>` makes `calls` calls of one
//! variant and prints the wall time per call (informative only).

// A bench binary: no public API to document.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use flightdeck_benches::{PeerError, KEYS};
use tower::{service_fn, Layer, Service, ServiceExt};

const VARIANTS: &[&str] = &[
    "bare_service",
    "flightdeck_local_prebuilt_key",
    "tower_resilience_coalesce",
    "async_singleflight",
    "moka_get_with",
];

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let variant = args.next().unwrap_or_default();
    let calls: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    if !VARIANTS.contains(&variant.as_str()) {
        eprintln!("usage: instructions <variant> [calls]; variants: {VARIANTS:?}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let start = Instant::now();
    rt.block_on(run(&variant, calls));
    let per_call = start.elapsed().as_nanos() as f64 / calls as f64;
    println!("{variant}: {calls} calls, {per_call:.1} ns/call");
}

async fn run(variant: &str, calls: u64) {
    let bare = service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    match variant {
        "bare_service" => {
            for n in 0..calls {
                let mut svc = bare;
                std::hint::black_box(svc.ready().await.unwrap().call(n).await.unwrap());
            }
        }
        "flightdeck_local_prebuilt_key" => {
            let svc = flightdeck_benches::local_prebuilt();
            let keys = flightdeck_benches::prebuilt_keys();
            for n in 0..calls {
                let mut svc = svc.clone();
                let k = keys[n as usize % KEYS].clone();
                std::hint::black_box(svc.ready().await.unwrap().call((k, n)).await.unwrap());
            }
        }
        "tower_resilience_coalesce" => {
            let svc = tower_resilience_coalesce::CoalesceLayer::new(|n: &u64| *n)
                .layer(service_fn(|n: u64| async move { Ok::<_, PeerError>(n) }));
            for n in 0..calls {
                let mut svc = svc.clone();
                std::hint::black_box(svc.ready().await.unwrap().call(n).await.unwrap());
            }
        }
        "async_singleflight" => {
            let sf: Arc<async_singleflight::Group<u64, u64, PeerError>> =
                Arc::new(async_singleflight::Group::new());
            for n in 0..calls {
                std::hint::black_box(sf.work(&n, async move { Ok(n) }).await.unwrap());
            }
        }
        "moka_get_with" => {
            let cache: moka::future::Cache<u64, u64> = moka::future::Cache::new(100_000);
            for n in 0..calls {
                std::hint::black_box(cache.get_with(n, async move { n }).await);
            }
        }
        _ => unreachable!("checked in main"),
    }
}
