//! Per-call overhead of a breaker in the closed state and a bulkhead below
//! its limit, against tower-resilience's breaker and bulkhead and tower's
//! `ConcurrencyLimit`, all in one criterion group around the same trivial
//! inner service (so the layer is all that differs).
//!
//! Run: `cargo bench -p flightdeck-breaker --bench overhead`
//!
//! After the group, the bench prints each of our rows divided by each peer
//! row, from criterion's estimates and from paired, interleaved batches,
//! and can run one row alone for callgrind (`OVERHEAD_ROW`); see
//! `flightdeck_benches::harness`:
//!
//! ```text
//! OVERHEAD_ROW="bulkhead below limit / flightdeck" OVERHEAD_ITERS=200000 \
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/deps/overhead-<hash>
//! ```

#![allow(missing_docs)] // a bench, not an API

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use flightdeck_benches::harness::{self, Report, Row};
use tower::{Layer, Service};

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

fn row<S>(name: &'static str, svc: S) -> Row
where
    S: Service<u64, Response = u64> + Clone + 'static,
    S::Error: std::fmt::Debug,
{
    Row::service(name, svc, |i| i)
}

const BASELINE: &str = "baseline (no layer)";
const BREAKER_OURS: &str = "breaker closed / flightdeck";
const BREAKER_TR: &str = "breaker closed / tower-resilience";
const BULKHEAD_OURS: &str = "bulkhead below limit / flightdeck";
const BULKHEAD_QUEUE_OURS: &str = "bulkhead below limit, queue configured / flightdeck";
const BULKHEAD_TR: &str = "bulkhead below limit / tower-resilience";
const CONCURRENCY_LIMIT: &str = "bulkhead below limit / tower ConcurrencyLimit";
const CONCURRENCY_LIMIT_BOXED: &str = "bulkhead below limit / tower ConcurrencyLimit, errors boxed";

/// Ours / peer, printed after the group.
const RATIOS: &[(&str, &str)] = &[
    (BULKHEAD_OURS, CONCURRENCY_LIMIT),
    (BULKHEAD_OURS, CONCURRENCY_LIMIT_BOXED),
    (BULKHEAD_OURS, BULKHEAD_TR),
    (BULKHEAD_QUEUE_OURS, CONCURRENCY_LIMIT),
    (BULKHEAD_QUEUE_OURS, BULKHEAD_TR),
    (BREAKER_OURS, BREAKER_TR),
];

/// Every row; built inside the runtime, as some layers read tokio's clock
/// on creation.
fn rows() -> Vec<Row> {
    let breaker =
        flightdeck_breaker::Breaker::new("bench", flightdeck_breaker::BreakerConfig::default())
            .unwrap();
    let tr_breaker = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .name("bench")
        .build()
        .unwrap();
    let tr_bulkhead = tower_resilience_bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(1024)
        .name("bench")
        .build()
        .unwrap();
    let queued = flightdeck_bulkhead::BulkheadConfig::new(1024).queue(64, Duration::from_secs(1));
    vec![
        row(BASELINE, Echo),
        row(BREAKER_OURS, breaker.layer().layer(Echo)),
        row(BREAKER_TR, tr_breaker.layer(Echo)),
        row(
            BULKHEAD_OURS,
            flightdeck_bulkhead::BulkheadLayer::new(1024).layer(Echo),
        ),
        row(
            BULKHEAD_QUEUE_OURS,
            flightdeck_bulkhead::BulkheadLayer::from_config(queued).layer(Echo),
        ),
        row(BULKHEAD_TR, tr_bulkhead.layer(Echo)),
        row(
            CONCURRENCY_LIMIT,
            tower::limit::ConcurrencyLimitLayer::new(1024).layer(Echo),
        ),
        // The same limit with errors boxed, as a layer that returns
        // `BoxError` would: isolates the cost of a boxed error type from the
        // cost of the limit itself.
        row(
            CONCURRENCY_LIMIT_BOXED,
            tower::ServiceBuilder::new()
                .map_err(Into::<flightdeck_core::BoxError>::into)
                .concurrency_limit(1024)
                .service(Echo),
        ),
    ]
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // Some layers read tokio's clock when they are built.
    let _guard = rt.enter();
    harness::run(
        "overhead",
        &rt,
        rows(),
        Report {
            baseline: Some(BASELINE),
            ratios: RATIOS,
        },
    );
}
