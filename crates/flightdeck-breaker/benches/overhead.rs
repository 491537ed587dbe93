//! Per-call overhead of a breaker in the closed state and a bulkhead below
//! its limit, against tower-resilience's breaker and bulkhead and tower's
//! `ConcurrencyLimit`, all in one criterion group around the same trivial
//! inner service (so the layer is all that differs).
//!
//! Run: `cargo bench -p flightdeck-breaker --bench overhead`

#![allow(missing_docs)] // criterion_group! generates an undocumented fn.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tower::{Layer, Service, ServiceExt};

/// The cheapest possible inner service: answers at once.
#[derive(Clone, Copy)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

/// Times `iters` sequential ready+call round trips on one service.
async fn drive<S>(mut svc: S, iters: u64) -> Duration
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        let out = svc.ready().await.unwrap().call(i).await.unwrap();
        std::hint::black_box(out);
    }
    start.elapsed()
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // Built inside the runtime: some layers read tokio's clock on creation.
    let _guard = rt.enter();
    let mut g = c.benchmark_group("overhead");

    g.bench_function("baseline (no layer)", |b| {
        b.to_async(&rt).iter_custom(|iters| drive(Echo, iters))
    });

    let ours =
        flightdeck_breaker::Breaker::new("bench", flightdeck_breaker::BreakerConfig::default())
            .unwrap();
    g.bench_function("breaker closed / flightdeck", |b| {
        let svc = ours.layer().layer(Echo);
        b.to_async(&rt)
            .iter_custom(move |iters| drive(svc.clone(), iters))
    });

    let theirs = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .name("bench")
        .build()
        .unwrap();
    g.bench_function("breaker closed / tower-resilience", |b| {
        let svc = theirs.layer(Echo);
        b.to_async(&rt)
            .iter_custom(move |iters| drive(svc.clone(), iters))
    });

    let ours = flightdeck_bulkhead::BulkheadLayer::new(1024);
    g.bench_function("bulkhead below limit / flightdeck", |b| {
        let svc = ours.layer(Echo);
        b.to_async(&rt)
            .iter_custom(move |iters| drive(svc.clone(), iters))
    });

    let theirs = tower_resilience_bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(1024)
        .name("bench")
        .build()
        .unwrap();
    g.bench_function("bulkhead below limit / tower-resilience", |b| {
        let svc = theirs.layer(Echo);
        b.to_async(&rt)
            .iter_custom(move |iters| drive(svc.clone(), iters))
    });

    g.bench_function("bulkhead below limit / tower ConcurrencyLimit", |b| {
        let svc = tower::limit::ConcurrencyLimitLayer::new(1024).layer(Echo);
        b.to_async(&rt)
            .iter_custom(move |iters| drive(svc.clone(), iters))
    });

    // The same limit with errors boxed, as every layer that can reject must
    // (LoadShed, Timeout and ours do): isolates the cost of a fallible
    // layer's larger output (returned through memory instead of registers)
    // from the cost of the limit itself.
    g.bench_function(
        "bulkhead below limit / tower ConcurrencyLimit, errors boxed",
        |b| {
            let svc = tower::ServiceBuilder::new()
                .map_err(Into::<flightdeck_core::BoxError>::into)
                .concurrency_limit(1024)
                .service(Echo);
            b.to_async(&rt)
                .iter_custom(move |iters| drive(svc.clone(), iters))
        },
    );

    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
