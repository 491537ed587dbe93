//! examples/axum.rs over real HTTP on loopback (axum server, hyper-util
//! client): a burst runs the model once, locally and across two nodes
//! sharing a real Redis; flightdeck's errors arrive as HTTP statuses; the
//! `/metrics` endpoint shows the stage's counters.

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod axum_example;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum_example::{run, score_as, score_once, Options};
use flightdeck::Mode;
use flightdeck_harness::RedisServer;
use http::StatusCode;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Body>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http::<Body>()
}

/// Every test gets a bounded time: nothing here may hang CI.
///
/// The tests of this file run one at a time: the example installs its
/// Prometheus recorder once per process, and every node's stages are named
/// alike, so a node that starts (or leaves degraded mode) sets the same
/// `singleflight_degraded{stage="score"}` series that another test reads.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the test finished within 60 s")
}

/// `n` identical requests per node, all released together; returns the
/// statuses and distinct bodies.
async fn burst(
    client: &HttpClient,
    addrs: &[std::net::SocketAddr],
    n: usize,
    answer: &'static str,
) -> (Vec<StatusCode>, std::collections::BTreeSet<bytes::Bytes>) {
    let barrier = Arc::new(tokio::sync::Barrier::new(n * addrs.len()));
    let mut tasks = Vec::new();
    for &addr in addrs {
        for _ in 0..n {
            let (client, barrier) = (client.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                score_once(&client, addr, answer).await
            }));
        }
    }
    let mut statuses = Vec::new();
    let mut bodies = std::collections::BTreeSet::new();
    for t in tasks {
        let (status, body) = t.await.unwrap().unwrap();
        statuses.push(status);
        bodies.insert(body);
    }
    (statuses, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_only_burst_runs_the_model_once() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(1000)))
            .await
            .unwrap();
        assert_eq!(node.mode(), Mode::LocalOnly, "no REDIS_URL: LOCAL_ONLY");
        let client = client();
        let (statuses, bodies) = burst(&client, &[node.addr], 40, "a tower layer").await;
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "{statuses:?}"
        );
        assert_eq!(bodies.len(), 1, "everybody got the same score");
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 1);

        // A different answer is different work.
        let (status, _) = score_once(&client, node.addr, "another answer")
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 2);

        // The usage endpoint and the metrics endpoint tell the same story.
        let usage = get(&client, node.addr, "/v1/usage").await;
        assert!(usage.contains("\"model_calls\":2"), "{usage}");
        let metrics = get(&client, node.addr, "/metrics").await;
        assert!(
            metrics.contains("singleflight_local_waiter_total{stage=\"score\"}"),
            "{metrics}"
        );
        assert!(metrics.contains("singleflight_execution_duration_bucket"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_two_nodes_share_one_execution_through_redis() {
    bounded(async {
        let redis = RedisServer::start().unwrap();
        let mut nodes = Vec::new();
        for _ in 0..2 {
            let mut opts = Options::local(Duration::from_millis(400));
            opts.redis_url = Some(redis.url());
            nodes.push(run(opts).await.unwrap());
        }
        assert_eq!(nodes[0].mode(), Mode::Hybrid, "REDIS_URL set: HYBRID");
        let client = client();
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let (statuses, bodies) = burst(&client, &addrs, 20, "shared across nodes").await;
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "{statuses:?}"
        );
        assert_eq!(bodies.len(), 1, "both nodes answered with the same score");
        let calls: u64 = nodes
            .iter()
            .map(|n| n.model.calls.load(Ordering::SeqCst))
            .sum();
        assert_eq!(calls, 1, "one model call for 40 requests on 2 nodes");

        // Later, a new request runs the model again: the example's
        // `replay-ttl` is 0s (no replay, only callers waiting share a run).
        let (status, _) = score_once(&client, addrs[1], "shared across nodes")
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        let calls: u64 = nodes
            .iter()
            .map(|n| n.model.calls.load(Ordering::SeqCst))
            .sum();
        assert_eq!(calls, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_breaker_is_503_in_distributed_only_and_a_local_fallback_in_hybrid() {
    bounded(async {
        let redis = RedisServer::start().unwrap();
        let mut opts = Options::local(Duration::from_millis(10));
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.unwrap();
        let stage = node.flights.stage("score").unwrap();
        stage.breaker().force_open();
        let client = client();

        // HYBRID: Redis is "down", the request still gets a score, computed
        // here, and the stage is visibly degraded.
        let (status, _) = score_once(&client, node.addr, "fallback").await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(stage.is_degraded());
        let metrics = get(&client, node.addr, "/metrics").await;
        assert!(
            metrics.contains(
                "singleflight_local_fallback_total{stage=\"score\",reason=\"circuit_open\"}"
            ),
            "{metrics}"
        );
        assert!(
            metrics.contains("singleflight_degraded{stage=\"score\"} 1"),
            "{metrics}"
        );

        // DISTRIBUTED_ONLY (work that must never run twice): fail fast.
        stage.set_mode(Mode::DistributedOnly).unwrap();
        let (status, body) = score_once(&client, node.addr, "must not run twice")
            .await
            .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
        assert_eq!(
            node.model.calls.load(Ordering::SeqCst),
            1,
            "only the fallback ran"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_model_is_504_and_full_bulkhead_is_429() {
    bounded(async {
        let config = axum_example::DEFAULT_CONFIG
            .replace(
                "execution-timeout = \"20s\"",
                "execution-timeout = \"1500ms\"",
            )
            .replace("limit = 32 ", "limit = 1 ")
            .replace("degraded-limit = 8 ", "degraded-limit = 1 ");
        assert_ne!(config, axum_example::DEFAULT_CONFIG);
        // Margins are wide so a loaded CI machine cannot blur 429 and 504.
        let mut opts = Options::local(Duration::from_millis(3000));
        opts.config = config;
        let node = run(opts).await.unwrap();
        let client = client();

        // One model call holds the only slot (and will overrun its budget).
        let slow = {
            let client = client.clone();
            let addr = node.addr;
            tokio::spawn(async move { score_once(&client, addr, "slow").await })
        };
        for _ in 0..500 {
            if node.model.calls.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 1);
        let (status, _) = score_once(&client, node.addr, "other work").await.unwrap();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "bulkhead full");

        let (status, body) = slow.await.unwrap().unwrap();
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body:?}");
    })
    .await;
}

async fn get(client: &HttpClient, addr: std::net::SocketAddr, path: &str) -> String {
    use http_body_util::BodyExt;
    let resp = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reached_under_their_own_addresses_coalesce_when_the_authority_is_ignored() {
    bounded(async {
        let redis = RedisServer::start().unwrap();
        let client = client();
        // Each client reaches a node by its own name, so the Host header
        // differs per node: part of the key by default. (Its port alone
        // would not split the flight: the port is never in the key.)
        let mut runs = Vec::new();
        for ignore in [false, true] {
            let mut nodes = Vec::new();
            for _ in 0..2 {
                let mut opts = Options::local(Duration::from_millis(400));
                opts.redis_url = Some(redis.url());
                if ignore {
                    opts.config = format!(
                        "{}\n[single-flight.keys]\nignore-authority = true\n",
                        axum_example::DEFAULT_CONFIG
                    );
                }
                nodes.push(run(opts).await.unwrap());
            }
            let answer = if ignore { "any host" } else { "own host" };
            let calls = nodes.iter().enumerate().map(|(i, n)| {
                let client = client.clone();
                let addr = n.addr;
                let host = format!("node-{i}.internal:{}", addr.port());
                tokio::spawn(async move { score_as(&client, addr, Some(&host), answer).await })
            });
            for call in calls.collect::<Vec<_>>() {
                let (status, _) = call.await.unwrap().unwrap();
                assert_eq!(status, StatusCode::OK);
            }
            runs.push(
                nodes
                    .iter()
                    .map(|n| n.model.calls.load(Ordering::SeqCst))
                    .sum::<u64>(),
            );
        }
        assert_eq!(runs, [2, 1], "host in the key: 2 runs; ignored: 1");
    })
    .await;
}

/// `PUT` on a path; returns the status.
async fn put(client: &HttpClient, addr: std::net::SocketAddr, path: &str) -> StatusCode {
    let req = http::Request::put(format!("http://{addr}{path}"))
        .body(Body::empty())
        .unwrap();
    client.request(req).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_fails_on_demand_until_it_is_up_again() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(10)))
            .await
            .unwrap();
        let client = client();
        let (status, _) = score_once(&client, node.addr, "before").await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 1);

        assert_eq!(
            put(&client, node.addr, "/v1/model/down").await,
            StatusCode::OK
        );
        for answer in ["before", "during"] {
            let (status, body) = score_once(&client, node.addr, answer).await.unwrap();
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
        }
        assert_eq!(
            node.model.calls.load(Ordering::SeqCst),
            1,
            "a model that is down is not called"
        );
        let usage = get(&client, node.addr, "/v1/usage").await;
        assert!(
            usage.contains("\"model_down\":true") && usage.contains("\"refused_while_down\":2"),
            "{usage}"
        );

        assert_eq!(
            put(&client, node.addr, "/v1/model/up").await,
            StatusCode::OK
        );
        let (status, _) = score_once(&client, node.addr, "after").await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 2);
        let usage = get(&client, node.addr, "/v1/usage").await;
        assert!(usage.contains("\"model_down\":false"), "{usage}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_is_refused_without_running_the_model() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(10)))
            .await
            .unwrap();
        let big = "x".repeat(100 * 1024);
        let (status, _) = score_once(&client(), node.addr, &big).await.unwrap();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_and_serves_with_redis_down() {
    bounded(async {
        let mut redis = RedisServer::start().unwrap();
        redis.kill();
        let mut opts = Options::local(Duration::from_millis(10));
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.expect("starts with Redis down");
        assert_eq!(node.mode(), Mode::Hybrid);
        let stage = node.flights.stage("score").unwrap();
        assert!(stage.is_degraded(), "starts degraded");
        let (status, _) = score_once(&client(), node.addr, "no redis").await.unwrap();
        assert_eq!(status, StatusCode::OK, "served from this process");
        assert_eq!(node.model.calls.load(Ordering::SeqCst), 1);
    })
    .await;
}

/// For the record (printed, not asserted: a measurement, not a timed
/// test): the Redis server time of one flight of this service, as `INFO
/// commandstats` counts it (the `usec` of `EVALSHA`, the scripts' inner
/// commands included): one HYBRID node, rounds of 24 fresh answers sent at
/// once (each its own flight: ACQUIRE, the model, COMMIT of the encoded
/// HTTP response), then the median over the rounds of the server time per
/// flight. `cargo test --release --all-features --test axum_example measure -- --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measure_redis_server_time_per_flight() {
    const ROUNDS: usize = if cfg!(debug_assertions) { 3 } else { 15 };
    const AT_ONCE: usize = 24;
    bounded(async {
        let redis = RedisServer::start().unwrap();
        let mut opts = Options::local(Duration::from_millis(1));
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.unwrap();
        let client = client();
        let (mut per_flight, mut scripts) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
            let tasks: Vec<_> = (0..AT_ONCE)
                .map(|i| {
                    let (client, addr) = (client.clone(), node.addr);
                    let answer = format!("measured answer {round}/{i}");
                    tokio::spawn(async move { score_once(&client, addr, &answer).await })
                })
                .collect();
            for t in tasks {
                let (status, _) = t.await.unwrap().unwrap();
                assert_eq!(status, StatusCode::OK);
            }
            node.flights.idle().await;
            let usec = redis.command_usec("evalsha").unwrap();
            let calls = redis.command_calls("evalsha").unwrap();
            per_flight.push(usec as f64 / AT_ONCE as f64);
            scripts.push(calls);
        }
        per_flight.sort_by(f64::total_cmp);
        eprintln!(
            "Redis server time per flight of the axum example ({AT_ONCE} fresh answers at once, \
             {ROUNDS} rounds): median {:.1} us (rounds {:.1}-{:.1} us); EVALSHA per round {scripts:?}",
            per_flight[per_flight.len() / 2],
            per_flight[0],
            per_flight[per_flight.len() - 1],
        );
    })
    .await;
}

/// The answer-anyway keys `flightdeck.toml` documents, commented out.
const STALE_KEYS: [&str; 7] = [
    "stale-while-revalidate",
    "stale-if-error",
    "stale-retry-after",
    "soft-timeout",
    "early-refresh",
    "hit-for-pass",
    "cache-status",
];

/// Uncommented, the shipped file's stale keys are the fixed names, in the
/// score stage's table, with values its loader takes; a build without
/// them refuses the first by its name, not the file's syntax or another
/// key.
#[test]
fn the_commented_stale_keys_parse_when_uncommented() {
    let mut uncommented = 0;
    let text: String = axum_example::DEFAULT_CONFIG
        .lines()
        .map(|line| {
            let key = line.strip_prefix("# ").filter(|rest| {
                STALE_KEYS
                    .iter()
                    .any(|k| rest.starts_with(&format!("{k} ")))
            });
            match key {
                Some(rest) => {
                    uncommented += 1;
                    format!("{rest}\n")
                }
                None => format!("{line}\n"),
            }
        })
        .collect();
    assert_eq!(uncommented, STALE_KEYS.len(), "each key once:\n{text}");
    match flightdeck::SingleFlightConfig::from_toml(&text) {
        Ok(cfg) => assert!(cfg.stages.contains_key("score")),
        Err(e) => {
            assert_eq!(e.stage(), Some("score"), "{e}");
            assert!(
                STALE_KEYS.contains(&e.field().unwrap_or_default()),
                "only a stale key may be refused: {e}"
            );
        }
    }
}
