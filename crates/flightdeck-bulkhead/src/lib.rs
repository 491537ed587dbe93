//! A bulkhead for any tower service: a per-stage limit on concurrent
//! executions.
//!
//! Without a bound, a slow downstream makes callers pile up until the
//! process or the downstream falls over. [`BulkheadLayer`] lets at most
//! `limit` calls run at once; the next ones are rejected **in `call`** with
//! [`BulkheadFull`](flightdeck_core::error::BulkheadFull) (HTTP 429 / gRPC
//! `RESOURCE_EXHAUSTED` through `flightdeck_core::http::ErrorResponseLayer`).
//! Rejecting in `call` matters: axum never waits on `poll_ready`, so a
//! limit enforced there (tower's `ConcurrencyLimit`) does nothing under
//! axum, and `LoadShed` sheds for any Pending inner service.
//!
//! Options:
//! - a bounded queue with a queue timeout: calls wait for a slot in arrival
//!   order, then give up with [`QueueTimeout`];
//! - a **degraded limit**, switched through [`BulkheadHandle::set_degraded`]
//!   (the facade lowers it while the coordination breaker is open, so a
//!   Redis outage does not multiply the load on the downstream); it applies
//!   to new calls at once and never touches running ones;
//! - a **degraded lane** ([`BulkheadHandle::degraded_lane`]): a second
//!   bulkhead, nested outside this one, that holds only part of the calls
//!   to the degraded limit while the others keep the normal one (the
//!   facade sends through it the executions of flights whose shard of the
//!   coordination store is degraded);
//! - a rate limit (permits per second, through `governor`, on tokio's clock)
//!   rejecting with [`RateLimited`], always or only while degraded.
//!
//! ```
//! use flightdeck_bulkhead::BulkheadLayer;
//! use flightdeck_core::error::BulkheadFull;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = BulkheadLayer::new(1);
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer.clone())
//!     .service(service_fn(|x: u32| async move {
//!         tokio::task::yield_now().await;
//!         Ok::<_, std::convert::Infallible>(x)
//!     }));
//!
//! let first = svc.ready().await.unwrap().call(1); // holds the only slot
//! let err = svc.ready().await.unwrap().call(2).await.unwrap_err();
//! assert!(err.is::<BulkheadFull>());
//! assert_eq!(first.await.unwrap(), 1);
//! assert_eq!(layer.handle().active(), 0);
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod error;
mod future;
mod layer;
mod service;
mod shared;
mod slots;
mod sync;

pub use error::{QueueTimeout, RateLimited};
pub use future::ResponseFuture;
pub use layer::BulkheadLayer;
pub use service::Bulkhead;
pub use shared::{BulkheadConfig, BulkheadHandle, Slot};

/// Metric names recorded by the bulkhead (label `stage`).
///
/// Defined with every other flightdeck metric name in
/// [`flightdeck_core::metric`]; re-exported here.
pub mod metric {
    pub use flightdeck_core::metric::{BULKHEAD_DEGRADED, BULKHEAD_REJECTED_TOTAL};
}
