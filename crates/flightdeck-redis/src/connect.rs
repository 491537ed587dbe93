//! Creating a [`RedisBackend`]: the clients, connected lazily and
//! reconnected in the background, the subscriber's tasks, and what the
//! node knows about its connection (for fail-fast calls and
//! [`RedisBackend::ready`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;
use tokio::sync::{broadcast, watch};

use crate::backend::{Inner, RedisBackend};
use crate::classify::classify;
use crate::config::{valid_prefix, RedisConfig};
use crate::eval::SOURCES;
use crate::routing::{CLUSTER_ATTEMPTS, NO_REDIRECTS};
use crate::subs::Subs;

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

/// What the node knows about its connections, from fred's events.
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// A connection attempt of the command client failed and none is
    /// known to have succeeded since: calls are refused before they are
    /// built (fred would refuse them anyway, see `Options::fail_fast`).
    failing: AtomicBool,
    /// The last connection error of either client, for messages.
    last_error: Mutex<Option<fred::error::Error>>,
    /// Bumped on every connection event, for [`RedisBackend::ready`].
    events: watch::Sender<u64>,
}

impl Link {
    fn failed(&self, command_client: bool, e: fred::error::Error) {
        if command_client {
            self.failing.store(true, Ordering::Release);
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(e);
        self.events.send_modify(|n| *n += 1);
    }

    fn connected(&self) {
        self.events.send_modify(|n| *n += 1);
    }

    fn last_error(&self) -> Option<fred::error::Error> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why there is no connection to send on.
    pub(crate) fn why_not_connected(&self) -> String {
        match self.last_error() {
            Some(e) => format!(
                "redis not connected (reconnecting in the background; last error: {})",
                e.details()
            ),
            None => "redis not connected yet (connecting)".to_owned(),
        }
    }

    /// Unavailable: no connection to send on (the call was not sent).
    pub(crate) fn not_connected(&self) -> BackendError {
        BackendError::unavailable(self.why_not_connected())
    }

    /// The cheap check before a call: refuses it while the command
    /// client's connection attempts fail (one atomic load otherwise).
    pub(crate) fn refuse(&self, client: &Client) -> Option<BackendError> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        if client.is_connected() {
            self.failing.store(false, Ordering::Release);
            return None;
        }
        Some(self.not_connected())
    }
}

/// Follows one client's connection events into `link`.
fn watch_link(
    client: &impl EventInterface,
    link: &Arc<Link>,
    command_client: bool,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    let mut errors = client.error_rx();
    let on_error = link.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            match errors.recv().await {
                Ok((e, _)) => on_error.failed(command_client, e),
                Err(broadcast::error::RecvError::Lagged(_)) => on_error.connected(),
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    }));
    let mut reconnects = client.reconnect_rx();
    let on_connect = link.clone();
    tasks.push(tokio::spawn(async move {
        while let Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) = reconnects.recv().await {
            on_connect.connected();
        }
    }));
}

impl RedisBackend {
    /// Creates the backend without waiting for Redis: the clients connect
    /// in the background and reconnect (with backoff up to
    /// [`RedisConfig::reconnect_max_delay`]) for as long as the backend
    /// lives. Until a connection exists, every call fails at once as
    /// *unavailable* (nothing was sent), so a HYBRID stage runs its
    /// flights in this process and a DISTRIBUTED_ONLY stage fails fast;
    /// both go distributed once Redis answers. Call
    /// [`ready`](Self::ready) to wait for the first connection.
    ///
    /// Fails only on what waiting would not fix: an invalid prefix or
    /// URL, or no tokio runtime to connect from.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use flightdeck_redis::{RedisBackend, RedisConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let backend = RedisBackend::new(RedisConfig::new("redis://127.0.0.1:6390"))?;
    /// // Optional: give Redis a moment, and start degraded without it.
    /// if let Err(e) = backend.ready(Duration::from_secs(2)).await {
    ///     eprintln!("starting without Redis: {e}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn new(config: RedisConfig) -> Result<Self, BackendError> {
        if !valid_prefix(&config.prefix) {
            return Err(BackendError::protocol(format!(
                "invalid key prefix {:?}: use 1-64 ASCII letters, digits, '_', '-', '.', ':'",
                config.prefix.escape_debug().to_string()
            )));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BackendError::protocol(
                "RedisBackend::new must be called inside a tokio runtime (it spawns the connection tasks)",
            ));
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
        // A first connection that fails is retried with the reconnect
        // policy, like a lost one, instead of ending the client.
        fred_config.fail_fast = false;
        let sharded = fred_config.server.is_clustered();
        let sources = SOURCES.map(|src| {
            if sharded {
                src.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
            } else {
                src.to_owned()
            }
        });
        // EVALSHA names a script by the SHA1 of its source, so the SHAs are
        // known without asking Redis; a node that lacks a script answers
        // NOSCRIPT and gets it with the call (see `eval`).
        let shas = sources.each_ref().map(|src| fred::util::sha1_hash(src));
        let mut builder = Builder::from_config(fred_config);
        let cmd = config.command_timeout;
        let connect = config.connect_timeout;
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect;
                // A hung server completes the TCP handshake: this bounds
                // each connection attempt.
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
        let subs = Arc::new(Subs {
            subscriber: subscriber.clone(),
            channels: Mutex::new(HashMap::new()),
            ops: Mutex::new(HashMap::new()),
            timeout: cmd,
            sharded,
        });
        let link = Arc::new(Link::default());
        let mut tasks = Vec::new();
        // Subscribed before connecting, so no event of the first attempt is
        // missed.
        watch_link(&client, &link, true, &mut tasks);
        watch_link(&subscriber, &link, false, &mut tasks);
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
        // The connection tasks run until `quit` (see `Inner`'s drop).
        drop(client.connect());
        drop(subscriber.connect());

        let opts = Options {
            timeout: Some(cmd),
            max_attempts: Some(if sharded { CLUSTER_ATTEMPTS } else { 1 }),
            // While disconnected, fred refuses a command at once
            // ("Connection closed unexpectedly.", unavailable) instead of
            // queueing it until a reconnect.
            fail_fast: true,
            ..Default::default()
        };
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                opts,
                prefix: config.prefix,
                timeout: cmd,
                sources,
                shas,
                subs,
                link,
                tasks,
            }),
        })
    }

    /// [`new`](Self::new), then [`ready`](Self::ready) within the
    /// config's connect timeout plus one command timeout: for tools and
    /// tests that need Redis now. A service that should start during an
    /// outage uses `new` (and, if it likes, `ready` with its own deadline).
    pub async fn connect(config: RedisConfig) -> Result<Self, BackendError> {
        let deadline = config.connect_timeout + config.command_timeout;
        let backend = Self::new(config)?;
        match backend.ready(deadline).await {
            Ok(()) => Ok(backend),
            Err(e) => {
                backend.quit().await;
                Err(e)
            }
        }
    }

    /// Whether both connections (commands and subscriber) are up now.
    pub fn is_connected(&self) -> bool {
        self.inner.client.is_connected() && self.inner.subs.subscriber.is_connected()
    }

    /// Loads the scripts on every primary, so the first calls need no
    /// `NOSCRIPT` round trip. Best effort (a node that misses them gets
    /// them with its first call), except that a refusal of the
    /// credentials is an error.
    async fn load_scripts(&self, until: tokio::time::Instant) -> Result<(), BackendError> {
        let inner = &*self.inner;
        for src in &inner.sources {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let load = inner.client.script_load_cluster::<String, _>(src.as_str());
            match tokio::time::timeout(left, load).await {
                Ok(Err(e)) => {
                    if let Some(refused) = auth_refused(&e) {
                        return Err(refused);
                    }
                    tracing::debug!("script not preloaded: {e}");
                }
                Ok(Ok(_)) => {}
                Err(_) => tracing::debug!("script not preloaded: timed out"),
            }
        }
        Ok(())
    }

    /// Waits until both connections are up, at most `deadline`, and loads
    /// the scripts.
    ///
    /// Fails as *unavailable* when the deadline passes first (naming the
    /// last connection error, e.g. "Connection refused"), and as a
    /// *protocol* error as soon as Redis refuses the credentials (waiting
    /// will not fix them). Either way the backend keeps reconnecting in
    /// the background and can be used as it is.
    pub async fn ready(&self, deadline: Duration) -> Result<(), BackendError> {
        let link = &self.inner.link;
        let mut events = link.events.subscribe();
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if self.is_connected() {
                return self.load_scripts(until).await;
            }
            if let Some(refused) = link.last_error().as_ref().and_then(auth_refused) {
                return Err(refused);
            }
            // Events say when to look again; the tick covers a state
            // change fred makes after its event.
            let tick = (tokio::time::Instant::now() + Duration::from_millis(20)).min(until);
            tokio::select! {
                _ = events.changed() => {}
                _ = tokio::time::sleep_until(tick) => {}
            }
            if tokio::time::Instant::now() >= until && !self.is_connected() {
                return Err(BackendError::unavailable(format!(
                    "within {deadline:?}: {}",
                    link.why_not_connected()
                )));
            }
        }
    }
}
