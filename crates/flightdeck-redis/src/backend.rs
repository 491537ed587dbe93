use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, FlightId,
    LeaseTerms, Notice, OwnerToken, Released, Renewal, ResultStatus, StoredResult, Subscription,
};
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::classify::classify;
use crate::scripts;

/// Settings of a [`RedisBackend`].
///
/// The URL picks the deployment (see fred's `Config::from_url`):
/// `redis://host:port[/db]` for one server,
/// `redis-cluster://host:port?node=host:port` for a cluster,
/// `redis-sentinel://sentinel:port/db?sentinelServiceName=NAME&node=sentinel2:port`
/// for a primary found (and re-found after a failover) through sentinels,
/// and `rediss://…` (feature `tls`) for TLS. Credentials can be in the URL
/// (`redis://user:pass@host:port`) or given with
/// [`credentials`](Self::credentials).
#[derive(Clone)]
pub struct RedisConfig {
    url: String,
    prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    reconnect_max_delay: Duration,
    username: Option<String>,
    password: Option<String>,
    #[cfg(feature = "tls")]
    tls: Option<fred::types::config::TlsConfig>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the password (nor one embedded in the URL).
        let url = match (self.url.find("://"), self.url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}://***@{}", &self.url[..scheme], &self.url[at + 1..])
            }
            _ => self.url.clone(),
        };
        let mut d = f.debug_struct("RedisConfig");
        d.field("url", &url)
            .field("prefix", &self.prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"));
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.is_some());
        d.finish()
    }
}

impl RedisConfig {
    /// Connects to `url` (`redis://host:port[/db]`, see fred's
    /// `Config::from_url`), key prefix `fd`, 1 s per command, 1 s to
    /// connect, reconnecting forever with backoff up to 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "fd".to_owned(),
            command_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            reconnect_max_delay: Duration::from_secs(1),
            username: None,
            password: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Authenticates as an ACL user (`AUTH username password`). Takes
    /// precedence over credentials in the URL.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Authenticates as the `default` user (`requirepass`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.username = None;
        self.password = Some(password.into());
        self
    }

    /// Connects over TLS, trusting only the CA certificates in `pem` (one or
    /// more `CERTIFICATE` blocks), with the rustls ring provider. Without
    /// this, a `rediss://` URL trusts the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl AsRef<[u8]>) -> Result<Self, BackendError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_ref()) {
            let cert = cert.map_err(|e| {
                BackendError::protocol(format!("tls: unreadable CA certificate PEM: {e}"))
            })?;
            roots.add(cert).map_err(|e| {
                BackendError::protocol(format!("tls: unusable CA certificate: {e}"))
            })?;
        }
        if roots.is_empty() {
            return Err(BackendError::protocol(
                "tls: no CERTIFICATE block in the CA PEM",
            ));
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| BackendError::protocol(format!("tls: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        self.tls = Some(fred::types::config::TlsConnector::from(client).into());
        Ok(self)
    }

    /// The first part of every key name (`{prefix}:{h}:f2`); letters,
    /// digits, `_`, `-`, `.` and `:` only.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The deadline of every command (also the unresponsive-connection
    /// bound, doubled).
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d;
        self
    }

    /// The deadline of connecting.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The longest pause between reconnection attempts.
    pub fn reconnect_max_delay(mut self, d: Duration) -> Self {
        self.reconnect_max_delay = d;
        self
    }
}

/// The Redis coordination backend (see the crate docs). Cheap to clone:
/// clones share the clients and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    opts: Options,
    prefix: String,
    timeout: Duration,
    sources: [String; SCRIPTS],
    shas: [String; SCRIPTS],
    subs: Arc<Subs>,
    tasks: Vec<JoinHandle<()>>,
}

/// The node's one subscriber connection, shared by every follower.
struct Subs {
    subscriber: SubscriberClient,
    channels: Mutex<HashMap<String, Channel>>,
    // Serializes SUBSCRIBE/UNSUBSCRIBE so a late UNSUBSCRIBE never undoes a
    // newer SUBSCRIBE of the same channel.
    commands: tokio::sync::Mutex<()>,
    timeout: Duration,
    // Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH), so a flight's
    // messages stay on the shard that owns its slot.
    sharded: bool,
}

impl Subs {
    async fn subscribe(&self, channel: String) -> Result<(), fred::error::Error> {
        if self.sharded {
            // SSUBSCRIBE waits for Redis's reply.
            self.subscriber.ssubscribe(channel).await
        } else {
            self.subscriber.subscribe(channel).await?;
            // fred 10.1 answers SUBSCRIBE as soon as it is written to the
            // socket (`Connection::push_command`: `has_no_responses`), not
            // when Redis applied it; a notice published in between by
            // another connection was lost (15% of subscribe-then-publish
            // rounds under load, tests/pubsub.rs). Redis answers a PING on
            // the same connection only after the SUBSCRIBE before it: the
            // barrier that makes "subscribed" true when this returns.
            self.subscriber.ping::<Value>(None).await.map(drop)
        }
    }

    async fn unsubscribe(&self, channel: String) -> Result<(), fred::error::Error> {
        if self.sharded {
            self.subscriber.sunsubscribe(channel).await
        } else {
            self.subscriber.unsubscribe(channel).await
        }
    }
}

struct Channel {
    tx: broadcast::Sender<Notice>,
    refs: usize,
}

impl Subs {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dispatch(&self, msg: &Message) {
        let Some(payload) = msg.value.as_bytes() else {
            return;
        };
        let notice = parse_notice(payload);
        let channels = self.channels();
        if let Some(ch) = channels.get(&*msg.channel) {
            match notice {
                Some(n) => {
                    let _ = ch.tx.send(n);
                }
                None => {
                    tracing::warn!("unparseable completion message; re-checking");
                    let _ = ch.tx.send(Notice::Resync);
                }
            }
        }
    }

    fn resync_all(&self) {
        for ch in self.channels().values() {
            let _ = ch.tx.send(Notice::Resync);
        }
    }
}

/// Parses `<gen>|c|<payload>`, `<gen>|c`, `<gen>|a`.
fn parse_notice(payload: &[u8]) -> Option<Notice> {
    let bar = payload.iter().position(|b| *b == b'|')?;
    let generation: u64 = std::str::from_utf8(&payload[..bar]).ok()?.parse().ok()?;
    match &payload[bar + 1..] {
        b"a" => Some(Notice::Abandoned { generation }),
        b"c" => Some(Notice::Committed {
            generation,
            inline: None,
        }),
        [b'c', b'|', inline @ ..] => Some(Notice::Committed {
            generation,
            inline: Some(Bytes::copy_from_slice(inline)),
        }),
        _ => None,
    }
}

/// Releases one reference to a channel; the last one unsubscribes.
struct SubGuard {
    subs: Arc<Subs>,
    channel: String,
}

impl Drop for SubGuard {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.subs.channels();
            match channels.get_mut(&self.channel) {
                Some(ch) if ch.refs <= 1 => {
                    channels.remove(&self.channel);
                    true
                }
                Some(ch) => {
                    ch.refs -= 1;
                    false
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let subs = self.subs.clone();
        let channel = std::mem::take(&mut self.channel);
        handle.spawn(async move {
            let _serial = subs.commands.lock().await;
            if subs.channels().contains_key(&channel) {
                return;
            }
            let _ = tokio::time::timeout(subs.timeout, subs.unsubscribe(channel)).await;
        });
    }
}

fn valid_prefix(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// A failure while connecting: refused credentials are named as such
/// (a protocol error: retrying will not fix them), anything else is
/// "unavailable".
fn connect_error(e: fred::error::Error) -> BackendError {
    auth_refused(&e).unwrap_or_else(|| BackendError::unavailable(e))
}

fn auth_refused(e: &fred::error::Error) -> Option<BackendError> {
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

fn timed_out(what: &str, after: Duration) -> BackendError {
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

    /// The Redis names of a flight: its record (the one key it stores)
    /// and its completion channel. Both carry the layout's version
    /// ([`LAYOUT`]), so nodes of another layout never read them.
    pub fn keys(&self, flight: &FlightId) -> [String; 2] {
        let p = &self.inner.prefix;
        let h = flight.to_hex();
        [
            format!("{p}:{{{h}}}:{LAYOUT}"),
            format!("{p}:{{{h}}}:{LAYOUT}:done"),
        ]
    }

    /// The command client (for tests and diagnostics).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// How many channels this node is subscribed to.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.subs.channels().len()
    }

    /// Closes both connections.
    pub async fn quit(&self) {
        let _ = self.inner.client.quit().await;
        let _ = self.inner.subs.subscriber.quit().await;
    }

    /// Runs one script by SHA; on `NOSCRIPT` (restart, failover, `SCRIPT
    /// FLUSH`) loads it and runs it again, once.
    async fn eval(
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

/// Whether Redis Cluster refused a command because its slot is moving:
/// `TRYAGAIN` (the keys are split between the two nodes), or `ASK` /
/// `MOVED`, which fred reports as "Too many redirections." since we let it
/// follow none (see [`NO_REDIRECTS`]). The command did not run.
fn slot_in_migration(e: &fred::error::Error) -> bool {
    e.details().starts_with("TRYAGAIN")
        || (matches!(e.kind(), fred::error::ErrorKind::Routing)
            && e.details().starts_with("Too many redirections"))
}

/// Classifies an error, naming a slot migration that outlasted the call's
/// deadline (unavailable: the script did not run).
fn migrating(e: fred::error::Error) -> BackendError {
    if slot_in_migration(&e) {
        BackendError::unavailable(format!(
            "redis cluster slot being migrated until the call's deadline (last answer: {})",
            e.details()
        ))
    } else {
        classify(e)
    }
}

/// Redirects fred may follow for the command client in a cluster: none.
///
/// fred 10.1 follows `ASK` wrongly (fred 10.1.0 is the newest release).
/// `process_ask` (src/router/commands.rs) sets the command's hash slot but
/// not its `cluster_node`, so the command is routed by the cached slot map,
/// that is back to the old owner, which answers `ASK` again, until the
/// redirections run out. And the `ASKING` it sends each time
/// (`send_asking_with_policy`, src/router/utils.rs) is written on the
/// shared connection to the target and its reply read straight off the
/// socket (`read_skip_pubsub`), ahead of the replies still owed to
/// commands in flight on that connection. With requests in flight we saw
/// `Max attempts reached.` from that function, `channel closed`, and
/// clients whose every later command timed out, after the migration too.
///
/// Following `ASK` correctly would not help our scripts anyway: the target
/// serves a multi-key command in an importing slot only when it has every
/// key (`getNodeByQuery` answers `TRYAGAIN` otherwise), and the channel in
/// `KEYS` is never a stored key. So every redirect comes back to us as an
/// error and the call is retried within its deadline; for `MOVED` fred
/// has refreshed its slot map first, so the retry goes to the new owner.
const NO_REDIRECTS: u32 = 0;

/// fred attempts per command in a cluster. One attempt would be enough
/// elsewhere (after a dropped connection the outcome is unknown and the
/// layer retries with the same token), but in a cluster fred may write a
/// command again after it re-syncs its slot map or reconnects a node, and
/// the subscriber follows `MOVED` for `SSUBSCRIBE` (our scripts follow no
/// redirect, see [`NO_REDIRECTS`]). A replay after a reconnect is safe:
/// every script is idempotent for the same (token, generation), and
/// INVALIDATE at worst starts one more generation.
const CLUSTER_ATTEMPTS: u32 = 4;

/// The pause before retrying a script whose slot is being migrated.
const MIGRATION_PAUSE: Duration = Duration::from_millis(20);

/// The version of the key layout, part of every key name (`…:f2`,
/// `…:f2:done`). The first layout (keys `…:lease`, `…:state`, `…:result`,
/// channel `…:done`) had none; a later incompatible layout takes a new
/// name, so nodes of two layouts never read each other's keys (see the
/// crate docs on rolling upgrades).
pub const LAYOUT: &str = "f2";

const SCRIPTS: usize = 6;
const SOURCES: [&str; SCRIPTS] = [
    scripts::ACQUIRE,
    scripts::HEARTBEAT,
    scripts::COMMIT,
    scripts::ABANDON,
    scripts::INVALIDATE,
    scripts::RELEASE,
];
const ACQUIRE: usize = 0;
const HEARTBEAT: usize = 1;
const COMMIT: usize = 2;
const ABANDON: usize = 3;
const INVALIDATE: usize = 4;
const RELEASE: usize = 5;

fn ms(d: Duration) -> Value {
    Value::Integer(i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1))
}

fn text(s: &str) -> Value {
    Value::String(s.into())
}

fn bytes(b: &Bytes) -> Value {
    Value::Bytes(b.clone())
}

fn bad_reply(what: &str, v: &Value) -> BackendError {
    BackendError::protocol(format!("unexpected {what} reply of kind {:?}", v.kind()))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::String(s) => s.parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn gen(v: &Value) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

fn parse_acquire(v: &Value) -> Result<Acquired, BackendError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("ACQUIRE", v));
    };
    let action = items.first().and_then(Value::as_str);
    let bad = || bad_reply("ACQUIRE", v);
    Ok(match (action.as_deref(), items.len()) {
        (Some("HIT"), 4) => {
            let status = match items[2].as_str().as_deref() {
                Some("ok") => ResultStatus::Ok,
                Some("err") => ResultStatus::Failed,
                _ => return Err(bad()),
            };
            let payload = match &items[3] {
                Value::Bytes(b) => b.clone(),
                other => Bytes::copy_from_slice(other.as_bytes().ok_or_else(bad)?),
            };
            Acquired::Hit(StoredResult {
                generation: gen(&items[1]).ok_or_else(bad)?,
                status,
                payload,
            })
        }
        (Some("OWNER"), 3) => Acquired::Owner {
            generation: gen(&items[1]).ok_or_else(bad)?,
            takeover: int(&items[2]).ok_or_else(bad)? == 1,
        },
        (Some("FOLLOWER"), 3) => Acquired::Follower {
            generation: gen(&items[1]).ok_or_else(bad)?,
            lease_remaining: Duration::from_millis(
                u64::try_from(int(&items[2]).ok_or_else(bad)?).unwrap_or(0),
            ),
        },
        (Some("EXPIRED"), 2) => Acquired::Expired {
            generation: gen(&items[1]).ok_or_else(bad)?,
        },
        _ => {
            return Err(BackendError::protocol(format!(
                "unknown ACQUIRE action {:?}",
                action.as_deref().unwrap_or("?")
            )))
        }
    })
}

/// Maps a one-word script answer through `table`; anything else is a
/// protocol error.
fn answer<T: Copy>(what: &str, v: &Value, table: &[(&str, T)]) -> Result<T, BackendError> {
    let word = v.as_str().ok_or_else(|| bad_reply(what, v))?;
    table
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, t)| *t)
        .ok_or_else(|| BackendError::protocol(format!("unknown {what} answer {word:?}")))
}

/// An ABANDON or RELEASE answer.
fn released(what: &str, v: &Value) -> Result<Released, BackendError> {
    answer(
        what,
        v,
        &[
            ("RELEASED", Released::Released),
            ("NOT_OWNER", Released::NotOwner),
        ],
    )
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let subscriber = self.subs.subscriber.clone();
            let t = self.timeout;
            handle.spawn(async move {
                let _ = tokio::time::timeout(t, client.quit()).await;
                let _ = tokio::time::timeout(t, subscriber.quit()).await;
            });
        }
    }
}

impl Backend for RedisBackend {
    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            let args = vec![
                text(token.as_str()),
                ms(terms.lease),
                text(if terms.allow_takeover { "1" } else { "0" }),
                ms(terms.record_ttl()),
            ];
            let v = self.eval(ACQUIRE, self.keys(flight).to_vec(), args).await?;
            parse_acquire(&v)
        })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        Box::pin(async move {
            let args = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                ms(terms.lease),
                ms(terms.record_ttl()),
            ];
            let v = self
                .eval(HEARTBEAT, self.keys(flight).to_vec(), args)
                .await?;
            answer(
                "HEARTBEAT",
                &v,
                &[("RENEWED", Renewal::Renewed), ("LOST", Renewal::Lost)],
            )
        })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        Box::pin(async move {
            let argv = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                bytes(&args.payload),
                ms(args.ttl),
                text(if args.payload.len() <= args.inline_below {
                    "1"
                } else {
                    "0"
                }),
            ];
            let v = self.eval(COMMIT, self.keys(flight).to_vec(), argv).await?;
            answer(
                "COMMIT",
                &v,
                &[
                    ("COMMITTED", Committed::Committed),
                    ("FENCED", Committed::Fenced),
                ],
            )
        })
    }

    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released> {
        Box::pin(async move {
            let argv = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                Value::Bytes(args.failure.clone().unwrap_or_default()),
                Value::Integer(i64::try_from(args.failure_ttl.as_millis()).unwrap_or(i64::MAX)),
            ];
            let v = self.eval(ABANDON, self.keys(flight).to_vec(), argv).await?;
            released("ABANDON", &v)
        })
    }

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        Box::pin(async move {
            let argv = vec![text(token.as_str()), ms(state_ttl)];
            let v = self.eval(RELEASE, self.keys(flight).to_vec(), argv).await?;
            released("RELEASE", &v)
        })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            let v = self
                .eval(INVALIDATE, self.keys(flight).to_vec(), vec![ms(state_ttl)])
                .await?;
            gen(&v).ok_or_else(|| bad_reply("INVALIDATE", &v))
        })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        Box::pin(async move {
            let subs = &self.inner.subs;
            let [_, channel] = self.keys(flight);
            let _serial = subs.commands.lock().await;
            let (rx, new) = {
                let mut channels = subs.channels();
                match channels.get_mut(&channel) {
                    Some(ch) => {
                        ch.refs += 1;
                        (ch.tx.subscribe(), false)
                    }
                    None => {
                        let (tx, rx) = broadcast::channel(16);
                        channels.insert(channel.clone(), Channel { tx, refs: 1 });
                        (rx, true)
                    }
                }
            };
            // From here the guard owns one reference, released on any error.
            let guard = SubGuard {
                subs: subs.clone(),
                channel: channel.clone(),
            };
            if new {
                let res = tokio::time::timeout(subs.timeout, subs.subscribe(channel))
                    .await
                    .map_err(|_| timed_out("SUBSCRIBE", subs.timeout))?;
                res.map_err(classify)?;
            }
            drop(_serial);
            Ok(Subscription::new(rx, guard))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_parse_and_garbage_does_not() {
        assert_eq!(
            parse_notice(b"7|c|\x00a|b"),
            Some(Notice::Committed {
                generation: 7,
                inline: Some(Bytes::from_static(b"\x00a|b"))
            })
        );
        assert_eq!(
            parse_notice(b"7|c"),
            Some(Notice::Committed {
                generation: 7,
                inline: None
            })
        );
        assert_eq!(
            parse_notice(b"3|a"),
            Some(Notice::Abandoned { generation: 3 })
        );
        for bad in [&b""[..], b"|", b"x|a", b"1|", b"1|z", b"-1|a", b"1|cx"] {
            assert_eq!(parse_notice(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn acquire_replies_are_checked() {
        let ok = Value::Array(vec![text("OWNER"), Value::Integer(3), Value::Integer(1)]);
        assert_eq!(
            parse_acquire(&ok).unwrap(),
            Acquired::Owner {
                generation: 3,
                takeover: true
            }
        );
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            Value::Array(vec![text("SURPRISE"), Value::Integer(1)]),
            Value::Array(vec![text("OWNER"), text("x"), Value::Integer(0)]),
            Value::Array(vec![
                text("HIT"),
                Value::Integer(1),
                text("maybe"),
                text(""),
            ]),
            Value::Array(vec![
                text("FOLLOWER"),
                Value::Integer(-1),
                Value::Integer(5),
            ]),
        ] {
            let e = parse_acquire(&bad).unwrap_err();
            assert_eq!(e.kind(), flightdeck_distributed::BackendErrorKind::Protocol);
        }
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(valid_prefix("fd:prod"));
        assert!(!valid_prefix("a{b}"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("with space"));
    }
}
