//! Test support for users of flightdeck (add it as a dev-dependency; none
//! of it is in a build of the library):
//!
//! - [`MemoryBackend`]: an in-memory coordination backend with the
//!   semantics of the Redis scripts and fault injection, for fast unit tests
//!   of L2 logic and of your service with paused time.
//! - [`conformance`]: the checks every [`Backend`](flightdeck_distributed::Backend)
//!   must pass; the memory and the Redis backends both run them.
//! - [`Hooked`]: a backend wrapper that runs a hook before calls, to force
//!   races (publish before subscribe) deterministically.
//! - [`recorded`]: the test binary's `metrics` recorder, which keeps every
//!   counter, gauge and histogram sample count for tests running in
//!   parallel.
//!
//! The processes flightdeck's own tests start (Redis, Cluster, Sentinel,
//! Prometheus, nodes), its fault proxy and chaos suites are in the
//! unpublished `flightdeck-harness` crate of its repository.

pub mod conformance;
pub mod hooked;
pub mod memory;
pub mod recorded;

pub use hooked::Hooked;
pub use memory::{CallCounts, MemoryBackend};
