//! The Redis backend on the deployments users run besides one open server:
//! a password and an ACL user, and Sentinel with a forced failover.
//! Every server is started by the testkit on free loopback ports.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    BackendErrorKind, DistributedFlightLayer, DistributedPolicy, PostcardCodec,
};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_testkit::{conformance, RedisSentinel, RedisServer, Resp};
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

/// An L2 stack whose work answers `v:{req}` and counts executions per key.
fn stack(b: RedisBackend, calls: &Calls) -> Svc {
    let calls = calls.clone();
    let layer = DistributedFlightLayer::new(
        b,
        DistributedPolicy::new()
            .lease(Duration::from_millis(1500))
            .heartbeat(Duration::from_millis(400))
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(Duration::from_secs(5))
            .result_ttl(Duration::from_secs(60))
            .call_timeout(Duration::from_millis(500)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &String| {
            Some(FlightKey::from_bytes(
                StageName::new("deploy").unwrap(),
                req,
            ))
        },
    )
    .unwrap();
    BoxCloneService::new(layer.layer(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            *calls.lock().unwrap().entry(req.clone()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, BoxError>(format!("v:{req}"))
        }
    })))
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
    let sentinel = within(60, "sentinel start", async {
        tokio::task::spawn_blocking(RedisSentinel::start)
            .await
            .unwrap()
            .unwrap()
    })
    .await;
    let sentinel = Arc::new(sentinel);
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
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (a, stop) = (a.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let key = format!("during-{i}");
                match timeout(Duration::from_secs(10), a.clone().oneshot(key.clone())).await {
                    Ok(Ok(v)) => {
                        assert_eq!(v, format!("v:{key}"));
                        ok += 1;
                    }
                    Ok(Err(_)) => failed += 1,
                    Err(_) => panic!("request {key} hung"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = sentinel.clone();
    within(60, "failover", async move {
        tokio::task::spawn_blocking(move || s.failover(Duration::from_secs(45)))
            .await
            .unwrap()
            .unwrap()
    })
    .await;
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
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = within(20, "load", load).await.unwrap();
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
