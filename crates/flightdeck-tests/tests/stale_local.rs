//! Answering anyway in one process (LOCAL_ONLY), on paused time, through
//! the HTTP layer around an axum router: grace (stale-while-revalidate),
//! stale-if-error with its throttle, the soft timeout, early refresh
//! (XFetch, seeded), hit-for-pass, a purge during a refresh, and what
//! the answers say (the `Stale` marker, `Cache-Status`, `Age`); then the
//! edges: windows ending exactly, refreshes out of order, purges in each
//! phase, panics, deadlines, mode switches, and quiescence.

#![cfg(feature = "http")]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use flightdeck::core::metric;
use flightdeck::core::stale::{Stale, StaleReason};
use flightdeck::{HttpKeyExtractor, Mode, Route, SingleFlightLayer, StageConfig};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::ServiceExt;

/// The origin: counts its executions, answers `v<n>` after `work`, with
/// the status it is told, and a cookie when told.
struct Origin {
    calls: AtomicUsize,
    status: AtomicU16,
    cookie: AtomicBool,
    /// Whether an execution panics (after its work).
    panic: AtomicBool,
    /// Milliseconds each execution takes.
    work: AtomicU64,
}

impl Origin {
    fn new(work: Duration) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            status: AtomicU16::new(200),
            cookie: AtomicBool::new(false),
            panic: AtomicBool::new(false),
            work: AtomicU64::new(work.as_millis() as u64),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn page(State(origin): State<Arc<Origin>>) -> Response<Body> {
    let n = origin.calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(origin.work.load(Ordering::SeqCst))).await;
    assert!(!origin.panic.load(Ordering::SeqCst), "the origin panics");
    let mut res = Response::builder().status(origin.status.load(Ordering::SeqCst));
    if origin.cookie.load(Ordering::SeqCst) {
        res = res.header("set-cookie", format!("session={n}"));
    }
    res.body(Body::from(format!("v{n}"))).unwrap()
}

struct App {
    router: Router,
    layer: SingleFlightLayer,
    stage: &'static str,
}

/// A LOCAL_ONLY stage `stage` on `GET /p`, set up by `cfg`.
fn app(stage: &'static str, origin: &Arc<Origin>, cfg: impl FnOnce(&mut StageConfig)) -> App {
    let mut c = StageConfig::new().mode(Mode::LocalOnly);
    cfg(&mut c);
    app_with(stage, origin, c)
}

/// A HYBRID stage `stage` on `GET /p` over a memory backend.
fn hybrid_app(
    stage: &'static str,
    origin: &Arc<Origin>,
    cfg: impl FnOnce(&mut StageConfig),
) -> App {
    let mut c = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    cfg(&mut c);
    app_with(stage, origin, c)
}

fn app_with(stage: &'static str, origin: &Arc<Origin>, cfg: StageConfig) -> App {
    app_on(stage, origin, cfg, flightdeck_test::MemoryBackend::new())
}

/// [`app_with`] over `store`.
fn app_on(
    stage: &'static str,
    origin: &Arc<Origin>,
    cfg: StageConfig,
    store: impl flightdeck::distributed::backend::Backend,
) -> App {
    let keys = HttpKeyExtractor::builder()
        .route(Route::get("/p", stage))
        .build()
        .unwrap();
    let layer = SingleFlightLayer::builder()
        .keys(keys)
        .backend("mem", store)
        .stage(stage, cfg)
        .build()
        .unwrap();
    let router = Router::new()
        .route("/p", get(page))
        .with_state(Arc::clone(origin))
        .layer(layer.clone());
    App {
        router,
        layer,
        stage,
    }
}

fn req() -> Request<Body> {
    Request::get("http://svc/p").body(Body::empty()).unwrap()
}

#[derive(Debug)]
struct Got {
    status: StatusCode,
    body: String,
    headers: HeaderMap,
    stale: Option<Stale>,
}

fn call(app: &App) -> impl std::future::Future<Output = Got> + Send + 'static {
    let router = app.router.clone();
    async move { answer(router).await }
}

async fn answer(router: Router) -> Got {
    let res = router.oneshot(req()).await.unwrap();
    let stale = res.extensions().get::<Stale>().copied();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Got {
        status: parts.status,
        body: String::from_utf8(body.to_vec()).unwrap(),
        headers: parts.headers,
        stale,
    }
}

fn stale_served(stage: &str, reason: StaleReason) -> u64 {
    common::counter_with(metric::STALE_SERVED_TOTAL, stage, "reason", reason.as_str())
}

/// Lets spawned work (a refresh) run its polls without moving the clock.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn grace_answers_fifty_callers_at_once_and_refreshes_once() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(200));
    let app = app("grace", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(10);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;

    let started = Instant::now();
    let calls = (0..50).map(|_| call(&app));
    let got = futures_join_all(calls).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "nobody waited");
    for g in &got {
        assert_eq!(g.body, "v1");
        let stale = g.stale.expect("marked stale");
        assert_eq!(stale.reason, StaleReason::Revalidate);
        assert!(stale.age >= Duration::from_secs(2));
    }
    assert_eq!(stale_served("grace", StaleReason::Revalidate), 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "one refresh for fifty callers");
    let next = call(&app).await;
    assert_eq!(next.body, "v2", "the refresh's result answers next");
    assert!(next.stale.is_none(), "fresh again");
    assert_eq!(origin.calls(), 2);
    assert_eq!(
        common::counter_with(metric::REFRESH_TOTAL, "grace", "outcome", "committed"),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_refresh_ends_at_the_execution_timeout_and_another_may_run() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("grace-hung", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(60);
        c.execution_timeout = Some(Duration::from_secs(2));
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.work.store(3_600_000, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v1");
    settle().await;
    assert_eq!(origin.calls(), 2, "the refresh runs");
    // While it hangs, no other refresh starts.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(call(&app).await.body, "v1");
    assert_eq!(origin.calls(), 2);
    // Cut at the execution timeout: the next stale answer starts another.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    settle().await;
    assert_eq!(
        common::counter_with(metric::REFRESH_TOTAL, "grace-hung", "outcome", "abandoned"),
        1
    );
    origin.work.store(100, Ordering::SeqCst);
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(origin.calls(), 3);
    assert_eq!(call(&app).await.body, "v3");
}

/// A refresh whose work outlives L1's wait timeout goes on for nobody and
/// holds the key's refresh until its work ends: no second refresh beside
/// it, and none held off once it ended (its result, kept, is stale again).
#[tokio::test(start_paused = true)]
async fn a_refresh_past_the_wait_timeout_holds_its_claim_as_long_as_its_work() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("grace-outlived", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(60);
        c.lease_timeout = Duration::from_secs(2);
        c.heartbeat_interval = Duration::from_millis(500);
        c.wait_timeout = Duration::from_secs(2);
        c.execution_timeout = Some(Duration::from_secs(30));
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.work.store(5_000, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v1");
    settle().await;
    assert_eq!(origin.calls(), 2, "the refresh runs");
    // Past the refresh's wait timeout its work goes on: no other starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(call(&app).await.body, "v1");
    settle().await;
    assert_eq!(origin.calls(), 2, "one refresh at a time");
    // Its work ends (5 s) and its result is kept.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    settle().await;
    assert_eq!(call(&app).await.body, "v2");
    // Stale again long before the refresh's bound (30 s): the next stale
    // answer starts the next refresh at once.
    origin.work.store(100, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v2");
    settle().await;
    assert_eq!(origin.calls(), 3, "the claim ended with the work");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call(&app).await.body, "v3");
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_answers_failures_and_throttles_the_work() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(50));
    let app = app("if-error", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.stale_retry_after = Duration::from_secs(10);
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;

    let got = call(&app).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
    assert_eq!(got.stale.unwrap().reason, StaleReason::Error);
    assert_eq!(origin.calls(), 2, "the work ran and failed");
    // Within stale-retry-after: the copy answers, the work does not run.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let got = call(&app).await;
        assert_eq!(got.body, "v1");
        assert_eq!(origin.calls(), 2);
    }
    tokio::time::advance(Duration::from_secs(6)).await;
    let got = call(&app).await;
    assert_eq!(got.body, "v1", "still failing: still the copy");
    assert_eq!(origin.calls(), 3, "one try after the throttle");
    assert_eq!(stale_served("if-error", StaleReason::Error), 7);
    // Up again: the next try answers, and replaces the copy.
    origin.status.store(200, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(11)).await;
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v4", None));
}

#[tokio::test(start_paused = true)]
async fn a_failure_past_the_window_is_the_callers() {
    let origin = Origin::new(Duration::from_millis(50));
    let app = app("if-error-past", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(5);
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(7)).await;
    let got = call(&app).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.stale.is_none());

    // Within the window when called, past it when the work failed: the
    // copy never answers older than freshness + window.
    let late = self::app("if-error-late", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(5);
    });
    origin.status.store(200, Ordering::SeqCst);
    assert_eq!(call(&late).await.status, StatusCode::OK);
    origin.status.store(503, Ordering::SeqCst);
    origin.work.store(2_000, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(5)).await;
    let got = call(&late).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.stale.is_none());
}

/// A stage with a 100 ms soft timeout and stale-if-error, whose copy (v1)
/// is 1 s past its freshness.
async fn soft_app(stage: &'static str, origin: &Arc<Origin>) -> App {
    let app = app(stage, origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.soft_timeout = Duration::from_millis(100);
        c.execution_timeout = Some(Duration::from_secs(5));
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    app
}

#[tokio::test(start_paused = true)]
async fn soft_timeout_answers_the_copy_and_the_work_replaces_it() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_secs(1));
    let app = soft_app("soft", &origin).await;

    let started = Instant::now();
    let got = call(&app).await;
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(got.body, "v1");
    assert_eq!(got.stale.unwrap().reason, StaleReason::SoftTimeout);
    assert_eq!(stale_served("soft", StaleReason::SoftTimeout), 1);
    // The work goes on without its caller, and its result replaces the
    // copy.
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(origin.calls(), 2);
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_caller_under_hit_for_pass_ends_by_its_own_deadline() {
    let origin = Origin::new(Duration::from_millis(500));
    origin.cookie.store(true, Ordering::SeqCst);
    let app = app("pass-deadline", &origin, |c| {
        c.hit_for_pass = Duration::from_secs(30);
    });
    assert!(call(&app).await.headers.contains_key("set-cookie"));
    // The key is under hit-for-pass: this caller runs alone, within the
    // 100 ms it gave itself.
    let started = Instant::now();
    let mut r = req();
    r.headers_mut()
        .insert("x-request-timeout", "100ms".parse().unwrap());
    let res = app.router.clone().oneshot(r).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_ne!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key("set-cookie"));
}

#[tokio::test(start_paused = true)]
async fn early_refresh_renews_a_hot_key_before_it_expires() {
    flightdeck::core::random::seed_this_thread(Some(34));
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("early", &origin, |c| {
        c.replay_ttl = Duration::from_secs(10);
        c.early_refresh = Duration::from_secs(5);
    });
    assert_eq!(call(&app).await.body, "v1");
    // v1 finished 1 s in and is fresh until 11 s. A hot key: a caller
    // every 100 ms until 10.5 s, each answered at once.
    let start = Instant::now() - Duration::from_secs(1);
    let mut refreshed_at = None;
    for _ in 0..95 {
        tokio::time::advance(Duration::from_millis(100)).await;
        let started = Instant::now();
        let got = call(&app).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "nobody waits");
        assert!(got.body == "v1" || got.body == "v2", "{}", got.body);
        if origin.calls() == 2 && refreshed_at.is_none() {
            refreshed_at = Some(Instant::now() - start);
        }
    }
    flightdeck::core::random::seed_this_thread(None);
    assert_eq!(
        origin.calls(),
        2,
        "one caller refreshed it, before it expired"
    );
    let at = refreshed_at.unwrap();
    assert!(at >= Duration::from_secs(6), "within its last 5 s: {at:?}");
    tokio::time::advance(Duration::from_millis(1500)).await;
    let got = call(&app).await;
    assert_eq!(got.body, "v2", "the refreshed copy answers past v1's end");
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn hit_for_pass_runs_callers_of_an_unshareable_key_at_once() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(500));
    origin.cookie.store(true, Ordering::SeqCst);
    let app = app("pass", &origin, |c| {
        c.hit_for_pass = Duration::from_secs(30);
    });
    assert!(call(&app).await.headers.contains_key("set-cookie"));
    let started = Instant::now();
    let got = futures_join_all((0..5).map(|_| call(&app))).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500),
        "nobody queued behind a leader whose response it cannot use"
    );
    let mut cookies: Vec<_> = got
        .iter()
        .map(|g| g.headers["set-cookie"].to_str().unwrap().to_owned())
        .collect();
    cookies.sort();
    cookies.dedup();
    assert_eq!(cookies.len(), 5, "each its own response");
    assert_eq!(origin.calls(), 6);
    assert_eq!(
        common::counter(metric::HIT_FOR_PASS_TOTAL, "pass"),
        5,
        "counted"
    );
    // After the window, callers coalesce again.
    origin.cookie.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(31)).await;
    futures_join_all((0..5).map(|_| call(&app))).await;
    assert_eq!(origin.calls(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_purge_during_a_refresh_never_brings_the_result_back() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("purge", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(10);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // Stale: answered at once; v2's refresh starts.
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(app.layer.invalidate_request(req()).await.unwrap());
    // The refresh (v2) started before the purge and ends after it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(origin.calls(), 2);
    assert_eq!(
        common::counter_with(metric::REFRESH_TOTAL, "purge", "outcome", "fenced"),
        1
    );
    // Nothing answers for the purged key: this caller runs (v3).
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v3", None));
    assert_eq!(origin.calls(), 3);
    // v2 never answers.
    for _ in 0..3 {
        tokio::time::advance(Duration::from_millis(500)).await;
        let got = call(&app).await;
        assert_eq!(got.body, "v3");
    }
    let handle = app.layer.stage(app.stage).unwrap();
    let key = flightdeck::FlightKey::from_bytes(handle.name().clone(), "unknown");
    handle.invalidate(&key).await.unwrap();
}

/// A stage's handle purges its own keys: a key of another stage is refused,
/// naming both, rather than "purged" here (where nothing of it is) while
/// its own stage's copies go on answering.
#[tokio::test(start_paused = true)]
async fn a_key_of_another_stage_is_refused_not_purged_in_silence() {
    let origin = Origin::new(Duration::from_millis(10));
    let app = app("purge-here", &origin, |c| {
        c.replay_ttl = Duration::from_secs(60);
        c.stale_if_error = Duration::from_secs(60);
    });
    let handle = app.layer.stage(app.stage).unwrap();
    let other = flightdeck::FlightKey::from_bytes(
        flightdeck::StageName::new("purge-elsewhere").unwrap(),
        "k",
    );
    let err = handle.invalidate(&other).await.unwrap_err();
    let msg = err.to_string();
    assert!(err.is::<flightdeck::error::WrongStage>(), "{msg}");
    assert!(
        msg.contains("purge-elsewhere") && msg.contains("purge-here"),
        "{msg}"
    );
}

#[tokio::test(start_paused = true)]
async fn cache_status_and_age_only_when_asked_for() {
    let origin = Origin::new(Duration::from_millis(10));
    let on = app("status-on", &origin, |c| {
        c.replay_ttl = Duration::from_secs(5);
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    let first = call(&on).await;
    assert_eq!(first.headers["cache-status"], "flightdeck; fwd=miss");
    tokio::time::advance(Duration::from_secs(2)).await;
    let hit = call(&on).await;
    assert_eq!(hit.headers["cache-status"], "flightdeck; hit; ttl=3");
    assert_eq!(hit.headers["age"], "2");
    tokio::time::advance(Duration::from_secs(5)).await;
    let stale = call(&on).await;
    assert_eq!(
        stale.headers["cache-status"],
        "flightdeck; fwd=stale; ttl=-2; detail=revalidate"
    );
    assert_eq!(stale.headers["age"], "7");

    // Without a window, a replay is a hit too, never "collapsed".
    let replays = app("status-replay", &origin, |c| {
        c.replay_ttl = Duration::from_secs(5);
        c.cache_status = true;
    });
    call(&replays).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let hit = call(&replays).await;
    assert_eq!(hit.headers["cache-status"], "flightdeck; hit; ttl=4");
    assert_eq!(hit.headers["age"], "1");
    assert!(hit.stale.is_none());

    let off = app("status-off", &origin, |c| {
        c.replay_ttl = Duration::from_secs(5);
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    call(&off).await;
    tokio::time::advance(Duration::from_secs(7)).await;
    let stale = call(&off).await;
    assert!(stale.stale.is_some(), "the marker is always there");
    assert!(!stale.headers.contains_key("cache-status"));
    assert!(!stale.headers.contains_key("age"));
}

/// A distributed stage whose breaker is open coordinates its flights on
/// this node alone: `Cache-Status` says so (`detail=local-fallback`), to
/// the caller that led the flight and to the one that joined it; once
/// the breaker closes, answers say nothing of it again.
#[tokio::test(start_paused = true)]
async fn a_flight_coordinated_alone_says_local_fallback() {
    let origin = Origin::new(Duration::from_millis(100));
    let app = hybrid_app("status-fallback", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.cache_status = true;
    });
    let healthy = call(&app).await;
    assert_eq!(healthy.headers["cache-status"], "flightdeck; fwd=miss");

    let handle = app.layer.stage(app.stage).unwrap();
    let breaker = handle.breaker();
    breaker.force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    let (led, joined) = tokio::join!(tokio::spawn(call(&app)), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        call(&app).await
    });
    assert_eq!(origin.calls(), 2, "one run for both callers");
    assert_eq!(
        led.unwrap().headers["cache-status"],
        "flightdeck; fwd=miss; detail=local-fallback"
    );
    assert_eq!(
        joined.headers["cache-status"],
        "flightdeck; fwd=miss; collapsed; detail=local-fallback"
    );

    breaker.force_closed();
    tokio::time::advance(Duration::from_secs(2)).await;
    let again = call(&app).await;
    assert_eq!(again.headers["cache-status"], "flightdeck; fwd=miss");
}

#[tokio::test(start_paused = true)]
async fn a_hybrid_node_whose_store_is_down_answers_from_its_copy() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = hybrid_app("hybrid-down", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    assert_eq!(call(&app).await.body, "v1");
    // Healthy: a fresh result answers as a hit, never as a stale one.
    let hit = call(&app).await;
    assert_eq!((hit.body.as_str(), hit.stale), ("v1", None));
    assert_eq!(origin.calls(), 1);

    app.layer.stage(app.stage).unwrap().breaker().force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    let got = call(&app).await;
    assert_eq!(got.body, "v1");
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::RedisDown);
    assert_eq!(stale.age, Duration::from_secs(2));
    assert_eq!(stale_served("hybrid-down", StaleReason::RedisDown), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(origin.calls(), 2, "one refresh, here");
    let got = call(&app).await;
    assert_eq!(got.body, "v2");
}

/// The store turns unreachable as the origin starts failing: the first
/// flights run in the local fallback before the breaker opens, and the
/// node's copy answers their failure (`redis_down`, within
/// `stale-if-error`) as it does once the stage is degraded. While the
/// store is reachable, the store answers: a failure with nothing kept
/// there is the caller's, whatever the node's copy.
#[tokio::test(start_paused = true)]
async fn a_failing_fallback_run_is_answered_by_the_copy_before_the_breaker_opens() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let mut cfg = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    cfg.replay_ttl = Duration::from_secs(1);
    cfg.stale_if_error = Duration::from_secs(30);
    let app = app_on("fallback-copy", &origin, cfg.clone(), store.clone());
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;

    // Reachable, and nothing kept in the store (purged by another node):
    // the origin's failure is the caller's.
    let other = app_on("fallback-copy", &origin, cfg, store.clone());
    assert!(other.layer.invalidate_request(req()).await.unwrap());
    origin.status.store(503, Ordering::SeqCst);
    let got = call(&app).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "v2")
    );
    assert!(got.stale.is_none());

    store.set_unavailable(true);
    let got = call(&app).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::RedisDown);
    assert_eq!(origin.calls(), 3, "the fallback ran");
    let handle = app.layer.stage(app.stage).unwrap();
    assert!(!handle.is_degraded(), "before the breaker opened");
    assert_eq!(stale_served("fallback-copy", StaleReason::RedisDown), 1);
}

/// A HYBRID stage over "mem" with stale-if-error, whose callers wait 3 s
/// at most (leases of 2 s).
fn waiting_cfg() -> StageConfig {
    let mut cfg = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    cfg.replay_ttl = Duration::from_secs(1);
    cfg.stale_if_error = Duration::from_secs(600);
    cfg.lease_timeout = Duration::from_secs(2);
    cfg.heartbeat_interval = Duration::from_millis(500);
    cfg.wait_timeout = Duration::from_secs(3);
    cfg
}

/// Another node of `stage` on `store` runs the key, slowly (300 s): its
/// caller, running.
async fn another_node_runs_it(
    stage: &'static str,
    cfg: StageConfig,
    store: &flightdeck_test::MemoryBackend,
) -> tokio::task::JoinHandle<Got> {
    let slow = Origin::new(Duration::from_secs(300));
    let other = app_on(stage, &slow, cfg, store.clone());
    let running = tokio::spawn(call(&other));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(slow.calls(), 1, "the other node runs it");
    running
}

/// A caller follows another node's flight when the store goes down: its
/// wait cannot end before the wait timeout (the other node may hold the
/// lease and finish), and at the wait timeout, the stage's store being
/// down, the node's copy answers (`redis_down`, within `stale-if-error`)
/// instead of the timeout.
#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_while_the_store_is_down_is_answered_by_the_copy() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let cfg = waiting_cfg();
    let app = app_on("wait-down", &origin, cfg.clone(), store.clone());
    // This node's copy comes from a run the store never saw (its breaker
    // was open).
    let handle = app.layer.stage(app.stage).unwrap();
    let breaker = handle.breaker();
    breaker.force_open();
    assert_eq!(call(&app).await.body, "v1");
    breaker.force_closed();
    tokio::time::advance(Duration::from_secs(2)).await;

    // Another node runs the key, slowly: this node follows, nothing kept
    // in the store beside the flight.
    let running = another_node_runs_it("wait-down", cfg, &store).await;
    let waiting = tokio::spawn(call(&app));
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The store goes down; the breaker opens on other callers' failures.
    store.set_unavailable(true);
    breaker.force_open();
    let got = waiting.await.unwrap();
    assert_eq!(
        (got.status, got.body.as_str()),
        (StatusCode::OK, "v1"),
        "{got:?}"
    );
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::RedisDown);
    assert_eq!(origin.calls(), 1, "nothing ran here");
    assert_eq!(stale_served("wait-down", StaleReason::RedisDown), 1);
    running.abort();
}

/// A caller of `app` waits 3 s (its wait timeout) and is answered v1,
/// stale as `wait_timeout`, counted so and never as `error`.
async fn answered_v1_at_the_wait_timeout(app: &App) {
    let started = Instant::now();
    let got = call(app).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (StatusCode::OK, "v1"),
        "{got:?}"
    );
    let stale = got.stale.expect("answered stale");
    assert_eq!(stale.reason, StaleReason::WaitTimeout);
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "at the wait timeout"
    );
    assert_eq!(stale_served(app.stage, StaleReason::WaitTimeout), 1);
    assert_eq!(stale_served(app.stage, StaleReason::Error), 0);
}

/// A LOCAL_ONLY caller whose wait runs out is answered by the copy within
/// `stale-if-error`, counted as `wait_timeout`: the work did not fail,
/// so nothing is throttled.
#[tokio::test(start_paused = true)]
async fn a_callers_wait_timeout_is_answered_by_the_copy() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("wait-copy", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(600);
        c.stale_retry_after = Duration::from_secs(30);
        c.lease_timeout = Duration::from_secs(2);
        c.heartbeat_interval = Duration::from_millis(500);
        c.wait_timeout = Duration::from_secs(3);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    origin.work.store(10_000, Ordering::SeqCst);
    answered_v1_at_the_wait_timeout(&app).await;
    // Not a failure of the work: nothing is throttled, the next caller
    // runs it.
    origin.work.store(100, Ordering::SeqCst);
    let next = call(&app).await;
    assert_eq!((next.body.as_str(), next.stale), ("v3", None));
}

/// A caller following another node's refresh while the store is up, its
/// store's kept result standing by: a wait that runs past `wait-timeout`
/// is answered by that result as `wait_timeout`, as LOCAL_ONLY counts it
/// (the work did not fail), never as `error`.
#[tokio::test(start_paused = true)]
async fn a_followers_wait_timeout_is_answered_by_the_stores_result() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let cfg = waiting_cfg();
    let app = app_on("follow-wait", &origin, cfg.clone(), store.clone());
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;

    // Another node is granted the refresh and runs it, slowly: this node
    // follows, the kept result beside.
    let running = another_node_runs_it("follow-wait", cfg, &store).await;
    answered_v1_at_the_wait_timeout(&app).await;
    assert_eq!(origin.calls(), 1, "nothing ran here");
    running.abort();
}

/// A caller following another node's refresh while the store is up is
/// answered the store's kept result at its soft timeout, as a caller of a
/// run here is: the soft timeout holds on every path a caller waits on.
#[tokio::test(start_paused = true)]
async fn a_follower_is_answered_the_stores_result_at_the_soft_timeout() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let mut cfg = waiting_cfg();
    soft_after_100ms(&mut cfg);
    let app = app_on("follow-soft", &origin, cfg.clone(), store.clone());
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;

    let running = another_node_runs_it("follow-soft", cfg, &store).await;
    let stale = answered_v1_at_the_soft_timeout(&app).await;
    assert_eq!(stale.reason, StaleReason::SoftTimeout);
    assert_eq!(origin.calls(), 1, "nothing ran here");
    // The other node's caller was answered so too, at its own.
    assert_eq!(stale_served("follow-soft", StaleReason::SoftTimeout), 2);
    running.abort();
}

/// A follower whose wait fails runs in the local fallback
/// (`on-wait-failure = local`) while the store is up: the store stays
/// the judge, so a result another node purged there never answers its
/// failure from this node's copy.
#[tokio::test(start_paused = true)]
async fn a_followers_fallback_run_leaves_a_purged_copy_unanswered() {
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let mut cfg = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    cfg.replay_ttl = Duration::from_secs(1);
    cfg.stale_if_error = Duration::from_secs(600);
    cfg.on_wait_failure = flightdeck::OnWaitFailure::Local;
    let app = app_on("follow-purged", &origin, cfg.clone(), store.clone());
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;

    // Another node purges the key and runs it, slowly: this node follows.
    let slow = Origin::new(Duration::from_secs(300));
    let other = app_on("follow-purged", &slow, cfg, store.clone());
    assert!(other.layer.invalidate_request(req()).await.unwrap());
    let running = tokio::spawn(call(&other));
    tokio::time::sleep(Duration::from_millis(10)).await;
    origin.status.store(503, Ordering::SeqCst);
    let got = call(&app).await;
    assert_eq!(origin.calls(), 2, "the follower ran in the fallback");
    assert!(
        got.stale.is_none(),
        "the purged copy answered: {}",
        got.body
    );
    assert_eq!(
        (got.status, got.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "v2")
    );
    running.abort();
}

/// A HYBRID stage over `store` with stale-if-error, set up by `cfg`,
/// whose copy (v1) is 1 s past its freshness.
async fn primed_past_freshness(
    stage: &'static str,
    origin: &Arc<Origin>,
    store: impl flightdeck::distributed::backend::Backend,
    cfg: impl FnOnce(&mut StageConfig),
) -> App {
    let mut c = StageConfig::new().mode(Mode::Hybrid).backend("mem");
    c.replay_ttl = Duration::from_secs(1);
    c.stale_if_error = Duration::from_secs(600);
    cfg(&mut c);
    let app = app_on(stage, origin, c, store);
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    app
}

/// [`primed_past_freshness`] over a memory backend, its breaker just
/// closed through a ramp that lets 1% of its flights back.
async fn ramp_holding_back(
    stage: &'static str,
    origin: &Arc<Origin>,
    cfg: impl FnOnce(&mut StageConfig),
) -> App {
    let store = flightdeck_test::MemoryBackend::new();
    let app = primed_past_freshness(stage, origin, store, |c| {
        c.breaker.ramp = vec![0.01];
        c.breaker.ramp_step = Duration::from_secs(600);
        cfg(c);
    })
    .await;
    let handle = app.layer.stage(app.stage).unwrap();
    let breaker = handle.breaker();
    breaker.trip();
    assert!(breaker.recover(), "closed, through its ramp");
    assert_eq!(breaker.ramp_share(), Some(0.01));
    app
}

/// A soft timeout of 100 ms (the work bounded at 5 s).
fn soft_after_100ms(c: &mut StageConfig) {
    c.soft_timeout = Duration::from_millis(100);
    c.execution_timeout = Some(Duration::from_secs(5));
}

/// A caller of `app` is answered v1 at its 100 ms soft timeout, stale.
async fn answered_v1_at_the_soft_timeout(app: &App) -> Stale {
    let started = Instant::now();
    let got = call(app).await;
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(got.body, "v1");
    got.stale.expect("answered by the copy")
}

/// A breaker's ramp after closing holds a flight back while the store is
/// up: the flight runs in the local fallback, and the node's copy answers
/// its failure as any failure (`error`, within `stale-if-error`), never as
/// `redis_down`, which says the store is down.
#[tokio::test(start_paused = true)]
async fn a_flight_a_ramp_held_back_fails_over_to_the_copy_as_an_error() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = ramp_holding_back("ramp-held", &origin, |_| {}).await;
    let handle = app.layer.stage(app.stage).unwrap();

    origin.status.store(503, Ordering::SeqCst);
    let got = call(&app).await;
    assert_eq!(origin.calls(), 2, "held back: it ran here");
    assert!(!handle.is_degraded());
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::Error, "the store is up");
    assert_eq!(stale_served("ramp-held", StaleReason::RedisDown), 0);
    assert_eq!(stale_served("ramp-held", StaleReason::Error), 1);
}

/// A flight a breaker's ramp held back runs in the local fallback while
/// the store is up: its callers still waiting at the soft timeout are
/// answered the copy (`soft_timeout`, the store is up), and the work goes
/// on: its result replaces the copy.
#[tokio::test(start_paused = true)]
async fn a_held_back_flight_answers_the_copy_at_the_soft_timeout() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = ramp_holding_back("ramp-soft", &origin, soft_after_100ms).await;
    origin.work.store(1_000, Ordering::SeqCst);
    let stale = answered_v1_at_the_soft_timeout(&app).await;
    assert_eq!(origin.calls(), 2, "held back: it runs here");
    assert_eq!(stale.reason, StaleReason::SoftTimeout, "the store is up");
    assert_eq!(stale_served("ramp-soft", StaleReason::SoftTimeout), 1);
    assert_eq!(stale_served("ramp-soft", StaleReason::RedisDown), 0);
    // The work goes on without its caller, and its result replaces the
    // copy.
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));
    assert_eq!(origin.calls(), 2);
}

/// A flight that could not reach the store runs in the local fallback
/// (before the breaker opens): its callers still waiting at the soft
/// timeout are answered the copy, as `redis_down`.
#[tokio::test(start_paused = true)]
async fn a_fallback_run_answers_the_copy_at_the_soft_timeout() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let app =
        primed_past_freshness("fallback-soft", &origin, store.clone(), soft_after_100ms).await;
    store.set_unavailable(true);
    origin.work.store(1_000, Ordering::SeqCst);
    let stale = answered_v1_at_the_soft_timeout(&app).await;
    assert_eq!(origin.calls(), 2, "unreachable: it runs here");
    assert!(!app.layer.stage(app.stage).unwrap().is_degraded());
    assert_eq!(stale.reason, StaleReason::RedisDown);
    assert_eq!(stale_served("fallback-soft", StaleReason::RedisDown), 1);
}

/// A store behind a local guard that is not a breaker (a quota, say): it
/// refuses every flight before any call while `refusing`.
#[derive(Clone)]
struct Quota {
    inner: flightdeck_test::MemoryBackend,
    refusing: Arc<AtomicBool>,
}

impl flightdeck::distributed::backend::Backend for Quota {
    fn reject_early(
        &self,
        shard: &flightdeck::distributed::backend::Shard,
    ) -> Option<flightdeck::distributed::BackendError> {
        if self.refusing.load(Ordering::SeqCst) {
            let over = flightdeck::distributed::BackendError::rejected("over this node's quota");
            return Some(over);
        }
        self.inner.reject_early(shard)
    }

    flightdeck::distributed::forward_backend!(inner => acquire_with, heartbeat, commit, abandon, subscribe, join_subscription, invalidate, release, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// A local guard's refusal says nothing of the store: the failure of the
/// flight it sent to the local fallback is answered by the copy as any
/// failure (`error`); the same failure with the store unreachable is
/// `redis_down`.
#[tokio::test(start_paused = true)]
async fn a_guards_refusal_fails_over_to_the_copy_as_an_error() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let refusing = Arc::new(AtomicBool::new(false));
    let quota = Quota {
        inner: store.clone(),
        refusing: Arc::clone(&refusing),
    };
    let app = primed_past_freshness("guard-refused", &origin, quota, |_| {}).await;

    origin.status.store(503, Ordering::SeqCst);
    refusing.store(true, Ordering::SeqCst);
    let got = call(&app).await;
    assert_eq!(origin.calls(), 2, "refused: it ran here");
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::Error, "the store is up");

    refusing.store(false, Ordering::SeqCst);
    store.set_unavailable(true);
    let got = call(&app).await;
    assert_eq!(origin.calls(), 3, "unreachable: it ran here");
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::RedisDown, "the store is down");
    assert_eq!(stale_served("guard-refused", StaleReason::Error), 1);
    assert_eq!(stale_served("guard-refused", StaleReason::RedisDown), 1);
}

/// A store that tells which flight it was last asked for.
#[derive(Clone)]
struct Asked {
    inner: flightdeck_test::MemoryBackend,
    flight: Arc<std::sync::Mutex<Option<flightdeck::distributed::FlightId>>>,
}

impl flightdeck::distributed::backend::Backend for Asked {
    fn acquire_with<'a>(
        &'a self,
        flight: &'a flightdeck::distributed::FlightId,
        token: &'a flightdeck::distributed::backend::OwnerToken,
        ask: flightdeck::distributed::backend::Ask,
        terms: &'a flightdeck::distributed::backend::LeaseTerms,
    ) -> flightdeck::distributed::backend::BackendFuture<
        'a,
        flightdeck::distributed::backend::Acquired,
    > {
        *self.flight.lock().unwrap() = Some(*flight);
        self.inner.acquire_with(flight, token, ask, terms)
    }

    flightdeck::distributed::forward_backend!(inner => heartbeat, commit, abandon, subscribe, join_subscription, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

/// A stored result this node cannot decode is a protocol error of the
/// store (docs/redis-errors.md), which is up and answered: the flight runs
/// in the local fallback, and the copy answers its failure as any failure
/// (`error`), never as `redis_down`.
#[tokio::test(start_paused = true)]
async fn a_stored_result_that_does_not_decode_fails_over_to_the_copy_as_an_error() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let store = flightdeck_test::MemoryBackend::new();
    let asked = Asked {
        inner: store.clone(),
        flight: Arc::default(),
    };
    let app = primed_past_freshness("undecodable", &origin, asked.clone(), |_| {}).await;

    let flight = asked.flight.lock().unwrap().expect("the store was asked");
    let garbage = bytes::Bytes::from_static(b"not a result of ours");
    store.put_raw_result(&flight, garbage, Duration::from_secs(60));
    origin.status.store(503, Ordering::SeqCst);
    let got = call(&app).await;
    assert_eq!(origin.calls(), 2, "its result unreadable: it ran here");
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "v1"));
    let stale = got.stale.expect("answered by the copy");
    assert_eq!(stale.reason, StaleReason::Error, "the store is up");
    assert_eq!(stale_served("undecodable", StaleReason::Error), 1);
    assert_eq!(stale_served("undecodable", StaleReason::RedisDown), 0);
}

#[tokio::test(start_paused = true)]
async fn a_purge_reaches_the_store_of_a_distributed_stage() {
    let origin = Origin::new(Duration::from_millis(10));
    let app = hybrid_app("hybrid-purge", &origin, |c| {
        c.replay_ttl = Duration::from_secs(60);
    });
    assert_eq!(call(&app).await.body, "v1");
    app.layer.flights().idle().await;
    assert_eq!(call(&app).await.body, "v1", "the stored result");
    assert!(app.layer.invalidate_request(req()).await.unwrap());
    assert_eq!(call(&app).await.body, "v2", "gone from the store");
    let other = Request::get("http://svc/elsewhere")
        .body(Body::empty())
        .unwrap();
    assert!(
        !app.layer.invalidate_request(other).await.unwrap(),
        "no key"
    );
}

/// Any request type: errors of the classes `ErrorFailures` names (an
/// execution timeout here), and values a predicate given to the builder
/// calls failures, are answered by the copy.
#[tokio::test(start_paused = true)]
async fn values_and_errors_judged_by_the_stage_rule() {
    use flightdeck::core::error::DeadlineExceeded;
    use flightdeck::core::{BoxError, CloneShare, FlightKey, StageName};
    use flightdeck::distributed::PostcardCodec;
    use flightdeck::GenericSingleFlightLayer;

    let answer = Arc::new(std::sync::Mutex::new(Ok::<_, ()>("good".to_owned())));
    let runs = Arc::new(AtomicUsize::new(0));
    let build = |predicate: bool| {
        let stage = StageName::new("values").unwrap();
        let mut cfg = StageConfig::new().mode(Mode::LocalOnly);
        cfg.replay_ttl = Duration::from_secs(1);
        cfg.stale_if_error = Duration::from_secs(60);
        let b = GenericSingleFlightLayer::builder(
            move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
        )
        .stage("values", cfg);
        let b = if predicate {
            b.stale_failures(|o: Result<&String, &BoxError>| o.is_ok_and(|v| v == "bad"))
        } else {
            b
        };
        let layer = b.build().unwrap();
        let (answer, runs) = (Arc::clone(&answer), Arc::clone(&runs));
        tower::Layer::layer(
            &layer,
            tower::service_fn(move |_q: String| {
                runs.fetch_add(1, Ordering::SeqCst);
                let a = answer.lock().unwrap().clone();
                async move { a.map_err(|()| Box::new(DeadlineExceeded::new("execution")) as BoxError) }
            }),
        )
    };
    for predicate in [false, true] {
        *answer.lock().unwrap() = Ok("good".to_owned());
        let svc = build(predicate);
        assert_eq!(svc.clone().oneshot("q".into()).await.unwrap(), "good");
        tokio::time::advance(Duration::from_secs(2)).await;
        *answer.lock().unwrap() = if predicate {
            Ok("bad".to_owned())
        } else {
            Err(())
        };
        let before = runs.load(Ordering::SeqCst);
        assert_eq!(svc.clone().oneshot("q".into()).await.unwrap(), "good");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            before + 1,
            "it ran, and failed"
        );
    }
    // Without the predicate, "bad" is an answer like any other.
    let svc = build(false);
    *answer.lock().unwrap() = Ok("bad".to_owned());
    assert_eq!(svc.oneshot("q".into()).await.unwrap(), "bad");
}

/// `stale-max-bytes` over values that own their bytes: with the
/// builder's weigher the copies of 100 keys of 1,000 bytes stay within
/// 10,000 bytes (the oldest go); without one, each counts only its
/// `String` header and every copy stays.
#[tokio::test(start_paused = true)]
async fn a_weigher_bounds_the_bytes_of_kept_values() {
    use flightdeck::core::error::DeadlineExceeded;
    use flightdeck::core::{BoxError, CloneShare, FlightKey, StageName};
    use flightdeck::distributed::PostcardCodec;
    use flightdeck::GenericSingleFlightLayer;

    let down = Arc::new(AtomicBool::new(false));
    let build = |weigh: bool| {
        let stage = StageName::new("weighed").unwrap();
        let mut cfg = StageConfig::new().mode(Mode::LocalOnly);
        cfg.replay_ttl = Duration::from_secs(1);
        cfg.stale_if_error = Duration::from_secs(600);
        cfg.stale_max_bytes = 10_000;
        let b = GenericSingleFlightLayer::builder(
            move |q: &String| Some(FlightKey::from_bytes(stage.clone(), q)),
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
        )
        .stage("weighed", cfg);
        let b = if weigh {
            b.stale_weigher(|v: &String| v.len())
        } else {
            b
        };
        let layer = b.build().unwrap();
        let down = Arc::clone(&down);
        tower::Layer::layer(
            &layer,
            tower::service_fn(move |q: String| {
                let failed = down.load(Ordering::SeqCst);
                async move {
                    if failed {
                        Err(Box::new(DeadlineExceeded::new("execution")) as BoxError)
                    } else {
                        Ok(format!("{q:>1000}"))
                    }
                }
            }),
        )
    };
    for weigh in [true, false] {
        down.store(false, Ordering::SeqCst);
        let svc = build(weigh);
        for i in 0..100 {
            svc.clone().oneshot(format!("k{i}")).await.unwrap();
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        down.store(true, Ordering::SeqCst);
        let first = svc.clone().oneshot("k0".into()).await;
        let last = svc.clone().oneshot("k99".into()).await;
        assert!(last.is_ok(), "the newest copy is kept (weigher: {weigh})");
        assert_eq!(first.is_ok(), !weigh, "the oldest copy (weigher: {weigh})");
    }
}

/// `join_all` without the futures crate: every call polled together.
async fn futures_join_all<F>(calls: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, f) in calls.enumerate() {
        set.spawn(async move { (i, f.await) });
    }
    let mut out: Vec<_> = set.join_all().await;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, v)| v).collect()
}

/// gRPC: a tonic reply is an HTTP response, so an `UNAVAILABLE` reply is
/// answered by the copy, and `cache-status` and `age` come as metadata.
#[tokio::test(start_paused = true)]
async fn grpc_unavailable_is_answered_by_the_copy_with_metadata() {
    use bytes::Bytes;
    use http_body_util::Full;

    const CHECK: &str = "/grpc.health.v1.Health/Check";
    let keys = flightdeck::GrpcKeyExtractor::builder()
        .method(CHECK, "grpc-stale")
        .build()
        .unwrap();
    let mut cfg = StageConfig::new().mode(Mode::LocalOnly);
    cfg.replay_ttl = Duration::from_secs(1);
    cfg.stale_if_error = Duration::from_secs(60);
    cfg.cache_status = true;
    let layer = SingleFlightLayer::builder()
        .keys(keys)
        .stage("grpc-stale", cfg)
        .build()
        .unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let svc = {
        let down = Arc::clone(&down);
        tower::Layer::layer(
            &layer,
            tower::service_fn(move |_req: Request<_>| {
                let down = down.load(Ordering::SeqCst);
                async move {
                    let (status, body) = if down {
                        ("14", Bytes::new())
                    } else {
                        ("0", Bytes::from_static(b"\0\0\0\0\x02ok"))
                    };
                    let res = Response::builder()
                        .header("content-type", "application/grpc")
                        .header("grpc-status", status)
                        .body(Full::new(body))
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(res)
                }
            }),
        )
    };
    let call = || {
        Request::post(CHECK)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\x01m")))
            .unwrap()
    };
    let first = svc.clone().oneshot(call()).await.unwrap();
    assert_eq!(first.headers()["grpc-status"], "0");
    assert_eq!(first.headers()["cache-status"], "flightdeck; fwd=miss");

    down.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(3)).await;
    let res = svc.oneshot(call()).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "0", "the copy's status");
    assert_eq!(
        res.headers()["cache-status"],
        "flightdeck; fwd=stale; ttl=-2; detail=error"
    );
    assert_eq!(res.headers()["age"], "3");
    assert_eq!(
        res.extensions().get::<Stale>().map(|s| s.reason),
        Some(StaleReason::Error)
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"\0\0\0\0\x02ok");
}

/// A request whose `call` runs outside a runtime (its future polled in one
/// later) past freshness: answered by the copy; no refresh can start
/// without a runtime, and nothing panics.
#[test]
fn a_call_outside_a_runtime_is_answered_by_the_copy() {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::Service;

    // Not paused: outside a runtime, tokio's clock is the real one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let keys = HttpKeyExtractor::builder()
        .route(Route::get("/p", "outside"))
        .build()
        .unwrap();
    let mut cfg = StageConfig::new().mode(Mode::LocalOnly);
    cfg.replay_ttl = Duration::from_millis(1);
    cfg.stale_while_revalidate = Duration::from_secs(600);
    let layer = rt.block_on(async {
        SingleFlightLayer::builder()
            .keys(keys)
            .stage("outside", cfg)
            .build()
            .unwrap()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = {
        let runs = Arc::clone(&runs);
        tower::Layer::layer(
            &layer,
            tower::service_fn(move |_req: Request<_>| {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let res = Response::builder()
                    .header("content-length", "2")
                    .body(Full::new(Bytes::from(format!("v{n}"))))
                    .unwrap();
                async move { Ok::<_, std::convert::Infallible>(res) }
            }),
        )
    };
    let get = || {
        Request::get("http://svc/p")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    rt.block_on(svc.clone().oneshot(get())).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    std::thread::sleep(Duration::from_millis(5));
    // Called here, outside the runtime.
    let fut = svc.call(get());
    let res = rt.block_on(fut).unwrap();
    let stale = res.extensions().get::<Stale>().copied();
    assert_eq!(stale.map(|s| s.reason), Some(StaleReason::Revalidate));
    // The next call, in the runtime, starts the refresh.
    rt.block_on(async {
        svc.clone().oneshot(get()).await.unwrap();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    });
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A call with one more header.
fn call_with(
    app: &App,
    name: &'static str,
    value: &'static str,
) -> impl std::future::Future<Output = Got> + Send + 'static {
    let router = app.router.clone();
    async move {
        let mut r = req();
        r.headers_mut().insert(name, value.parse().unwrap());
        let res = router.oneshot(r).await.unwrap();
        let stale = res.extensions().get::<Stale>().copied();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got {
            status: parts.status,
            body: String::from_utf8(body.to_vec()).unwrap(),
            headers: parts.headers,
            stale,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_purge_while_callers_wait_keeps_the_purged_copy_from_answering() {
    // At the soft timeout: the copy taken when the caller came was purged
    // since; the caller waits on for the work's own answer.
    let origin = Origin::new(Duration::from_secs(1));
    let soft = app("purge-soft", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.soft_timeout = Duration::from_millis(500);
        c.execution_timeout = Some(Duration::from_secs(5));
    });
    assert_eq!(call(&soft).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    let waiting = tokio::spawn(call(&soft));
    settle().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(soft.layer.invalidate_request(req()).await.unwrap());
    let got = waiting.await.unwrap();
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));

    // On a failure: the purged copy does not answer it either.
    let failing = app("purge-error", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
    });
    assert_eq!(call(&failing).await.status, StatusCode::OK);
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    let waiting = tokio::spawn(call(&failing));
    settle().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(failing.layer.invalidate_request(req()).await.unwrap());
    let got = waiting.await.unwrap();
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.stale.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_callers_own_deadline_throttles_nobody() {
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("deadline-throttle", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.stale_retry_after = Duration::from_secs(30);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // This caller gives up at its own deadline; the work has not failed.
    call_with(&app, "x-request-timeout", "100ms").await;
    // The next caller is not throttled: its work runs and answers.
    let next = call(&app).await;
    assert_eq!(next.status, StatusCode::OK);
    assert!(next.stale.is_none(), "{next:?}");
    assert_ne!(next.body, "v1");
}

#[tokio::test(start_paused = true)]
async fn a_failing_refresh_is_throttled_by_stale_retry_after() {
    let origin = Origin::new(Duration::from_millis(50));
    let app = app("refresh-throttle", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(60);
        c.stale_if_error = Duration::from_secs(60);
        c.stale_retry_after = Duration::from_secs(10);
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(origin.calls(), 2, "the refresh ran and failed");
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(call(&app).await.body, "v1");
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(origin.calls(), 2, "throttled: no refresh");
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(origin.calls(), 3, "one try after the throttle");
}

#[tokio::test(start_paused = true)]
async fn cache_status_ttl_is_a_whole_second_never_minus_zero() {
    let origin = Origin::new(Duration::from_millis(10));
    let app = app("status-subsecond", &origin, |c| {
        c.replay_ttl = Duration::from_secs(5);
        c.stale_while_revalidate = Duration::from_secs(30);
        c.cache_status = true;
    });
    call(&app).await;
    // Half a second left: fresh, 0 whole seconds left.
    tokio::time::advance(Duration::from_millis(4_500)).await;
    let hit = call(&app).await;
    assert_eq!(hit.headers["cache-status"], "flightdeck; hit; ttl=0");
    // Half a second past: stale, so the ttl is negative (RFC 9211: the
    // remaining freshness; an sf-integer is never "-0").
    tokio::time::advance(Duration::from_secs(1)).await;
    let stale = call(&app).await;
    assert_eq!(
        stale.headers["cache-status"],
        "flightdeck; fwd=stale; ttl=-1; detail=revalidate"
    );
    assert_eq!(stale.headers["age"], "5");
}

#[tokio::test(start_paused = true)]
async fn a_copy_answers_exactly_at_the_end_of_its_window_and_never_after() {
    let origin = Origin::new(Duration::ZERO);
    let edge = |stage| {
        app(stage, &origin, |c| {
            c.replay_ttl = Duration::from_secs(1);
            c.stale_if_error = Duration::from_secs(5);
        })
    };
    let at = edge("edge-at");
    let after = edge("edge-after");
    assert_eq!(call(&at).await.body, "v1");
    assert_eq!(call(&after).await.body, "v2");
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(6)).await;
    let got = call(&at).await;
    assert_eq!(got.body, "v1");
    assert_eq!(got.stale.unwrap().age, Duration::from_secs(6));
    tokio::time::advance(Duration::from_millis(1)).await;
    let got = call(&after).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.stale.is_none());
}

#[tokio::test(start_paused = true)]
async fn time_past_the_window_while_a_refresh_runs_waits_for_the_refresh() {
    let origin = Origin::new(Duration::from_secs(5));
    let app = app("grace-jump", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(2);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v1");
    settle().await;
    // Past freshness + window while the refresh still runs: the copy no
    // longer answers; the caller joins the refresh.
    tokio::time::advance(Duration::from_secs(3)).await;
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_hundred_callers_of_a_failing_key_run_it_once_per_retry_after() {
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("hundred", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(600);
        c.stale_retry_after = Duration::from_secs(10);
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.status.store(503, Ordering::SeqCst);
    for round in 0..5 {
        tokio::time::advance(Duration::from_secs(4)).await;
        let got = futures_join_all((0..100).map(|_| call(&app))).await;
        assert!(got
            .iter()
            .all(|g| g.body == "v1" && g.status == StatusCode::OK));
        // t = 4, 8 | 12, 16, 20 | 24: a try at 4 and at 16 (10 s after 4,
        // plus the work), none between.
        let expected = 1 + 1 + usize::from(round >= 3);
        assert_eq!(origin.calls(), expected, "round {round}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_refresh_ends_and_frees_its_claim() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("grace-panic", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(60);
    });
    assert_eq!(call(&app).await.body, "v1");
    origin.panic.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    settle().await;
    assert_eq!(
        common::counter_with(metric::REFRESH_TOTAL, "grace-panic", "outcome", "failed"),
        1
    );
    assert_eq!(app.layer.running_flights("grace-panic"), Some(0));
    origin.panic.store(false, Ordering::SeqCst);
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    settle().await;
    assert_eq!(call(&app).await.body, "v3", "another refresh ran");
}

#[tokio::test(start_paused = true)]
async fn a_leaders_deadline_leaves_its_waiters_their_answer() {
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("leader-deadline", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.stale_retry_after = Duration::from_secs(30);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    let impatient = tokio::spawn(call_with(&app, "x-request-timeout", "100ms"));
    settle().await;
    let patient = tokio::spawn(call(&app));
    settle().await;
    impatient.await.unwrap();
    let got = patient.await.unwrap();
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn one_copy_kept_and_a_result_too_large_leaves_none() {
    let origin = Origin::new(Duration::ZERO);
    let app = app("bounds", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.stale_max_entries = 1;
        c.stale_max_bytes = 200;
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // v2 is too large to keep: v1 must not answer once v2 was given.
    origin.cookie.store(false, Ordering::SeqCst);
    let big = Router::new()
        .route("/p", get(|| async { "x".repeat(1_000) }))
        .layer(app.layer.clone());
    let got = answer(big).await;
    assert_eq!(got.body.len(), 1_000);
    origin.status.store(503, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    let got = call(&app).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn a_purge_ends_a_keys_hit_for_pass_even_one_racing_it() {
    let origin = Origin::new(Duration::from_millis(500));
    origin.cookie.store(true, Ordering::SeqCst);
    let app = app("pass-purge", &origin, |c| {
        c.hit_for_pass = Duration::from_secs(30);
    });
    // A pass remembered before the purge goes with it.
    call(&app).await;
    assert!(app.layer.invalidate_request(req()).await.unwrap());
    origin.cookie.store(false, Ordering::SeqCst);
    futures_join_all((0..5).map(|_| call(&app))).await;
    assert_eq!(origin.calls(), 2, "callers coalesce again after the purge");

    // A response of work that started before the purge, and ends after
    // it, remembers no pass either.
    origin.cookie.store(true, Ordering::SeqCst);
    let running = tokio::spawn(call(&app));
    settle().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(app.layer.invalidate_request(req()).await.unwrap());
    assert!(running.await.unwrap().headers.contains_key("set-cookie"));
    origin.cookie.store(false, Ordering::SeqCst);
    futures_join_all((0..5).map(|_| call(&app))).await;
    assert_eq!(origin.calls(), 4, "callers coalesce again after the purge");
}

#[tokio::test(start_paused = true)]
async fn an_older_refresh_ending_after_a_purge_and_a_newer_one_is_dropped() {
    let origin = Origin::new(Duration::from_millis(100));
    let app = app("out-of-order", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(30);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // R1 (v2) takes 3 s.
    origin.work.store(3_000, Ordering::SeqCst);
    assert_eq!(call(&app).await.body, "v1");
    settle().await;
    assert!(app.layer.invalidate_request(req()).await.unwrap());
    // After the purge: a flight of its own (v3), 100 ms.
    origin.work.store(100, Ordering::SeqCst);
    assert_eq!(call(&app).await.body, "v3");
    // v3 goes stale; its refresh R2 (v4) ends long before R1.
    tokio::time::advance(Duration::from_millis(1_100)).await;
    assert_eq!(call(&app).await.body, "v3");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call(&app).await.body, "v4");
    // R1 ends now: its older result never replaces v4.
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(origin.calls(), 4);
    let got = call(&app).await;
    assert_eq!(got.body, "v4", "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn a_mode_switch_while_copies_exist() {
    let origin = Origin::new(Duration::from_millis(100));
    let mut c = StageConfig::new().mode(Mode::LocalOnly).backend("mem");
    c.replay_ttl = Duration::from_secs(1);
    c.stale_while_revalidate = Duration::from_secs(30);
    let app = app_with("switch", &origin, c);
    let handle = app.layer.stage("switch").unwrap();
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    let got = call(&app).await;
    assert_eq!(got.stale.unwrap().reason, StaleReason::Revalidate);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // HYBRID, healthy: the copy is no stale answer; the store decides.
    handle.set_mode(Mode::Hybrid).unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v3", None));
    app.layer.flights().idle().await;
    // Degraded: this node's copy (the HYBRID result) answers.
    handle.breaker().force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    let got = call(&app).await;
    assert_eq!(got.body, "v3");
    let stale = got.stale.unwrap();
    assert_eq!(stale.reason, StaleReason::RedisDown);
    assert!(stale.age >= Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn soft_timeout_without_a_copy_or_past_the_callers_deadline() {
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("soft-edges", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(60);
        c.soft_timeout = Duration::from_millis(500);
        c.execution_timeout = Some(Duration::from_secs(5));
    });
    // No copy: the caller waits for the work, as without a soft timeout.
    let started = Instant::now();
    let got = call(&app).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!((got.body.as_str(), got.stale), ("v1", None));
    // A deadline before the soft timeout: the caller is answered at its
    // deadline, never later.
    tokio::time::advance(Duration::from_secs(2)).await;
    let started = Instant::now();
    call_with(&app, "x-request-timeout", "200ms").await;
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn nothing_is_left_behind_after_quiescence() {
    common::metrics_on();
    let origin = Origin::new(Duration::from_millis(300));
    let app = app("quiescent", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(5);
        c.stale_if_error = Duration::from_secs(60);
        c.soft_timeout = Duration::from_millis(100);
        c.execution_timeout = Some(Duration::from_secs(2));
    });
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    call(&app).await;
    // The layer's own tasks, started by the first call.
    let base = alive();
    let mut stale = 0;
    for i in 0..40u64 {
        origin
            .status
            .store(if i % 3 == 0 { 503 } else { 200 }, Ordering::SeqCst);
        origin.work.store(100 + (i % 5) * 700, Ordering::SeqCst);
        tokio::time::advance(Duration::from_millis(400 + (i % 7) * 900)).await;
        let got = futures_join_all((0..5).map(|_| call(&app))).await;
        stale += got.iter().filter(|g| g.stale.is_some()).count() as u64;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    settle().await;
    assert_eq!(app.layer.running_flights("quiescent"), Some(0));
    assert_eq!(alive(), base, "no detached refresh or work left");
    assert_eq!(
        common::gauge(metric::ACTIVE_FLIGHTS, "quiescent"),
        Some(0.0)
    );
    let counted: u64 = [
        StaleReason::Revalidate,
        StaleReason::Error,
        StaleReason::SoftTimeout,
        StaleReason::RedisDown,
    ]
    .into_iter()
    .map(|r| stale_served("quiescent", r))
    .sum();
    assert!(stale > 0);
    assert_eq!(counted, stale, "one count per stale answer");
}

#[tokio::test(start_paused = true)]
async fn a_refresh_is_not_bound_by_the_budget_of_the_caller_that_started_it() {
    let origin = Origin::new(Duration::from_secs(1));
    let app = app("refresh-budget", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(60);
    });
    assert_eq!(call(&app).await.body, "v1");
    tokio::time::advance(Duration::from_secs(2)).await;
    // This caller's budget gives the work 200 ms: its own business.
    let budgeted = tower::ServiceBuilder::new()
        .layer(
            flightdeck::budget::BudgetLayer::new(Duration::from_secs(10))
                .execution(Duration::from_millis(200)),
        )
        .service(app.router.clone());
    let res = budgeted.oneshot(req()).await.unwrap();
    assert!(res.extensions().get::<Stale>().is_some());
    // The refresh it started is everyone's: it runs to its end.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    settle().await;
    let got = call(&app).await;
    assert_eq!((got.body.as_str(), got.stale), ("v2", None));
}

#[tokio::test(start_paused = true)]
async fn work_left_in_the_background_ends_without_an_execution_timeout() {
    let origin = Origin::new(Duration::from_millis(100));
    let grace = app("background-grace", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_while_revalidate = Duration::from_secs(600);
    });
    let soft = app("background-soft", &origin, |c| {
        c.replay_ttl = Duration::from_secs(1);
        c.stale_if_error = Duration::from_secs(600);
        c.soft_timeout = Duration::from_millis(100);
    });
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    call(&grace).await;
    call(&soft).await;
    let base = alive();
    // The work hangs; nobody waits for it past the soft timeout, and a
    // refresh has no caller of its own.
    origin.work.store(3_600_000, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(call(&grace).await.stale.is_some());
    assert!(call(&soft).await.stale.is_some());
    // Past the stage's wait timeout (35 s), it is cut, as a caller's
    // would be.
    tokio::time::sleep(Duration::from_secs(120)).await;
    settle().await;
    assert_eq!(grace.layer.running_flights("background-grace"), Some(0));
    assert_eq!(soft.layer.running_flights("background-soft"), Some(0));
    assert_eq!(alive(), base, "no work left running for nobody");
}
