//! Running the scripts: by SHA, reloaded on `NOSCRIPT`, retried while
//! the flight's slot moves.

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;

use crate::backend::RedisBackend;
use crate::connect::timed_out;
use crate::routing::{migrating, slot_in_migration, MIGRATION_PAUSE};
use crate::scripts;

impl RedisBackend {
    /// Runs one script by SHA; on `NOSCRIPT` (restart, failover, `SCRIPT
    /// FLUSH`) loads it and runs it again, once.
    pub(crate) async fn eval(
        &self,
        script: usize,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, BackendError> {
        let inner = &*self.inner;
        let t = inner.timeout;
        let sha = inner.shas[script].as_str();
        match self.evalsha(sha, &keys, &args).await? {
            Ok(v) => Ok(v),
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                tracing::debug!("script cache empty; reloading");
                let with = inner.client.with_options(&inner.opts);
                let loaded = tokio::time::timeout(
                    t,
                    with.script_load_cluster::<String, _>(inner.sources[script].as_str()),
                )
                .await
                .map_err(|_| timed_out("SCRIPT LOAD", t))?;
                // NOSCRIPT that cannot be reloaded: the backend is unusable.
                loaded.map_err(BackendError::unavailable)?;
                self.evalsha(sha, &keys, &args).await?.map_err(migrating)
            }
            Err(e) => Err(migrating(e)),
        }
    }

    /// One `EVALSHA` within one command timeout. While the flight's slot
    /// is being migrated (`TRYAGAIN`, or a redirect: see
    /// [`NO_REDIRECTS`]) the script did not run; it is sent again after a
    /// short pause while the deadline allows. The outer error is the
    /// deadline, the inner one Redis's (last) answer.
    async fn evalsha(
        &self,
        sha: &str,
        keys: &[String],
        args: &[Value],
    ) -> Result<Result<Value, fred::error::Error>, BackendError> {
        let inner = &*self.inner;
        let with = inner.client.with_options(&inner.opts);
        let t = inner.timeout;
        let deadline = tokio::time::Instant::now() + t;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let reply = tokio::time::timeout(
                left,
                with.evalsha::<Value, _, _, _>(sha, keys.to_vec(), args.to_vec()),
            )
            .await
            .map_err(|_| timed_out("EVALSHA", t))?;
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
