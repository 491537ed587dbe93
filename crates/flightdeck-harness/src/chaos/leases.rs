//! The leases a run leaves on Redis. Once the load has stopped and every
//! node is idle (its in-flight maps empty, its background commits,
//! abandons and releases done), no flight runs on any node, so a flight
//! record whose lease is still held (its deadline `d` later than the
//! server's `TIME`) belongs to a token nobody is going to use: an orphan
//! its node should have released.
//!
//! The scan reads every primary (each node of a cluster) with `SCAN`,
//! then `HMGET` of the record's holder `t`, deadline `d` and generation
//! `g` (the fields of the Redis backend's one hash per flight).

use std::time::Duration;

use super::{lock, Topology};
use crate::{RedisServer, RedisServerError, Resp};

/// A flight record whose lease was still held at the scan.
#[derive(Clone, Debug)]
pub struct HeldLease {
    /// The port of the server that holds it.
    pub port: u16,
    /// The record's key.
    pub key: String,
    /// The holder's token.
    pub token: String,
    /// The holder's generation.
    pub generation: String,
    /// How much of the lease was left, by the server's clock.
    pub remaining: Duration,
}

/// What a scan found.
#[derive(Clone, Debug, Default)]
pub struct LeaseScan {
    /// Flight records seen (the run's flights whose records had not yet
    /// expired): a scan that sees none did not look where the flights are.
    pub records: usize,
    /// The records whose lease was still held.
    pub held: Vec<HeldLease>,
}

fn scan_err(msg: String) -> RedisServerError {
    RedisServerError::new(msg)
}

fn text(r: &Resp) -> Option<String> {
    r.as_str().map(str::to_owned)
}

/// The server's clock in milliseconds (`TIME`).
fn server_ms(server: &RedisServer) -> Result<u64, RedisServerError> {
    match server.cmd(&["TIME"])? {
        Resp::Array(Some(parts)) if parts.len() == 2 => {
            let num = |r: &Resp| text(r).and_then(|s| s.parse::<u64>().ok());
            match (num(&parts[0]), num(&parts[1])) {
                (Some(s), Some(us)) => Ok(s * 1000 + us / 1000),
                _ => Err(scan_err(format!("TIME answered {parts:?}"))),
            }
        }
        other => Err(scan_err(format!("TIME answered {other:?}"))),
    }
}

/// Adds the flight records of `server` (keys ending in `}:{layout}`) to
/// `out`, and those whose lease is held to its `held`.
pub fn scan_server(
    server: &RedisServer,
    layout: &str,
    out: &mut LeaseScan,
) -> Result<(), RedisServerError> {
    let now = server_ms(server)?;
    let pattern = format!("*}}:{layout}");
    let mut cursor = "0".to_owned();
    loop {
        let reply = server.cmd(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"])?;
        let Resp::Array(Some(parts)) = reply else {
            return Err(scan_err(format!("SCAN answered {reply:?}")));
        };
        let (Some(next), Some(Resp::Array(Some(keys)))) =
            (parts.first().and_then(text), parts.get(1))
        else {
            return Err(scan_err(format!("SCAN answered {parts:?}")));
        };
        for key in keys.iter().filter_map(text) {
            let fields = server.cmd(&["HMGET", &key, "t", "d", "g"])?;
            let Resp::Array(Some(fields)) = fields else {
                return Err(scan_err(format!("HMGET {key} answered {fields:?}")));
            };
            out.records += 1;
            let field = |i: usize| fields.get(i).and_then(text).unwrap_or_default();
            let deadline = field(1).parse::<u64>().unwrap_or(0);
            if deadline > now {
                out.held.push(HeldLease {
                    port: server.port(),
                    key: key.clone(),
                    token: field(0),
                    generation: field(2),
                    remaining: Duration::from_millis(deadline - now),
                });
            }
        }
        if next == "0" {
            return Ok(());
        }
        cursor = next;
    }
}

/// Scans every primary of `topology` (blocking: run it off the runtime).
pub fn scan_leases(topology: &Topology, layout: &str) -> Result<LeaseScan, RedisServerError> {
    let mut out = LeaseScan::default();
    match topology {
        Topology::Standalone(redis) => scan_server(&lock(redis), layout, &mut out)?,
        Topology::Sentinel(s) => scan_server(s.primary()?, layout, &mut out)?,
        Topology::Cluster(c) => {
            for node in c.nodes() {
                scan_server(node, layout, &mut out)?;
            }
        }
    }
    Ok(out)
}
