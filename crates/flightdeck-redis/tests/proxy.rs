//! The Redis backend and the L2 layer behind the harness's TCP fault proxy:
//! latency, a blackhole (partition), connection resets and a reply cut in
//! the middle. Every request ends by its deadline, with the right value or
//! a typed error, and the backend recovers once the network heals.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{BoxError, ErrorClass};
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{DistributedFlightLayer, DistributedPolicy, PostcardCodec};
use flightdeck_harness::{Fault, FaultProxy, RedisServer};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::time::{timeout, Instant};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<String, String, BoxError>;
type Calls = Arc<Mutex<HashMap<String, usize>>>;

/// The bound on any one request here: two acquire attempts, a wait, commit
/// attempts, all with 300 ms deadlines, plus slack for 2 shared cores.
const REQUEST_BOUND: Duration = Duration::from_secs(8);

async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {secs} s"))
}

async fn node(url: String, calls: &Calls) -> Svc {
    let b = within(
        10,
        "connect",
        RedisBackend::connect(
            RedisConfig::new(url)
                .command_timeout(Duration::from_millis(300))
                .reconnect_max_delay(Duration::from_millis(100)),
        ),
    )
    .await
    .unwrap();
    let calls = calls.clone();
    let layer = DistributedFlightLayer::new(
        b,
        DistributedPolicy::new()
            .lease(Duration::from_millis(1200))
            .heartbeat(Duration::from_millis(300))
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(Duration::from_secs(3))
            .replay_ttl(Duration::from_secs(30))
            .call_timeout(Duration::from_millis(300)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &String| Some(FlightKey::from_bytes(StageName::new("proxy").unwrap(), req)),
    )
    .unwrap();
    BoxCloneService::new(layer.layer(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            *calls.lock().unwrap().entry(req.clone()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, BoxError>(format!("v:{req}"))
        }
    })))
}

/// One request, bounded: Ok(value) must be the key's own value.
fn call(svc: &Svc, key: &str) -> impl Future<Output = Result<(), BoxError>> + Send + 'static {
    let fut = svc.clone().oneshot(key.to_owned());
    let key = key.to_owned();
    checked(fut, key)
}

async fn checked(
    fut: impl Future<Output = Result<String, BoxError>>,
    key: String,
) -> Result<(), BoxError> {
    let started = Instant::now();
    let out = timeout(REQUEST_BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("request {key} hung past {REQUEST_BOUND:?}"));
    match out {
        Ok(v) => {
            assert_eq!(v, format!("v:{key}"), "a value for another key");
            Ok(())
        }
        Err(e) => {
            assert_eq!(
                ErrorClass::of(&*e),
                ErrorClass::Unavailable,
                "typed coordination error after {:?}: {e}",
                started.elapsed()
            );
            Err(e)
        }
    }
}

/// Retries until a request succeeds; the network healed, so this is bounded.
async fn recovers(svc: &Svc, what: &str) {
    let started = Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        if call(svc, &format!("{what}-heal-{i}")).await.is_ok() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}: no recovery"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 7: every proxy fault in turn, with a second node on a direct
/// connection: requests end by their deadline with the right value or a
/// typed error, nothing is executed twice, and each fault heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_end_by_their_deadlines_and_heal() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let calls = Calls::default();
    let behind = node(proxy.url(), &calls).await;
    let direct = node(redis.url(), &calls).await;

    call(&behind, "pass").await.unwrap();

    proxy.set(Fault::Latency(Duration::from_millis(40)));
    call(&behind, "slow").await.unwrap();
    // A follower behind the slow link gets the direct node's result.
    let owner = tokio::spawn({
        let direct = direct.clone();
        async move {
            call(&direct, "shared-slow")
                .await
                .map_err(|e| e.to_string())
        }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    call(&behind, "shared-slow").await.unwrap();
    within(10, "owner", owner).await.unwrap().unwrap();

    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    assert!(call(&behind, "partitioned").await.is_err());
    eprintln!("blackhole: typed error after {:?}", started.elapsed());
    // The other side of the partition is unaffected.
    call(&direct, "other-side").await.unwrap();
    proxy.set(Fault::Pass);
    recovers(&behind, "blackhole").await;

    proxy.set(Fault::Reset);
    assert!(call(&behind, "reset").await.is_err());
    proxy.set(Fault::Pass);
    recovers(&behind, "reset").await;

    proxy.reset_all();
    recovers(&behind, "reset-all").await;

    proxy.set(Fault::CutMidReply);
    let _ = call(&behind, "cut").await;
    let _ = call(&behind, "cut-2").await;
    proxy.set(Fault::Pass);
    recovers(&behind, "cut").await;
    assert!(proxy.stats().cuts >= 1, "{:?}", proxy.stats());
    // The cut flights finish cleanly later: each ran at most once.
    call(&behind, "cut").await.unwrap();
    call(&direct, "cut-2").await.unwrap();

    for (key, n) in calls.lock().unwrap().iter() {
        assert!(*n <= 1, "{key} executed {n} times");
    }
    eprintln!("proxy stats: {:?}", proxy.stats());
}
