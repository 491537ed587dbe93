//! A flight's record read without writing (the READ script): the stored
//! result replayed when the server refuses writes, the last invalidation,
//! and the wait for replicas after a commit.

use std::time::Duration;

use flightdeck_core::metric;
use flightdeck_distributed::backend::{Acquired, BackendError, FlightId, ResultStatus};
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use crate::args::Names;
use crate::backend::RedisBackend;
use crate::classify::classify;
use crate::connect::timed_out;
use crate::eval::READ;
use crate::reply::{bad_reply, gen, int, parse_acquire, text};

/// READ's answer: the record's `rg`, `s`, `b`, the last invalidation,
/// and the result's age, TTL and work time.
pub(crate) fn read_items(reply: Value) -> Result<[Value; 7], BackendError> {
    match reply {
        Value::Array(items) => {
            <[Value; 7]>::try_from(items).map_err(|items| bad_reply("READ", &Value::Array(items)))
        }
        other => Err(bad_reply("READ", &other)),
    }
}

/// The result stored in READ's `items` ([`Acquired::Hit`], under the
/// checks of ACQUIRE's hit path); `None` when none is stored.
pub(crate) fn stored_hit(items: &[Value; 7]) -> Option<Result<Acquired, BackendError>> {
    if items[1].is_null() {
        return None;
    }
    let [rg, s, b, _, age, ttl, wt] = items;
    let hit = Value::Array(vec![
        text("HIT"),
        rg.clone(),
        s.clone(),
        b.clone(),
        age.clone(),
        ttl.clone(),
        wt.clone(),
    ]);
    Some(parse_acquire(&hit))
}

/// The refusal's reason when the server refused a write it would serve as
/// a read: `NOREPLICAS` (a primary short of `min-replicas-to-write`) or
/// `READONLY` (a replica, e.g. the old primary after a failover).
pub(crate) fn writes_refused(e: &BackendError) -> Option<&'static str> {
    let source = std::error::Error::source(e)?.downcast_ref::<fred::error::Error>()?;
    match source.details().split_whitespace().next() {
        Some("NOREPLICAS") => Some("noreplicas"),
        Some("READONLY") => Some("readonly"),
        _ => None,
    }
}

impl RedisBackend {
    /// The record's `rg`, `s`, `b`, the last invalidation, and the
    /// result's age, TTL and work time; with `stale`, a success kept past
    /// its freshness too (see [`scripts::READ`](crate::scripts::READ)).
    async fn read(&self, flight: &FlightId, stale: bool) -> Result<[Value; 7], BackendError> {
        let args = || {
            self.script_args(flight, Names::WithInvalidation, 1)
                .text(if stale { "1" } else { "0" })
        };
        read_items(self.eval(READ, args).await?)
    }

    /// ACQUIRE was refused with `refused` because the server takes no
    /// writes now (`reason`): the stored result, read without writing, is
    /// the answer ([`Acquired::Hit`], under the checks of ACQUIRE's hit
    /// path). When the acquire asked for stale results (`stale`), a
    /// success kept past its freshness within its stale window answers as
    /// [`Acquired::Stale`]: no refresh can be granted while writes are
    /// refused, so the kept result answers and nothing runs, as during a
    /// failed refresh's throttle (counted `stale`). Without either (or
    /// when the read fails: counted `failed`, not `miss`) the refusal
    /// stands.
    pub(crate) async fn replay_refused(
        &self,
        flight: &FlightId,
        stale: bool,
        refused: BackendError,
        reason: &'static str,
    ) -> Result<Acquired, BackendError> {
        let count = |result: &'static str| {
            metrics::counter!(metric::READONLY_REPLAY_TOTAL, "reason" => reason, "result" => result)
                .increment(1);
        };
        let items = match self.read(flight, stale).await {
            Ok(items) => items,
            Err(e) => {
                tracing::debug!(error = %e, "read-only lookup after a refused write failed");
                count("failed");
                return Err(refused);
            }
        };
        let Some(replay) = stored_hit(&items) else {
            count("miss");
            return Err(refused);
        };
        let replay = match replay? {
            Acquired::Hit(kept) if kept.status == ResultStatus::Ok && kept.age >= kept.ttl => {
                count("stale");
                Acquired::Stale(kept)
            }
            hit => {
                count("hit");
                hit
            }
        };
        tracing::debug!(
            reason,
            "server refuses writes; replaying the stored result read-only"
        );
        Ok(replay)
    }

    /// Whether the flight was invalidated after `generation` (within the
    /// last `state_ttl`).
    pub(crate) async fn invalidated_after(
        &self,
        flight: &FlightId,
        generation: u64,
    ) -> Result<bool, BackendError> {
        let items = self.read(flight, false).await?;
        Ok(gen(&items[3]).is_some_and(|i| i > generation))
    }

    /// `WAIT replicas timeout` to the node serving the flight, on the
    /// connection that sent its commit (each node has one command
    /// connection): how many replicas acknowledged this connection's
    /// writes so far. Unavailable when that connection was lost since
    /// (seen before the call or before its answer): a new connection's
    /// count says nothing of the commit.
    pub(crate) async fn wait_for(
        &self,
        flight: &FlightId,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u32, BackendError> {
        let inner = &*self.inner;
        let slot = self.slot(flight);
        let limit = timeout + inner.timeout;
        // Not after a loss: the new connection (maybe to another server)
        // has acknowledgements of its own writes, not of the commit.
        let (node, losses) = inner.topology.route_now(slot)?;
        let mut opts = inner.opts.clone();
        opts.timeout = Some(limit);
        let wait_ms = i64::try_from(timeout.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        let command = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), true);
        let args = vec![Value::Integer(i64::from(replicas)), Value::Integer(wait_ms)];
        let with = node.client.with_options(&opts);
        let call = with.custom::<Value, Value>(command, args);
        let reply = tokio::time::timeout(limit, call)
            .await
            .map_err(|_| timed_out("WAIT", limit))?
            .map_err(classify)?;
        if node.link.losses() != losses {
            // Lost meanwhile: fred may have sent it on the new connection.
            return Err(BackendError::unavailable(
                "redis connection lost around WAIT: its count may be of another connection than the commit's",
            ));
        }
        int(&reply)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad_reply("WAIT", &reply))
    }
}
