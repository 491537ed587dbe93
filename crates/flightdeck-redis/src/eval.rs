//! Running the scripts: by SHA, by source on `NOSCRIPT`, retried while
//! the flight's slot moves.

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use crate::args::ScriptArgs;
use crate::backend::RedisBackend;
use crate::connect::timed_out;
use crate::routing::{migrating, moved_to, slot_in_migration, Topology, MIGRATION_PAUSE};
use crate::scripts;

impl RedisBackend {
    /// Runs one script by SHA, its arguments built by `args`; on
    /// `NOSCRIPT` runs it once more by its source. `args` builds the same
    /// arguments each time it is called: the first call's go to fred as
    /// they are, and only a call sent again (by source, or after a
    /// migration's answer) builds them again, so that the common call
    /// keeps no copy of its arguments.
    pub(crate) async fn eval(
        &self,
        script: usize,
        args: impl Fn() -> ScriptArgs,
    ) -> Result<Value, BackendError> {
        let inner = &*self.inner;
        let first = args();
        // Routed by the flight's slot (every key of a flight shares it);
        // one server has no slots to route by.
        let slot = match inner.topology {
            Topology::Cluster(_) => fred::util::redis_keyslot(first.record()),
            Topology::Single(_) => 0,
        };
        let by_sha =
            |args: ScriptArgs| args.into_argv_for(Value::String(inner.shas[script].clone()));
        let again = || by_sha(args());
        match self.send("EVALSHA", slot, by_sha(first), again).await? {
            Ok(v) => Ok(v),
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                // This node lacks the script (first call since it started,
                // a failover, `SCRIPT FLUSH`): EVAL sends the source to the
                // node that owns the flight's slot, which runs it and keeps
                // it for the next EVALSHA. Nothing else has to be reachable.
                tracing::debug!("script not cached on this node; sending its source");
                let by_source =
                    || args().into_argv_for(Value::String(inner.sources[script].as_str().into()));
                self.send("EVAL", slot, by_source(), by_source)
                    .await?
                    .map_err(migrating)
            }
            Err(e) => Err(migrating(e)),
        }
    }

    /// One `EVALSHA` or `EVAL` within one command timeout, on the node
    /// serving `slot`. While the slot is being migrated (`TRYAGAIN`,
    /// `ASK`) the script did not run; it is sent again after a short pause
    /// while the deadline allows. After `MOVED` the slot map is refreshed
    /// and the script sent again to the new owner, within the deadline too
    /// (see [`routing`](crate::routing)). The outer error is the deadline
    /// or a node without connection, the inner one Redis's (last) answer.
    ///
    /// Sent as a custom command because fred 10.1's `WithOptions` does not
    /// implement `LuaInterface`: `with_options(..).evalsha(..)` resolves
    /// (through `Deref`) to the plain client's `evalsha` and drops the
    /// options. Without `fail_fast` a script sent while fred reconnects
    /// waited in fred's queue until its timeout (outcome unknown) instead
    /// of failing at once (unavailable: never sent).
    ///
    /// `argv` is sent first; `again` builds the same arguments for each
    /// next try.
    async fn send(
        &self,
        cmd: &'static str,
        slot: u16,
        argv: Vec<Value>,
        again: impl Fn() -> Vec<Value>,
    ) -> Result<Result<Value, fred::error::Error>, BackendError> {
        let inner = &*self.inner;
        let t = inner.timeout;
        let now = tokio::time::Instant::now();
        let deadline = now + t;
        // Waited for (a connection) and sent again after a migration's
        // answer (see `RedisConfig::migration_retry`) only until here.
        let unsent = inner.unsent_until(now);
        let retry_until = unsent.min(now + inner.migration_retry);
        let mut argv = Some(argv);
        loop {
            let refreshes = self.refreshes();
            let node = inner.topology.route_within(slot, unsent).await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                // fred reads a zero timeout as none; nothing was sent yet
                // to call it otherwise than timed out.
                return Err(timed_out(cmd, t));
            }
            // Bounded by fred's own timer (what is left of the deadline),
            // not by one more of ours around it: a timer per call fewer.
            let opts = Options {
                timeout: Some(left),
                ..inner.opts.clone()
            };
            let command = CustomCommand::new_static(cmd, ClusterHash::Custom(slot), false);
            let reply = node
                .client
                .with_options(&opts)
                .custom::<Value, Value>(command, argv.take().unwrap_or_else(&again))
                .await;
            match reply {
                Err(e) if *e.kind() == ErrorKind::Timeout => return Err(timed_out(cmd, t)),
                Err(e)
                    if self
                        .retry_after(&e, (slot, &node.addr), refreshes, retry_until)
                        .await => {}
                other => return Ok(other),
            }
        }
    }

    /// The refreshes of the cluster's slot map so far (0 for one server).
    pub(crate) fn refreshes(&self) -> u64 {
        match &self.inner.topology {
            Topology::Cluster(c) => c.refreshes(),
            Topology::Single(_) => 0,
        }
    }

    /// Whether a call for `slot` that `from` (a node's address) refused
    /// with `e` goes again (before `deadline`): after `MOVED`, once the
    /// slot map was refreshed since the call was sent (`refreshes`, see
    /// [`Self::refreshes`]); after `TRYAGAIN` or `ASK`, after
    /// [`MIGRATION_PAUSE`].
    pub(crate) async fn retry_after(
        &self,
        e: &fred::error::Error,
        (slot, from): (u16, &str),
        refreshes: u64,
        deadline: tokio::time::Instant,
    ) -> bool {
        if !slot_in_migration(e) || tokio::time::Instant::now() + MIGRATION_PAUSE >= deadline {
            return false;
        }
        if let (Some(to), Topology::Cluster(cluster)) = (moved_to(e), &self.inner.topology) {
            let refresh = cluster.refreshed_since(refreshes, Some(to));
            if tokio::time::timeout_at(deadline, refresh).await.is_err() {
                return false;
            }
            if cluster.primary_of(slot).as_deref() == Some(from) {
                // The node asked has not heard of the move yet: no spin.
                tokio::time::sleep(MIGRATION_PAUSE).await;
            }
            return time_for_one_more(deadline);
        }
        tokio::time::sleep(MIGRATION_PAUSE).await;
        time_for_one_more(deadline)
    }
}

/// Whether a call sent again now still has time for its answer (at least
/// [`MIGRATION_PAUSE`] before `deadline`). One sent in the last instant
/// would time out (outcome unknown) where the slot's last answer says the
/// script did not run (unavailable).
fn time_for_one_more(deadline: tokio::time::Instant) -> bool {
    tokio::time::Instant::now() + MIGRATION_PAUSE < deadline
}

pub(crate) const SCRIPTS: usize = 7;
pub(crate) const SOURCES: [&str; SCRIPTS] = [
    scripts::ACQUIRE,
    scripts::HEARTBEAT,
    scripts::COMMIT,
    scripts::ABANDON,
    scripts::INVALIDATE,
    scripts::RELEASE,
    scripts::READ,
];
pub(crate) const ACQUIRE: usize = 0;
pub(crate) const HEARTBEAT: usize = 1;
pub(crate) const COMMIT: usize = 2;
pub(crate) const ABANDON: usize = 3;
pub(crate) const INVALIDATE: usize = 4;
pub(crate) const RELEASE: usize = 5;
pub(crate) const READ: usize = 6;

#[cfg(test)]
mod tests {
    use super::{time_for_one_more, MIGRATION_PAUSE};
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_retry_needs_a_migration_pause_left() {
        let now = Instant::now();
        assert!(time_for_one_more(now + 2 * MIGRATION_PAUSE));
        assert!(!time_for_one_more(now + MIGRATION_PAUSE));
        assert!(!time_for_one_more(now));
    }
}
