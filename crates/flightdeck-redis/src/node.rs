//! One Redis server's clients (commands and subscriber), connecting and
//! reconnecting on their own, and what we know about their connection.
//!
//! A standalone or sentinel deployment is one node; a cluster is one node
//! per primary (see [`cluster`](crate::cluster)), so that a primary that is
//! down takes only its own connections down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flightdeck_distributed::backend::{BackendError, Connection};
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::config::ServerConfig;
use tokio::sync::{broadcast, watch, Notify};
use tokio::task::JoinHandle;

use crate::classify::classify;
use crate::config::RedisConfig;
use crate::inbox::Inboxes;

/// What the node knows about its connections, from fred's events.
#[derive(Debug)]
pub(crate) struct Link {
    /// A connection attempt of the command client failed and none is
    /// known to have succeeded since: calls are refused before they are
    /// built (fred would refuse them anyway, see `Options::fail_fast`).
    failing: AtomicBool,
    /// The command client's connection was lost (fred's error event
    /// names the server whose connection closed) and no new one is made
    /// yet. Until its first reconnection attempt (50 ms or more later)
    /// fred still says it is connected, and a call sent then waits behind
    /// the reconnection, never written, until its timeout: outcome
    /// unknown for a call that did not run. Calls wait for the new
    /// connection instead ([`back_within`](Self::back_within)).
    lost: AtomicBool,
    /// How many times the command client's connection was lost: a call
    /// that must run on one connection (`WAIT`) tells by it that it may
    /// have gone on another.
    losses: AtomicU64,
    /// Woken whenever `failing` or `lost` changes.
    changed: Notify,
    /// The last connection error of either client, for messages.
    last_error: Mutex<Option<fred::error::Error>>,
    /// Whether the command client is connected, published (see
    /// `Backend::connection`): not until its first connection is made.
    pub(crate) connection: watch::Sender<Connection>,
}

impl Default for Link {
    fn default() -> Self {
        let not_yet = Connection::NotConnected(Arc::from(NOT_YET));
        Self {
            failing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            losses: AtomicU64::new(0),
            changed: Notify::new(),
            last_error: Mutex::new(None),
            connection: watch::channel(not_yet).0,
        }
    }
}

/// Why a client that never connected is not connected.
const NOT_YET: &str = "redis not connected yet (connecting)";

impl Link {
    /// An error event of one of the node's clients: `lost` when it names
    /// a server (a connection that closed), otherwise a connection
    /// attempt that failed.
    fn failed(&self, command_client: bool, e: fred::error::Error, lost: bool) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(e);
        if command_client {
            let flag = if lost { &self.lost } else { &self.failing };
            flag.store(true, Ordering::Release);
            if lost {
                // After `lost`: whoever reads this count sees it set.
                self.losses.fetch_add(1, Ordering::AcqRel);
            }
            self.changed.notify_waiters();
            let why = Connection::NotConnected(Arc::from(self.why_not_connected()));
            self.connection.send_replace(why);
        }
    }

    /// Publishes "connected" when the command client is (fred may say so
    /// before its event reaches [`reconnected`](Self::reconnected)).
    pub(crate) fn connected_now(&self, client: &Client) {
        if client.is_connected() && !self.is_lost() {
            self.connection.send_if_modified(|now| {
                let was = now.is_connected();
                *now = Connection::Connected;
                !was
            });
        }
    }

    /// The command client made a new connection.
    fn reconnected(&self) {
        self.lost.store(false, Ordering::Release);
        self.failing.store(false, Ordering::Release);
        self.changed.notify_waiters();
        self.connection.send_replace(Connection::Connected);
    }

    pub(crate) fn last_error(&self) -> Option<fred::error::Error> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether a connection attempt of the command client failed since it
    /// was last known connected.
    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Whether the command client lost its connection and has not made a
    /// new one yet (whatever fred says: see `lost`).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// How many times the command client's connection was lost so far.
    pub(crate) fn losses(&self) -> u64 {
        self.losses.load(Ordering::Acquire)
    }

    /// Waits until `deadline` for a lost connection to be made again:
    /// true once it is, false as soon as a reconnection attempt fails
    /// (nothing to send on: unavailable) or at the deadline.
    pub(crate) async fn back_within(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.is_lost() {
                return true;
            }
            if self.is_failing() {
                return false;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }

    /// Why there is no connection to send on.
    pub(crate) fn why_not_connected(&self) -> String {
        match self.last_error() {
            Some(e) => format!(
                "redis not connected (reconnecting in the background; last error: {})",
                e.details()
            ),
            None => NOT_YET.to_owned(),
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
        if client.is_connected() && !self.is_lost() {
            self.failing.store(false, Ordering::Release);
            return None;
        }
        Some(self.not_connected())
    }
}

/// Follows one client's connection events into `link` (and wakes
/// `changed`, if given, on each). One task reads both of fred's
/// channels, errors first: a loss is always followed by its
/// reconnection, so when both are pending the loss is older.
fn watch_link(
    client: &impl EventInterface,
    link: &Arc<Link>,
    command_client: bool,
    changed: Option<&Arc<Notify>>,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    let mut errors = client.error_rx();
    let mut reconnects = client.reconnect_rx();
    let link = link.clone();
    let wake = changed.cloned();
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                error = errors.recv() => match error {
                    Ok((e, server)) => link.failed(command_client, e, server.is_some()),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                reconnect = reconnects.recv() => match reconnect {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        if command_client {
                            link.reconnected();
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
            if let Some(wake) = &wake {
                wake.notify_one();
            }
        }
    }));
}

/// How every node's clients are built: the parsed URL with our settings.
pub(crate) struct Settings {
    /// fred's config of the deployment (credentials, TLS, `fail_fast`).
    pub(crate) fred: Config,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_max_delay: Duration,
    pub(crate) subscriber_ping: Duration,
}

impl Settings {
    pub(crate) fn new(config: &RedisConfig) -> Result<Self, BackendError> {
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
        Ok(Self {
            fred: fred_config,
            command_timeout: config.command_timeout,
            connect_timeout: config.connect_timeout,
            reconnect_max_delay: config.reconnect_max_delay,
            subscriber_ping: config.subscriber_ping.max(Duration::from_millis(10)),
        })
    }

    /// A builder for clients of `server` (the deployment's own server
    /// config when `None`).
    pub(crate) fn builder(&self, server: Option<ServerConfig>) -> Builder {
        let mut fred_config = self.fred.clone();
        if let Some(server) = server {
            fred_config.server = server;
        }
        let mut builder = Builder::from_config(fred_config);
        let cmd = self.command_timeout;
        let connect = self.connect_timeout;
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect;
                // A hung server completes the TCP handshake: this bounds
                // each connection attempt.
                c.internal_command_timeout = cmd.max(connect);
                // In-flight commands are not replayed after a reconnect: an
                // IO error means "outcome unknown", and we retry ourselves.
                c.max_command_attempts = 1;
                c.unresponsive.max_timeout = Some(cmd * 2);
                c.unresponsive.interval = (cmd / 2).max(Duration::from_millis(50));
            })
            .with_performance_config(|p| p.default_command_timeout = cmd)
            .set_policy(ReconnectPolicy::new_exponential(
                0,
                50,
                u32::try_from(self.reconnect_max_delay.as_millis()).unwrap_or(u32::MAX),
                2,
            ));
        builder
    }

    /// Per-command options: one attempt, one timeout, refused at once
    /// while disconnected.
    pub(crate) fn options(&self) -> Options {
        Options {
            timeout: Some(self.command_timeout),
            max_attempts: Some(1),
            // While disconnected, fred refuses a command at once
            // ("Connection closed unexpectedly.", unavailable) instead of
            // queueing it until a reconnect.
            fail_fast: true,
            ..Default::default()
        }
    }
}

/// One server's command client and subscriber, their connection state and
/// the tasks that follow their events.
pub(crate) struct Node {
    /// `host:port` in a cluster (the flight's shard); the URL otherwise.
    pub(crate) addr: Arc<str>,
    /// One primary of a cluster (not the deployment's one server).
    pub(crate) sharded: bool,
    pub(crate) client: Client,
    pub(crate) subscriber: SubscriberClient,
    pub(crate) link: Arc<Link>,
    tasks: Vec<JoinHandle<()>>,
    timeout: Duration,
}

impl Node {
    /// Builds the node's clients and starts connecting them (in the
    /// background, reconnecting for as long as the node lives). `changed`
    /// is woken on every connection event.
    pub(crate) fn start(
        settings: &Settings,
        server: Option<ServerConfig>,
        addr: Arc<str>,
        inboxes: &Arc<Inboxes>,
        changed: Option<&Arc<Notify>>,
    ) -> Result<Arc<Self>, BackendError> {
        let sharded = server.is_some();
        let builder = settings.builder(server);
        let client = builder.build().map_err(classify)?;
        let subscriber = builder.build_subscriber_client().map_err(classify)?;
        let link = Arc::new(Link::default());
        let mut tasks = Vec::new();
        // Subscribed before connecting, so no event of the first attempt is
        // missed.
        watch_link(&client, &link, true, changed, &mut tasks);
        watch_link(&subscriber, &link, false, changed, &mut tasks);
        inboxes.attach(&subscriber, &mut tasks);
        tasks.push(tokio::spawn(ping_subscriber(
            subscriber.clone(),
            addr.clone(),
            settings.subscriber_ping,
            settings.command_timeout,
        )));
        // The connection tasks run until `quit` (see the drop).
        drop(client.connect());
        drop(subscriber.connect());
        Ok(Arc::new(Self {
            addr,
            sharded,
            client,
            subscriber,
            link,
            tasks,
            timeout: settings.command_timeout,
        }))
    }

    /// Whether both connections (commands and subscriber) are up now.
    pub(crate) fn is_connected(&self) -> bool {
        self.client.is_connected() && self.subscriber.is_connected()
    }

    /// Closes both connections.
    pub(crate) async fn quit(&self) {
        let _ = self.client.quit().await;
        let _ = self.subscriber.quit().await;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let subscriber = self.subscriber.clone();
            let t = self.timeout;
            handle.spawn(async move {
                let _ = tokio::time::timeout(t, client.quit()).await;
                let _ = tokio::time::timeout(t, subscriber.quit()).await;
            });
        }
    }
}

/// Pings `subscriber` every `every` (see [`RedisConfig::subscriber_ping`]):
/// once its inboxes are subscribed nothing else goes out on it, so a
/// connection that died silently would never be found out. When two
/// `PING`s in a row get no answer within `timeout`, the connection is
/// made again: its reconnection makes every follower re-check, subscribes
/// its inboxes again and makes them re-check once more (see
/// [`Inboxes::attach`]).
///
/// [`RedisConfig::subscriber_ping`]: crate::RedisConfig::subscriber_ping
async fn ping_subscriber(
    subscriber: SubscriberClient,
    addr: Arc<str>,
    every: Duration,
    timeout: Duration,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut missed = 0;
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !subscriber.is_connected() {
            // fred is reconnecting it: the count starts again.
            missed = 0;
            continue;
        }
        let answered = match tokio::time::timeout(timeout, subscriber.ping::<Value>(None)).await {
            Ok(Ok(_)) => true,
            // An error reply (BUSY, LOADING) is an answer: the connection
            // lives. A lost connection fred reconnects by itself.
            Ok(Err(e)) => *e.kind() != fred::error::ErrorKind::Timeout,
            Err(_) => false,
        };
        if answered {
            missed = 0;
            continue;
        }
        // One PING can be slow (a server busy for a while); two in a row
        // unanswered mean the connection is gone.
        missed += 1;
        if missed < 2 {
            continue;
        }
        missed = 0;
        tracing::warn!(server = %addr, "subscriber connection answers no PING: it reconnects, and its followers re-check");
        if let Err(e) = subscriber.force_reconnection().await {
            tracing::debug!(server = %addr, error = %e, "forced reconnection of the subscriber failed; fred goes on reconnecting");
        }
    }
}
