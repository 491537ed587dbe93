//! [`RedisBackend::connect`]: the clients, the subscriber's tasks, the
//! scripts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;
use tokio::sync::broadcast;

use crate::backend::{Inner, RedisBackend};
use crate::classify::classify;
use crate::config::{valid_prefix, RedisConfig};
use crate::eval::{SCRIPTS, SOURCES};
use crate::routing::{CLUSTER_ATTEMPTS, NO_REDIRECTS};
use crate::subs::Subs;

/// A failure while connecting: refused credentials are named as such
/// (a protocol error: retrying will not fix them), anything else is
/// "unavailable".
pub(crate) fn connect_error(e: fred::error::Error) -> BackendError {
    auth_refused(&e).unwrap_or_else(|| BackendError::unavailable(e))
}

pub(crate) fn auth_refused(e: &fred::error::Error) -> Option<BackendError> {
    let first = e.details().split_whitespace().next().unwrap_or("");
    let refused = *e.kind() == fred::error::ErrorKind::Auth
        || matches!(first, "NOAUTH" | "WRONGPASS" | "NOPERM");
    refused.then(|| {
        BackendError::protocol(format!(
            "redis refused the credentials (give them with RedisConfig::credentials or in the URL): {}",
            e.details()
        ))
    })
}

pub(crate) fn timed_out(what: &str, after: Duration) -> BackendError {
    BackendError::outcome_unknown(format!("redis {what} timed out after {after:?}"))
}

impl RedisBackend {
    /// Connects the command client and the subscriber, and loads the
    /// scripts. Fails (classified) if Redis cannot be reached in time.
    pub async fn connect(config: RedisConfig) -> Result<Self, BackendError> {
        if !valid_prefix(&config.prefix) {
            return Err(BackendError::protocol(format!(
                "invalid key prefix {:?}: use 1-64 ASCII letters, digits, '_', '-', '.', ':'",
                config.prefix.escape_debug().to_string()
            )));
        }
        let mut fred_config = Config::from_url(&config.url).map_err(classify)?;
        if config.password.is_some() {
            fred_config.username = config.username.clone();
            fred_config.password = config.password.clone();
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            fred_config.tls = Some(tls.clone());
        }
        let sharded = fred_config.server.is_clustered();
        let sources = SOURCES.map(|src| {
            if sharded {
                src.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
            } else {
                src.to_owned()
            }
        });
        let mut builder = Builder::from_config(fred_config);
        let cmd = config.command_timeout;
        let connect = config.connect_timeout;
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect;
                // A hung server completes the TCP handshake: this bounds init.
                c.internal_command_timeout = cmd.max(connect);
                // In-flight commands are not replayed after a reconnect: an
                // IO error means "outcome unknown", and we retry ourselves.
                // A cluster needs more (see `CLUSTER_ATTEMPTS`).
                c.max_command_attempts = if sharded { CLUSTER_ATTEMPTS } else { 1 };
                c.unresponsive.max_timeout = Some(cmd * 2);
                c.unresponsive.interval = (cmd / 2).max(Duration::from_millis(50));
            })
            .with_performance_config(|p| p.default_command_timeout = cmd)
            .set_policy(ReconnectPolicy::new_exponential(
                0,
                50,
                u32::try_from(config.reconnect_max_delay.as_millis()).unwrap_or(u32::MAX),
                2,
            ));
        // The command client follows no redirect (see `NO_REDIRECTS`; fred
        // reads a per-command 0 as "unset", so it is set here). The
        // subscriber keeps fred's default: `SSUBSCRIBE` is served by the old
        // owner during a migration and gets `MOVED` after it.
        let default_redirections = builder.get_connection_config().max_redirections;
        if sharded {
            builder.with_connection_config(|c| c.max_redirections = NO_REDIRECTS);
        }
        let client = builder.build().map_err(classify)?;
        builder.with_connection_config(|c| c.max_redirections = default_redirections);
        let subscriber = builder.build_subscriber_client().map_err(classify)?;
        let init_deadline = connect + cmd;
        let init = tokio::time::timeout(init_deadline, client.init())
            .await
            .map_err(|_| BackendError::unavailable("redis connect timed out"));
        if let Err(e) = init.and_then(|r| r.map_err(connect_error)) {
            let _ = client.quit().await;
            return Err(e);
        }
        let sub_init = tokio::time::timeout(init_deadline, subscriber.init()).await;
        match sub_init {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let _ = client.quit().await;
                return Err(connect_error(e));
            }
            Err(_) => {
                let _ = client.quit().await;
                return Err(BackendError::unavailable(
                    "redis subscriber connect timed out",
                ));
            }
        }
        let subs = Arc::new(Subs {
            subscriber: subscriber.clone(),
            channels: Mutex::new(HashMap::new()),
            commands: tokio::sync::Mutex::new(()),
            timeout: cmd,
            sharded,
        });
        let mut tasks = Vec::new();
        // Resubscribe every tracked channel after a reconnect.
        let manage = subscriber.manage_subscriptions();
        tasks.push(tokio::spawn(async move {
            let _ = manage.await;
        }));
        let mut messages = subscriber.message_rx();
        let dispatch = subs.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(msg) => dispatch.dispatch(&msg),
                    Err(broadcast::error::RecvError::Lagged(_)) => dispatch.resync_all(),
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        }));
        // Messages sent while disconnected are lost: re-check on reconnect.
        let mut reconnects = subscriber.reconnect_rx();
        let resync = subs.clone();
        tasks.push(tokio::spawn(async move {
            while let Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) = reconnects.recv().await
            {
                resync.resync_all();
            }
        }));

        let opts = Options {
            timeout: Some(cmd),
            max_attempts: Some(if sharded { CLUSTER_ATTEMPTS } else { 1 }),
            fail_fast: true,
            ..Default::default()
        };
        let with = client.with_options(&opts);
        let mut shas: [String; SCRIPTS] = Default::default();
        for (sha, src) in shas.iter_mut().zip(&sources) {
            // On every primary of a cluster.
            *sha = tokio::time::timeout(cmd, with.script_load_cluster::<String, _>(src.as_str()))
                .await
                .map_err(|_| timed_out("SCRIPT LOAD", cmd))?
                .map_err(|e| auth_refused(&e).unwrap_or_else(|| classify(e)))?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                opts,
                prefix: config.prefix,
                timeout: cmd,
                sources,
                shas,
                subs,
                tasks,
            }),
        })
    }
}
