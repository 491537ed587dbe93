//! The Redis backend on a real 3-primary Redis Cluster (testkit): hash-tagged
//! keys in one slot, sharded pub/sub (SSUBSCRIBE/SPUBLISH), scripts loaded on
//! every primary and reloaded after a cluster-wide SCRIPT FLUSH
//! (invariant 13).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedPolicy, FlightId, KeyFn, PostcardCodec,
};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_testkit::{conformance, RedisCluster};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

async fn backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(cluster.url())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connects to the test cluster")
}

type Svc = BoxCloneService<String, String, BoxError>;

fn node(b: RedisBackend, calls: &Arc<AtomicUsize>) -> Svc {
    let calls = calls.clone();
    let layer = DistributedFlightLayer::new(
        b,
        DistributedPolicy::new()
            .lease(Duration::from_millis(900))
            .heartbeat(Duration::from_millis(300))
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(Duration::from_secs(5))
            .result_ttl(Duration::from_secs(10))
            .call_timeout(Duration::from_millis(500)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        KeyFn::new(|req: &String| {
            Some(FlightKey::from_bytes(
                StageName::new("cluster").unwrap(),
                req,
            ))
        }),
    )
    .unwrap();
    BoxCloneService::new(layer.layer(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, BoxError>(format!("v:{req}"))
        }
    })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_backend_conforms() {
    let cluster = RedisCluster::start(3).unwrap();
    conformance::run_all(Arc::new(backend(&cluster).await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_three_nodes_one_execution_with_sharded_pubsub() {
    let cluster = RedisCluster::start(3).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(node(backend(&cluster).await, &calls));
    }
    // Several keys, so flights land on different shards.
    for key in ["a", "b", "c", "d"] {
        let mut tasks = Vec::new();
        for node in &nodes {
            for _ in 0..20 {
                tasks.push(tokio::spawn(node.clone().oneshot(key.to_owned())));
            }
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), format!("v:{key}"));
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4, "one execution per key");
    assert_eq!(cluster.command_calls("publish").unwrap(), 0);
    assert!(cluster.command_calls("spublish").unwrap() >= 4);
    assert!(cluster.command_calls("ssubscribe").unwrap() >= 1);

    // A cluster-wide SCRIPT FLUSH is transparent (scripts are reloaded on
    // the node that answered NOSCRIPT).
    cluster.flush_scripts().unwrap();
    assert_eq!(nodes[0].clone().oneshot("e".into()).await.unwrap(), "v:e");
    assert_eq!(nodes[1].clone().oneshot("e".into()).await.unwrap(), "v:e");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// Issue 7 / invariant 13: the server agrees that every key of a flight
/// (lease, state, result, channel) lives in one slot (`CLUSTER KEYSLOT`),
/// for many flights, and that slot is the one fred routes by.
#[tokio::test]
async fn flight_keys_share_one_slot_by_cluster_keyslot() {
    let cluster = RedisCluster::start(3).unwrap();
    let b = backend(&cluster).await;
    let stage = StageName::new("slots").unwrap();
    let mut slots_seen = std::collections::HashSet::new();
    for i in 0..50 {
        let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), format!("req-{i}")));
        let names = b.keys(&flight);
        let slot = cluster.keyslot(&names[0]).unwrap();
        for n in &names {
            assert_eq!(cluster.keyslot(n).unwrap(), slot, "{n}");
            assert_eq!(fred::util::redis_keyslot(n.as_bytes()), slot, "{n}");
        }
        slots_seen.insert(slot);
    }
    assert!(slots_seen.len() > 40, "flights spread over slots");
}

/// Flight keys (request strings) of stage `stage` whose keys hash to `slot`.
fn requests_in_slot(b: &RedisBackend, stage: &StageName, slot: u16, n: usize) -> Vec<String> {
    let mut found = Vec::new();
    for i in 0.. {
        let req = format!("m{i}");
        let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), &req));
        if fred::util::redis_keyslot(b.keys(&flight)[0].as_bytes()) == slot {
            found.push(req);
            if found.len() == n {
                break;
            }
        }
    }
    found
}

/// Issue 7: the slot holding several flights is migrated to another
/// primary (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) between bursts of
/// requests from two nodes whose clients still map the slot to the old
/// owner: fred follows the `MOVED` redirects, every flight goes on on the
/// new owner with its generation counter (moved with its keys), and each
/// new generation executes once.
///
/// Not covered: requests in flight DURING the migration. In our runs a
/// fred 10.1 client that followed an `ASK` redirect stopped getting
/// replies for good (every later command timed out): its `process_ask`
/// sends `ASKING` to the target but routes the command itself by slot, to
/// the old owner. A live resharding is a coordination outage for the nodes
/// that meet it (HYBRID falls back locally); see the crate docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_moved_is_followed() {
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    // The stage of `node`.
    let stage = StageName::new("cluster").unwrap();
    let probe = backend(&cluster).await;
    let first = FlightId::of(&FlightKey::from_bytes(stage.clone(), "m-first"));
    let slot = cluster.keyslot(&probe.keys(&first)[0]).unwrap();
    let mut reqs = vec!["m-first".to_owned()];
    reqs.extend(requests_in_slot(&probe, &stage, slot, 4));
    let from = cluster.slot_owner(slot).unwrap();
    let to = (from + 1) % 3;

    let calls = Arc::new(AtomicUsize::new(0));
    let nodes = [
        node(backend(&cluster).await, &calls),
        node(backend(&cluster).await, &calls),
    ];
    let burst = |round: &'static str| {
        let mut tasks = Vec::new();
        for req in &reqs {
            for node in &nodes {
                for _ in 0..5 {
                    let req = req.clone();
                    let fut = node.clone().oneshot(req.clone());
                    tasks.push(tokio::spawn(async move {
                        let v = tokio::time::timeout(Duration::from_secs(10), fut)
                            .await
                            .unwrap_or_else(|_| panic!("{round}: {req} hung"))
                            .unwrap_or_else(|e| panic!("{round}: {req}: {e}"));
                        assert_eq!(v, format!("v:{req}"), "a value for another key");
                    }));
                }
            }
        }
        tasks
    };
    for t in burst("before") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), reqs.len());
    let keys_before = cluster.nodes()[from]
        .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
        .unwrap();

    let c = cluster.clone();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || c.migrate_slot(slot, to, Duration::ZERO)),
    )
    .await
    .expect("migration within 60 s")
    .unwrap()
    .unwrap();
    assert_eq!(cluster.slot_owner(slot).unwrap(), to);
    let keys_after = cluster.nodes()[to]
        .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
        .unwrap();
    assert_eq!(keys_after, keys_before, "every key moved");

    // Stored results are replayed from the new owner (no execution)...
    for t in burst("replay") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), reqs.len());
    // ... and new generations start there, after the old ones.
    for req in &reqs {
        let key = FlightKey::from_bytes(stage.clone(), req);
        let flight = FlightId::of(&key);
        let gen = {
            use flightdeck_distributed::Backend;
            probe
                .invalidate(&flight, Duration::from_secs(60))
                .await
                .unwrap()
        };
        assert!(gen >= 2, "the generation counter moved with the keys");
    }
    let evalsha_before = cluster.nodes()[to].command_calls("evalsha").unwrap();
    for t in burst("after") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2 * reqs.len(),
        "one execution per new generation"
    );
    assert!(cluster.nodes()[to].command_calls("evalsha").unwrap() > evalsha_before);
    eprintln!(
        "slot {slot} moved from node {from} to {to} with {keys_before:?} keys; MOVED followed"
    );
}
