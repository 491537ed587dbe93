//! The Redis backend on the deployments users run besides one open server:
//! a password and an ACL user, and Sentinel with a forced failover.
//! Every server is started by the harness on free loopback ports.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{metric, CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    BackendErrorKind, DistributedFlightLayer, DistributedFlights, DistributedPolicy, PostcardCodec,
};
use flightdeck_harness::{RedisSentinel, RedisServer, Resp};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::{conformance, recorded};
use tokio::time::{timeout, Instant};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// Every await of these tests is bounded.
async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {secs} s"))
}

fn config(url: String) -> RedisConfig {
    RedisConfig::new(url)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(200))
}

type Svc = BoxCloneService<String, String, BoxError>;
type Calls = Arc<Mutex<HashMap<String, usize>>>;

fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(Duration::from_millis(1500))
        .heartbeat(Duration::from_millis(400))
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(Duration::from_secs(5))
        .replay_ttl(Duration::from_secs(60))
        .call_timeout(Duration::from_millis(500))
}

/// An L2 stack whose work answers `v:{req}` and counts executions per key.
fn stack(b: RedisBackend, calls: &Calls) -> Svc {
    stack_with(b, calls, "deploy", policy()).0
}

/// [`stack`] for a stage and a policy, with its flights (to wait for the
/// background calls).
fn stack_with(
    b: RedisBackend,
    calls: &Calls,
    stage: &'static str,
    policy: DistributedPolicy,
) -> (Svc, DistributedFlights<RedisBackend, PostcardCodec<String>>) {
    recorded::install();
    let calls = calls.clone();
    let layer = DistributedFlightLayer::new(
        b,
        policy,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        move |req: &String| Some(FlightKey::from_bytes(StageName::new(stage).unwrap(), req)),
    )
    .unwrap();
    let flights = layer.flights().clone();
    let svc = BoxCloneService::new(layer.layer(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            *calls.lock().unwrap().entry(req.clone()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, BoxError>(format!("v:{req}"))
        }
    })));
    (svc, flights)
}

async fn start_sentinel() -> Arc<RedisSentinel> {
    let sentinel = within(60, "sentinel start", async {
        tokio::task::spawn_blocking(RedisSentinel::start)
            .await
            .unwrap()
            .unwrap()
    })
    .await;
    Arc::new(sentinel)
}

/// A forced failover, waited for (see `RedisSentinel::failover`).
async fn failover(sentinel: &Arc<RedisSentinel>) {
    let s = sentinel.clone();
    within(60, "failover", async move {
        tokio::task::spawn_blocking(move || s.failover(Duration::from_secs(45)))
            .await
            .unwrap()
            .unwrap()
    })
    .await;
}

/// Distinct flights one after the other (`during-{i}`, 20 ms apart) until
/// stopped; every answer is right or a typed error, none hangs.
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<String>, u32)>,
}

impl Load {
    fn start(svc: &Svc) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (svc, stopped) = (svc.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let (mut answered, mut failed) = (Vec::new(), 0);
            for i in 0.. {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let key = format!("during-{i}");
                match timeout(Duration::from_secs(10), svc.clone().oneshot(key.clone())).await {
                    Ok(Ok(v)) => {
                        assert_eq!(v, format!("v:{key}"));
                        answered.push(key);
                    }
                    Ok(Err(_)) => failed += 1,
                    Err(_) => panic!("request {key} hung"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (answered, failed)
        });
        Self { stop, task }
    }

    /// The keys answered, and how many requests failed (typed errors).
    async fn stop(self) -> (Vec<String>, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        within(20, "load", self.task).await.unwrap()
    }
}

/// Issue 7: a server with a password and an ACL user. The backend connects
/// with either credential (given in the config or in the URL); without
/// them, or with a wrong password, `connect` fails with an error that says
/// the credentials were refused.
#[tokio::test]
async fn password_and_acl_user() {
    let redis = RedisServer::start_with_args(&[
        "--requirepass",
        "admin-pw",
        "--user",
        "app",
        "on",
        ">app-pw",
        "~*",
        "&*",
        "+@all",
    ])
    .unwrap()
    .with_auth("default", "admin-pw");
    let url = redis.url();

    for (what, cfg) in [
        ("no credentials", config(url.clone())),
        (
            "wrong password",
            config(url.clone()).credentials("app", "wrong"),
        ),
        (
            "unknown user",
            config(url.clone()).credentials("nobody", "x"),
        ),
    ] {
        let err = within(10, what, RedisBackend::connect(cfg))
            .await
            .expect_err(what);
        assert_eq!(err.kind(), BackendErrorKind::Protocol, "{what}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("refused the credentials"), "{what}: {msg}");
    }

    let calls = Calls::default();
    let acl = within(
        10,
        "connect as app",
        RedisBackend::connect(config(url.clone()).credentials("app", "app-pw")),
    )
    .await
    .unwrap();
    let default = within(
        10,
        "connect with requirepass",
        RedisBackend::connect(config(url.clone()).password("admin-pw")),
    )
    .await
    .unwrap();
    let in_url = within(
        10,
        "connect with credentials in the URL",
        RedisBackend::connect(config(format!(
            "redis://app:app-pw@127.0.0.1:{}",
            redis.port()
        ))),
    )
    .await
    .unwrap();
    // The credentials stay out of Debug output.
    let shown = format!(
        "{:?}",
        config(format!("redis://app:app-pw@127.0.0.1:{}", redis.port())).password("admin-pw")
    );
    assert!(
        !shown.contains("app-pw") && !shown.contains("admin-pw"),
        "{shown}"
    );

    let nodes = [
        stack(acl, &calls),
        stack(default, &calls),
        stack(in_url, &calls),
    ];
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..5 {
            tasks.push(tokio::spawn(node.clone().oneshot("k".to_owned())));
        }
    }
    for t in tasks {
        assert_eq!(within(10, "request", t).await.unwrap().unwrap(), "v:k");
    }
    assert_eq!(calls.lock().unwrap()["k"], 1);
    // The server saw the ACL user.
    let clients = redis.cmd(&["CLIENT", "LIST"]).unwrap();
    assert!(
        clients.as_str().unwrap_or_default().contains("user=app"),
        "{clients:?}"
    );
}

/// Issue 7: fred finds the primary through three sentinels; the backend
/// passes the conformance suite there, and after a forced failover
/// (`SENTINEL FAILOVER`), with requests running throughout, it keeps
/// working: new flights commit on the new primary and a result committed
/// before the failover is replayed, not re-executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_the_backend_working() {
    let sentinel = start_sentinel().await;
    let first_primary = sentinel.primary_port().unwrap();
    let url = sentinel.url();
    let raw = within(10, "connect", RedisBackend::connect(config(url.clone())))
        .await
        .unwrap();
    within(60, "conformance", conformance::run_all(Arc::new(raw))).await;

    let calls = Calls::default();
    let a = stack(
        within(10, "connect a", RedisBackend::connect(config(url.clone())))
            .await
            .unwrap(),
        &calls,
    );
    let b = stack(
        within(10, "connect b", RedisBackend::connect(config(url.clone())))
            .await
            .unwrap(),
        &calls,
    );
    assert_eq!(
        within(10, "before", a.clone().oneshot("before".into()))
            .await
            .unwrap(),
        "v:before"
    );

    // Load during the failover: every answer is right or a typed error.
    let load = Load::start(&a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    failover(&sentinel).await;
    let new_primary = sentinel.primary_port().unwrap();
    assert_ne!(new_primary, first_primary);

    // Bounded recovery: the first success after the failover.
    let healed = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("after-{n}");
        match timeout(Duration::from_secs(10), b.clone().oneshot(key.clone())).await {
            Ok(Ok(v)) => {
                assert_eq!(v, format!("v:{key}"));
                break;
            }
            Ok(Err(e)) => {
                assert!(healed.elapsed() < Duration::from_secs(20), "not back: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => panic!("request hung after the failover"),
        }
    }
    let (answered, failed) = load.stop().await;
    let ok = answered.len();
    eprintln!(
        "sentinel failover {first_primary} -> {new_primary}: during it {ok} ok, {failed} typed errors; \
         back {:?} after the sentinels agreed",
        healed.elapsed()
    );

    // Both nodes work on the new primary, and coalesce there.
    let mut tasks = Vec::new();
    for node in [&a, &b] {
        for _ in 0..10 {
            tasks.push(tokio::spawn(node.clone().oneshot("shared".to_owned())));
        }
    }
    for t in tasks {
        assert_eq!(within(15, "shared", t).await.unwrap().unwrap(), "v:shared");
    }
    assert_eq!(calls.lock().unwrap()["shared"], 1);
    // Replicated before the failover: replayed, not executed again.
    assert_eq!(
        within(10, "before again", b.clone().oneshot("before".into()))
            .await
            .unwrap(),
        "v:before"
    );
    assert_eq!(calls.lock().unwrap()["before"], 1);
    // The new primary holds the flights.
    let primary = sentinel.primary().unwrap();
    let Resp::Array(Some(keys)) = primary.cmd(&["KEYS", "fd:*"]).unwrap() else {
        panic!("KEYS answers an array");
    };
    assert!(!keys.is_empty());
}

/// What a forced failover under load did to the results of one node.
#[derive(Debug)]
struct Losses {
    /// Requests answered during the failover (each a flight of its own).
    answered: usize,
    /// Of those, the ones asked again after it that ran again: their
    /// result was gone.
    ran_again: usize,
    lost: u64,
    write_failures: u64,
    /// Commits refused because the store named another owner: the value
    /// served its callers and was never stored.
    fenced: u64,
    acked: u64,
    unacked: u64,
}

/// Starts Sentinel, runs distinct flights on one node through a forced
/// failover (after `SENTINEL FAILOVER` the old primary keeps taking this
/// node's writes until the sentinels demote it, several seconds later: a
/// failover that loses writes, for real), then asks every answered key
/// again on the same node and counts what ran again and what the node's
/// metrics said.
async fn failover_under_load(stage: &'static str, policy: DistributedPolicy) -> Losses {
    let sentinel = start_sentinel().await;
    let calls = Calls::default();
    let backend = within(10, "connect", RedisBackend::connect(config(sentinel.url())))
        .await
        .unwrap();
    let (a, flights) = stack_with(backend, &calls, stage, policy);
    let load = Load::start(&a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    failover(&sentinel).await;
    // The old primary is a replica now (it refuses writes): the node is
    // back once a new flight commits and is replayed.
    let healed = Instant::now();
    for n in 0.. {
        let key = format!("after-{n}");
        let first = within(10, "after", a.clone().oneshot(key.clone())).await;
        flights.idle().await;
        let again = within(10, "after again", a.clone().oneshot(key.clone())).await;
        if first.is_ok() && again.is_ok() && calls.lock().unwrap().get(&key) == Some(&1) {
            break;
        }
        assert!(healed.elapsed() < Duration::from_secs(30), "not back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (answered, _) = load.stop().await;
    flights.idle().await;
    let mut ran_again = 0;
    for key in &answered {
        within(10, "again", a.clone().oneshot(key.clone()))
            .await
            .unwrap();
        if calls.lock().unwrap()[key] > 1 {
            ran_again += 1;
        }
    }
    // The lost-result checks run in the background.
    flights.idle().await;
    let replicas = |result| {
        recorded::counter_where(
            metric::COMMIT_REPLICAS_TOTAL,
            stage,
            Some(("result", result)),
        )
    };
    Losses {
        answered: answered.len(),
        ran_again,
        lost: recorded::counter(metric::RESULT_LOST_TOTAL, stage),
        write_failures: recorded::counter(metric::RESULT_WRITE_FAILURE_TOTAL, stage),
        fenced: recorded::counter(metric::FENCED_TOTAL, stage),
        acked: replicas("acked"),
        unacked: replicas("short") + replicas("failed"),
    }
}

/// A Sentinel failover that loses committed results says so: every result
/// this node committed and later found gone ran again, and each is counted
/// in `singleflight_result_lost_total` (or was never stored: a counted
/// write failure, or a commit fenced by the new primary); nothing is lost
/// silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_counts_the_results_it_lost() {
    let l = failover_under_load("lost", policy()).await;
    eprintln!("{l:?}");
    assert!(
        l.ran_again > 0,
        "the old primary took writes after the promotion, and lost them: {l:?}"
    );
    assert!(l.lost as usize <= l.ran_again, "{l:?}");
    assert!(
        (l.lost + l.write_failures + l.fenced) as usize >= l.ran_again,
        "every result that ran again was counted lost or never stored: {l:?}"
    );
}

/// With `commit_replicas(1)` no acknowledged result is lost in the same
/// failover: what ran again had been counted unacknowledged at its commit
/// (the old primary had no replica any more), and nothing counts as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_loses_no_acknowledged_result() {
    let wait = policy()
        .commit_replicas(1)
        .commit_replicas_timeout(Duration::from_millis(100));
    let l = failover_under_load("acked", wait).await;
    eprintln!("{l:?}");
    assert!(l.acked > 0, "{l:?}");
    assert_eq!(l.lost, 0, "{l:?}");
    assert!(
        (l.unacked + l.write_failures + l.fenced) as usize >= l.ran_again,
        "every result that ran again was reported at its commit: {l:?}"
    );
    assert!(l.answered > l.ran_again, "{l:?}");
}
