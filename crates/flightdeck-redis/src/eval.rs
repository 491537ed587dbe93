//! Running the scripts: by SHA, by source on `NOSCRIPT`, retried while
//! the flight's slot moves.

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use crate::backend::RedisBackend;
use crate::connect::timed_out;
use crate::routing::{migrating, slot_in_migration, MIGRATION_PAUSE};
use crate::scripts;

impl RedisBackend {
    /// Runs one script by SHA; on `NOSCRIPT` runs it once more by its
    /// source.
    pub(crate) async fn eval(
        &self,
        script: usize,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, BackendError> {
        let inner = &*self.inner;
        // Routed by the flight's slot (every key of a flight shares it).
        let slot = keys.first().map_or(ClusterHash::Random, |k| {
            ClusterHash::Custom(fred::util::redis_keyslot(k.as_bytes()))
        });
        let argv = script_args(&keys, args);
        match self
            .send("EVALSHA", &inner.shas[script], &slot, &argv)
            .await?
        {
            Ok(v) => Ok(v),
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                // This node lacks the script (first call since it started,
                // a failover, `SCRIPT FLUSH`): EVAL sends the source to the
                // node that owns the flight's slot, which runs it and keeps
                // it for the next EVALSHA. Nothing else has to be reachable.
                tracing::debug!("script not cached on this node; sending its source");
                self.send("EVAL", &inner.sources[script], &slot, &argv)
                    .await?
                    .map_err(migrating)
            }
            Err(e) => Err(migrating(e)),
        }
    }

    /// One `EVALSHA` or `EVAL` within one command timeout. While the
    /// flight's slot is being migrated (`TRYAGAIN`, or a redirect: see
    /// [`NO_REDIRECTS`]) the script did not run; it is sent again after a
    /// short pause while the deadline allows. The outer error is the
    /// deadline, the inner one Redis's (last) answer.
    ///
    /// Sent as a custom command because fred 10.1's `WithOptions` does not
    /// implement `LuaInterface`: `with_options(..).evalsha(..)` resolves
    /// (through `Deref`) to the plain client's `evalsha` and drops the
    /// options. Without `fail_fast` a script sent while fred reconnects
    /// waited in fred's queue until its timeout (outcome unknown) instead
    /// of failing at once (unavailable: never sent).
    async fn send(
        &self,
        cmd: &'static str,
        script: &str,
        slot: &ClusterHash,
        argv: &[Value],
    ) -> Result<Result<Value, fred::error::Error>, BackendError> {
        let inner = &*self.inner;
        let with = inner.client.with_options(&inner.opts);
        let t = inner.timeout;
        let deadline = tokio::time::Instant::now() + t;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut args = Vec::with_capacity(argv.len() + 1);
            args.push(Value::String(script.into()));
            args.extend(argv.iter().cloned());
            let command = CustomCommand::new_static(cmd, slot.clone(), false);
            let reply = tokio::time::timeout(left, with.custom::<Value, Value>(command, args))
                .await
                .map_err(|_| timed_out(cmd, t))?;
            match reply {
                Err(e)
                    if slot_in_migration(&e)
                        && tokio::time::Instant::now() + MIGRATION_PAUSE < deadline =>
                {
                    tokio::time::sleep(MIGRATION_PAUSE).await;
                }
                other => return Ok(other),
            }
        }
    }
}

/// `numkeys key ... arg ...`, the part of a script call after the script.
fn script_args(keys: &[String], args: Vec<Value>) -> Vec<Value> {
    let mut argv = Vec::with_capacity(1 + keys.len() + args.len());
    argv.push(Value::Integer(
        i64::try_from(keys.len()).unwrap_or(i64::MAX),
    ));
    argv.extend(keys.iter().map(|k| Value::String(k.as_str().into())));
    argv.extend(args);
    argv
}

pub(crate) const SCRIPTS: usize = 6;
pub(crate) const SOURCES: [&str; SCRIPTS] = [
    scripts::ACQUIRE,
    scripts::HEARTBEAT,
    scripts::COMMIT,
    scripts::ABANDON,
    scripts::INVALIDATE,
    scripts::RELEASE,
];
pub(crate) const ACQUIRE: usize = 0;
pub(crate) const HEARTBEAT: usize = 1;
pub(crate) const COMMIT: usize = 2;
pub(crate) const ABANDON: usize = 3;
pub(crate) const INVALIDATE: usize = 4;
pub(crate) const RELEASE: usize = 5;
