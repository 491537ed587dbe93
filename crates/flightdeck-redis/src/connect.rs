//! Creating a [`RedisBackend`]: its nodes (one server's, or a cluster's
//! primaries), connected lazily and reconnected in the background, and
//! waiting for them ([`RedisBackend::ready`]).

use crate::clock::ServerClocks;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::BackendError;
use fred::prelude::*;

use crate::backend::{Inner, RedisBackend};
use crate::cluster::Cluster;
use crate::config::{valid_prefix, RedisConfig};
use crate::eval::SOURCES;
use crate::inbox::Inboxes;
use crate::node::{Node, Settings};
use crate::routing::Topology;

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
    /// Creates the backend without waiting for Redis: the clients connect
    /// in the background and reconnect (with backoff up to
    /// [`RedisConfig::reconnect_max_delay`]) for as long as the backend
    /// lives. Until a connection exists, every call fails at once as
    /// *unavailable* (nothing was sent), so a HYBRID stage runs its
    /// flights in this process and a DISTRIBUTED_ONLY stage fails fast;
    /// both go distributed once Redis answers. In a cluster the same holds
    /// per primary: a flight is refused while the primary serving its slot
    /// (or the slot map) is not connected, whatever the other primaries
    /// do. Call [`ready`](Self::ready) to wait for the connections.
    ///
    /// Fails only on what waiting would not fix: an invalid prefix or
    /// URL, a duration out of range (over 30 days, or a zero timeout), or
    /// no tokio runtime to connect from.
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
        config.check()?;
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
        let settings = Settings::new(&config)?;
        let sharded = settings.fred.server.is_clustered();
        let sources: Arc<[String]> = SOURCES
            .map(|src| {
                if sharded {
                    src.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
                } else {
                    src.to_owned()
                }
            })
            .into();
        // EVALSHA names a script by the SHA1 of its source, so the SHAs are
        // known without asking Redis; a node that lacks a script answers
        // NOSCRIPT and gets it with the call (see `eval`).
        let shas = std::array::from_fn(|i| fred::util::sha1_hash(&sources[i]).into());
        let cmd = config.command_timeout;
        let inboxes = Arc::new(Inboxes::new(&config.prefix, cmd, sharded));
        let opts = settings.options();
        let mut tasks = Vec::new();
        let topology = if sharded {
            let (cluster, refresher) = Cluster::start(settings, inboxes.clone(), sources.clone())?;
            tasks.push(refresher);
            Topology::Cluster(cluster)
        } else {
            let addr: Arc<str> = Arc::from("the server");
            Topology::Single(Node::start(&settings, None, addr, &inboxes, None)?)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                topology,
                opts,
                prefix: config.prefix,
                timeout: cmd,
                migration_retry: config.migration_retry.min(cmd),
                cut_after: AtomicU64::new(u64::MAX),
                clocks: ServerClocks::default(),
                sources,
                shas,
                inboxes,
                tasks,
            }),
        })
    }

    /// [`new`](Self::new), then [`ready`](Self::ready) within the
    /// config's connect timeout plus one command timeout: for tools and
    /// tests that need Redis now. A service that should start during an
    /// outage uses `new` (and, if it likes, `ready` with its own deadline).
    pub async fn connect(config: RedisConfig) -> Result<Self, BackendError> {
        config.check()?;
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

    /// Whether every connection is up now: both of the server (commands
    /// and subscriber), or in a cluster both of every primary, with the
    /// slot map known.
    pub fn is_connected(&self) -> bool {
        match &self.inner.topology {
            Topology::Single(node) => node.is_connected(),
            Topology::Cluster(cluster) => {
                cluster.has_map() && cluster.nodes().iter().all(|n| n.is_connected())
            }
        }
    }

    /// Loads the scripts on every connected node, so the first calls need
    /// no `NOSCRIPT` round trip. Best effort (a node that misses them gets
    /// them with its first call), except that a refusal of the
    /// credentials is an error.
    async fn load_scripts(&self, until: tokio::time::Instant) -> Result<(), BackendError> {
        let inner = &*self.inner;
        for node in inner.topology.nodes() {
            if !node.client.is_connected() {
                continue;
            }
            for src in inner.sources.iter() {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let load = node.client.script_load::<String, _>(src.as_str());
                match tokio::time::timeout(left, load).await {
                    Ok(Err(e)) => {
                        if let Some(refused) = auth_refused(&e) {
                            return Err(refused);
                        }
                        tracing::debug!("script not preloaded on {}: {e}", node.addr);
                    }
                    Ok(Ok(_)) => {}
                    Err(_) => tracing::debug!("script not preloaded on {}: timed out", node.addr),
                }
            }
        }
        Ok(())
    }

    /// Whether the backend can serve: one server's both connections are
    /// up and its inbox subscribed (`partial`: without the inbox, whose
    /// followers subscribe and re-check meanwhile); a cluster's slot map
    /// is known and every primary is connected, or at least one is and
    /// every other one has failed a connection attempt (`partial` allows
    /// that from the first connected primary on: at the deadline).
    fn serving(&self, partial: bool) -> bool {
        let Topology::Cluster(cluster) = &self.inner.topology else {
            return self.is_connected() && (partial || self.inner.inboxes.in_force(0));
        };
        if !cluster.has_map() {
            return false;
        }
        let nodes = cluster.nodes();
        nodes.iter().any(|n| n.is_connected())
            && (partial
                || nodes
                    .iter()
                    .all(|n| n.is_connected() || n.link.is_failing()))
    }

    /// Why the backend cannot serve (for `ready`'s error).
    fn why_not_serving(&self) -> String {
        match &self.inner.topology {
            Topology::Single(node) => node.link.why_not_connected(),
            Topology::Cluster(cluster) => {
                let nodes: Vec<String> = cluster
                    .nodes()
                    .iter()
                    .map(|n| format!("{}: {}", n.addr, n.link.why_not_connected()))
                    .collect();
                let nodes = nodes.join("; ");
                if cluster.has_map() {
                    format!("no redis cluster primary connected ({nodes})")
                } else {
                    let why = cluster.why_no_map();
                    format!("redis cluster slot map not known ({why}; {nodes})")
                }
            }
        }
    }

    /// Waits until the backend can serve, at most `deadline`, and loads
    /// the scripts.
    ///
    /// One server (standalone, sentinel): both connections (commands and
    /// subscriber) are up, and this node's inbox is subscribed (at the
    /// deadline, the connections are enough). A cluster: the slot map is known, and every
    /// primary is connected, or at least one is and each other one has
    /// failed a connection attempt (it is down: its flights are refused
    /// as unavailable while the others are served); at the deadline, at
    /// least one primary connected is enough. So `ready` succeeds with any
    /// subset of the primaries down except all of them.
    ///
    /// Fails as *unavailable* when the deadline passes first (naming the
    /// last connection error, e.g. "Connection refused"), and as a
    /// *protocol* error as soon as Redis refuses the credentials (waiting
    /// will not fix them). Either way the backend keeps reconnecting in
    /// the background and can be used as it is.
    pub async fn ready(&self, deadline: Duration) -> Result<(), BackendError> {
        let until = flightdeck_core::time::later(tokio::time::Instant::now(), deadline);
        loop {
            if self.serving(false) {
                return self.load_scripts(until).await;
            }
            let refused = self
                .inner
                .topology
                .nodes()
                .iter()
                .find_map(|n| n.link.last_error().as_ref().and_then(auth_refused));
            if let Some(refused) = refused {
                return Err(refused);
            }
            if tokio::time::Instant::now() >= until {
                if self.serving(true) {
                    return self.load_scripts(until).await;
                }
                return Err(BackendError::unavailable(format!(
                    "within {deadline:?}: {}",
                    self.why_not_serving()
                )));
            }
            // What `serving` reads changes on many events: each node's two
            // clients (fred announces a reconnection before its state says
            // connected, so no event marks the moment `is_connected` turns
            // true), the slot map, the inbox's confirmation. Rather than
            // a signal from each, look again every few milliseconds: only
            // a caller of `ready` waits here.
            let tick = (tokio::time::Instant::now() + Duration::from_millis(20)).min(until);
            tokio::time::sleep_until(tick).await;
        }
    }
}
