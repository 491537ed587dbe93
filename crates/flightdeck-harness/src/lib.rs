//! flightdeck's own test machinery (unpublished): the processes its tests
//! start, the fault proxy and the chaos suites. What users of the library
//! test with (the memory backend, the conformance suite, the metrics
//! recorder) is the published `flightdeck-test` crate.
//!
//! - [`RedisServer`]: a real `redis-server` process on a free loopback
//!   port, with no persistence, that can be killed, paused (SIGSTOP),
//!   resumed, restarted on the same port and have its script cache flushed.
//!   It is killed when dropped. Tests never touch a Redis they did not start.
//! - [`RedisCluster`]: a Redis Cluster of such processes (primaries only,
//!   slots split evenly, `cluster-require-full-coverage no` so the others
//!   keep serving while one is down), for hash-tag, sharded pub/sub,
//!   primary-outage and slot-migration tests.
//! - [`FaultProxy`]: a TCP proxy between a client and Redis that adds
//!   latency, blackholes, resets connections or cuts a reply in the middle,
//!   switchable at run time.
//! - [`RedisSentinel`]: a primary, a replica and three sentinels, with a
//!   forced failover.
//! - [`Recorder`]: a backend wrapper that journals grants and commits and
//!   checks the chaos invariants (no stale commit, at most one committed
//!   result per generation).
//! - [`prometheus::PrometheusServer`]: a real `prometheus` scraping test
//!   nodes and evaluating alerting rules, queried through its HTTP API.
//! - [`node::NodeProcess`]: the `flightdeck-node` binary (feature `node`)
//!   as a separate process driven over HTTP, for multi-process tests.
//! - [`chaos`]: the seeded fault schedule, the load, and the printed and
//!   checked invariants of the chaos suites (in-process nodes and node
//!   processes).
//! - [`http`]: `GET` from a test process (node, Prometheus) over hyper.
//! - [`wait_until`], [`wait_until_async`]: bounded polling waits that
//!   panic naming what they waited for; [`free_port`]: a free loopback
//!   port.

pub mod chaos;
pub mod cluster;
mod eventlog;
pub mod http;
pub mod node;
pub mod prometheus;
pub mod proxy;
pub mod recorder;
pub mod redis;
pub mod sentinel;
mod wait;

pub use cluster::RedisCluster;
pub use proxy::{Fault, FaultProxy, ProxyStats};
pub use recorder::{Journal, Recorder};
pub use redis::{free_port, Pending, RedisServer, RedisServerError, Resp};
pub use sentinel::RedisSentinel;
pub use wait::{wait_until, wait_until_async};
