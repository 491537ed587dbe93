//! The Redis protocol of flightdeck's distributed single-flight, as a
//! [`stateright`](https://docs.rs/stateright) model (not published).
//!
//! [`server`] is the six Lua scripts of `flightdeck_redis::scripts` that
//! write (all but READ) over a flight's record (its lease, the result kept for waiters and for stale
//! answers, a failed refresh's throttle), one function each; [`model`] puts two nodes (or more),
//! the network, the server clock, a replica and its failover around them,
//! and states the promises of `docs/guarantees.md` as properties, which
//! the checker verifies over every interleaving of a small configuration
//! (`tests/exhaustive.rs`).
//!
//! The model and the scripts are kept in step by replaying the model's
//! runs against the real scripts on a real Redis (`tests/replay.rs`):
//! every answer and every notice must be the model's.

pub mod model;
pub mod server;

pub use model::{Action, Config, ProtocolModel, ServerStep, State};
