//! What a coalesced HTTP response may be handed to, end to end: an axum
//! origin on a loopback port behind the documented stack
//! (`ErrorResponseLayer` + `KeyLayer` + the single-flight layer), called by
//! a hyper client, in LOCAL_ONLY and in HYBRID with two nodes sharing one
//! backend.
//!
//! - `Set-Cookie`: every caller gets its own cookie; nothing is replayed on
//!   another node.
//! - `Cache-Control: private`, `no-store`, `no-cache` and `Vary: *`: never
//!   shared, never replayed.
//! - `Vary: X-Flavor`: every caller gets the body of its own flavour, on
//!   this node and on another.
//! - `X-Api-Key` and `Proxy-Authorization` tenants never share.
//! - The opt-ins (`SetCookie::Strip`, `SetCookie::Share`,
//!   `CacheControl::Ignore`) do exactly what they say.

#![cfg(feature = "http")]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request as AxumRequest, State};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::fast;
use flightdeck::core::http::{CacheControl, ErrorResponseLayer, HttpShare, SetCookie};
use flightdeck::distributed::Backend;
use flightdeck::key::http::HttpKeyExtractor;
use flightdeck::key::KeyLayer;
use flightdeck::readers::HttpReaders;
use flightdeck::{GenericSingleFlightLayer, Mode};
use flightdeck_harness::{RedisServer, Resp};
use flightdeck_test::MemoryBackend;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;

const STAGE: &str = "page";

/// How long the origin works on each request: long enough for a burst
/// released together to arrive while the first one runs.
const WORK: Duration = Duration::from_millis(300);

type Flights = GenericSingleFlightLayer<HttpReaders, HttpShare>;

/// The origin: counts its executions per path and answers by path.
#[derive(Default)]
struct Origin {
    calls: Mutex<HashMap<String, usize>>,
}

impl Origin {
    fn calls(&self, path: &str) -> usize {
        self.calls.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// `/<kind>`: the body names the path, the execution's number and the
/// request headers the response depends on; the headers are the kind's.
async fn page(State(origin): State<Arc<Origin>>, req: AxumRequest) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let n = {
        let mut calls = origin.calls.lock().unwrap();
        let n = calls.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    tokio::time::sleep(WORK).await;
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let mut resp = Response::builder();
    resp = match path.as_str() {
        // A fresh session for every execution.
        "/cookie" => resp.header("set-cookie", format!("sid={path}-{n}; HttpOnly")),
        "/private" => resp.header("cache-control", "private, max-age=60"),
        "/no-store" => resp.header("cache-control", "no-store"),
        "/no-cache" => resp.header("cache-control", "No-Cache"),
        "/vary-star" => resp.header("vary", "*"),
        "/flavor" => resp.header("vary", "X-Flavor"),
        _ => resp,
    };
    let body = format!(
        "{path} #{n} flavor={} api-key={} proxy={}",
        header("x-flavor"),
        header("x-api-key"),
        header("proxy-authorization")
    );
    resp.body(Body::from(body)).unwrap()
}

/// One node: the origin behind the stack, served on a loopback port.
async fn node(flights: Flights, origin: Arc<Origin>) -> SocketAddr {
    let keys = HttpKeyExtractor::builder()
        .default_stage(STAGE)
        .scope_secret("http-sharing-test-secret")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/{kind}", get(page))
        .with_state(origin)
        .layer(
            ServiceBuilder::new()
                .layer(ErrorResponseLayer::new())
                .layer(KeyLayer::new(keys))
                .layer(flights),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The layer of one node, with `share`'s sharing policy.
fn flights<B: Backend + Clone>(share: HttpShare, mode: Mode, backend: Option<&B>) -> Flights {
    let mut b = GenericSingleFlightLayer::http()
        .share(share)
        .stage(STAGE, fast(mode));
    if let Some(backend) = backend {
        b = b.backend("redis", backend.clone());
    }
    b.build().unwrap()
}

/// A LOCAL_ONLY node.
async fn local(share: HttpShare) -> (SocketAddr, Arc<Origin>) {
    let origin = Arc::new(Origin::default());
    let addr = node(
        flights::<MemoryBackend>(share, Mode::LocalOnly, None),
        origin.clone(),
    )
    .await;
    (addr, origin)
}

/// Two HYBRID nodes sharing one backend (like two processes of one
/// deployment sharing a Redis) and one origin.
async fn hybrid(share: HttpShare) -> ([SocketAddr; 2], Arc<Origin>, MemoryBackend) {
    let backend = MemoryBackend::new();
    let (addrs, origin) = two_nodes(share, &backend).await;
    (addrs, origin, backend)
}

async fn two_nodes<B: Backend + Clone>(
    share: HttpShare,
    backend: &B,
) -> ([SocketAddr; 2], Arc<Origin>) {
    let origin = Arc::new(Origin::default());
    let a = node(
        flights(share.clone(), Mode::Hybrid, Some(backend)),
        origin.clone(),
    )
    .await;
    let b = node(flights(share, Mode::Hybrid, Some(backend)), origin.clone()).await;
    ([a, b], origin)
}

/// Two HYBRID nodes, each with its own connection to one real
/// redis-server, and one origin.
async fn hybrid_redis(share: HttpShare) -> ([SocketAddr; 2], Arc<Origin>, RedisServer) {
    let redis = RedisServer::start().unwrap();
    let origin = Arc::new(Origin::default());
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let backend = common::redis_backend(redis.url()).await;
        addrs.push(
            node(
                flights(share.clone(), Mode::Hybrid, Some(&backend)),
                origin.clone(),
            )
            .await,
        );
    }
    ([addrs[0], addrs[1]], origin, redis)
}

/// How many flights in `redis` hold a stored result (field `s` of a
/// flight's hash: `ok` or `err`).
fn stored_results(redis: &RedisServer) -> usize {
    let Ok(Resp::Array(Some(keys))) = redis.cmd(&["KEYS", "*"]) else {
        panic!("KEYS answers an array")
    };
    keys.iter()
        .filter_map(Resp::as_str)
        .filter(|k| {
            k.ends_with(&format!(":{}", flightdeck_redis::LAYOUT))
                && redis
                    .cmd(&["HGET", k, "s"])
                    .ok()
                    .and_then(|r| r.as_str().map(str::to_owned))
                    .is_some()
        })
        .count()
}

#[derive(Debug, Clone)]
struct Reply {
    status: StatusCode,
    cookies: Vec<String>,
    body: String,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn fetch(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&'static str, &'static str)],
) -> Reply {
    // Every node sees one public name, as behind a load balancer (the
    // authority is part of the key).
    let mut req =
        http::Request::get(format!("http://{addr}{path}")).header("host", "pages.example");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("the node answers");
    let status = resp.status();
    let cookies = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        cookies,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// Sends every `(node, headers)` request of `calls` at once to `path`;
/// returns the replies in the order of `calls`.
async fn burst(
    addrs: &[SocketAddr],
    path: &'static str,
    calls: Vec<(usize, Vec<(&'static str, &'static str)>)>,
) -> Vec<Reply> {
    let client = client();
    let barrier = Arc::new(tokio::sync::Barrier::new(calls.len()));
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|(n, headers)| {
            let (client, barrier, addr) = (client.clone(), barrier.clone(), addrs[n]);
            tokio::spawn(async move {
                barrier.wait().await;
                fetch(&client, addr, path, &headers).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let reply = t.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        out.push(reply);
    }
    out
}

/// `n` anonymous requests to node 0, at once.
async fn anonymous(addr: SocketAddr, path: &'static str, n: usize) -> Vec<Reply> {
    burst(&[addr], path, (0..n).map(|_| (0, Vec::new())).collect()).await
}

/// Every test gets a bounded time: nothing here may hang CI.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the test finished within 60 s")
}

fn distinct<'a>(items: impl IntoIterator<Item = &'a String>) -> usize {
    items.into_iter().collect::<BTreeSet<_>>().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shareable_responses_still_merge() {
    // The rules take nothing away from a response that may be shared:
    // one execution for the whole burst, locally and across nodes.
    bounded(async {
        let (addr, origin) = local(HttpShare::new()).await;
        let replies = anonymous(addr, "/public", 20).await;
        assert_eq!(origin.calls("/public"), 1);
        assert_eq!(distinct(replies.iter().map(|r| &r.body)), 1);

        let (addrs, origin, _) = hybrid(HttpShare::new()).await;
        let calls = (0..20).map(|i| (i % 2, Vec::new())).collect();
        let replies = burst(&addrs, "/public", calls).await;
        assert_eq!(origin.calls("/public"), 1);
        assert_eq!(distinct(replies.iter().map(|r| &r.body)), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_anonymous_caller_gets_its_own_cookie() {
    bounded(async {
        let (addr, origin) = local(HttpShare::new()).await;
        let replies = anonymous(addr, "/cookie", 20).await;
        for r in &replies {
            assert_eq!(r.cookies.len(), 1, "{r:?}");
        }
        assert_eq!(
            distinct(replies.iter().flat_map(|r| &r.cookies)),
            20,
            "20 callers, 20 sessions"
        );
        assert_eq!(origin.calls("/cookie"), 20);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_is_never_replayed_on_another_node() {
    bounded(async {
        let (addrs, origin, backend) = hybrid(HttpShare::new()).await;
        let calls = (0..20).map(|i| (i % 2, Vec::new())).collect();
        let mut replies = burst(&addrs, "/cookie", calls).await;
        // A later visitor on the other node.
        replies.push(fetch(&client(), addrs[1], "/cookie", &[]).await);
        for r in &replies {
            assert_eq!(r.cookies.len(), 1, "{r:?}");
        }
        assert_eq!(distinct(replies.iter().flat_map(|r| &r.cookies)), 21);
        assert_eq!(origin.calls("/cookie"), 21);
        assert_eq!(backend.calls().commit, 0, "nothing was stored");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_no_store_no_cache_and_vary_star_are_never_shared() {
    bounded(async {
        let (addr, origin) = local(HttpShare::new()).await;
        for path in ["/private", "/no-store", "/no-cache", "/vary-star"] {
            let replies = anonymous(addr, path, 10).await;
            assert_eq!(origin.calls(path), 10, "{path}");
            assert_eq!(distinct(replies.iter().map(|r| &r.body)), 10, "{path}");
            // Nor replayed to a later caller of this node.
            let later = fetch(&client(), addr, path, &[]).await;
            assert!(later.body.contains(" #11 "), "{path}: {later:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_no_store_no_cache_and_vary_star_are_never_replayed_from_the_backend() {
    bounded(async {
        let (addrs, origin, backend) = hybrid(HttpShare::new()).await;
        never_replayed(
            addrs,
            &origin,
            &["/private", "/no-store", "/no-cache", "/vary-star"],
        )
        .await;
        assert_eq!(backend.calls().commit, 0, "nothing was stored");
    })
    .await;
}

const FLAVORS: [&str; 2] = ["vanilla", "chocolate"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_every_waiter_gets_its_own_flavour() {
    bounded(async {
        let (addr, origin) = local(HttpShare::new()).await;
        let calls = (0..10)
            .map(|i| (0, vec![("x-flavor", FLAVORS[i % 2])]))
            .collect();
        let replies = burst(&[addr], "/flavor", calls).await;
        for (i, r) in replies.iter().enumerate() {
            let want = format!("flavor={}", FLAVORS[i % 2]);
            assert!(r.body.contains(&want), "caller {i} asked for {want}: {r:?}");
        }
        // At least one execution per flavour, never one per caller less.
        assert!(origin.calls("/flavor") >= 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_a_replay_on_another_node_honours_the_flavour() {
    bounded(async {
        let (addrs, origin, _) = hybrid(HttpShare::new()).await;
        vary_replays(addrs, &origin).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_a_replay_with_the_same_flavour_is_shared() {
    bounded(async {
        let (addrs, origin, _) = hybrid(HttpShare::new()).await;
        let client = client();
        let first = fetch(&client, addrs[0], "/flavor", &[("x-flavor", "vanilla")]).await;
        let again = fetch(&client, addrs[1], "/flavor", &[("X-Flavor", "vanilla")]).await;
        assert_eq!(first.body, again.body, "replayed from the backend");
        assert_eq!(origin.calls("/flavor"), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_proxy_authorization_tenants_never_share() {
    bounded(async {
        for header in ["x-api-key", "proxy-authorization"] {
            let (addr, origin) = local(HttpShare::new()).await;
            let tenants = ["tenant-a", "tenant-b"];
            let calls = (0..10)
                .map(|i| (0, vec![(header, tenants[i % 2])]))
                .collect();
            let replies = burst(&[addr], "/public", calls).await;
            for (i, r) in replies.iter().enumerate() {
                assert!(
                    r.body.contains(tenants[i % 2]),
                    "{header}: caller {i} of {} got {r:?}",
                    tenants[i % 2]
                );
            }
            // One execution per tenant: within a tenant they still merge.
            assert_eq!(origin.calls("/public"), 2, "{header}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strip_shares_the_page_and_only_the_leader_gets_the_cookie() {
    bounded(async {
        let strip = HttpShare::new().set_cookie(SetCookie::Strip);
        let (addr, origin) = local(strip.clone()).await;
        let replies = anonymous(addr, "/cookie", 20).await;
        assert_eq!(origin.calls("/cookie"), 1, "shared");
        assert_eq!(distinct(replies.iter().map(|r| &r.body)), 1);
        let with_cookie: Vec<_> = replies.iter().filter(|r| !r.cookies.is_empty()).collect();
        assert_eq!(
            with_cookie.len(),
            1,
            "the leader, and only the leader, keeps its cookie: {replies:?}"
        );
        assert_eq!(with_cookie[0].cookies, ["sid=/cookie-1; HttpOnly"]);

        // Replayed on another node: the page, never the cookie.
        let (addrs, origin, _) = hybrid(strip).await;
        let client = client();
        let first = fetch(&client, addrs[0], "/cookie", &[]).await;
        assert_eq!(first.cookies.len(), 1, "the leader's own cookie: {first:?}");
        let replay = fetch(&client, addrs[1], "/cookie", &[]).await;
        assert_eq!(replay.body, first.body);
        assert!(replay.cookies.is_empty(), "{replay:?}");
        assert_eq!(origin.calls("/cookie"), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_hands_the_same_cookie_to_everyone() {
    bounded(async {
        let (addr, origin) = local(HttpShare::new().set_cookie(SetCookie::Share)).await;
        let replies = anonymous(addr, "/cookie", 20).await;
        assert_eq!(origin.calls("/cookie"), 1);
        for r in &replies {
            assert_eq!(r.cookies, ["sid=/cookie-1; HttpOnly"], "{r:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_shares_despite_cache_control_but_still_refuses_cookies_and_vary_star() {
    bounded(async {
        let ignore = HttpShare::new().cache_control(CacheControl::Ignore);
        let (addr, origin) = local(ignore.clone()).await;
        for path in ["/private", "/no-store", "/no-cache"] {
            let replies = anonymous(addr, path, 10).await;
            assert_eq!(origin.calls(path), 1, "{path}");
            assert_eq!(distinct(replies.iter().map(|r| &r.body)), 1, "{path}");
        }
        anonymous(addr, "/cookie", 5).await;
        assert_eq!(origin.calls("/cookie"), 5);
        anonymous(addr, "/vary-star", 5).await;
        assert_eq!(origin.calls("/vary-star"), 5);

        // And replayed on another node.
        let (addrs, origin, _) = hybrid(ignore).await;
        let client = client();
        let first = fetch(&client, addrs[0], "/private", &[]).await;
        let replay = fetch(&client, addrs[1], "/private", &[]).await;
        assert_eq!(first.body, replay.body);
        assert_eq!(origin.calls("/private"), 1);
    })
    .await;
}

/// The opt-ins as a stage's configuration: a layer built with the default
/// (safe) adapter, whose stage says `set-cookie = "strip"`, shares the page
/// and keeps the cookie for the leader alone; an unset setting keeps the
/// adapter's own choice.
#[cfg(feature = "toml")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_config_opts_in_for_its_stage_only() {
    bounded(async {
        let cfg = flightdeck::SingleFlightConfig::from_toml(&format!(
            r#"
[single-flight.stages.{STAGE}]
mode = "local-only"
sharing = {{ set-cookie = "strip" }}
"#
        ))
        .unwrap();
        let layer = GenericSingleFlightLayer::http()
            .share(HttpShare::new())
            .config(cfg)
            .build()
            .unwrap();
        let origin = Arc::new(Origin::default());
        let addr = node(layer, origin.clone()).await;
        let replies = anonymous(addr, "/cookie", 20).await;
        assert_eq!(origin.calls("/cookie"), 1, "shared, as the stage says");
        let with_cookie = replies.iter().filter(|r| !r.cookies.is_empty()).count();
        assert_eq!(with_cookie, 1, "the leader alone keeps its cookie");

        // Unset in the stage: the adapter's own choice (here, share).
        let layer = GenericSingleFlightLayer::http()
            .share(HttpShare::new().set_cookie(SetCookie::Share))
            .stage(STAGE, fast(Mode::LocalOnly))
            .build()
            .unwrap();
        let origin = Arc::new(Origin::default());
        let addr = node(layer, origin.clone()).await;
        let replies = anonymous(addr, "/cookie", 20).await;
        assert_eq!(origin.calls("/cookie"), 1);
        assert!(replies.iter().all(|r| r.cookies.len() == 1), "{replies:?}");
    })
    .await;
}

/// Each of `paths` fetched on node 0, then on node 1: the second runs
/// the origin again (nothing was replayed).
async fn never_replayed(addrs: [SocketAddr; 2], origin: &Origin, paths: &[&'static str]) {
    let client = client();
    for &path in paths {
        let first = fetch(&client, addrs[0], path, &[]).await;
        let second = fetch(&client, addrs[1], path, &[]).await;
        assert!(first.body.contains(" #1 "), "{path}: {first:?}");
        assert!(
            second.body.contains(" #2 "),
            "{path} was replayed: {second:?}"
        );
        assert_eq!(origin.calls(path), 2, "{path}");
    }
}

/// A `Vary: X-Flavor` page stored by node 0 for vanilla: node 1 replays it
/// for vanilla only (the header's name in any case), never for chocolate
/// nor for a caller without the header.
async fn vary_replays(addrs: [SocketAddr; 2], origin: &Origin) {
    let client = client();
    let vanilla = fetch(&client, addrs[0], "/flavor", &[("x-flavor", "vanilla")]).await;
    assert!(vanilla.body.contains("flavor=vanilla"), "{vanilla:?}");
    let chocolate = fetch(&client, addrs[1], "/flavor", &[("x-flavor", "chocolate")]).await;
    assert!(chocolate.body.contains("flavor=chocolate"), "{chocolate:?}");
    let plain = fetch(&client, addrs[1], "/flavor", &[]).await;
    assert!(plain.body.contains("flavor=-"), "{plain:?}");
    let same = fetch(&client, addrs[1], "/flavor", &[("X-Flavor", "vanilla")]).await;
    assert_eq!(same.body, vanilla.body, "the same flavour is replayed");
    assert_eq!(origin.calls("/flavor"), 3);
}

// ---------------------------------------------------------------- over a real redis-server

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_redis_a_shareable_page_is_replayed_on_the_other_node() {
    bounded(async {
        let (addrs, origin, redis) = hybrid_redis(HttpShare::new()).await;
        let client = client();
        let first = fetch(&client, addrs[0], "/plain", &[]).await;
        let again = fetch(&client, addrs[1], "/plain", &[]).await;
        assert_eq!(first.body, again.body, "replayed from Redis");
        assert_eq!(origin.calls("/plain"), 1);
        assert_eq!(stored_results(&redis), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_redis_cookies_private_no_store_no_cache_and_vary_star_are_never_stored() {
    bounded(async {
        let (addrs, origin, redis) = hybrid_redis(HttpShare::new()).await;
        never_replayed(
            addrs,
            &origin,
            &[
                "/cookie",
                "/private",
                "/no-store",
                "/no-cache",
                "/vary-star",
            ],
        )
        .await;
        assert_eq!(stored_results(&redis), 0, "nothing was stored in Redis");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_redis_a_replay_honours_vary() {
    bounded(async {
        let (addrs, origin, _redis) = hybrid_redis(HttpShare::new()).await;
        vary_replays(addrs, &origin).await;
    })
    .await;
}
