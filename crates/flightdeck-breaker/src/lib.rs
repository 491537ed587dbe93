//! A circuit breaker for any tower service.
//!
//! When a dependency (Redis, a database, a downstream API) starts failing,
//! calling it anyway wastes time and piles load on it. A [`Breaker`] watches
//! the results of recent calls and, past a threshold, *opens*: calls are
//! rejected at once with [`CircuitOpen`](flightdeck_core::error::CircuitOpen)
//! (HTTP 503 / gRPC `UNAVAILABLE` through
//! `flightdeck_core::http::ErrorResponseLayer`). After a wait it lets a few
//! probe calls through, and closes again when they succeed.
//!
//! What it does that the usual breakers do not:
//! - **Truly sliding windows.** A count window evicts its oldest call on
//!   every new one; a time window uses fixed buckets (O(1) memory at any call
//!   rate). The rate is judged as soon as `min_calls` are in the window, not
//!   once the window is full.
//! - **Jitter by default.** The open wait gets a random extra (0–50 % by
//!   default), so breakers on many nodes that opened together do not probe
//!   the dependency in the same millisecond. It can also grow on every
//!   reopening.
//! - **Bounded, unstickable half-open.** Only `half_open_probes` calls are
//!   admitted at once; a probe that never finishes frees its slot after
//!   `probe_timeout`, and a cancelled probe frees it at once.
//! - **Gradual ramp** back to full traffic after closing ([`Ramp`]).
//! - **tokio's clock** everywhere, so tests run with paused time.
//! - A shared handle ([`Breaker`]) to read, force, reset and subscribe to
//!   transitions; a bounded [`BreakerRegistry`] that publishes which of
//!   its breakers are open on one watch channel; metrics
//!   ([`metric`]) and tracing events on every transition.
//!
//! The result classification is pluggable ([`Classify`]): by default every
//! `Err` is a failure; [`TransientErrors`] counts only outages (connection
//! errors, timeouts, Redis `LOADING`/`READONLY`/`CLUSTERDOWN`…).
//!
//! ```
//! use std::time::Duration;
//! use flightdeck_breaker::{Breaker, BreakerConfig, CircuitState};
//! use flightdeck_core::error::CircuitOpen;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let breaker = Breaker::new(
//!     "redis",
//!     BreakerConfig::default()
//!         .count_window(20)
//!         .min_calls(5)
//!         .failure_rate(0.5)
//!         .wait_in_open(Duration::from_secs(2)),
//! )
//! .unwrap();
//!
//! let svc = ServiceBuilder::new()
//!     .layer(breaker.layer())
//!     .service(service_fn(|fail: bool| async move {
//!         if fail { Err("redis down") } else { Ok("ok") }
//!     }));
//!
//! for _ in 0..5 {
//!     let _ = svc.clone().oneshot(true).await;
//! }
//! assert_eq!(breaker.state(), CircuitState::Open);
//! let err = svc.clone().oneshot(false).await.unwrap_err();
//! assert!(err.is::<CircuitOpen>());
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod breaker;
pub mod classify;
mod config;
mod future;
mod layer;
mod registry;
mod service;
mod state;
mod window;

pub use breaker::{Breaker, Permit};
pub use classify::{Classify, ErrIsFailure, Outcome, TransientErrors};
pub use config::{BreakerConfig, BreakerConfigError, Ramp, WindowKind};
pub use future::ResponseFuture;
pub use layer::CircuitBreakerLayer;
pub use registry::{BreakerRegistry, OpenSince, RegistryFull};
pub use service::CircuitBreaker;
pub use state::{CircuitState, Transition, TransitionReason};
pub use window::WindowStats;

/// Metric names recorded by the breaker (label [`LABEL_BREAKER`](metric::LABEL_BREAKER)).
///
/// Defined with every other flightdeck metric name in
/// [`flightdeck_core::metric`]; re-exported here.
pub mod metric {
    pub use flightdeck_core::metric::{
        CIRCUIT_OPEN_TOTAL, CIRCUIT_REJECTED_TOTAL, CIRCUIT_STATE, LABEL_BREAKER,
    };
}
