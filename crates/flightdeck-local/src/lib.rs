//! In-process single-flight (L1): one execution per key, shared with every
//! waiter.
//!
//! When many requests with the same [`FlightKey`] arrive at once, the first
//! one (the *leader*) starts the work and the others *wait* for its result.
//! [`LocalFlights::run`] does it for any work (a library call, like Go's
//! `Group.Do`); [`LocalFlightLayer`] does it for a `tower` service.
//! Everybody gets the same outcome: the same value, or the same error
//! (wrapped in [`SharedError`]).
//!
//! - **Detached work.** The leader drives the work inline (no task spawn on
//!   the common path). If the leader goes away (client disconnect) or times
//!   out while others still want the result, the work moves to a task of its
//!   own and goes on; when the *last* caller is gone it is cancelled, unless
//!   the policy says [`OnAbandon::Finish`].
//! - **Panics** in the work become [`WorkPanicked`] for every caller, the
//!   leader included (the panic is caught, it does not unwind through the
//!   caller), and the key is free again at once.
//! - **Event-driven waiting.** Waiters sleep on their flight's board,
//!   where its outcome is posted once, and are woken once; 10,000 waiters
//!   cost memory, not CPU.
//! - **Four clocks** (see [`FlightPolicy`]): wait timeout, flight TTL,
//!   replay TTL, and the execution budget (not ours).
//!   The callers' clocks (wait timeout, own deadline) arm no timer per
//!   caller: their expiries sit in the flights' slots, and one task per
//!   layer, spawned on the tokio runtime where the first one is armed,
//!   sleeps until the earliest and wakes whoever is due. A caller on
//!   another runtime keeps a timer of its own, so a runtime that stops
//!   being driven (or is busy) never holds another runtime's callers past
//!   their time.
//! - **Bounded**: max flights and max waiters per flight, with typed
//!   rejections.
//! - **Responses need not be `Clone`.** A [`Share`] adapter turns the one
//!   response into a cheap-to-clone form: [`CloneShare`] for `Clone`
//!   values, `HttpShare` (feature `http`) for `http::Response`s. Results
//!   that cannot be shared (streams, oversize bodies) go to the leader
//!   intact, and waiters run the service themselves.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use flightdeck_core::{FlightKey, StageName};
//! use flightdeck_local::{FlightPolicy, LocalFlightLayer};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stage = StageName::new("score").unwrap();
//! let calls = Arc::new(AtomicUsize::new(0));
//! let counter = calls.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(LocalFlightLayer::with_key(
//!         FlightPolicy::new(),
//!         move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
//!     ))
//!     .service(service_fn(move |q: String| {
//!         let counter = counter.clone();
//!         async move {
//!             counter.fetch_add(1, Ordering::SeqCst);
//!             tokio::time::sleep(std::time::Duration::from_millis(50)).await;
//!             Ok::<_, std::convert::Infallible>(q.len())
//!         }
//!     }));
//!
//! let a = svc.clone().oneshot("same question".to_owned());
//! let b = svc.clone().oneshot("same question".to_owned());
//! let (a, b) = tokio::join!(a, b);
//! assert_eq!((a.unwrap(), b.unwrap()), (13, 13));
//! assert_eq!(calls.load(Ordering::SeqCst), 1);
//! # }
//! ```
//!
//! [`FlightKey`]: flightdeck_core::FlightKey
//! [`SharedError`]: flightdeck_core::SharedError
//! [`WorkPanicked`]: flightdeck_core::error::WorkPanicked
//! [`Share`]: flightdeck_core::Share
//! [`CloneShare`]: flightdeck_core::CloneShare

#![cfg_attr(docsrs, feature(doc_cfg))]

mod flights;
pub mod future;
mod group;
mod layer;
mod metrics;
mod policy;
mod run;
mod service;
mod sync;

pub use flights::{Caller, FlightWork, LocalFlights};
pub use layer::LocalFlightLayer;
pub use policy::{FlightPolicy, OnAbandon};
pub use run::Answer;
pub use service::{LocalFlight, ServiceWork};
