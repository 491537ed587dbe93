use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendError, BackendFuture, CommitArgs, Committed,
    ConnectionWatch, FlightId, LeaseTerms, OwnerToken, Released, Renewal, Shard, Subscription,
};
use fred::bytes_utils::Str;
use fred::prelude::*;
use tokio::task::JoinHandle;

use crate::args::{millis, millis_or_zero, Names, ScriptArgs};
use crate::classify::classify;
use crate::clock::ServerClocks;
use crate::connect::timed_out;
use crate::eval::{ABANDON, ACQUIRE, COMMIT, HEARTBEAT, INVALIDATE, RELEASE, SCRIPTS};
use crate::inbox::Inboxes;
use crate::reply::{bytes, committed, invalidated, parse_timed_acquire, released, renewal};
use crate::routing::{not_connected, Topology};
use crate::stored::writes_refused;

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
    /// The servers' clocks as the ACQUIRE replies show them, for the
    /// not-after deadline of the next ACQUIRE.
    pub(crate) clocks: ServerClocks,
    pub(crate) sources: Arc<[String]>,
    /// The scripts' SHAs, shared with every call that names them.
    pub(crate) shas: [Str; SCRIPTS],
    pub(crate) inboxes: Arc<Inboxes>,
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

    /// When a call started `now` is given up, as outcome unknown: after
    /// one command timeout, or the shortest call timeout told, or the
    /// caller's own deadline `not_after`, whichever comes first.
    pub(crate) fn given_up_at(
        &self,
        now: tokio::time::Instant,
        not_after: Option<tokio::time::Instant>,
    ) -> tokio::time::Instant {
        let told = Duration::from_nanos(self.cut_after.load(Ordering::Relaxed));
        let at = now + self.timeout.min(told);
        not_after.map_or(at, |t| t.min(at))
    }
}

/// What an ACQUIRE that ran past its not-after answers: nothing granted,
/// nothing changed; the server was slow (frozen, or the call resent after
/// its caller gave up), so retry as after an unavailable server.
fn too_late() -> BackendError {
    BackendError::unavailable(
        "ACQUIRE reached redis after its caller gave it up (LATE): nothing granted",
    )
}

impl RedisBackend {
    /// One ACQUIRE (see [`Backend::acquire_with`]), sent `now`, with the
    /// not-after of a call given up at `give_up`; `None` when the script
    /// answered `LATE`.
    #[allow(clippy::too_many_arguments)]
    async fn acquire_once(
        &self,
        flight: &FlightId,
        token: &OwnerToken,
        ask: Ask,
        terms: &LeaseTerms,
        slot: u16,
        now: tokio::time::Instant,
        give_up: tokio::time::Instant,
    ) -> Result<Option<Acquired>, BackendError> {
        let not_after = self.inner.clocks.not_after(slot, now, give_up);
        // The short arguments packed into one (see `scripts::ACQUIRE`):
        // each argument more costs fred and Redis a bulk string. Then the
        // inbox, not copied on one server.
        let args = || {
            let args = self
                .script_args(flight, Names::Record, 2)
                .string(token.as_bytes())
                .num(millis(terms.lease))
                .num(millis(terms.record_ttl()))
                .num_or_none(ask.follows)
                .num_or_none(not_after)
                .flag(terms.allow_takeover)
                .flag(ask.stale)
                .flag(ask.early)
                .end();
            self.inner.inboxes.name_in(slot, args)
        };
        match self.eval(ACQUIRE, args).await {
            Ok(v) => {
                let (answer, server_ms) = parse_timed_acquire(&v)?;
                let at = tokio::time::Instant::now();
                self.inner.clocks.saw(slot, server_ms, at);
                Ok(answer)
            }
            Err(e) => match writes_refused(&e) {
                // The server refuses writes (ACQUIRE may write), not
                // reads: a stored result is still replayed.
                Some(reason) => self
                    .replay_refused(flight, ask.stale, e, reason)
                    .await
                    .map(Some),
                None => Err(e),
            },
        }
    }

    /// The Redis name of a flight's record, the one key it stores. It
    /// carries the layout's version ([`LAYOUT`]), so nodes of another
    /// layout never read it.
    pub fn record_key(&self, flight: &FlightId) -> String {
        format!("{}:{{{}}}:{LAYOUT}", self.inner.prefix, flight.to_hex())
    }

    /// This node's inbox for flights of `flight`'s slot: the pub/sub
    /// channel where it hears that a flight it follows ended (one per
    /// backend on one server; one per hash slot in a cluster). See the
    /// crate docs.
    pub fn inbox(&self, flight: &FlightId) -> String {
        String::from_utf8_lossy(&self.inner.inboxes.name(self.slot(flight))).into_owned()
    }

    /// The arguments of a script call on `flight` (room for `args` of its
    /// own), its keys written: the flight's record
    /// ([`record_key`](Self::record_key)), and for INVALIDATE and READ its
    /// last invalidation (`…:f5:i`, see [`scripts`](crate::scripts)).
    pub(crate) fn script_args(&self, flight: &FlightId, names: Names, args: usize) -> ScriptArgs {
        ScriptArgs::new(&self.inner.prefix, flight, names, args)
    }

    /// The Redis Cluster hash slot of the flight, shared by all its names
    /// ([`record_key`](Self::record_key), its invalidation, and this
    /// node's [`inbox`](Self::inbox) for it): their hash tags hash to it.
    /// To see which slots (and so which primary) a set of flights lands
    /// on, or to move them in a reshard.
    pub fn slot(&self, flight: &FlightId) -> u16 {
        fred::util::redis_keyslot(&flight.digest().hex())
    }

    /// How many inboxes this node has subscribed to (one on one server;
    /// in a cluster one per slot it followed flights in).
    pub fn subscribed_channels(&self) -> usize {
        self.inner.inboxes.count()
    }

    /// How many flights this node's followers wait on now, as its inboxes
    /// see them (a follower is counted from its first wait).
    pub fn followed_flights(&self) -> usize {
        self.inner.inboxes.followed()
    }

    /// Closes every connection.
    pub async fn quit(&self) {
        for node in self.inner.topology.nodes() {
            node.quit().await;
        }
    }
}

/// The version of the key layout, part of every key and channel name
/// (`…:f5`, `…:f5:i`, the inboxes' `…:f5:n:…`). The first layout (keys
/// `…:lease`, `…:state`, `…:result`, channel `…:done`) had none, the
/// second was `f2` (channel per flight `…:f2:done`), the third `f3` (a
/// result dropped by the next grant, no freshness), the fourth `f4` (no
/// stale results: no commit time, stale window, work time or throttle);
/// each incompatible layout takes a new name, so nodes of two layouts
/// never read each other's keys (see the crate docs on rolling upgrades).
pub const LAYOUT: &str = "f5";

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
    /// (S)SUBSCRIBEs `slot`'s inbox on the subscriber of the node serving
    /// `slot` ([`Inboxes::subscribe_on`]), following `MOVED` as
    /// [`send`](Self::eval) does, within one command timeout: what
    /// [`Inboxes::subscribe`] asks for when the inbox is not in force.
    async fn subscribe_on_owner(&self, slot: u16) -> Result<(), BackendError> {
        let timeout = self.inner.timeout;
        let now = tokio::time::Instant::now();
        let deadline = now + timeout;
        let unsent = self.inner.unsent_until(now).min(deadline);
        let retry_until = unsent.min(now + self.inner.migration_retry);
        loop {
            let refreshes = self.refreshes();
            let node = self.inner.topology.route_within(slot, unsent).await?;
            if !node.subscriber.is_connected() {
                // fred would queue the SUBSCRIBE until a reconnect.
                return Err(not_connected(&node));
            }
            let subscribe = self.inner.inboxes.subscribe_on(slot, &node.subscriber);
            let res = tokio::time::timeout_at(deadline, subscribe)
                .await
                .map_err(|_| timed_out("SUBSCRIBE", timeout))?;
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

    /// The record's name, as the inboxes' messages carry it.
    fn record_bytes(&self, flight: &FlightId) -> Bytes {
        Bytes::from(self.record_key(flight))
    }

    /// The slot a flight's names hash to; 0 on one server, where no slot
    /// is worked out.
    fn slot_of(&self, flight: &FlightId) -> u16 {
        match self.inner.topology {
            Topology::Cluster(_) => self.slot(flight),
            Topology::Single(_) => 0,
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

    /// One server: whether its command client is connected (not until
    /// its first connection is made). A cluster: whether its slot map is
    /// known and a primary is connected.
    fn connection(&self) -> ConnectionWatch {
        // Brought up to date first: fred may tell a connection (what
        // `ready` waits for) before its event reaches our tasks.
        match &self.inner.topology {
            Topology::Single(node) => {
                node.link.connected_now(&node.client);
                node.link.connection.subscribe()
            }
            Topology::Cluster(cluster) => {
                cluster.publish_connection();
                cluster.connection.subscribe()
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

    /// ACQUIRE, naming the generation followed (`''` for none),
    /// whether it asks for stale results and for an early refresh (`1`
    /// or `0` each), and its not-after: when this call is given up (one
    /// command timeout, the shortest call timeout told, or
    /// [`Ask::not_after`], whichever is first) in the server's time as
    /// the last reply from the flight's node showed it (`''` before the
    /// first). Past it the script grants nothing and answers `LATE`:
    /// read while this call still waits (the estimate lagged: the reply it
    /// came from was read late), it is asked once more with the clock the
    /// `LATE` answer carried; otherwise it is returned as *unavailable*.
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        // Allocated first, then written: the future (~7.5 KB, fred's
        // command future inside) is made in its box, not on the stack
        // and copied in whole as `Box::pin(async move { … })` does.
        let fut = Box::write(Box::new_uninit(), async move {
            let now = tokio::time::Instant::now();
            let slot = self.slot_of(flight);
            let give_up = self.inner.given_up_at(now, ask.not_after);
            // A LATE answer read while this call still waits means the
            // estimate of the server's clock lagged (the answer corrects
            // it): asked once more, with the same give-up time.
            let first = self.acquire_once(flight, token, ask, terms, slot, now, give_up);
            let answer = match first.await? {
                None if tokio::time::Instant::now() < give_up => {
                    let now = tokio::time::Instant::now();
                    self.acquire_once(flight, token, ask, terms, slot, now, give_up)
                        .await?
                }
                answer => answer,
            };
            answer.ok_or_else(too_late)
        });
        Box::into_pin(fut)
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
            let args = || {
                self.script_args(flight, Names::Record, 4)
                    .bytes(token.as_bytes())
                    .uint(generation)
                    .millis(terms.lease)
                    .millis(terms.record_ttl())
            };
            renewal(&self.eval(HEARTBEAT, args).await?)
        })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        // When it was sent, in the server's time (see `CommitArgs::sent`),
        // as the last ACQUIRE reply from its slot lets the client tell.
        let sent = args.sent.and_then(|sent| {
            let now = tokio::time::Instant::now();
            self.inner.clocks.not_after(self.slot_of(flight), now, sent)
        });
        Box::pin(async move {
            // The short arguments packed into one (see `scripts::COMMIT`),
            // then the payload, not copied.
            let argv = || {
                self.script_args(flight, Names::Record, 2)
                    .string(token.as_bytes())
                    .digits(generation)
                    .digits(millis_or_zero(args.work_time))
                    .num(millis_or_zero(args.ttl))
                    .num(millis(args.retain))
                    .num(millis_or_zero(args.stale_for))
                    .num_or_none(sent)
                    .flag(args.payload.len() <= args.inline_below)
                    .end()
                    .value(bytes(&args.payload))
            };
            committed(&self.eval(COMMIT, argv).await?)
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
            let argv = || {
                self.script_args(flight, Names::Record, 5)
                    .bytes(token.as_bytes())
                    .uint(generation)
                    .value(Value::Bytes(args.failure.clone().unwrap_or_default()))
                    .millis_or_zero(args.failure_ttl)
                    .millis_or_zero(args.retry_after)
            };
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
            let argv = || {
                self.script_args(flight, Names::Record, 2)
                    .bytes(token.as_bytes())
                    .millis(state_ttl)
            };
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
            let args = || {
                self.script_args(flight, Names::WithInvalidation, 1)
                    .millis(state_ttl)
            };
            invalidated(&self.eval(INVALIDATE, args).await?)
        })
    }

    /// Subscribes this node's inbox for the flight's slot, if it is not
    /// in force yet, and registers a follower of the flight on it. The
    /// follower then re-checks: that ACQUIRE names the inbox.
    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        Box::pin(async move {
            let slot = self.slot_of(flight);
            let record = self.record_bytes(flight);
            let subscribe = || self.subscribe_on_owner(slot);
            self.inner.inboxes.subscribe(slot, record, subscribe).await
        })
    }

    /// While this node's inbox for the flight's slot is in force (and on
    /// one server its subscriber connected): every ACQUIRE names the
    /// inbox, so a flight that turns out to follow hears of every end of
    /// the grant after its ACQUIRE ran. Opened (registered) only when a
    /// follower first reads it; costs an atomic load or two otherwise.
    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        let mark = self.inner.inboxes.join(self.slot_of(flight))?;
        let (backend, flight) = (self.clone(), *flight);
        Some(Subscription::deferred(move || {
            let record = backend.record_bytes(&flight);
            backend.inner.inboxes.follow(record, mark)
        }))
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
            let record = b.record_key(&flight);
            for name in [record.clone(), format!("{record}:i")] {
                assert_eq!(fred::util::redis_keyslot(name.as_bytes()), b.slot(&flight));
            }
        }
    }

    /// The scripts get the names `record_key` gives (and the invalidation's).
    #[tokio::test]
    async fn script_keys_are_the_flight_names() {
        let b = RedisBackend::new(RedisConfig::new("redis://127.0.0.1:1").prefix("p:q")).unwrap();
        let flight = FlightId::of(&FlightKey::from_bytes(StageName::new("n").unwrap(), "r"));
        let record = b.record_key(&flight);
        let argv = b
            .script_args(&flight, crate::args::Names::WithInvalidation, 0)
            .into_argv();
        let names: Vec<_> = argv[2..].iter().map(|v| v.as_bytes().unwrap()).collect();
        let invalidation = format!("{record}:i");
        let want = [record.as_bytes(), invalidation.as_bytes()];
        assert_eq!(names, want);
        assert_eq!(argv[1].as_bytes(), Some(&b"2"[..]));
    }
}
