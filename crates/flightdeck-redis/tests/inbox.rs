//! A node's inbox stays in force where the owners publish, or its
//! followers hear that it is not: when its subscriber connection dies
//! without a word, and when a cluster slot moves. Each test failed before
//! its fix (found in review): a follower waited for a notice that never
//! came (its node believed its inbox in force, but nothing was subscribed
//! where the owner publishes), a full poll interval with the result
//! already committed.
//!
//! The bounds are liveness bounds, not speed: the poll interval and the
//! lease are a minute, the follower is given 10 s after the owner's
//! commit (a notice takes a millisecond); without the notice it wakes up
//! only after 30 s or more.

use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, Shareable, StageName};
use flightdeck_distributed::backend::Backend;
use flightdeck_distributed::{
    DistributedFlights, DistributedPolicy, Execute, FlightId, PostcardCodec, Propagate, Role,
};
use flightdeck_harness::{
    wait_until, wait_until_async, FaultProxy, RedisCluster, RedisServer, Resp,
};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::sync::oneshot;

type Flights = DistributedFlights<RedisBackend, PostcardCodec<String>>;

/// The owner's work waits for the test's signal; a follower's is never run.
struct Work {
    gate: Option<oneshot::Receiver<()>>,
    value: &'static str,
}

impl Execute<String> for Work {
    type Shared = String;
    type Output = String;

    async fn execute(
        self,
        _req: String,
        role: Role,
    ) -> Result<Shareable<String, String>, BoxError> {
        if let Some(gate) = self.gate {
            let _ = gate.await;
        }
        Ok(Shareable::Shared(format!("{}:{role:?}", self.value)))
    }
}

/// A minute of lease and of poll interval: a follower that misses its
/// notice wakes up after tens of seconds, one that gets it at once.
fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(Duration::from_secs(60))
        .heartbeat(Duration::from_secs(5))
        .poll_interval(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(180))
        .replay_ttl(Duration::from_secs(300))
        .call_timeout(Duration::from_millis(500))
}

fn flights(b: RedisBackend) -> Flights {
    DistributedFlights::new(b, policy(), PostcardCodec::<String>::new()).unwrap()
}

fn key(stage: &StageName, name: &str) -> FlightKey {
    FlightKey::from_bytes(stage.clone(), name)
}

/// The owner (on `owner`) holds `k`'s lease with its work waiting; a
/// follower (on `follower`) follows it. Returns the owner's gate, and the
/// follower's request.
async fn owner_and_follower(
    owner: &Flights,
    follower: &Flights,
    k: &FlightKey,
    granted: impl Fn(&str) -> bool,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Shareable<String, String>, BoxError>>,
    tokio::task::JoinHandle<Result<Shareable<String, String>, BoxError>>,
) {
    let (tx, rx) = oneshot::channel();
    let (o, kk) = (owner.clone(), k.clone());
    let owner_task = tokio::spawn(async move {
        let work = Work {
            gate: Some(rx),
            value: "v",
        };
        o.run(&kk, "req".to_owned(), work, &Propagate).await
    });
    // The owner's ACQUIRE first.
    let record = owner.backend().record_key(&FlightId::of(k));
    wait_until_async("the owner's grant", Duration::from_secs(10), || {
        let granted = granted(&record);
        async move { granted }
    })
    .await;
    let (f, kk) = (follower.clone(), k.clone());
    let follower_task = tokio::spawn(async move {
        let work = Work {
            gate: None,
            value: "follower-ran-it",
        };
        f.run(&kk, "req".to_owned(), work, &Propagate).await
    });
    (tx, owner_task, follower_task)
}

/// Whether `record` holds a grant (a token), asked of `server`.
fn held(server: &RedisServer, record: &str) -> bool {
    matches!(server.cmd(&["HGET", record, "t"]), Ok(Resp::Bulk(Some(t))) if !t.is_empty())
}

/// Releases the owner's work and gives the follower 10 s (its poll is a
/// minute away) to get the value.
async fn commit_and_expect_follower(
    gate: oneshot::Sender<()>,
    owner_task: tokio::task::JoinHandle<Result<Shareable<String, String>, BoxError>>,
    follower_task: tokio::task::JoinHandle<Result<Shareable<String, String>, BoxError>>,
    round: &str,
) {
    gate.send(()).unwrap();
    let owned = owner_task.await.unwrap().unwrap();
    assert!(matches!(&owned, Shareable::Shared(v) if v.starts_with("v:Owner")));
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(Duration::from_secs(10), follower_task).await {
        Ok(res) => {
            let v = res.unwrap().unwrap();
            assert!(
                matches!(&v, Shareable::Shared(s) if s.starts_with("v:Owner")),
                "{round}: the follower got the owner's value"
            );
            eprintln!(
                "{round}: follower done {:?} after the commit",
                started.elapsed()
            );
        }
        Err(_) => panic!(
            "{round}: the owner committed, but its follower heard nothing within 10 s \
             (its notice was lost with no resync; it waits for its 30-60 s poll)"
        ),
    }
}

// ---------------------------------------------------------------------
// 1. A subscriber connection that dies silently is never noticed.
// ---------------------------------------------------------------------

/// The inbox is subscribed once, and nothing else is sent on the
/// subscriber connection: when it dies without a FIN/RST reaching the
/// client (a NAT or load balancer idle timeout, a partition the server
/// side resolved), only the backend's periodic `PING` on it
/// (`RedisConfig::subscriber_ping`) finds it out; its followers then
/// re-check (and keep doing so while the new connection is cut too), so
/// the committed result reaches them. Without the `PING` the joinable bit
/// stayed set and `is_connected()` true for ever: every follower on the
/// node joined the dead inbox, the owner's COMMIT published into the
/// void, and no resync ever came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_subscriber_is_found_out_and_its_followers_recheck() {
    let redis = RedisServer::start().unwrap();
    let cutter = FaultProxy::start(redis.addr()).unwrap();
    let config = |url: String| {
        RedisConfig::new(url)
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
    };
    // The follower's node goes through the proxy; the owner's does not.
    let follower = flights(RedisBackend::connect(config(cutter.url())).await.unwrap());
    let owner = flights(RedisBackend::connect(config(redis.url())).await.unwrap());
    let stage = StageName::new("half-open").unwrap();

    // Control: with the subscriber alive, the follower hears the commit.
    let (gate, o, f) = owner_and_follower(&owner, &follower, &key(&stage, "before"), |r| {
        held(&redis, r)
    })
    .await;
    wait_until_async("the follower waits", Duration::from_secs(10), || async {
        follower.backend().followed_flights() == 1
    })
    .await;
    commit_and_expect_follower(gate, o, f, "subscriber alive").await;

    // The subscriber's connection dies without the client hearing of it.
    cutter.sever_subscribers();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (gate, o, f) = owner_and_follower(&owner, &follower, &key(&stage, "after"), |r| {
        held(&redis, r)
    })
    .await;
    wait_until_async("the follower waits", Duration::from_secs(10), || async {
        follower.backend().followed_flights() == 1
    })
    .await;
    commit_and_expect_follower(gate, o, f, "subscriber silently dead").await;
}

// ---------------------------------------------------------------------
// 2. Cluster: a slot moves; its waiting followers re-check, and then wait
//    on an inbox that is subscribed nowhere.
// ---------------------------------------------------------------------

/// Cluster, 3 primaries. The follower's node subscribes
/// its inbox for slot S on primary A (its first follower there). S is
/// migrated to B: A drops the shard channel's subscription (Redis sends
/// `sunsubscribe`, which fred swallows: "Dropping unused subscription
/// response"). The follower's node refreshes its slot map (periodically,
/// or on a MOVED): every follower re-checks (ACQUIRE on B: FOLLOWER, the
/// inbox in `w`), every inbox is SSUBSCRIBEd again on the primary now
/// serving its slot, and the followers re-check once more; the owner's
/// COMMIT on B reaches the follower. Before, only a *new* follower in the
/// slot subscribed the inbox again: the waiting one waited on an inbox
/// subscribed nowhere, for its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_slot_moves_its_inbox_is_subscribed_where_the_slot_is() {
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    let config = || {
        RedisConfig::new(cluster.url())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
    };
    let follower = flights(RedisBackend::connect(config()).await.unwrap());
    let owner = flights(RedisBackend::connect(config()).await.unwrap());
    let stage = StageName::new("slot-move").unwrap();
    let k = key(&stage, "moving");
    let flight = FlightId::of(&k);
    let slot = follower.backend().slot(&flight);
    let from = cluster.slot_owner(slot).unwrap();
    let to = (from + 1) % 3;
    let to_addr = format!("127.0.0.1:{}", cluster.nodes()[to].port());

    // Control, in the same slot before it moves: the notice arrives.
    let same_slot = (0..)
        .map(|i| key(&stage, &format!("control-{i}")))
        .find(|c| follower.backend().slot(&FlightId::of(c)) == slot)
        .unwrap();
    let (gate, o, f) = owner_and_follower(&owner, &follower, &same_slot, |r| {
        held(cluster.node_for(r).unwrap(), r)
    })
    .await;
    wait_until_async("the follower waits", Duration::from_secs(10), || async {
        follower.backend().followed_flights() == 1
    })
    .await;
    commit_and_expect_follower(gate, o, f, "before the slot moved").await;

    let (gate, o, f) = owner_and_follower(&owner, &follower, &k, |r| {
        held(cluster.node_for(r).unwrap(), r)
    })
    .await;
    wait_until_async("the follower waits", Duration::from_secs(10), || async {
        follower.backend().followed_flights() == 1
    })
    .await;
    let inbox = follower.backend().inbox(&flight);
    let subscribed_on = |i: usize| -> i64 {
        match cluster.nodes()[i]
            .cmd(&["PUBSUB", "SHARDNUMSUB", &inbox])
            .unwrap()
        {
            Resp::Array(Some(v)) => match v.get(1) {
                Some(Resp::Int(n)) => *n,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        subscribed_on(from),
        1,
        "the inbox is subscribed where the slot is"
    );

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.migrate_slot(slot, to, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    // The follower's node learns of the move (its periodic refresh, 5 s).
    wait_until_async(
        "the follower's node maps the slot to its new primary",
        Duration::from_secs(20),
        || async { follower.backend().shard(&flight).name() == Some(to_addr.as_str()) },
    )
    .await;
    // Its follower re-checks (the resync), and waits again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "inbox subscribed: {} on the old primary, {} on the new one",
        subscribed_on(from),
        subscribed_on(to)
    );
    assert_eq!(subscribed_on(to), 1, "the inbox follows its slot");
    commit_and_expect_follower(gate, o, f, "after the slot moved").await;
}

// ---------------------------------------------------------------------
// 3. Slots that move to a new primary; map changes that move no inbox.
// ---------------------------------------------------------------------

fn ok(r: Resp) {
    assert!(matches!(&r, Resp::Simple(s) if s == "OK"), "{r:?}");
}

fn text(r: Resp) -> String {
    r.as_str().expect("a text reply").to_owned()
}

/// Moves `slot` from cluster node `from` to `to` (not one of the
/// cluster's nodes), keys and all, the way `redis-cli --cluster reshard`
/// does.
fn migrate_to(cluster: &RedisCluster, slot: u16, from: usize, to: &RedisServer) {
    let source = &cluster.nodes()[from];
    let from_id = text(source.cmd(&["CLUSTER", "MYID"]).unwrap());
    let to_id = text(to.cmd(&["CLUSTER", "MYID"]).unwrap());
    let s = slot.to_string();
    ok(to
        .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
        .unwrap());
    ok(source
        .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
        .unwrap());
    loop {
        let Resp::Array(Some(keys)) = source
            .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])
            .unwrap()
        else {
            panic!("GETKEYSINSLOT");
        };
        if keys.is_empty() {
            break;
        }
        let port = to.port().to_string();
        let mut cmd = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        let names: Vec<&str> = keys.iter().filter_map(Resp::as_str).collect();
        cmd.extend(names.iter().copied());
        let r = source.cmd(&cmd).unwrap();
        assert!(matches!(r, Resp::Simple(_)), "MIGRATE: {r:?}");
    }
    ok(to.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]).unwrap());
    for n in cluster.nodes() {
        ok(n.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]).unwrap());
    }
}

fn shard_subscribers(server: &RedisServer, channel: &str) -> i64 {
    match server.cmd(&["PUBSUB", "SHARDNUMSUB", channel]).unwrap() {
        Resp::Array(Some(v)) => match v.get(1) {
            Some(Resp::Int(n)) => *n,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

// A slot moves to a primary this node had no client for.

/// Cluster of 2 primaries, and a third node joined later that serves no
/// slot (scale-out; a failover to a replica is the same case: the new
/// primary is not in the old map). The follower's node subscribed its
/// inbox for slot S on primary A; S moves to the new node D. The
/// follower's node refreshes its map: `install` starts a `Node` for D
/// (its clients only begin to connect), notes S's inbox on D's subscriber
/// and subscribes it there once D is connected; the follower re-checks
/// (its ACQUIRE on D puts the inbox in the record) and the owner's COMMIT
/// on D reaches it. Before the fix (found in review) the inbox was
/// skipped while D was still connecting and left noted on A's
/// subscriber: subscribed nowhere, the COMMIT published into the void.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_slot_moves_to_a_new_primary_its_inbox_is_subscribed_there() {
    let cluster = Arc::new(RedisCluster::start(2).unwrap());
    a_follower_waits_across(
        cluster,
        "new-primary",
        |c, _| c.join_empty_node().unwrap(),
        migrate_to,
        "after the slot moved to a new primary",
    )
    .await;
}

/// A follower of a flight of `stage` waits on its owner while `move_slot`
/// gives the flight's slot (served by primary `from`) to the node
/// `new_node` started (one the backends had no client for); the owner's
/// COMMIT then reaches the follower, through its inbox subscribed again on
/// the new node.
async fn a_follower_waits_across(
    cluster: Arc<RedisCluster>,
    stage: &str,
    new_node: impl FnOnce(&RedisCluster, usize) -> RedisServer + Send + 'static,
    move_slot: impl FnOnce(&RedisCluster, u16, usize, &RedisServer) + Send + 'static,
    round: &str,
) {
    let config = || {
        RedisConfig::new(cluster.url())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
    };
    let follower = flights(RedisBackend::connect(config()).await.unwrap());
    let owner = flights(RedisBackend::connect(config()).await.unwrap());
    let stage = StageName::new(stage).unwrap();
    let k = key(&stage, "moving");
    let flight = FlightId::of(&k);
    let slot = follower.backend().slot(&flight);
    let from = cluster.slot_owner(slot).unwrap();

    let c = cluster.clone();
    let node = tokio::task::spawn_blocking(move || Arc::new(new_node(&c, from)))
        .await
        .unwrap();
    let new_addr = format!("127.0.0.1:{}", node.port());

    let (gate, o, f) = owner_and_follower(&owner, &follower, &k, |r| {
        held(cluster.node_for(r).unwrap(), r)
    })
    .await;
    wait_until_async("the follower waits", Duration::from_secs(10), || async {
        follower.backend().followed_flights() == 1
    })
    .await;
    let inbox = follower.backend().inbox(&flight);
    assert_eq!(shard_subscribers(&cluster.nodes()[from], &inbox), 1);

    let (c, n) = (cluster.clone(), node.clone());
    tokio::task::spawn_blocking(move || move_slot(&c, slot, from, &n))
        .await
        .unwrap();
    wait_until_async(
        "the follower's node maps the slot to the new primary",
        Duration::from_secs(20),
        || async { follower.backend().shard(&flight).name() == Some(new_addr.as_str()) },
    )
    .await;
    // Its follower re-checks (the resyncs), and waits again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "{round}: inbox subscribed on the new primary: {}",
        shard_subscribers(&node, &inbox),
    );
    commit_and_expect_follower(gate, o, f, round).await;
}

// A map change that moves none of the node's inboxes.

/// A flight of stage `stage` in each of `n` distinct slots, avoiding
/// `except`.
fn flights_in_distinct_slots(
    b: &RedisBackend,
    stage: &StageName,
    n: usize,
    except: u16,
) -> Vec<FlightId> {
    let mut seen = std::collections::HashSet::from([except]);
    (0..)
        .map(|i| FlightId::of(&key(stage, &format!("k{i}"))))
        .filter(|f| seen.insert(b.slot(f)))
        .take(n)
        .collect()
}

/// A node that followed flights in many slots has an inbox in each of
/// them (they are never dropped: up to 16384). Redis drops only a
/// *moved* slot's shard channels: after a slot-map change only the
/// inboxes whose slot another primary serves now are subscribed again
/// (and lose their joinable bit meanwhile). Before the fix (found in
/// review) every map change sent one SSUBSCRIBE per inbox, one at a time,
/// before the followers' last re-check: a reshard of M slots cost M ×
/// (inboxes) round trips. Here: 1500 inboxes, one slot that has
/// none moves; before the fix (found in review) 1500 SSUBSCRIBEs were
/// sent again, where none is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_change_subscribes_again_only_the_inboxes_whose_slot_moved() {
    const INBOXES: usize = 1500;
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    let config = RedisConfig::new(cluster.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
        .subscriber_ping(Duration::from_secs(3600));
    let b = RedisBackend::connect(config).await.unwrap();
    let stage = StageName::new("many-inboxes").unwrap();

    // The slot that moves, with no inbox of this node.
    let moving = FlightId::of(&key(&stage, "moving"));
    let slot = b.slot(&moving);
    let from = cluster.slot_owner(slot).unwrap();
    let to = (from + 1) % 3;
    let to_addr = format!("127.0.0.1:{}", cluster.nodes()[to].port());

    // This node follows one flight in each of 1500 other slots (the
    // follower leaves; its inbox stays, as after any follower).
    for f in flights_in_distinct_slots(&b, &stage, INBOXES, slot) {
        let sub = b.subscribe(&f).await.expect("subscribed");
        drop(sub);
    }
    assert_eq!(b.subscribed_channels(), INBOXES);
    let before = cluster.command_calls("ssubscribe").unwrap();

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.migrate_slot(slot, to, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    wait_until_async(
        "the node maps the slot to its new primary",
        Duration::from_secs(20),
        || async { b.shard(&moving).name() == Some(to_addr.as_str()) },
    )
    .await;
    let changed = tokio::time::Instant::now();
    // Let the subscriptions after the change run their course.
    let mut sent = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cluster.command_calls("ssubscribe").unwrap() - before;
        if now == sent {
            break;
        }
        sent = now;
    }
    eprintln!(
        "one slot without an inbox moved: {sent} SSUBSCRIBEs sent again in {:?} ({INBOXES} inboxes, none moved)",
        changed.elapsed()
    );
    assert!(
        sent <= 10,
        "a map change that moved no inbox's slot sent {sent} SSUBSCRIBEs (one per inbox the node ever had)"
    );
}

// ---------------------------------------------------------------------
// 3. The same after a failover: the promoted replica is a new primary.
// ---------------------------------------------------------------------

fn info_has(server: &RedisServer, section: &str, line: &str) -> bool {
    text(server.cmd(&["INFO", section]).unwrap())
        .lines()
        .any(|l| l.trim() == line)
}

/// A manual failover (`CLUSTER FAILOVER` on a replica of the primary
/// serving the follower's slot): the replica, a node the backends had no
/// client for, now serves the slot; the old primary is a replica and its
/// `Node` is dropped. Before the fix (found in review), as in the test
/// above, `subscribe_inboxes_again` found the promoted node's subscriber
/// still connecting and skipped the inbox, whose `on` stayed at the
/// dropped node's subscriber, so nothing ever subscribed it on the new
/// primary: every follower waiting across a failover missed its notice
/// and waited for its poll. Now it waits for the new node to connect, and
/// the inbox is noted on the new node's subscriber at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_inbox_is_subscribed_on_the_promoted_replica() {
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    // A replica of the slot's primary, in sync; then promoted.
    let replica_of = |c: &RedisCluster, from: usize| {
        let replica = c.join_empty_node().unwrap();
        let primary_id = text(c.nodes()[from].cmd(&["CLUSTER", "MYID"]).unwrap());
        ok(replica.cmd(&["CLUSTER", "REPLICATE", &primary_id]).unwrap());
        wait_until("the replica in sync", Duration::from_secs(30), || {
            info_has(&replica, "replication", "master_link_status:up")
        });
        replica
    };
    let promote = |_: &RedisCluster, _: u16, _: usize, r: &RedisServer| {
        ok(r.cmd(&["CLUSTER", "FAILOVER"]).unwrap());
        wait_until("the replica promoted", Duration::from_secs(30), || {
            info_has(r, "replication", "role:master")
        });
    };
    a_follower_waits_across(cluster, "failover", replica_of, promote, "after a failover").await;
}
