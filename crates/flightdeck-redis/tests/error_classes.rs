//! Each row of `docs/redis-errors.md` that needs a real server: the
//! failure is produced against the harness's Redis (or cluster) and the
//! backend's error class is checked.

mod short;

use std::future::Future;
use std::time::Duration;

use flightdeck_core::metric;
use flightdeck_distributed::backend::{Acquired, Backend, BackendFuture, LeaseTerms, Renewal};
use flightdeck_distributed::{BackendError, BackendErrorKind, FlightId, OwnerToken};
use flightdeck_harness::{FaultProxy, RedisCluster, RedisServer, Resp};
use flightdeck_redis::RedisBackend;
use flightdeck_test::conformance::commit_args;
use flightdeck_test::recorded;
use short::{config, flight, keys_by_node, terms};

async fn acquire_kind(b: &RedisBackend, key: &str) -> Option<BackendErrorKind> {
    acquire_error(b, key).await.map(|e| e.kind())
}

/// The error of an ACQUIRE by a fresh token (`None`: it succeeded).
async fn acquire_error(b: &RedisBackend, key: &str) -> Option<BackendError> {
    let (f, token, terms) = (flight(key), OwnerToken::random(), terms());
    error_of(&format!("acquire {key}"), b.acquire(&f, &token, &terms)).await
}

/// The class of one call's error (`None`: it succeeded), within 5 s.
async fn kind_of<T>(
    what: &str,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Option<BackendErrorKind> {
    error_of(what, call).await.map(|e| e.kind())
}

/// One call's error (`None`: it succeeded), within 5 s.
async fn error_of<T>(
    what: &str,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Option<BackendError> {
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => panic!("{what}: no answer within 5 s"),
    }
}

/// The fred error under a backend error, if it has one.
fn fred_error(e: &BackendError) -> Option<&fred::error::Error> {
    std::error::Error::source(e)?.downcast_ref::<fred::error::Error>()
}

/// Asserts that `e` is unavailable and names `word` (Redis's reply, say).
fn assert_unavailable(e: Option<BackendError>, word: &str) {
    let e = e.expect("the call failed");
    assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains(word), "{word}: {e}");
}

/// Polls `done` every 10 ms (letting the backend's tasks run) for up to
/// 10 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `CONFIG SET` of each `(name, value)` on `server`, checked.
fn config_set(server: &RedisServer, settings: &[(&str, &str)]) {
    for (name, value) in settings {
        assert_eq!(
            server.cmd(&["CONFIG", "SET", name, value]).unwrap(),
            Resp::Simple("OK".into()),
            "{name}"
        );
    }
}

/// A flight `name` owned by `token` at `generation`, and the key of
/// another flight (`name-other`).
struct Flights {
    owned: FlightId,
    token: OwnerToken,
    generation: u64,
    other: String,
}

impl Flights {
    async fn of(b: &RedisBackend, name: &str) -> Self {
        let owned = flight(name);
        let (token, generation) = self::owned(b, &owned).await;
        Self {
            owned,
            token,
            generation,
            other: format!("{name}-other"),
        }
    }

    /// HEARTBEAT of the owned flight.
    fn renew<'a>(
        &'a self,
        b: &'a RedisBackend,
        lease: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        b.heartbeat(&self.owned, &self.token, self.generation, lease)
    }
}

/// Asserts that ACQUIRE (of the other flight) and HEARTBEAT (of the
/// owned one) are refused as unavailable, naming `word`, while a
/// follower's subscribe is served: the node's inbox was subscribed before
/// (nothing is sent for it).
async fn assert_refused(b: &RedisBackend, flights: &Flights, word: &str) {
    assert_unavailable(acquire_error(b, &flights.other).await, word);
    let lease = terms();
    let renewal = flights.renew(b, &lease);
    assert_unavailable(error_of("heartbeat", renewal).await, word);
    let follower = flight(&flights.other);
    assert_eq!(kind_of("subscribe", b.subscribe(&follower)).await, None);
}

/// Asserts that the calls of [`assert_refused`] are served.
async fn assert_served(b: &RedisBackend, flights: &Flights) {
    assert_eq!(acquire_kind(b, &flights.other).await, None);
    let lease = terms();
    let renewal = flights.renew(b, &lease);
    assert_eq!(kind_of("heartbeat", renewal).await, None);
    let follower = flight(&flights.other);
    assert_eq!(kind_of("subscribe", b.subscribe(&follower)).await, None);
}

/// A flight owned by a fresh token: the token and the generation.
async fn owned(b: &RedisBackend, f: &FlightId) -> (OwnerToken, u64) {
    let token = OwnerToken::random();
    match b.acquire(f, &token, &terms()).await.expect("acquired") {
        Acquired::Owner { generation, .. } => (token, generation),
        other => panic!("not the owner: {other:?}"),
    }
}

/// Rows "reconnecting after a loss" and "connection refused": the server
/// killed, fred's reconnection attempts are refused (`IO` "Connection
/// refused"). Every call is refused before it is sent, naming that
/// error: unavailable, not outcome unknown — the script was never sent.
/// The layer's own check before a flight (`reject_early`) says the same.
#[tokio::test]
async fn killed_server_is_unavailable_not_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    assert_eq!(acquire_kind(&b, "up").await, None);
    redis.kill();
    // Let fred see the dropped connection and fail to reconnect.
    let _ = b.ready(Duration::from_millis(0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = b.reject_early(&b.shard(&flight("down"))).expect("refused");
    assert_unavailable(Some(early), "Connection refused");
    for i in 0..3 {
        let e = acquire_error(&b, &format!("down-{i}")).await;
        assert_unavailable(e, "Connection refused");
    }
}

/// Row "reconnecting after a loss": a call made after fred saw the
/// connection close and before its first reconnection attempt (50 ms or
/// more later) was written nowhere. fred still says "connected" then, so
/// its `fail_fast` lets the call in, and its router holds it behind the
/// reconnection until the call's timeout (outcome unknown, for a script
/// that was never sent). The backend refuses it: unavailable, at once
/// when the reconnection fails (Redis is down).
#[tokio::test]
async fn call_just_after_a_loss_is_unavailable_not_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    // The window is short: try until a call lands in it.
    for _ in 0..10 {
        assert_eq!(acquire_kind(&b, "before").await, None);
        redis.kill();
        // fred reads the close (and says why on its error channel).
        tokio::time::sleep(Duration::from_millis(10)).await;
        if b.is_connected() {
            let e = acquire_error(&b, "just-after").await;
            assert_unavailable(e, "Connection refused");
            return;
        }
        redis.restart().unwrap();
        b.ready(Duration::from_secs(5)).await.unwrap();
    }
    panic!("no call made while fred still said connected after the loss");
}

/// Row "a cluster primary down": the flights of its slots are refused as
/// unavailable at once (before anything is sent: `reject_early`, and the
/// call itself fails fast), the other primaries' flights are served.
#[tokio::test]
async fn dead_cluster_primary_is_unavailable_for_its_slots_only() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &b, 3);
    let dead = format!("127.0.0.1:{}", cluster.nodes()[1].port());
    assert_eq!(acquire_kind(&b, &keys[1][0]).await, None);
    cluster.node_mut(1).unwrap().kill();
    // The backend sees the loss (its connection to that primary fails).
    let seen = tokio::time::Instant::now();
    while b.reject_early(&b.shard(&flight(&keys[1][1]))).is_none() {
        assert!(seen.elapsed() < Duration::from_secs(5), "loss not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for key in &keys[1][1..] {
        let refused = b
            .reject_early(&b.shard(&flight(key)))
            .expect("refused early");
        assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
        assert!(refused.to_string().contains(&dead), "{refused}");
        let started = tokio::time::Instant::now();
        assert_eq!(
            acquire_kind(&b, key).await,
            Some(BackendErrorKind::Unavailable)
        );
        let took = started.elapsed();
        assert!(took < Duration::from_millis(200), "{key}: {took:?}");
    }
    for key in keys[0].iter().chain(&keys[2]) {
        assert!(b.reject_early(&b.shard(&flight(key))).is_none(), "{key}");
        assert_eq!(acquire_kind(&b, key).await, None, "{key}");
    }
    assert!(b.unreachable().is_none(), "two primaries are connected");
}

/// Row "TRYAGAIN / ASK while a slot migrates, beyond the deadline":
/// unavailable, never protocol. ACQUIRE names the record alone, so while
/// the record is still on the slot's old owner it is served there; once
/// the record moved (the slot not yet), the old owner answers ASK.
#[tokio::test]
async fn slot_in_migration_is_unavailable() {
    let cluster = RedisCluster::start(2).unwrap();
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let f = flight("moving");
    let record = b.record_key(&f);
    assert_eq!(acquire_kind(&b, "moving").await, None);
    let slot = cluster.keyslot(&record).unwrap();
    let from = cluster.slot_owner(slot).unwrap();
    let migration = cluster
        .begin_migration(slot, 1 - from)
        .unwrap()
        .expect("the slot moves to the other node");
    assert_eq!(
        acquire_kind(&b, "moving").await,
        None,
        "the record is still on the old owner, which serves it"
    );
    // Subscribing while the slot moves works (the old owner serves it).
    let sub = tokio::time::timeout(Duration::from_secs(5), b.subscribe(&f))
        .await
        .expect("subscribe answers")
        .expect("subscribes during the migration");
    cluster.migrate_all_keys(&migration).unwrap();
    assert_eq!(
        acquire_kind(&b, "moving").await,
        Some(BackendErrorKind::Unavailable),
        "the record moved, the slot not yet: ASK until the deadline"
    );
    cluster.finish_migration(&migration).unwrap();
    assert_eq!(
        acquire_kind(&b, "moving").await,
        None,
        "served again after the move"
    );
    // Subscribing after the move: fred's subscriber may give up (its
    // attempts used up by the redirect); that is unavailable, never a
    // protocol error.
    drop(sub);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = tokio::time::timeout(Duration::from_secs(5), b.subscribe(&f))
        .await
        .expect("subscribe answers");
    if let Err(e) = after {
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
    }
}

/// Row "BUSY": a script of another client runs past
/// `busy-reply-threshold`; our scripts and WAIT are refused
/// (unavailable: nothing ran), and served again once it is killed.
#[tokio::test]
async fn busy_server_is_unavailable_until_the_script_is_killed() {
    let redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    let flights = Flights::of(&b, "busy").await;
    config_set(&redis, &[("busy-reply-threshold", "10")]);
    let script = redis.send(&["EVAL", "while true do end", "0"]).unwrap();
    until(
        "the server answers BUSY",
        || matches!(redis.cmd(&["PING"]), Ok(Resp::Error(e)) if e.starts_with("BUSY")),
    )
    .await;

    assert_refused(&b, &flights, "BUSY").await;
    let (f, args) = (&flights.owned, commit_args(b"v", 1024));
    let commit = b.commit(f, &flights.token, flights.generation, &args);
    assert_unavailable(error_of("commit", commit).await, "BUSY");
    let wait = b.wait_replicas(f, 1, Duration::from_millis(10));
    assert_unavailable(error_of("wait", wait).await, "BUSY");

    assert_eq!(
        redis.cmd(&["SCRIPT", "KILL"]).unwrap(),
        Resp::Simple("OK".into())
    );
    let Resp::Error(killed) = script.reply().unwrap() else {
        panic!("the long script ended without an error");
    };
    assert!(killed.contains("SCRIPT KILL"), "{killed}");
    assert_served(&b, &flights).await;
}

/// Row "LOADING": `DEBUG RELOAD` reloads a dataset slowly
/// (`key-load-delay`, with events processed every KiB so that clients
/// are answered meanwhile); our calls during the load are refused
/// (unavailable), and served once it is loaded.
#[tokio::test]
async fn loading_server_is_unavailable_until_loaded() {
    let redis = RedisServer::start_with_args(&["--enable-debug-command", "yes"]).unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    let flights = Flights::of(&b, "loading").await;
    // 1000 keys, 1 ms each: a load of about a second.
    redis.cmd(&["DEBUG", "POPULATE", "1000"]).unwrap();
    config_set(
        &redis,
        &[
            ("key-load-delay", "1000"),
            ("loading-process-events-interval-bytes", "1024"),
        ],
    );
    let reload = redis.send(&["DEBUG", "RELOAD"]).unwrap();
    until(
        "the server answers LOADING",
        || matches!(redis.cmd(&["PING"]), Ok(Resp::Error(e)) if e.starts_with("LOADING")),
    )
    .await;

    assert_refused(&b, &flights, "LOADING").await;

    assert_eq!(reload.reply().unwrap(), Resp::Simple("OK".into()));
    // The grant made before the reload is still there (HEARTBEAT renews it).
    assert_served(&b, &flights).await;
}

/// Row "MASTERDOWN": the backend pointed at a replica with
/// `replica-serve-stale-data no`. While its primary is up, ACQUIRE is
/// refused `READONLY` and the stored result is replayed by the read-only
/// READ. Once the primary is gone, READ is refused `MASTERDOWN` too:
/// ACQUIRE ends unavailable (the `READONLY` refusal stands), as does a
/// read (`invalidated_since`: `MASTERDOWN`); a follower's subscribe sends
/// nothing (the inbox was subscribed before).
#[tokio::test]
async fn stale_replica_is_unavailable() {
    let mut primary = RedisServer::start().unwrap();
    let replica = RedisServer::start_replica_of(&primary).unwrap();
    replica
        .cmd(&["CONFIG", "SET", "replica-serve-stale-data", "no"])
        .unwrap();
    let on_primary = RedisBackend::connect(config(primary.url())).await.unwrap();
    let f = flight("stale");
    let (token, generation) = owned(&on_primary, &f).await;
    on_primary
        .commit(&f, &token, generation, &commit_args(b"v", 1024))
        .await
        .unwrap();
    let copied = on_primary
        .wait_replicas(&f, 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(copied, Some(1), "the commit reached the replica");
    let b = RedisBackend::connect(config(replica.url())).await.unwrap();
    let hit = b.acquire(&f, &OwnerToken::random(), &terms()).await;
    assert!(matches!(hit, Ok(Acquired::Hit(_))), "{hit:?}");

    primary.kill();
    until("the replica sees its primary gone", || {
        replica
            .cmd(&["INFO", "replication"])
            .ok()
            .and_then(|info| info.as_str().map(|s| s.contains("master_link_status:down")))
            .unwrap_or(false)
    })
    .await;
    recorded::install();
    let failed = || {
        recorded::counter_where(
            metric::READONLY_REPLAY_TOTAL,
            "",
            Some(("result", "failed")),
        )
    };
    let before = failed();
    assert_unavailable(acquire_error(&b, "stale").await, "READONLY");
    assert_eq!(
        failed(),
        before + 1,
        "the read-only lookup failed, not a miss"
    );
    assert_unavailable(
        error_of("invalidated_since", b.invalidated_since(&f, 0)).await,
        "MASTERDOWN",
    );
    // The inbox was subscribed while the replica was healthy: a
    // follower's subscribe sends nothing.
    assert_eq!(
        kind_of("subscribe", b.subscribe(&flight("stale-other"))).await,
        None
    );
}

/// Row "CLUSTERDOWN": `cluster-require-full-coverage yes` (set at run
/// time, with a short `cluster-node-timeout`), one primary killed; once
/// the others mark it failed they answer `CLUSTERDOWN` for their own
/// slots too: every flight is unavailable (the dead primary's refused
/// before anything is sent). Only SSUBSCRIBE is still served.
#[tokio::test]
async fn cluster_down_is_unavailable_on_every_shard() {
    let mut cluster = RedisCluster::start(3).unwrap();
    for node in cluster.nodes() {
        config_set(
            node,
            &[
                ("cluster-require-full-coverage", "yes"),
                ("cluster-node-timeout", "500"),
            ],
        );
    }
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &b, 2);
    let healthy = flight(&keys[0][0]);
    let (token, generation) = owned(&b, &healthy).await;
    cluster.node_mut(1).unwrap().kill();
    until("the others mark the primary failed", || {
        [0, 2].iter().all(|&i| {
            cluster.nodes()[i]
                .cmd(&["CLUSTER", "INFO"])
                .ok()
                .and_then(|info| info.as_str().map(|s| s.contains("cluster_state:fail")))
                .unwrap_or(false)
        })
    })
    .await;

    for key in [&keys[0][1], &keys[2][0]] {
        assert_unavailable(acquire_error(&b, key).await, "CLUSTERDOWN");
    }
    assert_unavailable(
        error_of(
            "heartbeat",
            b.heartbeat(&healthy, &token, generation, &terms()),
        )
        .await,
        "CLUSTERDOWN",
    );
    // SSUBSCRIBE is still served (`cluster-allow-pubsubshard-when-down`
    // is `yes` by default): a follower waits for a notice no commit can
    // send, and polls.
    let follower = flight(&keys[2][1]);
    assert_eq!(kind_of("subscribe", b.subscribe(&follower)).await, None);
    let dead = flight(&keys[1][0]);
    assert!(b.reject_early(&b.shard(&dead)).is_some());
    assert_eq!(
        acquire_kind(&b, &keys[1][0]).await,
        Some(BackendErrorKind::Unavailable)
    );
}

/// Row "no answer within the command timeout": the server paused
/// (SIGSTOP) with our connection open; the ACQUIRE was written and may
/// run when the server wakes up: outcome unknown. Served again once
/// resumed.
#[tokio::test]
async fn paused_server_is_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    let f = flight("paused");
    let (token, generation) = owned(&b, &f).await;
    redis.pause().unwrap();
    assert_eq!(
        acquire_kind(&b, "paused-other").await,
        Some(BackendErrorKind::OutcomeUnknown)
    );
    assert_eq!(
        kind_of("heartbeat", b.heartbeat(&f, &token, generation, &terms())).await,
        Some(BackendErrorKind::OutcomeUnknown)
    );
    redis.resume().unwrap();
    let started = tokio::time::Instant::now();
    while acquire_kind(&b, "paused-after").await.is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not served again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Row "connection lost after the command was written": an ACQUIRE
/// written to a paused server, which is then killed. fred ends it with
/// the IO error of the lost connection (not `Canceled`): outcome
/// unknown, as the server may have run it.
#[tokio::test]
async fn connection_lost_in_flight_is_outcome_unknown() {
    let mut redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    assert_eq!(acquire_kind(&b, "before").await, None);
    redis.pause().unwrap();
    let in_flight = {
        let b = b.clone();
        tokio::spawn(async move { acquire_error(&b, "in-flight").await })
    };
    // Written (into the paused server's socket buffer), not answered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.kill();
    let e = in_flight.await.unwrap().expect("the call failed");
    assert_eq!(e.kind(), BackendErrorKind::OutcomeUnknown, "{e}");
    let fred = fred_error(&e).expect("fred's error");
    assert_eq!(*fred.kind(), fred::error::ErrorKind::IO, "{e}");
}

/// Row "command sent while disconnected", for a backend whose server was
/// never up: fred refuses it before sending (`fail_fast`: `Canceled`):
/// unavailable.
#[tokio::test]
async fn never_connected_is_refused_by_fail_fast() {
    let port = flightdeck_harness::free_port().unwrap();
    let b = RedisBackend::new(config(format!("redis://127.0.0.1:{port}"))).unwrap();
    let not_ready = b.ready(Duration::from_millis(300)).await.unwrap_err();
    assert!(
        not_ready.to_string().contains("Connection refused"),
        "{not_ready}"
    );
    let e = acquire_error(&b, "never").await.expect("refused");
    assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
    let fred = fred_error(&e).expect("fred's error");
    assert_eq!(*fred.kind(), fred::error::ErrorKind::Canceled, "{e}");
}

/// `WAIT` (`commit-replicas`) in a cluster goes to the primary serving
/// the flight's slot, on the connection that ran its commit, and reports
/// the replicas that acknowledged: none in the harness's cluster, without
/// an error.
#[tokio::test]
async fn cluster_wait_asks_the_flights_primary() {
    let cluster = RedisCluster::start(2).unwrap();
    let b = RedisBackend::connect(config(cluster.url())).await.unwrap();
    let keys = keys_by_node(&cluster, &b, 1);
    for (owner, key) in keys.iter().map(|k| &k[0]).enumerate() {
        let f = flight(key);
        let (token, generation) = owned(&b, &f).await;
        b.commit(&f, &token, generation, &commit_args(b"v", 1024))
            .await
            .unwrap();
        let waits = || -> Vec<u64> {
            let nodes = cluster.nodes();
            nodes
                .iter()
                .map(|n| n.command_calls("wait").unwrap())
                .collect()
        };
        let before = waits();
        let acked = b
            .wait_replicas(&f, 1, Duration::from_millis(20))
            .await
            .unwrap();
        assert_eq!(acked, Some(0), "{key}");
        let after = waits();
        for (i, (was, is)) in before.iter().zip(&after).enumerate() {
            let expected = was + u64::from(i == owner);
            assert_eq!(*is, expected, "{key}: WAIT calls of node {i}");
        }
    }
}

/// `WAIT` counts the replicas that acknowledged the writes of the
/// connection it runs on, on the server it runs on. Asked just after the
/// connection that ran the commit was lost, it must not wait for the new
/// connection and go there: that may be another server (fred asks
/// Sentinel for the primary again; here a proxy switched to another
/// server), whose replicas acknowledge its own writes, never this commit.
/// The commit's server has one replica, paused (it acknowledges nothing);
/// the other server has one that works. The wait must fail (the owner
/// counts the commit unacknowledged), not report one replica.
#[tokio::test]
async fn wait_after_the_commits_connection_was_lost_acknowledges_nothing() {
    let first = RedisServer::start().unwrap();
    let mut first_replica = RedisServer::start_replica_of(&first).unwrap();
    let second = RedisServer::start().unwrap();
    let _second_replica = RedisServer::start_replica_of(&second).unwrap();
    let proxy = FaultProxy::start(first.addr()).unwrap();
    let b = RedisBackend::connect(config(proxy.url())).await.unwrap();
    // Still online for its primary, acknowledging nothing from now on.
    first_replica.pause().unwrap();
    let f = flight("unacked");
    let (token, generation) = owned(&b, &f).await;
    b.commit(&f, &token, generation, &commit_args(b"v", 1024))
        .await
        .unwrap();
    let on_its_connection = b.wait_replicas(&f, 1, Duration::from_millis(20)).await;
    assert_eq!(
        on_its_connection.unwrap(),
        Some(0),
        "the paused replica did not acknowledge the commit"
    );
    // The commit's connection is lost, and the next one reaches another
    // server (a failover).
    proxy.set_upstream(second.addr());
    proxy.reset_all();
    // fred reads the reset (and says so on its error channel); its first
    // reconnection attempt comes 50 ms or more later.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.is_connected(), "fred says connected until then");
    let after = b.wait_replicas(&f, 1, Duration::from_millis(20)).await;
    assert!(
        !matches!(after, Ok(Some(n)) if n >= 1),
        "a replica that never got the commit counted as acknowledging it: {after:?}"
    );
    first_replica.resume().unwrap();
}

/// Calls made just after a loss wait for the new connection (the row
/// above): once it is made, with Redis up, they are served, not refused by
/// fred's `fail_fast` in the instant between fred's new connection and its
/// state saying so. Many calls from a multi-threaded runtime, several
/// losses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_for_the_new_connection_are_served() {
    let redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(config(redis.url())).await.unwrap();
    let mut waited = 0;
    for round in 0..10 {
        redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !b.is_connected() {
            // fred already reconnecting: not the window.
            b.ready(Duration::from_secs(5)).await.unwrap();
            continue;
        }
        waited += 1;
        let calls: Vec<_> = (0..20)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { acquire_error(&b, &format!("r{round}-{i}")).await })
            })
            .collect();
        for call in calls {
            let e = call.await.unwrap();
            assert!(e.is_none(), "round {round}: {e:?}");
        }
        b.ready(Duration::from_secs(5)).await.unwrap();
    }
    assert!(waited > 0, "no call made while fred still said connected");
}

/// Row "a call made while the connection is being made again": when the
/// new connection takes long (a host that accepts and never answers, the
/// attempt lasting its connect timeout), a call waits for it only until
/// shortly before its caller cuts it off (the layer's call timeout, told
/// by `Backend::call_timeout_hint`), and is refused as unavailable: it
/// was never sent, so it must not end cut off as outcome unknown.
#[tokio::test]
async fn call_waiting_for_a_slow_reconnection_is_refused_before_its_caller_cuts_it_off() {
    use flightdeck_harness::Fault;
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let b = RedisBackend::connect(
        config(proxy.url())
            .command_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let cut = Duration::from_millis(300);
    b.call_timeout_hint(cut);
    assert_eq!(acquire_kind(&b, "before").await, None);

    proxy.set(Fault::Blackhole);
    proxy.reset_all();
    // The loss is seen; the reconnection hangs on the blackhole.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let f = flight("while-reconnecting");
    let started = tokio::time::Instant::now();
    let answered = tokio::time::timeout(cut, b.acquire(&f, &OwnerToken::random(), &terms())).await;
    let took = started.elapsed();
    let err = match answered {
        Ok(Err(e)) => e,
        Ok(Ok(a)) => panic!("served through a blackhole: {a:?}"),
        Err(_) => {
            panic!("cut off by its caller after {took:?}: outcome unknown for a call never sent")
        }
    };
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");

    proxy.set(Fault::Pass);
    let back = tokio::time::Instant::now();
    while acquire_kind(&b, "after").await.is_some() {
        assert!(back.elapsed() < Duration::from_secs(10), "not back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
