//! Answering anyway across nodes through the facade: two HYBRID layers
//! (two nodes) on one in-memory store, paused time, an axum origin. The
//! stage's windows reach L2, so with the store up a stale result answers
//! on every node while one refresh runs for the deployment, a failing
//! origin runs at most once per `stale-retry-after` across both nodes,
//! and a refresh's result becomes the refreshing node's copy (what it
//! answers from if the store goes down), without its caller's cookies.

#![cfg(feature = "http")]

mod common;

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use flightdeck::core::http::SetCookie;
use flightdeck::core::metric;
use flightdeck::core::stale::{Stale, StaleReason};
use flightdeck::{HttpKeyExtractor, Mode, Route, SingleFlightLayer, StageConfig};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::ServiceExt;

/// The origin every node calls: answers `v<n>` after 200 ms (or the delay
/// it is told) with the status it is told, counting its executions.
struct Origin {
    calls: AtomicUsize,
    status: AtomicU16,
    delay_ms: AtomicU64,
}

impl Origin {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            status: AtomicU16::new(200),
            delay_ms: AtomicU64::new(200),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn page(State(origin): State<Arc<Origin>>) -> Response<Body> {
    let n = origin.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let delay = origin.delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    Response::builder()
        .status(origin.status.load(Ordering::SeqCst))
        .body(Body::from(format!("v{n}")))
        .unwrap()
}

/// Like [`page`], and sets a session cookie for the caller its
/// `x-user` names.
async fn page_with_cookie(State(origin): State<Arc<Origin>>, req: Request<Body>) -> Response<Body> {
    let user = req.headers()["x-user"].to_str().unwrap().to_owned();
    let mut res = page(State(origin)).await;
    let cookie = format!("sid={user}").parse().unwrap();
    res.headers_mut().insert(http::header::SET_COOKIE, cookie);
    res
}

struct Node {
    router: Router,
    layer: SingleFlightLayer,
}

/// Two nodes of stage `stage` (HYBRID, fresh for 1 s) on one store.
fn nodes(stage: &'static str, origin: &Arc<Origin>, cfg: impl Fn(&mut StageConfig)) -> [Node; 2] {
    nodes_on(flightdeck_test::MemoryBackend::new(), stage, origin, cfg)
}

/// [`nodes`] on `store`.
fn nodes_on<B: flightdeck::distributed::Backend + Clone>(
    store: B,
    stage: &'static str,
    origin: &Arc<Origin>,
    cfg: impl Fn(&mut StageConfig),
) -> [Node; 2] {
    let node = || {
        let mut c = StageConfig::new().mode(Mode::Hybrid).backend("mem");
        c.replay_ttl = Duration::from_secs(1);
        cfg(&mut c);
        let keys = HttpKeyExtractor::builder()
            .route(Route::get("/p", stage))
            .route(Route::get("/c", stage))
            .build()
            .unwrap();
        let layer = SingleFlightLayer::builder()
            .keys(keys)
            .backend("mem", store.clone())
            .stage(stage, c)
            .build()
            .unwrap();
        let router = Router::new()
            .route("/p", get(page))
            .route("/c", get(page_with_cookie))
            .with_state(Arc::clone(origin))
            .layer(layer.clone());
        Node { router, layer }
    };
    [node(), node()]
}

/// One call on `node`: its status and body.
fn call(node: &Node) -> impl std::future::Future<Output = (StatusCode, String)> + Send + 'static {
    let got = answer(node);
    async move {
        let got = got.await;
        (got.status, got.body)
    }
}

struct Got {
    status: StatusCode,
    body: String,
    stale: Option<Stale>,
    headers: HeaderMap,
}

/// One call on `node`, with what its answer says of itself.
fn answer(node: &Node) -> impl std::future::Future<Output = Got> + Send + 'static {
    answer_to(
        node,
        Request::get("http://svc/p").body(Body::empty()).unwrap(),
    )
}

/// A call of `user` on `node` to the page that sets its session cookie.
fn answer_user(node: &Node, user: &str) -> impl std::future::Future<Output = Got> + Send + 'static {
    let req = Request::get("http://svc/c").header("x-user", user);
    answer_to(node, req.body(Body::empty()).unwrap())
}

/// `req` on `node`, with what its answer says of itself.
fn answer_to(
    node: &Node,
    req: Request<Body>,
) -> impl std::future::Future<Output = Got> + Send + 'static {
    let router = node.router.clone();
    async move {
        let res = router.oneshot(req).await.unwrap();
        let stale = res.extensions().get::<Stale>().copied();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got {
            status: parts.status,
            body: String::from_utf8(body.to_vec()).unwrap(),
            stale,
            headers: parts.headers,
        }
    }
}

fn stale_served(stage: &str, reason: StaleReason) -> u64 {
    common::counter_with(metric::STALE_SERVED_TOTAL, stage, "reason", reason.as_str())
}

/// Grace across nodes: past freshness, 50 callers on two nodes are all
/// answered at once with the stale value, and the origin runs once more
/// for the whole deployment; the refresh's result answers next, and is
/// the refreshing node's copy (it answers from it with the store down).
#[tokio::test(start_paused = true)]
async fn grace_answers_both_nodes_at_once_and_refreshes_once() {
    common::metrics_on();
    let origin = Origin::new();
    let [a, b] = nodes("x-grace", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // The first caller is granted the refresh: node a runs it.
    assert_eq!(call(&a).await.1, "v1");
    let started = Instant::now();
    let calls = (0..50).map(|i| answer(if i % 2 == 0 { &a } else { &b }));
    let mut set = tokio::task::JoinSet::new();
    for c in calls {
        set.spawn(c);
    }
    for got in set.join_all().await {
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
        let stale = got.stale.expect("marked stale");
        assert_eq!(stale.reason, StaleReason::Revalidate);
        assert_eq!(stale.age, Duration::from_secs(2), "the store's age");
        assert_eq!(
            got.headers.get("cache-status").unwrap(),
            "flightdeck; fwd=stale; ttl=-1; detail=revalidate"
        );
        assert_eq!(got.headers.get("age").unwrap(), "2");
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "nobody waited");
    assert_eq!(stale_served("x-grace", StaleReason::Revalidate), 51);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "one refresh for both nodes");
    let next = answer(&b).await;
    assert_eq!(next.body, "v2", "the refresh's result answers next");
    assert!(next.stale.is_none());
    assert_eq!(origin.calls(), 2);

    // Node a kept the refresh's result: with its store down and the
    // result past freshness, its copy answers, and it is v2.
    a.layer.stage("x-grace").unwrap().breaker().force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&a).await.1, "v2");
    assert_eq!(stale_served("x-grace", StaleReason::RedisDown), 1);
}

/// Every caller answered with the store's stale result is counted, those
/// that joined another caller's flight on their node too (the store
/// answers slowly here, so the callers of one node share one flight).
#[tokio::test(start_paused = true)]
async fn every_caller_answered_stale_is_counted_joiners_too() {
    common::metrics_on();
    let origin = Origin::new();
    let slow = flightdeck_test::Hooked::new(flightdeck_test::MemoryBackend::new())
        .after_acquire(|_| tokio::time::sleep(Duration::from_millis(50)));
    let [a, _] = nodes_on(slow, "x-count", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..10 {
        set.spawn(answer(&a));
    }
    for got in set.join_all().await {
        assert_eq!(got.body, "v1");
        assert_eq!(got.stale.map(|s| s.reason), Some(StaleReason::Revalidate));
    }
    assert_eq!(stale_served("x-count", StaleReason::Revalidate), 10);
}

/// Grace while the store answers slowly: the first caller past the copy's
/// freshness leads the node's flight, which asks the store (50 ms here);
/// the callers that arrive meanwhile are answered by the node's copy at
/// once, not made to wait for the store's answer, and are told and
/// counted as stale answers; one refresh runs.
#[tokio::test(start_paused = true)]
async fn callers_do_not_wait_for_the_store_to_answer_their_nodes_refresh() {
    common::metrics_on();
    let stage = "x-no-wait";
    let origin = Origin::new();
    let slow = flightdeck_test::Hooked::new(flightdeck_test::MemoryBackend::new())
        .after_acquire(|_| tokio::time::sleep(Duration::from_millis(50)));
    let [a, _] = nodes_on(slow, stage, &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    let led = tokio::spawn(answer(&a));
    tokio::task::yield_now().await;
    let started = Instant::now();
    for _ in 0..5 {
        let got = answer(&a).await;
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
        let stale = got.stale.expect("marked stale");
        assert_eq!(stale.reason, StaleReason::Revalidate);
        assert_eq!(
            got.headers.get("cache-status").unwrap(),
            "flightdeck; fwd=stale; ttl=-1; detail=revalidate"
        );
        assert_eq!(got.headers.get("age").unwrap(), "2");
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "nobody waited");
    let led = led.await.unwrap();
    assert_eq!(
        led.body, "v1",
        "the store's kept result, the refresh granted"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(50),
        "the leader asked"
    );
    assert_eq!(stale_served(stage, StaleReason::Revalidate), 6);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "one refresh");
    assert_eq!(call(&a).await.1, "v2", "the refresh's result answers next");
}

/// A stale result the store gave a caller on this node is the node's copy
/// from then on: the store's kept v2 answers a's caller only because its
/// work started after a's copy v1 ended, and a caller that arrives while
/// a's next flight asks the store is answered by the copy at once, which
/// must not be v1 then (the node gave v2 already).
#[tokio::test(start_paused = true)]
async fn a_stale_result_the_store_gave_is_the_copy_that_answers_next() {
    let origin = Origin::new();
    let slow = flightdeck_test::Hooked::new(flightdeck_test::MemoryBackend::new())
        .after_acquire(|_| tokio::time::sleep(Duration::from_millis(50)));
    let [a, b] = nodes_on(slow, "x-given-stale", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // b, with no copy, is granted the refresh: v2 is stored, a not told.
    assert_eq!(call(&b).await.1, "v1");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(origin.calls(), 2);
    tokio::time::advance(Duration::from_secs(2)).await;
    let first = answer(&a).await;
    assert_eq!(
        first.body, "v2",
        "the store's kept result, newer than a's copy"
    );
    assert!(first.stale.is_some());
    let second = tokio::spawn(answer(&a));
    tokio::task::yield_now().await;
    let third = answer(&a).await;
    assert_eq!(third.body, "v2", "never older than what a gave");
    assert_eq!(second.await.unwrap().body, "v2");
}

/// Stale-if-error across nodes: while the origin fails, both nodes answer
/// the stale value, and the origin runs at most once per
/// `stale-retry-after` for the whole deployment.
#[tokio::test(start_paused = true)]
async fn a_failing_origin_runs_once_per_retry_after_across_nodes() {
    common::metrics_on();
    let origin = Origin::new();
    let [a, b] = nodes("x-if-error", &origin, |c| {
        c.stale_if_error = Duration::from_secs(120);
        c.stale_retry_after = Duration::from_secs(10);
    });
    assert_eq!(call(&a).await.1, "v1");
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        for node in [&a, &b] {
            let (status, body) = call(node).await;
            assert_eq!((status, body.as_str()), (StatusCode::OK, "v1"));
        }
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    let tries = origin.calls() - 1;
    assert!(
        (5..=7).contains(&tries),
        "{tries} executions in 60 s across both nodes: one per 10 s"
    );
    assert!(stale_served("x-if-error", StaleReason::Error) >= 200);
}

/// A hit another node stored says how old it is by the store's clock
/// (`Age`, `Cache-Status`), not since it reached this node.
#[tokio::test(start_paused = true)]
async fn a_hit_from_the_store_carries_the_stores_age() {
    let origin = Origin::new();
    let [a, b] = nodes("x-age", &origin, |c| {
        c.replay_ttl = Duration::from_secs(10);
        c.cache_status = true;
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(3)).await;
    let got = answer(&b).await;
    assert_eq!((got.body.as_str(), got.stale), ("v1", None));
    assert_eq!(got.headers.get("age").unwrap(), "3");
    assert_eq!(
        got.headers.get("cache-status").unwrap(),
        "flightdeck; hit; ttl=7"
    );
    assert_eq!(origin.calls(), 1);
}

/// A node's copy of a result the store replayed to it is as old as the
/// store said: replayed from the copy only within `replay-ttl` of the
/// work's end, never a replay of a replay (the store is cut off from
/// node b, so only its copy can answer).
#[tokio::test(start_paused = true)]
async fn a_copy_of_a_store_replay_is_not_replayed_past_the_replay_ttl() {
    let origin = Origin::new();
    let [a, b] = nodes("x-replay-copy", &origin, |c| {
        c.replay_ttl = Duration::from_secs(2);
        c.cache_status = true;
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_millis(1500)).await;
    // Node b is replayed the store's result, 1.5 s old, and keeps a copy.
    let hit = answer(&b).await;
    assert_eq!(hit.body, "v1");
    assert_eq!(hit.headers.get("age").unwrap(), "1");
    b.layer
        .stage("x-replay-copy")
        .unwrap()
        .breaker()
        .force_open();
    tokio::time::advance(Duration::from_millis(400)).await;
    let copy = answer(&b).await;
    assert_eq!(copy.body, "v1", "the copy replays within replay-ttl");
    assert_eq!(copy.headers.get("age").unwrap(), "1");
    assert_eq!(origin.calls(), 1);
    // 3 s after the work's end (1.5 s after the copy reached node b):
    // past replay-ttl, the work runs again.
    tokio::time::advance(Duration::from_millis(1100)).await;
    let next = answer(&b).await;
    assert_eq!(next.body, "v2", "replayed from a copy past replay-ttl");
    assert_eq!(origin.calls(), 2);
}

/// A node never answers a result older than one it gave, even once its
/// copy went: b ran the work alone while the store was down (v2, started
/// after a's v1 began and ended before it); a's v1, committed later, is
/// still within its window when b's copy of v2 expires, and must not
/// answer on b in its place. b waits for its refresh instead.
#[tokio::test(start_paused = true)]
async fn a_copy_that_expired_keeps_the_stores_older_result_from_answering() {
    let origin = Origin::new();
    let store = flightdeck_test::MemoryBackend::new();
    let [a, b] = nodes_on(store.clone(), "x-floor", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(2);
    });
    origin.delay_ms.store(1_500, Ordering::SeqCst);
    let first = tokio::spawn(call(&a));
    tokio::time::advance(Duration::from_millis(100)).await;
    origin.delay_ms.store(200, Ordering::SeqCst);
    store.set_unavailable(true);
    assert_eq!(call(&b).await.1, "v2", "b runs it alone, the store down");
    store.set_unavailable(false);
    assert_eq!(first.await.unwrap().1, "v1");
    // v1 was committed at 1.5 s (now): stale from 2.5 s to 4.5 s. b's
    // copy of v2 (ended at 0.3 s) may answer until 3.3 s, then goes.
    tokio::time::advance(Duration::from_millis(2_000)).await;
    let got = answer(&b).await;
    assert_eq!(
        (got.body.as_str(), got.stale),
        ("v3", None),
        "v1 started before v2 ended: b refreshes instead"
    );
}

/// A caller is told how its own flight was answered, not another's of
/// the same key: a purge on a leaves a's flight running for its caller
/// (v1) while the next caller there starts another, answered at once with
/// the store's stale v2; v1's caller is not told "stale".
#[tokio::test(start_paused = true)]
async fn a_caller_is_told_of_its_own_flight_not_of_one_beside_it() {
    let origin = Origin::new();
    let [a, b] = nodes("x-own-flight", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    origin.delay_ms.store(1_500, Ordering::SeqCst);
    let first = tokio::spawn(answer(&a));
    tokio::time::advance(Duration::from_millis(100)).await;
    origin.delay_ms.store(200, Ordering::SeqCst);
    let req = Request::get("http://svc/p").body(Body::empty()).unwrap();
    assert!(a.layer.invalidate_request(req).await.unwrap());
    assert_eq!(call(&b).await.1, "v2", "b runs it after the purge");
    // v2 is past its freshness at 1.4 s; a's first flight ends at 1.5 s.
    tokio::time::advance(Duration::from_millis(1_150)).await;
    let beside = answer(&a).await;
    assert_eq!(beside.body, "v2");
    assert_eq!(
        beside.stale.map(|s| s.reason),
        Some(StaleReason::Revalidate)
    );
    let got = first.await.unwrap();
    assert_eq!((got.body.as_str(), got.stale), ("v1", None));
    let status = got.headers.get("cache-status").unwrap().to_str().unwrap();
    assert!(!status.contains("stale"), "{status}");
}

fn local_flights(stage: &str) -> u64 {
    common::counter(metric::LOCAL_OWNER_TOTAL, stage)
}

/// A node the store told that a refresh runs elsewhere answers its next
/// callers the kept result without a flight (as it answers a hit: no L1
/// flight, no store call), told and counted as the caller that went
/// through the flight was: the same stale marker, `Cache-Status`, `Age`
/// and counters.
#[tokio::test(start_paused = true)]
async fn callers_during_a_refresh_elsewhere_are_answered_without_a_flight() {
    common::metrics_on();
    let stage = "x-no-flight";
    let origin = Origin::new();
    let [a, b] = nodes(stage, &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    assert_eq!(call(&a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // Node a refreshes; node b's flight is told so (FOLLOWER, v1 beside).
    assert_eq!(call(&a).await.1, "v1");
    let first = answer(&b).await;
    assert_eq!(first.body, "v1");
    let (flights, counted) = (
        local_flights(stage),
        stale_served(stage, StaleReason::Revalidate),
    );
    for _ in 0..5 {
        let got = answer(&b).await;
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
        assert_eq!(got.stale, first.stale);
        assert_eq!(
            got.headers.get("cache-status"),
            first.headers.get("cache-status")
        );
        assert_eq!(got.headers.get("age"), first.headers.get("age"));
    }
    assert_eq!(
        first.headers.get("cache-status").unwrap(),
        "flightdeck; fwd=stale; ttl=-1; detail=revalidate"
    );
    assert_eq!(first.headers.get("age").unwrap(), "2");
    assert_eq!(local_flights(stage), flights, "no flight for them");
    assert_eq!(stale_served(stage, StaleReason::Revalidate), counted + 5);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "one refresh");
    assert_eq!(call(&b).await.1, "v2", "the refresh's result answers next");
}

/// v1 on `a`; past its freshness, `a` refreshes it in the background and
/// `b` is told so (FOLLOWER, v1 beside), both answered v1.
async fn refresh_on_a_known_to_b(a: &Node, b: &Node) {
    assert_eq!(call(a).await.1, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(a).await.1, "v1", "a refreshes in the background");
    assert_eq!(call(b).await.1, "v1", "b is told of the refresh");
}

/// The refresh that ran elsewhere commits: its notice brings the result
/// (small enough to come inline), and the next callers on the watching
/// node are answered it at once, fresh, without a flight or a store
/// call: nobody there waits at the end of a refresh. It is that node's
/// copy from then on.
#[tokio::test(start_paused = true)]
async fn a_refresh_committed_elsewhere_answers_without_a_flight() {
    common::metrics_on();
    let stage = "x-committed-elsewhere";
    let origin = Origin::new();
    let store = flightdeck_test::MemoryBackend::new();
    let [a, b] = nodes_on(store.clone(), stage, &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.stale_if_error = Duration::from_secs(60);
        c.cache_status = true;
    });
    refresh_on_a_known_to_b(&a, &b).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "the refresh committed");
    let (flights, acquires) = (local_flights(stage), store.calls().acquire);
    let got = answer(&b).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v2"));
    assert!(got.stale.is_none(), "fresh");
    // Committed 100 ms ago (the work took 200 ms): fresh for 0.9 s more.
    assert_eq!(
        got.headers.get("cache-status").unwrap(),
        "flightdeck; hit; ttl=0"
    );
    assert_eq!(local_flights(stage), flights, "no flight");
    tokio::time::advance(Duration::from_millis(500)).await;
    let got = answer(&b).await;
    assert_eq!(got.body, "v2", "b's copy");
    assert_eq!(got.headers.get("age").unwrap(), "0");
    assert_eq!(local_flights(stage), flights, "no flight");
    assert_eq!(store.calls().acquire, acquires, "no store call");
    assert_eq!(origin.calls(), 2);
    // b kept it: with the store and the work down, its copy answers.
    store.set_unavailable(true);
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(1)).await;
    let got = answer(&b).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v2"));
    assert_eq!(got.stale.map(|s| s.reason), Some(StaleReason::RedisDown));
}

/// A purge on the node a refresh's result reached with its commit notice:
/// the next caller there runs the work again, not answered that result.
#[tokio::test(start_paused = true)]
async fn a_purge_here_ends_answers_of_a_refresh_committed_elsewhere() {
    let stage = "x-committed-purged";
    let origin = Origin::new();
    let [a, b] = nodes(stage, &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    refresh_on_a_known_to_b(&a, &b).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "the refresh committed");
    let req = Request::get("http://svc/p").body(Body::empty()).unwrap();
    assert!(b.layer.invalidate_request(req).await.unwrap());
    assert_eq!(call(&b).await.1, "v3", "the purged result never answers");
}

/// `early-refresh` on a distributed stage: a hot key whose callers every
/// node answers from its fresh copy is still refreshed before it expires,
/// once across the nodes, and nobody waits or is answered stale.
#[tokio::test(start_paused = true)]
async fn early_refresh_renews_a_hot_key_across_nodes_before_it_expires() {
    flightdeck::core::random::seed_this_thread(Some(34));
    let stage = "x-early";
    let origin = Origin::new();
    let [a, b] = nodes(stage, &origin, |c| {
        c.replay_ttl = Duration::from_secs(10);
        c.early_refresh = Duration::from_secs(5);
    });
    assert_eq!(call(&a).await.1, "v1");
    // v1 finished 200 ms in and is fresh until 10.2 s. A hot key: a
    // caller every 10 ms until 10.19 s, on either node, each answered at
    // once.
    let start = Instant::now() - Duration::from_millis(200);
    let mut refreshed_at = None;
    for i in 0..999 {
        tokio::time::advance(Duration::from_millis(10)).await;
        let node = if i % 2 == 0 { &a } else { &b };
        let started = Instant::now();
        let got = answer(node).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "nobody waits");
        assert!(got.body == "v1" || got.body == "v2", "{}", got.body);
        assert!(got.stale.is_none(), "nobody is answered stale");
        if origin.calls() == 2 && refreshed_at.is_none() {
            refreshed_at = Some(Instant::now() - start);
        }
    }
    flightdeck::core::random::seed_this_thread(None);
    assert_eq!(origin.calls(), 2, "one refresh across the nodes");
    let at = refreshed_at.expect("refreshed before v1 expired");
    assert!(at >= Duration::from_secs(5), "within v1's last 5 s: {at:?}");
    tokio::time::advance(Duration::from_millis(1000)).await;
    for node in [&a, &b] {
        let got = answer(node).await;
        assert_eq!(got.body, "v2", "the refresh's result answers past v1's end");
        assert!(got.stale.is_none());
    }
    assert_eq!(origin.calls(), 2);
}

/// A purge on a node that knows of a refresh elsewhere: its next caller
/// is not answered the purged result.
#[tokio::test(start_paused = true)]
async fn a_purge_here_ends_answers_of_a_refresh_elsewhere() {
    let stage = "x-no-flight-purged";
    let origin = Origin::new();
    let [a, b] = nodes(stage, &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    refresh_on_a_known_to_b(&a, &b).await;
    let req = Request::get("http://svc/p").body(Body::empty()).unwrap();
    assert!(b.layer.invalidate_request(req).await.unwrap());
    let got = answer(&b).await;
    assert_ne!(got.body, "v1", "the purged result never answers");
    assert!(got.stale.is_none());
}

/// `set-cookie = "strip"`: a refresh's result becomes the refreshing
/// node's copy without its caller's cookie. Its commit never got
/// through, so the copy (of later work than the store's result) answers
/// the next flight on that node in the store's stead: that flight's
/// leader, another user, gets the page, never the session cookie of the
/// caller whose request ran the refresh.
#[tokio::test(start_paused = true)]
async fn a_kept_copy_never_hands_its_leaders_cookie_to_another_leader() {
    let origin = Origin::new();
    let store = flightdeck_test::MemoryBackend::new();
    let [a, _] = nodes_on(store.clone(), "x-cookie", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(30);
        c.sharing.set_cookie = Some(SetCookie::Strip);
    });
    let cookies = |got: &Got| -> Vec<String> {
        let all = got.headers.get_all(http::header::SET_COOKIE);
        all.iter().map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    let first = answer_user(&a, "alice").await;
    assert_eq!(first.body, "v1");
    assert_eq!(cookies(&first), ["sid=alice"], "the leader's own cookie");
    // Past freshness, bob is answered the store's v1 while his request
    // refreshes it in the background: v2, with bob's cookie, whose
    // commit the store refuses (it is tried on for a lease). Node a
    // keeps v2.
    tokio::time::advance(Duration::from_secs(2)).await;
    store.set_fail_commits(true);
    let second = answer_user(&a, "bob").await;
    assert_eq!(
        second.stale.map(|s| s.reason),
        Some(StaleReason::Revalidate)
    );
    assert_eq!(second.body, "v1");
    // Past v2's freshness too: carol leads the next flight on node a,
    // which the store answers with its stale v1, and node a's later v2
    // in its stead.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(origin.calls(), 2, "bob's refresh ran");
    let third = answer_user(&a, "carol").await;
    assert_eq!(third.body, "v2", "node a's own copy answered");
    assert!(
        cookies(&third).is_empty(),
        "bob's cookie went to carol: {:?}",
        cookies(&third)
    );
    store.set_fail_commits(false);
    a.layer.idle().await;
}

/// An early refresh granted across the nodes runs on this node; its
/// claim must hold until that refresh ends. `Leader::refresh_early` ends
/// it by time (the copy's `left` after the store's answer), so a slow
/// work outlives it: once the copy expires, a node switched to
/// LOCAL_ONLY starts a grace refresh of the key beside the early one
/// still running here (two runs of the key on one node at a time).
#[tokio::test(start_paused = true)]
async fn an_early_refresh_across_nodes_holds_its_claim_until_it_ends() {
    flightdeck::core::random::seed_this_thread(Some(34));
    let stage = "x-early-claim";
    let origin = Origin::new();
    let [a, _b] = nodes(stage, &origin, |c| {
        c.replay_ttl = Duration::from_secs(10);
        c.early_refresh = Duration::from_secs(5);
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    let t0 = Instant::now();
    assert_eq!(call(&a).await.1, "v1");
    // Nobody calls until v1's last 120 ms (v1 ended at 0.2 s).
    tokio::time::advance(Duration::from_millis(9_880)).await;
    let mut refresh_started = None;
    for _ in 0..11 {
        tokio::time::advance(Duration::from_millis(10)).await;
        let _ = answer(&a).await;
        if origin.calls() == 2 {
            refresh_started = Some(Instant::now());
            break;
        }
    }
    flightdeck::core::random::seed_this_thread(None);
    let started = refresh_started.expect("an early refresh started");
    assert!(
        started - t0 < Duration::from_millis(10_200),
        "early: v1 still fresh"
    );
    // The early refresh (200 ms of work) runs on a; a switches to
    // LOCAL_ONLY meanwhile, its copy expires before that work ends.
    let handle = a.layer.stage(stage).unwrap();
    handle.set_mode(Mode::LocalOnly).unwrap();
    while started.elapsed() < Duration::from_millis(180) {
        tokio::time::advance(Duration::from_millis(10)).await;
        let _ = answer(&a).await;
        assert_eq!(
            origin.calls(),
            2,
            "a second refresh on a while its early refresh runs ({:?} in)",
            started.elapsed()
        );
    }
}

/// The claim `Leader::refresh_early` holds for the copy's `left` is
/// ended by a task that sleeps that long: a runtime shut down meanwhile
/// drops it, and the claim stays (a copy that replaces the key's keeps
/// it), so the key is never refreshed on that node again: here, a node
/// switched to LOCAL_ONLY never runs its grace refresh.
#[test]
fn a_runtime_shutdown_does_not_leave_an_early_refresh_claim_behind() {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let stage = "x-early-shutdown";
    let origin = Origin::new();
    let first = rt();
    let [a, _b] = first.block_on(async {
        nodes(stage, &origin, |c| {
            c.replay_ttl = Duration::from_secs(10);
            c.early_refresh = Duration::from_secs(5);
            c.stale_while_revalidate = Duration::from_secs(30);
        })
    });
    first.block_on(async {
        flightdeck::core::random::seed_this_thread(Some(34));
        assert_eq!(call(&a).await.1, "v1");
        tokio::time::advance(Duration::from_millis(9_880)).await;
        for _ in 0..11 {
            tokio::time::advance(Duration::from_millis(10)).await;
            let _ = answer(&a).await;
            if origin.calls() == 2 {
                break;
            }
        }
        flightdeck::core::random::seed_this_thread(None);
        assert_eq!(origin.calls(), 2, "an early refresh started");
    });
    // The early refresh's claim-holding task sleeps; the runtime ends.
    drop(first);
    let second = rt();
    second.block_on(async {
        a.layer
            .stage(stage)
            .unwrap()
            .set_mode(Mode::LocalOnly)
            .unwrap();
        // Well past v1's freshness (whatever this runtime's clock), within
        // its grace window.
        tokio::time::advance(Duration::from_secs(12)).await;
        let got = answer(&a).await;
        assert_eq!(got.stale.map(|s| s.reason), Some(StaleReason::Revalidate));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(origin.calls(), 3, "the grace refresh ran");
    });
}

/// A result a node receives in a commit's notice is ordered by its work's
/// start even when the commit was held up on its way (a frozen store:
/// 150 ms here): a's v1 (started at 0) must not look as if its work
/// started after b's own v2 (started at 0.1 s, run alone with the store
/// down, given to b's caller), replace v2 as b's copy, and later answer on
/// b although b gave v2, of work that started later.
#[tokio::test(start_paused = true)]
async fn a_held_up_commits_notice_does_not_replace_a_later_started_copy() {
    let origin = Origin::new();
    let store = flightdeck_test::MemoryBackend::new();
    let held = flightdeck_test::Hooked::new(store.clone())
        .before_commit(|_| tokio::time::sleep(Duration::from_millis(150)));
    let [a, b] = nodes_on(held, "x-held-notice", &origin, |c| {
        c.stale_while_revalidate = Duration::from_secs(10);
    });
    origin.delay_ms.store(1_500, Ordering::SeqCst);
    let first = tokio::spawn(call(&a));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    origin.delay_ms.store(200, Ordering::SeqCst);
    store.set_unavailable(true);
    assert_eq!(call(&b).await.1, "v2", "b runs it alone, the store down");
    store.set_unavailable(false);
    // b's copy of v2 (ended at 0.3 s) is past its freshness at 1.3 s: b's
    // next caller follows a's flight and gets v1 by its commit's notice.
    tokio::time::advance(Duration::from_millis(1_050)).await;
    assert_eq!(call(&b).await.1, "v1", "b follows a's flight");
    assert_eq!(first.await.unwrap().1, "v1");
    // With b's store down, its copy answers: it must be the result of
    // the latest-started work b gave, v2.
    b.layer
        .stage("x-held-notice")
        .unwrap()
        .breaker()
        .force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        call(&b).await.1,
        "v2",
        "b's copy is of the latest-started work it gave"
    );
}
