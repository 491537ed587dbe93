//! A real Redis Cluster of `redis-server` processes on free loopback ports,
//! built from the same binary as [`RedisServer`]: N primaries, no replicas,
//! the 16384 slots split evenly, joined with `CLUSTER MEET`. Every node is
//! killed when the cluster is dropped.
//!
//! The nodes run with `cluster-node-timeout 2000` (a node unreachable for
//! 2 s is marked failed) and `cluster-require-full-coverage no`, also after
//! a [`restart`](RedisServer::restart): once one primary is marked failed,
//! the others keep serving their own slots (with the Redis default `yes`,
//! every node answers `CLUSTERDOWN` for every key instead). There are no
//! replicas, so nothing fails over: a killed primary's slots are
//! unavailable until it is restarted.
//!
//! ```no_run
//! use flightdeck_harness::RedisCluster;
//!
//! let cluster = RedisCluster::start(3).unwrap();
//! println!("{}", cluster.url()); // redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&node=...
//! cluster.flush_scripts().unwrap();
//! ```

use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use crate::redis::{free_port, RedisServer, RedisServerError, Resp};

/// Total hash slots of Redis Cluster.
const SLOTS: u16 = 16384;
/// The cluster bus listens on the node's port + 10000.
const BUS_OFFSET: u16 = 10000;

/// A running Redis Cluster (see the module docs).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

fn fail(msg: impl Into<String>) -> RedisServerError {
    RedisServerError::new(msg)
}

/// A free port whose bus port (+10000) is free too.
fn free_cluster_port() -> Result<u16, RedisServerError> {
    for _ in 0..100 {
        let port = free_port()?;
        if port > u16::MAX - BUS_OFFSET {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + BUS_OFFSET)).is_ok() {
            return Ok(port);
        }
    }
    Err(fail(
        "no free port pair (port, port + 10000) for a cluster node",
    ))
}

impl RedisCluster {
    /// Starts `primaries` nodes (at least 1), assigns the slots, joins them
    /// and waits until every node reports `cluster_state:ok`. See the
    /// module docs for the nodes' settings.
    pub fn start(primaries: usize) -> Result<Self, RedisServerError> {
        let n = primaries.max(1);
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(RedisServer::start_with(NODE_ARGS, free_cluster_port)?);
        }
        let per = SLOTS / n as u16;
        for (i, node) in nodes.iter().enumerate() {
            let first = per * i as u16;
            let last = if i + 1 == n {
                SLOTS - 1
            } else {
                first + per - 1
            };
            expect_ok(node.cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ])?)?;
        }
        for other in &nodes[1..] {
            expect_ok(nodes[0].cmd(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &other.port().to_string(),
            ])?)?;
        }
        let cluster = Self { nodes };
        wait_ok(
            &cluster.nodes.iter().collect::<Vec<_>>(),
            Duration::from_secs(20),
        )?;
        Ok(cluster)
    }

    /// Starts one more cluster-enabled node, serving no slot and not one of
    /// [`nodes`](Self::nodes), meets it with the cluster and waits until
    /// every node knows every other: a primary the clients had no
    /// connection to (scale-out), to move slots to or to make a replica.
    pub fn join_empty_node(&self) -> Result<RedisServer, RedisServerError> {
        let node = RedisServer::start_with(NODE_ARGS, free_cluster_port)?;
        expect_ok(node.cmd(&[
            "CLUSTER",
            "MEET",
            "127.0.0.1",
            &self.nodes[0].port().to_string(),
        ])?)?;
        let all: Vec<&RedisServer> = self.nodes.iter().chain([&node]).collect();
        wait_ok(&all, Duration::from_secs(20))?;
        Ok(node)
    }

    /// One node, to kill, pause or restart it (a restarted node keeps its
    /// `nodes.conf`, so it rejoins with its slots). `None` past the last.
    pub fn node_mut(&mut self, i: usize) -> Option<&mut RedisServer> {
        self.nodes.get_mut(i)
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// `redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&node=...`, as fred's
    /// `Config::from_url` takes it.
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port());
        for (i, node) in self.nodes[1..].iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", node.port()));
        }
        url
    }

    /// `SCRIPT FLUSH` on every node.
    pub fn flush_scripts(&self) -> Result<(), RedisServerError> {
        self.nodes.iter().try_for_each(RedisServer::flush_scripts)
    }

    /// `CLUSTER KEYSLOT key`, as the server computes it.
    pub fn keyslot(&self, key: &str) -> Result<u16, RedisServerError> {
        match self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])? {
            Resp::Int(s) => u16::try_from(s).map_err(|_| fail("bad slot")),
            other => Err(fail(format!("CLUSTER KEYSLOT answered {other:?}"))),
        }
    }

    /// The index (in [`nodes`](Self::nodes)) of the node serving `slot`
    /// now, by `CLUSTER SLOTS` of the first node.
    pub fn slot_owner(&self, slot: u16) -> Result<usize, RedisServerError> {
        let Resp::Array(Some(ranges)) = self.nodes[0].cmd(&["CLUSTER", "SLOTS"])? else {
            return Err(fail("CLUSTER SLOTS did not answer an array"));
        };
        for range in ranges {
            let Resp::Array(Some(items)) = range else {
                continue;
            };
            let (Some(Resp::Int(first)), Some(Resp::Int(last)), Some(Resp::Array(Some(node)))) =
                (items.first(), items.get(1), items.get(2))
            else {
                continue;
            };
            if (*first..=*last).contains(&i64::from(slot)) {
                let Some(Resp::Int(port)) = node.get(1) else {
                    continue;
                };
                return self
                    .nodes
                    .iter()
                    .position(|n| i64::from(n.port()) == *port)
                    .ok_or_else(|| fail(format!("slot {slot} served by unknown port {port}")));
            }
        }
        Err(fail(format!("slot {slot} is not served")))
    }

    /// The node serving `key`'s slot now.
    pub fn node_for(&self, key: &str) -> Result<&RedisServer, RedisServerError> {
        let slot = self.keyslot(key)?;
        Ok(&self.nodes[self.slot_owner(slot)?])
    }

    fn node_id(&self, i: usize) -> Result<String, RedisServerError> {
        self.nodes[i]
            .cmd(&["CLUSTER", "MYID"])?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| fail("CLUSTER MYID did not answer text"))
    }

    /// Moves `slot` to node `to` the way `redis-cli --cluster reshard` does:
    /// IMPORTING on the target, MIGRATING on the source, `MIGRATE` of every
    /// key, then `SETSLOT NODE` everywhere. `pause` is slept after marking
    /// the slot and again after moving the keys, so clients running
    /// meanwhile meet `ASK` (keys already moved), `TRYAGAIN` (a multi-key
    /// command split across the two nodes) and finally `MOVED`. Blocking:
    /// call it from a thread (`spawn_blocking`) while requests run. For
    /// finer control (which keys move when), use
    /// [`begin_migration`](Self::begin_migration) and its steps.
    pub fn migrate_slot(
        &self,
        slot: u16,
        to: usize,
        pause: Duration,
    ) -> Result<(), RedisServerError> {
        let Some(migration) = self.begin_migration(slot, to)? else {
            return Ok(());
        };
        std::thread::sleep(pause);
        self.migrate_all_keys(&migration)?;
        std::thread::sleep(pause);
        self.finish_migration(&migration)
    }

    /// Starts moving `slot` to node `to`: `CLUSTER SETSLOT IMPORTING` on
    /// the target, then `MIGRATING` on the source. From here until
    /// [`finish_migration`](Self::finish_migration) the source answers
    /// `ASK` for keys it no longer has (and `TRYAGAIN` for multi-key
    /// commands it has only some keys of). `None` when `to` owns the slot
    /// already; an error for a node index out of range.
    pub fn begin_migration(
        &self,
        slot: u16,
        to: usize,
    ) -> Result<Option<SlotMigration>, RedisServerError> {
        if to >= self.nodes.len() {
            return Err(fail(format!(
                "no node {to} in a cluster of {}",
                self.nodes.len()
            )));
        }
        let from = self.slot_owner(slot)?;
        if from == to {
            return Ok(None);
        }
        let (from_id, to_id) = (self.node_id(from)?, self.node_id(to)?);
        let slot_s = slot.to_string();
        expect_ok(self.nodes[to].cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id])?)?;
        expect_ok(self.nodes[from].cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id])?)?;
        Ok(Some(SlotMigration {
            slot,
            from,
            to,
            to_id,
        }))
    }

    /// `MIGRATE`s `keys` (all in the migrating slot) from the source to the
    /// target in one command, so they move together; keys the source does
    /// not have are skipped. Returns how many keys the source had.
    pub fn migrate_keys(
        &self,
        migration: &SlotMigration,
        keys: &[&str],
    ) -> Result<usize, RedisServerError> {
        let source = &self.nodes[migration.from];
        let mut present = Vec::new();
        for key in keys {
            if let Resp::Int(1) = source.cmd(&["EXISTS", key])? {
                present.push(*key);
            }
        }
        if present.is_empty() {
            return Ok(0);
        }
        let to_port = self.nodes[migration.to].port().to_string();
        let mut cmd = vec![
            "MIGRATE",
            "127.0.0.1",
            &to_port,
            "",
            "0",
            "5000",
            "REPLACE",
            "KEYS",
        ];
        cmd.extend(present.iter().copied());
        match source.cmd(&cmd)? {
            // `NOKEY`: the keys expired in between.
            Resp::Simple(_) => Ok(present.len()),
            other => Err(fail(format!("MIGRATE answered {other:?}"))),
        }
    }

    /// `MIGRATE`s every key still on the source, 100 at a time. Returns how
    /// many moved.
    pub fn migrate_all_keys(&self, migration: &SlotMigration) -> Result<usize, RedisServerError> {
        let slot_s = migration.slot.to_string();
        let mut moved = 0;
        loop {
            let Resp::Array(Some(keys)) =
                self.nodes[migration.from].cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"])?
            else {
                return Err(fail("CLUSTER GETKEYSINSLOT did not answer an array"));
            };
            if keys.is_empty() {
                return Ok(moved);
            }
            let names: Vec<&str> = keys.iter().filter_map(Resp::as_str).collect();
            moved += self.migrate_keys(migration, &names)?;
        }
    }

    /// Ends a migration: `SETSLOT NODE` on the target, the source, then the
    /// other nodes. Keys still on the source stay there, unreachable (call
    /// [`migrate_all_keys`](Self::migrate_all_keys) first). From here
    /// clients that ask the source get `MOVED`.
    pub fn finish_migration(&self, migration: &SlotMigration) -> Result<(), RedisServerError> {
        let (from, to) = (migration.from, migration.to);
        let slot_s = migration.slot.to_string();
        for i in std::iter::once(to)
            .chain(std::iter::once(from))
            .chain((0..self.nodes.len()).filter(|i| *i != to && *i != from))
        {
            expect_ok(self.nodes[i].cmd(&[
                "CLUSTER",
                "SETSLOT",
                &slot_s,
                "NODE",
                &migration.to_id,
            ])?)?;
        }
        Ok(())
    }

    /// How many error replies starting with `code` (`ASK`, `MOVED`,
    /// `TRYAGAIN`, ...) node `node` has sent (`INFO errorstats`).
    pub fn error_replies(&self, node: usize, code: &str) -> Result<u64, RedisServerError> {
        let server = self
            .nodes
            .get(node)
            .ok_or_else(|| fail(format!("no node {node}")))?;
        let info = server.cmd(&["INFO", "errorstats"])?;
        let text = info
            .as_str()
            .ok_or_else(|| fail("INFO errorstats did not answer text"))?;
        // errorstat_ASK:count=3
        let wanted = format!("errorstat_{code}:count=");
        Ok(text
            .lines()
            .find_map(|line| line.trim().strip_prefix(wanted.as_str()))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// Sum of `calls` of commands starting with `prefix`, over all nodes.
    pub fn command_calls(&self, prefix: &str) -> Result<u64, RedisServerError> {
        self.nodes.iter().map(|n| n.command_calls(prefix)).sum()
    }
}

/// A slot migration in progress (see [`RedisCluster::begin_migration`]).
#[derive(Clone, Debug)]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
    to_id: String,
}

impl SlotMigration {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the source node (MIGRATING).
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the target node (IMPORTING).
    pub fn to(&self) -> usize {
        self.to
    }
}

/// The settings of every node: see the module docs.
const NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
    "--cluster-require-full-coverage",
    "no",
];

/// Waits until each of `nodes` reports `cluster_state:ok` and knows all of
/// them.
fn wait_ok(nodes: &[&RedisServer], limit: Duration) -> Result<(), RedisServerError> {
    let started = Instant::now();
    loop {
        let mut all_ok = true;
        for node in nodes {
            let info = node.cmd(&["CLUSTER", "INFO"])?;
            let text = info.as_str().unwrap_or_default();
            if !text.contains("cluster_state:ok")
                || !text.contains(&format!("cluster_known_nodes:{}", nodes.len()))
            {
                all_ok = false;
            }
        }
        if all_ok {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(fail(format!(
                "cluster of {} nodes not ok within {limit:?}",
                nodes.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn expect_ok(reply: Resp) -> Result<(), RedisServerError> {
    match reply {
        Resp::Simple(s) if s == "OK" => Ok(()),
        other => Err(fail(format!("cluster setup answered {other:?}"))),
    }
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field(
                "ports",
                &self.nodes.iter().map(RedisServer::port).collect::<Vec<_>>(),
            )
            .finish()
    }
}
