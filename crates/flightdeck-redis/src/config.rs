//! [`RedisConfig`]: which deployment to reach, and how patiently.

use std::fmt;
use std::time::Duration;

use flightdeck_distributed::backend::BackendError;

/// Settings of a [`RedisBackend`](crate::RedisBackend).
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
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) command_timeout: Duration,
    pub(crate) migration_retry: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_max_delay: Duration,
    pub(crate) subscriber_ping: Duration,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<fred::types::config::TlsConfig>,
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
            .field("migration_retry", &self.migration_retry)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("subscriber_ping", &self.subscriber_ping)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"));
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.is_some());
        d.finish()
    }
}

impl RedisConfig {
    /// Connects to `url` (`redis://host:port[/db]`, see fred's
    /// `Config::from_url`), key prefix `fd`, 1 s per command, calls on a
    /// migrating slot retried for 100 ms, 1 s to connect, reconnecting
    /// forever with backoff up to 1 s, subscriber connections pinged every
    /// second.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "fd".to_owned(),
            command_timeout: Duration::from_secs(1),
            migration_retry: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(1),
            reconnect_max_delay: Duration::from_secs(1),
            subscriber_ping: Duration::from_secs(1),
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

    /// The first part of every key name (`{prefix}:{h}:f5`); letters,
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

    /// How long a call whose slot is being migrated in a Redis Cluster
    /// (answered `TRYAGAIN`, `ASK` or `MOVED`) is sent again before it is
    /// refused as *unavailable* (the script did not run); at most the
    /// command timeout, and never past shortly before the call timeout of
    /// the layers built on this backend (they tell it:
    /// `Backend::call_timeout_hint`), so the layer does not cut such a call
    /// off as outcome unknown. 100 ms by default.
    pub fn migration_retry(mut self, d: Duration) -> Self {
        self.migration_retry = d;
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

    /// How often each subscriber connection (where this node's inboxes
    /// are) is sent a `PING` (1 s by default; at least 10 ms). Nothing else
    /// goes out on it once its inboxes are subscribed, so a connection that
    /// died silently (no FIN or RST reached this node: a NAT or load
    /// balancer that forgot it, a partition) would otherwise never be
    /// found out: its followers would hear nothing and wait for their next
    /// poll. Two `PING`s in a row unanswered within the command timeout make
    /// the connection reconnect, which makes every follower re-check and
    /// subscribes its inboxes again. It also keeps an idle connection's NAT
    /// mappings alive.
    pub fn subscriber_ping(mut self, d: Duration) -> Self {
        self.subscriber_ping = d;
        self
    }
}

impl RedisConfig {
    /// Checks the durations: each at most 30 days (so deadlines can be
    /// added to the clock), the timeouts positive (a zero timeout is one
    /// every call misses).
    pub(crate) fn check(&self) -> Result<(), BackendError> {
        for (name, d, positive) in [
            ("command timeout", self.command_timeout, true),
            ("connect timeout", self.connect_timeout, true),
            ("migration retry", self.migration_retry, false),
            ("reconnect max delay", self.reconnect_max_delay, false),
            ("subscriber ping", self.subscriber_ping, false),
        ] {
            if d > flightdeck_core::time::MAX_SETTING || (positive && d.is_zero()) {
                let bound = if positive {
                    "(0, 30 days]"
                } else {
                    "[0, 30 days]"
                };
                return Err(BackendError::protocol(format!(
                    "invalid {name} {d:?}: must be in {bound}"
                )));
            }
        }
        Ok(())
    }
}

pub(crate) fn valid_prefix(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_validated() {
        assert!(valid_prefix("fd:prod"));
        assert!(!valid_prefix("a{b}"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("with space"));
    }
}
