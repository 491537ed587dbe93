//! A Redis Cluster as we see it: our own slot map (from `CLUSTER SLOTS`)
//! and one [`Node`] per primary, each connecting and reconnecting on its
//! own, so that a primary that is down fails only the flights of its
//! slots.
//!
//! The map is asked of any connected node (then of the URL's nodes, by a
//! short-lived connection), and refreshed when a call meets `MOVED`, when
//! a node's connection is lost or comes back, and every
//! [`REFRESH_PERIOD`]. A refresh starts a node for each new primary (and
//! loads the scripts there) and drops the nodes that serve no slot.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use flightdeck_distributed::backend::{BackendError, Connection, Shard};
use fred::prelude::*;
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::inbox::{Inboxes, Moved};
use crate::node::{Node, Settings};

/// How often the slot map is refreshed when nothing asked for it.
pub(crate) const REFRESH_PERIOD: Duration = Duration::from_secs(5);

/// Hash slots of Redis Cluster (`0..SLOTS`).
pub(crate) const SLOTS: u16 = 16384;

/// The shard of flights whose slot no primary serves in our map (or while
/// the map is not known): judged apart from every primary's, and from the
/// whole store.
pub(crate) const UNMAPPED: &str = "unmapped";

/// One range of slots and the primary serving it (`host:port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) first: u16,
    pub(crate) last: u16,
    pub(crate) primary: Arc<str>,
}

#[derive(Default)]
struct State {
    /// Sorted by `first`; `None` until a node answered `CLUSTER SLOTS`.
    map: Option<Vec<Range>>,
    /// The primaries of the map (before it is known: the URL's nodes).
    nodes: HashMap<Arc<str>, Arc<Node>>,
}

/// The primary `map` (sorted by `first`) names for `slot`, if any.
fn primary_in(map: &[Range], slot: u16) -> Option<&Arc<str>> {
    let i = map.partition_point(|r| r.first <= slot).checked_sub(1)?;
    let r = &map[i];
    (slot <= r.last).then_some(&r.primary)
}

impl State {
    fn primary_of(&self, slot: u16) -> Option<&Arc<str>> {
        primary_in(self.map.as_ref()?, slot)
    }

    /// See [`Cluster::shards`].
    fn shards(&self) -> Option<Vec<Shard>> {
        let map = self.map.as_ref()?;
        let mut shards: Vec<Shard> = Vec::new();
        let mut covered = 0u32;
        for r in map {
            covered += u32::from(r.last) - u32::from(r.first) + 1;
            let shard = Shard::new(Arc::clone(&r.primary));
            if !shards.contains(&shard) {
                shards.push(shard);
            }
        }
        if covered < u32::from(SLOTS) {
            shards.push(Shard::new(UNMAPPED));
        }
        Some(shards)
    }
}

/// The cluster's slot map and nodes (see the module docs).
pub(crate) struct Cluster {
    seeds: Vec<(String, u16)>,
    settings: Settings,
    inboxes: Arc<Inboxes>,
    sources: Arc<[String]>,
    state: RwLock<State>,
    /// Wakes the refresher: a node's connection event, a `MOVED`.
    wake: Arc<Notify>,
    /// Refreshes done (successful or not), for callers that wait for one
    /// to start after their `MOVED`.
    refreshes: AtomicU64,
    refreshing: tokio::sync::Mutex<()>,
    last_error: Mutex<Option<String>>,
    /// Connected while the slot map is known and a primary is connected
    /// (see `Backend::connection`), published by the refresher.
    pub(crate) connection: watch::Sender<Connection>,
}

fn addr(host: &str, port: u16) -> Arc<str> {
    Arc::from(format!("{host}:{port}"))
}

impl Cluster {
    /// Starts a node for each of the URL's nodes (until the map says
    /// which are the primaries) and the refresher task.
    pub(crate) fn start(
        settings: Settings,
        inboxes: Arc<Inboxes>,
        sources: Arc<[String]>,
    ) -> Result<(Arc<Self>, JoinHandle<()>), BackendError> {
        let ServerConfig::Clustered { hosts, .. } = &settings.fred.server else {
            return Err(BackendError::protocol(
                "internal: a cluster backend for a URL that is not redis-cluster://",
            ));
        };
        let seeds: Vec<(String, u16)> =
            hosts.iter().map(|s| (s.host.to_string(), s.port)).collect();
        if seeds.is_empty() {
            return Err(BackendError::protocol(
                "a redis-cluster:// URL without any node",
            ));
        }
        let cluster = Arc::new(Self {
            seeds,
            settings,
            inboxes,
            sources,
            state: RwLock::new(State::default()),
            wake: Arc::new(Notify::new()),
            refreshes: AtomicU64::new(0),
            refreshing: tokio::sync::Mutex::new(()),
            last_error: Mutex::new(None),
            connection: watch::channel(Connection::NotConnected(Arc::from(
                "redis cluster slot map not known yet (connecting)",
            )))
            .0,
        });
        {
            let mut state = cluster.write();
            for (host, port) in &cluster.seeds {
                let a = addr(host, *port);
                if let Entry::Vacant(slot) = state.nodes.entry(a.clone()) {
                    slot.insert(cluster.start_node(host, *port, a)?);
                }
            }
        }
        let weak = Arc::downgrade(&cluster);
        let retry = cluster
            .settings
            .reconnect_max_delay
            .max(Duration::from_millis(50));
        let task = tokio::spawn(refresher(weak, cluster.wake.clone(), retry));
        Ok((cluster, task))
    }

    fn start_node(&self, host: &str, port: u16, a: Arc<str>) -> Result<Arc<Node>, BackendError> {
        let server = ServerConfig::Centralized {
            server: fred::types::config::Server::new(host.to_owned(), port),
        };
        Node::start(
            &self.settings,
            Some(server),
            a,
            &self.inboxes,
            Some(&self.wake),
        )
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node serving `slot`, or why there is none (unavailable: no call
    /// can be sent for it).
    pub(crate) fn node_for(&self, slot: u16) -> Result<Arc<Node>, BackendError> {
        let state = self.read();
        let primary = state.primary_of(slot).cloned();
        self.node_named(&state, primary.as_deref().unwrap_or(UNMAPPED))
    }

    /// The node of the shard `primary` ([`UNMAPPED`]: no primary serves
    /// the flight's slot, or the map is not known), or why there is none.
    fn node_named(&self, state: &State, primary: &str) -> Result<Arc<Node>, BackendError> {
        if state.map.is_none() {
            return Err(BackendError::unavailable(format!(
                "redis cluster slot map not known yet ({})",
                self.why_no_map()
            )));
        }
        if primary == UNMAPPED {
            return Err(BackendError::unavailable(
                "redis cluster slot is served by no primary",
            ));
        }
        state.nodes.get(primary).cloned().ok_or_else(|| {
            BackendError::unavailable(format!("redis cluster primary {primary} has no client"))
        })
    }

    /// Why no call can be sent to the shard named `primary` (see
    /// [`Backend::shard`](flightdeck_distributed::Backend::shard);
    /// [`UNMAPPED`] when the slot map is not known or names no primary for
    /// the flight's slot).
    pub(crate) fn refuse(&self, primary: &str) -> Option<BackendError> {
        let node = match self.node_named(&self.read(), primary) {
            Ok(node) => node,
            Err(e) => return Some(e),
        };
        // Connected, or connecting (no attempt failed yet: a new primary,
        // say): the call waits for it within its deadline.
        (!node.client.is_connected() && node.link.is_failing())
            .then(|| crate::routing::not_connected(&node))
    }

    /// The shards flights are served from now: the map's primaries, and
    /// [`UNMAPPED`] when some slot has none; `None` while the map is not
    /// known.
    pub(crate) fn shards(&self) -> Option<Vec<Shard>> {
        self.read().shards()
    }

    /// The `host:port` of the primary serving `slot`, if known.
    pub(crate) fn primary_of(&self, slot: u16) -> Option<Arc<str>> {
        self.read().primary_of(slot).cloned()
    }

    pub(crate) fn why_no_map(&self) -> String {
        match &*self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(e) => format!("no node answered CLUSTER SLOTS; last error: {e}"),
            None => "asking the nodes for CLUSTER SLOTS".to_owned(),
        }
    }

    /// Every node (the map's primaries once it is known).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        self.read().nodes.values().cloned().collect()
    }

    /// Publishes whether calls can be sent: the map is known and a
    /// primary is connected.
    pub(crate) fn publish_connection(&self) {
        let connection = if !self.has_map() {
            let why = format!(
                "redis cluster slot map not known yet ({})",
                self.why_no_map()
            );
            Connection::NotConnected(Arc::from(why))
        } else if self.nodes().iter().any(|n| n.client.is_connected()) {
            Connection::Connected
        } else {
            Connection::NotConnected(Arc::from("no redis cluster primary connected"))
        };
        self.connection.send_if_modified(|now| {
            let changed = *now != connection;
            *now = connection;
            changed
        });
    }

    /// Whether the slot map is known.
    pub(crate) fn has_map(&self) -> bool {
        self.read().map.is_some()
    }

    /// The number of refreshes done so far (see [`refreshed_since`](Self::refreshed_since)).
    pub(crate) fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Acquire)
    }

    /// Refreshes the map unless a refresh started after `seen` (a
    /// [`refreshes`](Self::refreshes) count) already did, asking `prefer`
    /// first (the node a `MOVED` named).
    pub(crate) async fn refreshed_since(&self, seen: u64, prefer: Option<&str>) {
        let _one = self.refreshing.lock().await;
        if self.refreshes() > seen {
            return;
        }
        self.refresh_locked(prefer).await;
    }

    async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        self.refresh_locked(None).await;
    }

    async fn refresh_locked(&self, prefer: Option<&str>) {
        let result = self.ask_slots(prefer).await;
        self.refreshes.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok(map) => {
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                self.install(map);
            }
            Err(e) => {
                tracing::debug!("redis cluster slot map not refreshed: {e}");
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(e);
            }
        }
    }

    /// `CLUSTER SLOTS` of the first node that answers: connected nodes
    /// (`prefer` first), then the URL's nodes that have no connected
    /// client, each by a short-lived connection.
    async fn ask_slots(&self, prefer: Option<&str>) -> Result<Vec<Range>, String> {
        let mut nodes: Vec<Arc<Node>> = self
            .nodes()
            .into_iter()
            .filter(|n| n.client.is_connected())
            .collect();
        nodes.sort_by_key(|n| Some(&*n.addr) != prefer);
        let mut last = String::from("not connected to any node");
        for node in &nodes {
            let host = node.addr.rsplit_once(':').map_or("", |(h, _)| h);
            match self.cluster_slots(&node.client).await {
                Ok(v) => match parse_slots(&v, host) {
                    Ok(map) => return Ok(map),
                    Err(e) => last = format!("{}: {e}", node.addr),
                },
                Err(e) => last = format!("{}: {e}", node.addr),
            }
        }
        // A seed that has a node reconnects on its own and wakes the
        // refresher when it is back.
        let known: HashSet<Arc<str>> = self.read().nodes.keys().cloned().collect();
        for (host, port) in &self.seeds {
            if known.contains(&addr(host, *port)) {
                continue;
            }
            let server = ServerConfig::Centralized {
                server: fred::types::config::Server::new(host.clone(), *port),
            };
            let client = match self.settings.builder(Some(server)).build() {
                Ok(c) => c,
                Err(e) => {
                    last = format!("{host}:{port}: {e}");
                    continue;
                }
            };
            let init = tokio::time::timeout(self.settings.connect_timeout, client.init()).await;
            let answer = match init {
                Ok(Ok(_)) => self.cluster_slots(&client).await,
                Ok(Err(e)) => Err(e.details().to_owned()),
                Err(_) => Err(format!(
                    "not connected within {:?}",
                    self.settings.connect_timeout
                )),
            };
            let _ = tokio::time::timeout(self.settings.command_timeout, client.quit()).await;
            match answer.and_then(|v| parse_slots(&v, host)) {
                Ok(map) => return Ok(map),
                Err(e) => last = format!("{host}:{port}: {e}"),
            }
        }
        Err(last)
    }

    async fn cluster_slots(&self, client: &Client) -> Result<Value, String> {
        let cmd = CustomCommand::new_static("CLUSTER", ClusterHash::Random, false);
        let with = client.with_options(&self.settings.options());
        let t = self.settings.command_timeout;
        match tokio::time::timeout(t, with.custom::<Value, _>(cmd, vec!["SLOTS"])).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.details().to_owned()),
            Err(_) => Err(format!("CLUSTER SLOTS timed out after {t:?}")),
        }
    }

    /// Installs `map`: a node for each new primary (its scripts loaded in
    /// the background), none for a node that serves no slot; then tells
    /// the inboxes which slots moved ([`Inboxes::map_changed`]).
    fn install(&self, map: Vec<Range>) {
        let primaries: HashSet<Arc<str>> = map.iter().map(|r| r.primary.clone()).collect();
        let mut dropped = Vec::new();
        let mut state = self.write();
        if state.map.as_ref() == Some(&map) {
            return;
        }
        for primary in &primaries {
            if state.nodes.contains_key(primary) {
                continue;
            }
            let Some((host, port)) = primary
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            else {
                continue;
            };
            match self.start_node(host, port, primary.clone()) {
                Ok(node) => {
                    tokio::spawn(load_when_connected(
                        Arc::downgrade(&node),
                        self.sources.clone(),
                        self.settings.connect_timeout + self.settings.command_timeout,
                    ));
                    state.nodes.insert(primary.clone(), node);
                }
                Err(e) => tracing::warn!("no client for redis cluster primary {primary}: {e}"),
            }
        }
        state.nodes.retain(|a, node| {
            let keep = primaries.contains(a);
            if !keep {
                dropped.push(node.clone());
            }
            keep
        });
        tracing::debug!(
            "redis cluster slot map: {} ranges on {} primaries",
            map.len(),
            primaries.len()
        );
        let moved: Vec<Moved> = moved_slots(state.map.as_deref(), &map)
            .into_iter()
            .map(|(slots, primary)| Moved {
                slots,
                to: primary
                    .and_then(|p| state.nodes.get(&p))
                    .map(|node| node.subscriber.clone()),
            })
            .collect();
        state.map = Some(map);
        drop(state);
        // Dropped outside the lock: the last reference quits the clients.
        drop(dropped);
        if !moved.is_empty() {
            let within = self.settings.connect_timeout + self.settings.command_timeout;
            self.inboxes.map_changed(&moved, within);
        }
    }
}

/// The slots whose primary in `after` is not the one in `before` (`None`:
/// no map yet), in runs of consecutive slots with the same new primary
/// (`None`: no primary serves them now). Both maps are constant between
/// any two of their ranges' bounds, so each stretch between two bounds is
/// looked up once.
fn moved_slots(
    before: Option<&[Range]>,
    after: &[Range],
) -> Vec<(RangeInclusive<u16>, Option<Arc<str>>)> {
    let mut bounds: Vec<u32> = vec![0, u32::from(SLOTS)];
    for r in before.into_iter().flatten().chain(after) {
        bounds.extend([u32::from(r.first), u32::from(r.last) + 1]);
    }
    bounds.sort_unstable();
    bounds.dedup();
    let mut moved: Vec<(RangeInclusive<u16>, Option<Arc<str>>)> = Vec::new();
    for stretch in bounds.windows(2) {
        // Below `SLOTS`, so a u16.
        let (Ok(first), Ok(last)) = (u16::try_from(stretch[0]), u16::try_from(stretch[1] - 1))
        else {
            continue;
        };
        let now = primary_in(after, first);
        if before.and_then(|map| primary_in(map, first)) == now {
            continue;
        }
        match moved.last_mut() {
            Some((run, to))
                if u32::from(*run.end()) + 1 == u32::from(first) && to.as_ref() == now =>
            {
                *run = *run.start()..=last;
            }
            _ => moved.push((first..=last, now.cloned())),
        }
    }
    moved
}

/// Refreshes the map when woken, every [`REFRESH_PERIOD`], and every
/// `retry` while it is not known.
async fn refresher(cluster: Weak<Cluster>, wake: Arc<Notify>, retry: Duration) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        c.refresh().await;
        c.publish_connection();
        let pause = if c.has_map() { REFRESH_PERIOD } else { retry };
        drop(c);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Loads the scripts on a new primary once it is connected, within
/// `within` (best effort: a node that lacks them gets them with its first
/// call, on `NOSCRIPT`). Only the client is held while it connects, not
/// the node: a node dropped meanwhile is not loaded.
async fn load_when_connected(node: Weak<Node>, sources: Arc<[String]>, within: Duration) {
    let until = tokio::time::Instant::now() + within;
    let Some(client) = node.upgrade().map(|n| n.client.clone()) else {
        return;
    };
    // At once when it is connected, else with its next connection.
    let connected = tokio::time::timeout_at(until, client.wait_for_connect()).await;
    if !matches!(connected, Ok(Ok(()))) {
        return;
    }
    let Some(n) = node.upgrade() else { return };
    for src in sources.iter() {
        let load = n.client.script_load::<String, _>(src.as_str());
        match tokio::time::timeout_at(until, load).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!("script not preloaded on {}: {e}", n.addr),
            Err(_) => tracing::debug!("script not preloaded on {}: timed out", n.addr),
        }
    }
}

/// Parses a `CLUSTER SLOTS` reply: `[[first, last, [host, port, id, ...],
/// replicas...], ...]`. A host that is empty or `?` (the node does not know
/// its own address) is `asked`, the host of the node that answered.
pub(crate) fn parse_slots(v: &Value, asked: &str) -> Result<Vec<Range>, String> {
    let Value::Array(ranges) = v else {
        return Err(format!("CLUSTER SLOTS answered a {:?}", v.kind()));
    };
    let int = |v: &Value| -> Option<i64> {
        match v {
            Value::Integer(i) => Some(*i),
            other => other.as_str()?.parse().ok(),
        }
    };
    let mut map = Vec::with_capacity(ranges.len());
    for range in ranges {
        let bad = || format!("unreadable CLUSTER SLOTS entry {range:?}");
        let Value::Array(items) = range else {
            return Err(bad());
        };
        let (Some(first), Some(last), Some(Value::Array(primary))) = (
            items.first().and_then(int),
            items.get(1).and_then(int),
            items.get(2),
        ) else {
            return Err(bad());
        };
        let host = primary.first().and_then(Value::as_str).ok_or_else(bad)?;
        let port = primary.get(1).and_then(int).ok_or_else(bad)?;
        let host = if host.is_empty() || host == "?" {
            asked.to_owned()
        } else {
            host.to_string()
        };
        let (Ok(first), Ok(last), Ok(port)) = (
            u16::try_from(first),
            u16::try_from(last),
            u16::try_from(port),
        ) else {
            return Err(bad());
        };
        if first > last || last >= SLOTS {
            return Err(bad());
        }
        map.push(Range {
            first,
            last,
            primary: addr(&host, port),
        });
    }
    if map.is_empty() {
        return Err("CLUSTER SLOTS: no slot is served".to_owned());
    }
    map.sort_by_key(|r| r.first);
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Integer(first),
            Value::Integer(last),
            Value::Array(vec![
                Value::String(host.into()),
                Value::Integer(port),
                Value::String("id".into()),
            ]),
        ])
    }

    #[test]
    fn slots_parse_and_route() {
        let v = Value::Array(vec![
            entry(5461, 10922, "10.0.0.2", 7001),
            entry(0, 5460, "", 7000),
            entry(10923, 16383, "10.0.0.3", 7002),
        ]);
        let map = parse_slots(&v, "10.0.0.1").unwrap();
        let state = State {
            map: Some(map),
            nodes: HashMap::new(),
        };
        assert_eq!(state.primary_of(0).map(|a| &**a), Some("10.0.0.1:7000"));
        assert_eq!(state.primary_of(5461).map(|a| &**a), Some("10.0.0.2:7001"));
        assert_eq!(state.primary_of(16383).map(|a| &**a), Some("10.0.0.3:7002"));
        let holes = State {
            map: Some(parse_slots(&Value::Array(vec![entry(10, 20, "h", 1)]), "x").unwrap()),
            nodes: HashMap::new(),
        };
        assert_eq!(holes.primary_of(9), None);
        assert_eq!(holes.primary_of(21), None);
        assert!(holes.primary_of(15).is_some());
        // The shards flights are served from: each primary once, and
        // `unmapped` while some slot has none.
        assert_eq!(
            state.shards(),
            Some(vec![
                Shard::new("10.0.0.1:7000"),
                Shard::new("10.0.0.2:7001"),
                Shard::new("10.0.0.3:7002"),
            ])
        );
        assert_eq!(
            holes.shards(),
            Some(vec![Shard::new("h:1"), Shard::new(UNMAPPED)])
        );
        let unknown = State {
            map: None,
            nodes: HashMap::new(),
        };
        assert_eq!(unknown.shards(), None);
    }

    /// A slot map change names the slots whose primary changed, in runs
    /// with their new primary (`None`: none serves them now); every
    /// served slot moved when there was no map.
    #[test]
    fn moved_slots_are_those_whose_primary_changed() {
        let map = |entries: Vec<Value>| parse_slots(&Value::Array(entries), "x").unwrap();
        let three = map(vec![
            entry(0, 5460, "a", 1),
            entry(5461, 10922, "b", 1),
            entry(10923, 16383, "c", 1),
        ]);
        let p = |s: &str| Some(Arc::<str>::from(s));
        assert_eq!(moved_slots(Some(&three), &three), []);
        // 5001-5460 went from a to b, and nobody serves c's any more.
        let after = map(vec![entry(0, 5000, "a", 1), entry(5001, 10922, "b", 1)]);
        assert_eq!(
            moved_slots(Some(&three), &after),
            [(5001..=5460, p("b:1")), (10923..=16383, None)]
        );
        // Back: b's old slots stay with b; the others moved.
        assert_eq!(
            moved_slots(Some(&after), &three),
            [(5001..=5460, p("a:1")), (10923..=16383, p("c:1"))]
        );
        // The first map: every slot it serves.
        assert_eq!(
            moved_slots(None, &after),
            [(0..=5000, p("a:1")), (5001..=10922, p("b:1"))]
        );
        // One slot moving alone, at either end.
        let edges = map(vec![
            entry(0, 0, "c", 1),
            entry(1, 5460, "a", 1),
            entry(5461, 10922, "b", 1),
            entry(10923, 16382, "c", 1),
            entry(16383, 16383, "a", 1),
        ]);
        assert_eq!(
            moved_slots(Some(&three), &edges),
            [(0..=0, p("c:1")), (16383..=16383, p("a:1"))]
        );
    }

    #[test]
    fn unreadable_slots_are_errors() {
        for bad in [
            Value::Null,
            Value::Array(vec![Value::Integer(1)]),
            Value::Array(vec![entry(5, 1, "h", 1)]),
            Value::Array(vec![entry(0, 16384, "h", 1)]),
            Value::Array(vec![entry(0, 1, "h", 70000)]),
        ] {
            assert!(parse_slots(&bad, "x").is_err(), "{bad:?}");
        }
    }
}
