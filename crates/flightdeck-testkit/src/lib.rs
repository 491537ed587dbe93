//! Test support for flightdeck.
//!
//! - [`RedisServer`]: a real `redis-server` process on a free loopback
//!   port, with no persistence, that can be killed, paused (SIGSTOP),
//!   resumed, restarted on the same port and have its script cache flushed.
//!   It is killed when dropped. Tests never touch a Redis they did not start.
//! - [`MemoryBackend`]: an in-memory coordination backend with the
//!   semantics of the Redis scripts and fault injection, for fast unit tests
//!   of L2 logic with paused time.
//! - [`Hooked`]: a backend wrapper that runs a hook before calls, to force
//!   races (publish before subscribe) deterministically.
//! - [`conformance`]: the checks every [`Backend`](flightdeck_distributed::Backend)
//!   must pass; the memory and the Redis backends both run them.

pub mod conformance;
pub mod hooked;
pub mod memory;
pub mod redis;

pub use hooked::Hooked;
pub use memory::{CallCounts, MemoryBackend};
pub use redis::{RedisServer, RedisServerError, Resp};
