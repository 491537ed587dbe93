use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, FlightId,
    LeaseTerms, OwnerToken, Released, Renewal, Shard, Subscription,
};
use fred::bytes_utils::Str;
use fred::prelude::*;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::args::{Names, ScriptArgs};
use crate::classify::classify;
use crate::connect::timed_out;
use crate::eval::{ABANDON, ACQUIRE, COMMIT, HEARTBEAT, INVALIDATE, RELEASE, SCRIPTS};
use crate::reply::{answer, bad_reply, bytes, gen, parse_acquire, released};
use crate::routing::{not_connected, Topology};
use crate::stored::writes_refused;
use crate::subs::{Channel, SubGuard, Subs};

/// The Redis coordination backend (see the crate docs). Cheap to clone:
/// clones share the clients and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) topology: Topology,
    pub(crate) opts: Options,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    /// How long calls on a migrating slot are sent again (at most
    /// `timeout`; see [`crate::RedisConfig::migration_retry`]).
    pub(crate) migration_retry: Duration,
    /// The shortest call timeout of the layers built on this backend
    /// (`Backend::call_timeout_hint`), in nanoseconds; `u64::MAX` until
    /// one is told.
    pub(crate) cut_after: AtomicU64,
    pub(crate) sources: Arc<[String]>,
    /// The scripts' SHAs, shared with every call that names them.
    pub(crate) shas: [Str; SCRIPTS],
    pub(crate) subs: Arc<Subs>,
    pub(crate) tasks: Vec<JoinHandle<()>>,
}

impl Inner {
    /// Until when a call started now may wait before it is sent (for a
    /// connection being made, a migrating slot): one command timeout, and
    /// clear of the moment its caller cuts it off (the shortest call
    /// timeout told, less a tenth of it and at least 20 ms), so that a
    /// call that was never sent ends unavailable, not cut off as outcome
    /// unknown.
    pub(crate) fn unsent_until(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        let told = Duration::from_nanos(self.cut_after.load(Ordering::Relaxed));
        let margin = (told / 10).max(Duration::from_millis(20));
        now + self.timeout.min(told.saturating_sub(margin))
    }
}

impl RedisBackend {
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

    /// The command client, for tests and diagnostics: the server's, or in
    /// a cluster one primary's (a connected one if any).
    pub fn client(&self) -> Client {
        let nodes = self.inner.topology.nodes();
        let node = nodes
            .iter()
            .find(|n| n.client.is_connected())
            .or(nodes.first());
        // A cluster always has a node (the URL's, then the primaries).
        node.map_or_else(Client::default, |n| n.client.clone())
    }

    /// The arguments of a script call on `flight` (room for `args` of its
    /// own), its keys written: the flight's record and channel
    /// ([`keys`](Self::keys)), and with `invalidation` (INVALIDATE and
    /// READ) its last invalidation (`…:f2:i`, see [`scripts`](crate::scripts)).
    pub(crate) fn script_args(&self, flight: &FlightId, names: Names, args: usize) -> ScriptArgs {
        ScriptArgs::new(&self.inner.prefix, flight, names, args)
    }

    /// The Redis Cluster hash slot of the flight, shared by all its names
    /// ([`keys`](Self::keys)): their hash tag is the digest in hex, and a
    /// name's slot is its hash tag's. To see which slots (and so which
    /// primary) a set of flights lands on, or to move them in a reshard.
    pub fn slot(&self, flight: &FlightId) -> u16 {
        fred::util::redis_keyslot(flight.to_hex().as_bytes())
    }

    /// How many channels this node is subscribed to.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.subs.channels().len()
    }

    /// Closes every connection.
    pub async fn quit(&self) {
        for node in self.inner.topology.nodes() {
            node.quit().await;
        }
    }
}

/// The version of the key layout, part of every key name (`…:f2`,
/// `…:f2:done`). The first layout (keys `…:lease`, `…:state`, `…:result`,
/// channel `…:done`) had none; a later incompatible layout takes a new
/// name, so nodes of two layouts never read each other's keys (see the
/// crate docs on rolling upgrades).
pub const LAYOUT: &str = "f2";

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// The nodes quit their clients when the last reference to them goes.
impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Classifies a failed (S)SUBSCRIBE. fred's subscriber can give up with
/// "Too many failed write attempts." (its attempts used up by a
/// reconnect): no subscription was made, which is unavailable, not a
/// protocol error (a follower polls instead). Anything else as for every
/// command (a `MOVED` past the deadline is unavailable too).
fn subscribe_error(e: fred::error::Error) -> BackendError {
    if e.details().starts_with("Too many failed write attempts") {
        BackendError::unavailable(format!("redis subscription not made: {}", e.details()))
    } else {
        classify(e)
    }
}

impl RedisBackend {
    /// (S)SUBSCRIBEs `channel` on the subscriber of the node serving
    /// `slot`, following `MOVED` as [`send`](Self::eval) does, within one
    /// command timeout. The caller holds the channel's [`Subs::serial`].
    async fn subscribe_on_owner(&self, channel: &str, slot: u16) -> Result<(), BackendError> {
        let subs = &self.inner.subs;
        let now = tokio::time::Instant::now();
        let deadline = now + subs.timeout;
        let unsent = self.inner.unsent_until(now).min(deadline);
        let retry_until = unsent.min(now + self.inner.migration_retry);
        loop {
            let refreshes = self.refreshes();
            let node = self.inner.topology.route_within(slot, unsent).await?;
            if !node.subscriber.is_connected() {
                // fred would queue the SUBSCRIBE until a reconnect.
                return Err(not_connected(&node));
            }
            // Set before it is sent: a follower that gives up meanwhile
            // unsubscribes there.
            if let Some(ch) = subs.channels().get_mut(channel) {
                ch.on = Some(node.subscriber.clone());
            }
            let res = tokio::time::timeout_at(
                deadline,
                subs.subscribe(&node.subscriber, channel.to_owned()),
            )
            .await
            .map_err(|_| timed_out("SUBSCRIBE", subs.timeout))?;
            match res {
                Ok(()) => return Ok(()),
                Err(e)
                    if self
                        .retry_after(&e, (slot, &node.addr), refreshes, retry_until)
                        .await => {}
                Err(e) => return Err(subscribe_error(e)),
            }
        }
    }
}

impl Backend for RedisBackend {
    fn call_timeout_hint(&self, timeout: Duration) {
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.inner.cut_after.fetch_min(nanos, Ordering::Relaxed);
    }

    /// While the connection attempts fail (Redis down at start, or since),
    /// every flight is refused before its first call is built:
    /// *unavailable*, nothing sent. In a cluster: only while no primary at
    /// all is connected and each has failed a connection attempt (see
    /// [`reject_early`](Self::reject_early) for one flight's primary).
    fn unreachable(&self) -> Option<BackendError> {
        match &self.inner.topology {
            Topology::Single(node) => node.link.refuse(&node.client),
            Topology::Cluster(cluster) => {
                let nodes = cluster.nodes();
                if nodes.iter().any(|n| n.client.is_connected())
                    || !nodes.iter().all(|n| n.link.is_failing())
                {
                    return None;
                }
                let why = nodes
                    .first()
                    .map_or_else(String::new, |n| n.link.why_not_connected());
                Some(BackendError::unavailable(format!(
                    "no redis cluster primary connected: {why}"
                )))
            }
        }
    }

    /// In a cluster: refused (*unavailable*, nothing sent) when the
    /// shard's primary has no connection, or no primary serves the
    /// flight's slot in our map (the shard `unmapped`, also while the map
    /// is not known); flights of the other primaries go on. For
    /// [`Shard::WHOLE`] (a caller that did not name the flight's shard),
    /// and for one server: as [`unreachable`](Self::unreachable).
    fn reject_early(&self, shard: &Shard) -> Option<BackendError> {
        match (&self.inner.topology, shard.name()) {
            (Topology::Cluster(cluster), Some(primary)) => cluster.refuse(primary),
            _ => self.unreachable(),
        }
    }

    /// In a cluster, once the slot map is known: its primaries (and
    /// `unmapped` while some slot has none).
    fn shards(&self) -> Option<Vec<Shard>> {
        match &self.inner.topology {
            Topology::Cluster(cluster) => cluster.shards(),
            Topology::Single(_) => None,
        }
    }

    /// In a cluster.
    fn sharded(&self) -> bool {
        matches!(self.inner.topology, Topology::Cluster(_))
    }

    /// In a cluster, the primary serving the flight's slot (`host:port`,
    /// by our slot map; `unmapped` while the map is not known or names no
    /// primary for the slot). One server: [`Shard::WHOLE`].
    fn shard(&self, flight: &FlightId) -> Shard {
        self.inner.topology.shard(self.slot(flight))
    }

    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            let args = self
                .script_args(flight, Names::Record, 4)
                .text(token.as_str())
                .millis(terms.lease)
                .text(if terms.allow_takeover { "1" } else { "0" })
                .millis(terms.record_ttl());
            match self.eval(ACQUIRE, args).await {
                Ok(v) => parse_acquire(&v),
                Err(e) => match writes_refused(&e) {
                    // The server refuses writes (ACQUIRE may write), not
                    // reads: a stored result is still replayed.
                    Some(reason) => self.replay_refused(flight, e, reason).await,
                    None => Err(e),
                },
            }
        })
    }

    /// From the invalidation key INVALIDATE leaves for `state_ttl`.
    fn invalidated_since<'a>(
        &'a self,
        flight: &'a FlightId,
        generation: u64,
    ) -> BackendFuture<'a, Option<bool>> {
        Box::pin(async move { self.invalidated_after(flight, generation).await.map(Some) })
    }

    /// `WAIT replicas timeout` on the connection to the flight's node (in
    /// a cluster, the primary serving its slot: the one that ran the
    /// commit, unless the slot moved since). Redis answers nothing else on
    /// that connection meanwhile.
    fn wait_replicas<'a>(
        &'a self,
        flight: &'a FlightId,
        replicas: u32,
        timeout: Duration,
    ) -> BackendFuture<'a, Option<u32>> {
        Box::pin(async move { self.wait_for(flight, replicas, timeout).await.map(Some) })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        Box::pin(async move {
            let args = self
                .script_args(flight, Names::Record, 4)
                .text(token.as_str())
                .uint(generation)
                .millis(terms.lease)
                .millis(terms.record_ttl());
            let v = self.eval(HEARTBEAT, args).await?;
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
            let argv = self
                .script_args(flight, Names::Flight, 5)
                .text(token.as_str())
                .uint(generation)
                .value(bytes(&args.payload))
                .millis(args.ttl)
                .text(if args.payload.len() <= args.inline_below {
                    "1"
                } else {
                    "0"
                });
            let v = self.eval(COMMIT, argv).await?;
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
            let argv = self
                .script_args(flight, Names::Flight, 4)
                .text(token.as_str())
                .uint(generation)
                .value(Value::Bytes(args.failure.clone().unwrap_or_default()))
                .millis_or_zero(args.failure_ttl);
            let v = self.eval(ABANDON, argv).await?;
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
            let argv = self
                .script_args(flight, Names::Flight, 2)
                .text(token.as_str())
                .millis(state_ttl);
            let v = self.eval(RELEASE, argv).await?;
            released("RELEASE", &v)
        })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            let args = self.script_args(flight, Names::All, 1).millis(state_ttl);
            let v = self.eval(INVALIDATE, args).await?;
            gen(&v).ok_or_else(|| bad_reply("INVALIDATE", &v))
        })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        Box::pin(async move {
            let subs = &self.inner.subs;
            let [_, channel] = self.keys(flight);
            let slot = self.slot(flight);
            let serial = subs.serial(&channel).await;
            let (rx, new) = {
                let mut channels = subs.channels();
                match channels.get_mut(&channel) {
                    Some(ch) => {
                        ch.refs += 1;
                        (ch.tx.subscribe(), false)
                    }
                    None => {
                        let (tx, rx) = broadcast::channel(16);
                        let ch = Channel {
                            tx,
                            refs: 1,
                            on: None,
                            joinable: false,
                        };
                        channels.insert(channel.clone(), ch);
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
                let resyncs = subs.resyncs();
                self.subscribe_on_owner(&channel, slot).await?;
                subs.confirmed(&channel, resyncs);
            }
            drop(serial);
            Ok(Subscription::new(rx, guard))
        })
    }

    /// While another follower of the flight on this node holds a
    /// subscription that Redis confirmed, its subscriber is connected, and
    /// no reconnect (or moved slot) came since. Costs one atomic load when
    /// this node follows nothing.
    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        let (rx, guard) = self.inner.subs.join(|| {
            let [_, channel] = self.keys(flight);
            channel
        })?;
        Some(Subscription::new(rx, guard))
    }
}

#[cfg(test)]
mod tests {
    use flightdeck_core::{FlightKey, StageName};
    use flightdeck_distributed::FlightId;

    use crate::{RedisBackend, RedisConfig};

    #[tokio::test]
    async fn a_flight_slot_is_its_names_slot() {
        let b = RedisBackend::new(RedisConfig::new("redis://127.0.0.1:1").prefix("p:q")).unwrap();
        let stage = StageName::new("slots").unwrap();
        for i in 0..100 {
            let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), format!("r{i}")));
            for name in b.keys(&flight) {
                assert_eq!(fred::util::redis_keyslot(name.as_bytes()), b.slot(&flight));
            }
        }
    }

    /// The scripts get the names `keys` gives (and the invalidation's).
    #[tokio::test]
    async fn script_keys_are_the_flight_names() {
        let b = RedisBackend::new(RedisConfig::new("redis://127.0.0.1:1").prefix("p:q")).unwrap();
        let flight = FlightId::of(&FlightKey::from_bytes(StageName::new("n").unwrap(), "r"));
        let [record, channel] = b.keys(&flight);
        let argv = b
            .script_args(&flight, crate::args::Names::All, 0)
            .into_argv();
        let names: Vec<_> = argv[2..].iter().map(|v| v.as_bytes().unwrap()).collect();
        let invalidation = format!("{record}:i");
        let want = [
            record.as_bytes(),
            channel.as_bytes(),
            invalidation.as_bytes(),
        ];
        assert_eq!(names, want);
        assert_eq!(argv[1].as_bytes(), Some(&b"3"[..]));
    }
}
