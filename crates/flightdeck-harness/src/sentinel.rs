//! Redis Sentinel from the same `redis-server` binary: one primary, one
//! replica and three sentinels (`redis-server <conf> --sentinel`, generated
//! configs), all on free loopback ports, with a forced failover
//! (`SENTINEL FAILOVER`). Every process is killed when the value is
//! dropped.
//!
//! ```no_run
//! use std::time::Duration;
//! use flightdeck_harness::RedisSentinel;
//!
//! let sentinel = RedisSentinel::start().unwrap();
//! // redis-sentinel://127.0.0.1:S1/0?sentinelServiceName=fdprimary&node=127.0.0.1:S2&node=...
//! println!("{}", sentinel.url());
//! let before = sentinel.primary_port().unwrap();
//! sentinel.failover(Duration::from_secs(30)).unwrap();
//! assert_ne!(sentinel.primary_port().unwrap(), before);
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use crate::redis::{free_port, RedisServer, RedisServerError, Resp};

/// The monitored service's name.
pub const SERVICE: &str = "fdprimary";

/// A primary, a replica and three sentinels (see the module docs).
pub struct RedisSentinel {
    data: [RedisServer; 2],
    sentinels: Vec<RedisServer>,
}

fn fail(msg: impl Into<String>) -> RedisServerError {
    RedisServerError::new(msg)
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> Option<String> {
    let info = server.cmd(&["INFO", section]).ok()?;
    let text = info.as_str()?.to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
}

fn wait(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), RedisServerError> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return Err(fail(format!(
                "sentinel setup: {what} not reached within {limit:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn array_len(reply: &Resp) -> usize {
    match reply {
        Resp::Array(Some(items)) => items.len(),
        _ => 0,
    }
}

impl RedisSentinel {
    /// Starts the primary, the replica (waits until it is in sync) and three
    /// sentinels (waits until each one knows the replica and the two other
    /// sentinels).
    pub fn start() -> Result<Self, RedisServerError> {
        Self::start_with_guard(false)
    }

    /// Like [`start`](Self::start), with `min-replicas-to-write 1` and
    /// `min-replicas-max-lag 2` on both data nodes: a primary that lost its
    /// replica refuses writes (`NOREPLICAS`). After a failover the old
    /// primary keeps accepting writes from clients still connected to it
    /// until the sentinels demote it (up to their 10 s INFO period), and
    /// those writes are lost; the guard turns them into errors, at the
    /// price of refusing writes until a replica is attached again.
    pub fn start_guarded() -> Result<Self, RedisServerError> {
        Self::start_with_guard(true)
    }

    fn start_with_guard(guard: bool) -> Result<Self, RedisServerError> {
        let guard_args: &[&str] = if guard {
            &[
                "--min-replicas-to-write",
                "1",
                "--min-replicas-max-lag",
                "2",
            ]
        } else {
            &[]
        };
        let primary = RedisServer::start_with(guard_args, free_port)?;
        let primary_port = primary.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &primary_port];
        replica_args.extend_from_slice(guard_args);
        let replica = RedisServer::start_with(&replica_args, free_port)?;
        wait(Duration::from_secs(20), "replica in sync", || {
            info_field(&replica, "replication", "master_link_status").as_deref() == Some("up")
        })?;
        let conf = move |_port: u16| {
            format!(
                "sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 5000\n\
                 sentinel parallel-syncs {SERVICE} 1\n"
            )
        };
        let mut sentinels = Vec::with_capacity(3);
        for _ in 0..3 {
            sentinels.push(RedisServer::start_configured(
                &[],
                Some(&conf),
                true,
                free_port,
            )?);
        }
        let this = Self {
            data: [primary, replica],
            sentinels,
        };
        for s in &this.sentinels {
            wait(
                Duration::from_secs(30),
                "sentinels know the replica and each other",
                || {
                    s.cmd(&["SENTINEL", "REPLICAS", SERVICE])
                        .map(|r| array_len(&r))
                        .unwrap_or(0)
                        >= 1
                        && s.cmd(&["SENTINEL", "SENTINELS", SERVICE])
                            .map(|r| array_len(&r))
                            .unwrap_or(0)
                            >= 2
                },
            )?;
        }
        Ok(this)
    }

    /// `redis-sentinel://127.0.0.1:S1/0?sentinelServiceName=fdprimary&node=127.0.0.1:S2&node=127.0.0.1:S3`,
    /// as fred's `Config::from_url` takes it.
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}/0?sentinelServiceName={SERVICE}",
            self.sentinels[0].port()
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port()));
        }
        url
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The two data nodes (the first started as the primary).
    pub fn data_nodes(&self) -> &[RedisServer; 2] {
        &self.data
    }

    /// The two data nodes, to kill or pause one.
    pub fn data_nodes_mut(&mut self) -> &mut [RedisServer; 2] {
        &mut self.data
    }

    /// The primary's port as the first sentinel reports it.
    pub fn primary_port(&self) -> Result<u16, RedisServerError> {
        self.primary_port_from(&self.sentinels[0])
    }

    fn primary_port_from(&self, sentinel: &RedisServer) -> Result<u16, RedisServerError> {
        match sentinel.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])? {
            Resp::Array(Some(items)) if items.len() == 2 => items[1]
                .as_str()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| fail("GET-MASTER-ADDR-BY-NAME answered a bad port")),
            other => Err(fail(format!("GET-MASTER-ADDR-BY-NAME answered {other:?}"))),
        }
    }

    /// The data node that is the primary now.
    pub fn primary(&self) -> Result<&RedisServer, RedisServerError> {
        let port = self.primary_port()?;
        self.data.iter().find(|d| d.port() == port).ok_or_else(|| {
            fail(format!(
                "the sentinels name an unknown primary on port {port}"
            ))
        })
    }

    /// Forces a failover (`SENTINEL FAILOVER`, retried while the sentinel
    /// answers that it cannot yet) and waits until every sentinel names the
    /// other data node, that node says it is the primary, and the old
    /// primary replicates from it (so a later failover can go back).
    pub fn failover(&self, limit: Duration) -> Result<(), RedisServerError> {
        let started = Instant::now();
        let before = self.primary_port()?;
        let after = self
            .data
            .iter()
            .find(|d| d.port() != before)
            .ok_or_else(|| fail("no replica to promote"))?;
        let old = self
            .data
            .iter()
            .find(|d| d.port() == before)
            .ok_or_else(|| fail("unknown primary"))?;
        // The replica must be in sync, or the sentinel finds no good replica.
        wait(limit, "replica in sync before the failover", || {
            info_field(after, "replication", "master_link_status").as_deref() == Some("up")
        })?;
        loop {
            match self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", SERVICE])? {
                Resp::Simple(ok) if ok == "OK" => break,
                other => {
                    if started.elapsed() > limit {
                        return Err(fail(format!("SENTINEL FAILOVER answered {other:?}")));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        let left = limit.saturating_sub(started.elapsed());
        wait(left, "every sentinel names the new primary", || {
            self.sentinels
                .iter()
                .all(|s| self.primary_port_from(s).ok() == Some(after.port()))
        })?;
        wait(
            left,
            "the new primary and the old one as its replica",
            || {
                info_field(after, "replication", "role").as_deref() == Some("master")
                    && info_field(old, "replication", "role").as_deref() == Some("slave")
                    && info_field(old, "replication", "master_port").as_deref()
                        == Some(after.port().to_string().as_str())
                    && info_field(old, "replication", "master_link_status").as_deref() == Some("up")
            },
        )?;
        Ok(())
    }
}

impl fmt::Debug for RedisSentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinel")
            .field(
                "data",
                &self.data.iter().map(RedisServer::port).collect::<Vec<_>>(),
            )
            .field(
                "sentinels",
                &self
                    .sentinels
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
