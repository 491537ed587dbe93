//! The Redis backend on a real 3-primary Redis Cluster (testkit): hash-tagged
//! keys in one slot, sharded pub/sub (SSUBSCRIBE/SPUBLISH), scripts loaded on
//! every primary and reloaded after a cluster-wide SCRIPT FLUSH
//! (invariant 13).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{DistributedFlightLayer, DistributedPolicy, KeyFn, PostcardCodec};
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
