//! The Redis coordination backend of flightdeck's distributed
//! single-flight, on [fred](https://docs.rs/fred).
//!
//! [`RedisBackend`] implements
//! [`Backend`](flightdeck_distributed::Backend) with seven Lua scripts,
//! ACQUIRE / HEARTBEAT / COMMIT / ABANDON / RELEASE / INVALIDATE / READ
//! (see [`scripts`] for the exact protocol and its command budget), run by
//! `EVALSHA` with a transparent reload on `NOSCRIPT`. A flight is one key,
//! the hash `{prefix}:{h}:f5` (its record: last grant, lease deadline,
//! result, kept for the stage's stale windows, the nodes that follow it),
//! and one more after an invalidation (`{prefix}:{h}:f5:i`), where `h` is
//! the flight digest in hex: one hash tag per flight, no raw input. Lease deadlines and
//! expiries use the server's clock (`TIME`, `PEXPIRE`), never the
//! clients'.
//!
//! Generations (fencing tokens) are `max(last + 1, server time in µs)`:
//! they never repeat or decrease for a flight, also after its record
//! expired or was lost in a failover, provided the server's clock (the
//! new primary's, after a failover) does not step back by more than the
//! time since the record was last written. They are large numbers and not
//! consecutive: compare them, never count them.
//!
//! **Rolling upgrades.** Key and channel names carry the layout's version
//! ([`LAYOUT`]). The earlier layouts (the first: keys `{prefix}:{h}:lease`,
//! `:state`, `:result`, channel `:done`; `f2`: the record
//! `{prefix}:{h}:f2` and a channel per flight `{prefix}:{h}:f2:done`;
//! `f3` and `f4`: the records `{prefix}:{h}:f3` and `{prefix}:{h}:f4`,
//! without stale results) are
//! never read or written by this version, and nodes of those versions
//! never touch this one's names. So while old and new nodes serve side by
//! side, each layout coordinates its own nodes only: a flight asked of
//! both kinds at once may run once per layout (at most twice), each node
//! replays only results its own layout stored, none reads the other's
//! values or hands out the other's result, and no notice crosses. Nothing
//! needs cleaning up afterwards: the old keys expire on their own TTLs (at
//! most two leases plus the replay TTL). To avoid those duplicates, move
//! a stage's traffic over at once rather than node by node. A value at this layout's names that its scripts did not write
//! (another type, an unreadable field, an unknown status) is refused with
//! a protocol error, so the layer answers as for any protocol failure and
//! nothing is replayed.
//!
//! Within `f5`, the ACQUIRE that carries a not-after deadline (and ends
//! its answers with the server's time) is a new script with a new SHA and
//! reads and writes the same record: nodes from before it keep running
//! their own ACQUIRE and coordinate with newer ones as before; only their
//! late ACQUIREs may still grant a lease nobody works on. So are the
//! ACQUIRE and COMMIT that take their short arguments packed into one
//! (see [`scripts`]): a node sends its arguments to its own scripts, by
//! their SHAs, and every build writes the record's fields alike.
//!
//! One [`RedisBackend`] holds one command connection and one subscriber
//! connection per server (per primary in a cluster). On its subscriber it
//! keeps an **inbox**, a channel of its own ([`RedisBackend::inbox`]),
//! subscribed once (on one server as soon as it connects; in a cluster one
//! per hash slot, by the node's first follower there) and kept. Every
//! ACQUIRE names the inbox, and one that answers FOLLOWER adds it to the
//! flight's record in the same script; the script that ends the grant
//! (commit, abandon, release, invalidate) publishes to each inbox there,
//! and to nothing when nobody follows. So a follower whose inbox was in
//! force before its ACQUIRE sends that one ACQUIRE and waits: no
//! SUBSCRIBE, no re-check (see [`scripts`] for the race this closes).
//! After a reconnect of the subscriber (messages sent meanwhile are lost)
//! every follower re-checks, the backend subscribes the inboxes again,
//! confirmed, and every follower re-checks once more: a notice published
//! before the inbox was back in force is not missed; until then new
//! followers subscribe and re-check. Nothing else goes out on a subscriber
//! connection, so the backend sends it a `PING` every
//! [`RedisConfig::subscriber_ping`]: one that died silently (no FIN or RST
//! reached this node) is found out and reconnected the same way. In a
//! cluster, after a slot-map change, every inbox is subscribed again on the
//! primary now serving its slot (Redis drops a moved slot's shard
//! channels), and the followers re-check. Every command has a deadline
//! and is sent at most once (fred would otherwise replay in-flight
//! commands after a reconnect); errors are classified as unavailable,
//! protocol or outcome-unknown ([`classify`]).
//!
//! Cluster: give a `redis-cluster://host:port?node=host:port` URL. The
//! backend keeps its own slot map (`CLUSTER SLOTS`, asked of a connected
//! node, else of the URL's nodes) and one client pair per primary, each
//! connecting and reconnecting on its own, and sends each call to the
//! primary that serves the flight's slot. So a primary that is down fails
//! only the flights of its slots: they are refused at once as
//! *unavailable* (`Backend::reject_early` names the primary; nothing is
//! sent), while the other primaries' flights are served, by a backend that
//! was running and by one created during the outage; once the primary is
//! back its flights are served again, without a restart.
//! `Backend::shard` names the primary (`host:port`) serving a flight,
//! so that a per-shard breaker degrades that shard only, and
//! `Backend::unreachable` answers only while no primary at all is
//! connected. The map is refreshed when a call meets `MOVED`, when a
//! node's connection is lost or back, and every 5 s; a new primary gets a
//! client pair (and the scripts), one that serves no slot any more is
//! dropped. Run the cluster with `cluster-require-full-coverage no`:
//! otherwise, once the cluster has marked a primary failed (after
//! `cluster-node-timeout`), the healthy primaries themselves answer
//! `CLUSTERDOWN` for every key.
//!
//! Every name of a flight shares one slot through the hash tag, the
//! scripts are loaded on every primary (and reloaded on the node that
//! answers `NOSCRIPT`), and completion messages use sharded pub/sub: a
//! node's inbox for a slot is named with a hash tag of that slot, so the
//! scripts' `SPUBLISH` stays in the flight's slot (on its shard), and the
//! node `SSUBSCRIBE`s it on the subscriber of the primary serving the slot
//! (again after a slot moved). A slot migration (resharding) is followed
//! through `MOVED` once it is done: the backend refreshes its map and
//! sends the call to the new owner, within the call's deadline. While it
//! runs, every script but INVALIDATE and READ (whose `KEYS` also hold the
//! invalidation key) has the record as its only key, and is served by the
//! old owner as long as the record is still there; once the record moved,
//! the old owner answers `ASK`, and the new owner, even after `ASKING`,
//! serves a multi-key command only when it has every key. So the
//! backend follows no `ASK` and retries `TRYAGAIN` and `ASK` for
//! [`RedisConfig::migration_retry`] (100 ms by default), and never past
//! shortly before the layer cuts the call off (each L2 layer tells the
//! backend its call timeout, `Backend::call_timeout_hint`; the same bound
//! holds for a call waiting for a connection being made); past it the call
//! is *unavailable* (the script did not run), not cut off by the layer as
//! *outcome unknown*. A caller's own shorter deadline (an outer budget) can
//! still cut a call off first: outcome unknown, its lease (if any) released
//! in the background. HYBRID stages fall back
//! locally for the moving slot's flights,
//! owners keep retrying their commit (`commit_attempts`), and followers
//! keep polling: a migration shorter than the lease and the owner's commit
//! retries costs no second execution. (fred's own cluster client is not
//! used: it refuses every command while any primary is down, and follows
//! `ASK` wrongly; see the routing module's source.)
//!
//! Sentinel: give `redis-sentinel://sentinel:port/0?sentinelServiceName=NAME&node=sentinel2:port`;
//! fred asks the sentinels for the primary when it (re)connects. It does
//! not follow `+switch-master`: after a forced failover it keeps writing
//! to the old primary until the sentinels demote it (which closes the
//! connections, up to 10 s later), and those writes are lost. Run the data
//! nodes with `min-replicas-to-write 1` so the old primary refuses them
//! (`NOREPLICAS`, classified unavailable). An ACQUIRE refused so (or with
//! `READONLY`) still replays a stored result: the backend then reads it
//! with a script that writes nothing (`scripts::READ`), and answers
//! unavailable only when none is stored. Credentials: in the URL or with
//! [`RedisConfig::credentials`] / [`RedisConfig::password`]; refused ones
//! fail `connect` with a protocol error that says so. TLS (feature `tls`,
//! rustls with the ring provider): `rediss://…`, with
//! `RedisConfig::tls_root_certificates` for a private CA.
//!
//! Replication is asynchronous: a failover can lose a granted lease, so the
//! promise is at most one committed result per generation, not exactly-once
//! execution; handlers that write elsewhere should fence with the
//! [`FencingToken`](flightdeck_distributed::FencingToken).
//!
//! ```no_run
//! use flightdeck_core::{CloneShare, FlightKey, StageName};
//! use flightdeck_distributed::{DistributedFlightLayer, DistributedPolicy, PostcardCodec};
//! use flightdeck_redis::{RedisBackend, RedisConfig};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Connects (and reconnects) in the background; `ready` waits for it.
//! let backend = RedisBackend::new(RedisConfig::new("redis://127.0.0.1:6390"))?;
//! let stage = StageName::new("report")?;
//! let layer = DistributedFlightLayer::new(
//!     backend,
//!     DistributedPolicy::new(),
//!     CloneShare::<String>::new(),
//!     PostcardCodec::<String>::new(),
//!     (move |req: &String| Some(FlightKey::from_bytes(stage.clone(), req))),
//! )?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|req: String| async move {
//!     Ok::<_, std::convert::Infallible>(format!("report for {req}"))
//! }));
//! let report = svc.oneshot("tenant-42".to_owned()).await?;
//! # Ok(()) }
//! ```

mod args;
mod backend;
pub mod classify;
mod clock;
mod cluster;
mod config;
mod connect;
mod eval;
mod inbox;
mod node;
mod reply;
mod routing;
pub mod scripts;
mod stored;

pub use backend::{RedisBackend, LAYOUT};

/// The parsers of what Redis answers, for the fuzz targets (`fuzz/`) only:
/// built under `cfg(fuzzing)`, never part of the API.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use flightdeck_distributed::backend::{
        Acquired, BackendError, Committed, Notice, Released, Renewal,
    };
    use fred::prelude::Value;

    /// An ACQUIRE answer without the server's time (as READ's hit is
    /// checked).
    pub fn acquire(v: &Value) -> Result<Acquired, BackendError> {
        crate::reply::parse_acquire(v)
    }

    /// An ACQUIRE answer as the script sends it: the answer (`None`:
    /// `LATE`) and the server's time it ends with.
    pub fn timed_acquire(v: &Value) -> Result<(Option<Acquired>, u64), BackendError> {
        crate::reply::parse_timed_acquire(v)
    }

    /// A HEARTBEAT answer.
    pub fn heartbeat(v: &Value) -> Result<Renewal, BackendError> {
        crate::reply::renewal(v)
    }

    /// A COMMIT answer.
    pub fn commit(v: &Value) -> Result<Committed, BackendError> {
        crate::reply::committed(v)
    }

    /// An ABANDON or RELEASE answer.
    pub fn release(v: &Value) -> Result<Released, BackendError> {
        crate::reply::released("RELEASE", v)
    }

    /// An INVALIDATE answer.
    pub fn invalidate(v: &Value) -> Result<u64, BackendError> {
        crate::reply::invalidated(v)
    }

    /// A READ answer: the stored result it holds, if any.
    pub fn read(v: Value) -> Result<Option<Acquired>, BackendError> {
        let items = crate::stored::read_items(v)?;
        crate::stored::stored_hit(&items).transpose()
    }

    /// A message on an inbox: the record it names and the notice.
    pub fn notice(msg: &bytes::Bytes) -> Option<(bytes::Bytes, Notice)> {
        crate::inbox::parse_message(msg)
    }
}
pub use config::RedisConfig;
