//! A time budget for any tower service: one deadline per request, sliced
//! per phase.
//!
//! A request that has already waited 9 of its caller's 10 seconds should
//! not start 8 seconds of work. [`BudgetLayer`] computes one [`Deadline`]
//! per request, the smaller of
//! - the inbound one: `grpc-timeout` (gRPC wire format, units H M S m u n)
//!   or `x-request-timeout` (or a header you name), and an outer
//!   `Deadline` already in the extensions;
//! - the stage's total;
//!
//! puts it in the request's extensions, and runs the inner service within
//! the execution slice. Inner layers take their own slices with
//! [`Deadline::slice`] and [`Deadline::within`]: coordination (default
//! 200 ms), execution (default: all that remains), result handling. A slice
//! never exceeds what remains. Exhaustion is
//! [`DeadlineExceeded`](flightdeck_core::error::DeadlineExceeded) (HTTP 504
//! / gRPC `DEADLINE_EXCEEDED` through
//! `flightdeck_core::http::ErrorResponseLayer`), naming the phase. A
//! malformed inbound header is an [`InvalidTimeout`] error (or ignored, by
//! [`FromHeaders::ignore_invalid`]), never a panic.
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_budget::{BudgetLayer, Deadline, Phase};
//! use flightdeck_core::error::DeadlineExceeded;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(BudgetLayer::new(Duration::from_secs(10)))
//!     .service(service_fn(|req: http::Request<()>| async move {
//!         let deadline = *req.extensions().get::<Deadline>().unwrap();
//!         // The caller asked for 300 ms: that is the budget.
//!         assert_eq!(deadline.remaining(), Duration::from_millis(300));
//!         tokio::time::sleep(Duration::from_secs(1)).await;
//!         Ok::<_, std::convert::Infallible>(())
//!     }));
//!
//! let req = http::Request::builder().header("grpc-timeout", "300m").body(()).unwrap();
//! let err = svc.oneshot(req).await.unwrap_err();
//! assert_eq!(err.downcast_ref::<DeadlineExceeded>().unwrap().phase(), "execution");
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod deadline;
mod future;
mod inbound;
mod layer;
mod parse;
mod service;

pub use deadline::{Deadline, Phase, Slices, Within};
pub use future::ResponseFuture;
#[cfg(feature = "http")]
pub use inbound::FromHeaders;
pub use inbound::{Inbound, NoInbound};
pub use layer::BudgetLayer;
pub use parse::{parse_grpc_timeout, parse_timeout, InvalidTimeout};
pub use service::Budget;
