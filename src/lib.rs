//! flightdeck: composable tower layers that stop duplicate work.
//!
//! When many requests that mean the same thing arrive at once, only one of
//! them runs the expensive call; the others wait and share its result.
//!
//! This facade re-exports the layers:
//!
//! - [`core`]: keys, stages, result sharing, errors, HTTP/gRPC error
//!   mapping.
//! - [`key`]: request keys ([`key::KeyLayer`], HTTP and gRPC extractors).
//! - [`local`]: in-process single-flight ([`LocalFlightLayer`]).
//!
//! ```
//! use flightdeck::{FlightKey, FlightPolicy, LocalFlightLayer, StageName};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("report").unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(LocalFlightLayer::with_key(FlightPolicy::new(), move |id: &u64| {
//!         Some(FlightKey::from_bytes(stage.clone(), id.to_le_bytes()))
//!     }))
//!     .service(service_fn(|id: u64| async move {
//!         Ok::<_, std::convert::Infallible>(format!("report {id}"))
//!     }));
//! assert_eq!(svc.oneshot(7).await.unwrap(), "report 7");
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use flightdeck_core as core;
pub use flightdeck_key as key;
pub use flightdeck_local as local;

pub use flightdeck_core::{FlightKey, KeyEncoder, StageName};
pub use flightdeck_local::{FlightPolicy, LocalFlight, LocalFlightLayer, OnAbandon};
