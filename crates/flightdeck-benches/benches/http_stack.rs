//! What the one layer costs a fast service, through the full HTTP stack:
//! a real axum server on a loopback port whose handler answers at once,
//! driven by `wrk` (HTTP/1.1, 32 connections, 2 threads), bare and behind
//! the layer; rows alternating in one run, several rounds, each ratio
//! taken between rows of the same round.
//!
//! Rows, each with a fresh key per request (`unique`) and with one key
//! for every request (`hot`):
//!
//! - `bare`: the axum app alone;
//! - `local`: the app behind the layer, its stage LOCAL_ONLY;
//! - `hybrid`: the stage HYBRID over a `redis-server` started for the run;
//! - `degraded`: HYBRID over a Redis that was killed, the breaker open;
//! - `floor`: the bare app whose handler sends two trivial `EVALSHA`s per
//!   request through fred to the same Redis (the least a distributed
//!   flight asks of Redis: two round trips);
//! - `store floor`: the bare app whose handler sends two `EVALSHA`s that do
//!   what an ACQUIRE and a COMMIT of a fresh key ask of Redis (read the
//!   flight record, the server's clock, write the lease, the result, set
//!   the record's life) without the protocol's decisions: the two round
//!   trips with Redis's own work for them, on a key per request;
//! - `bare 1ms`, `local 1ms`, `hybrid 1ms`: the realistic case, an app
//!   whose handler's work is pending at its first poll and takes a
//!   millisecond (a timer of 1 ms: 1–2 ms with tokio's millisecond
//!   wheel), as a database load or a call to another service does; bare,
//!   LOCAL_ONLY and HYBRID over the same Redis. The handler counts its
//!   runs: what the layer spares the work.
//!
//! Printed: req/s per row and round; the median over rounds of
//! LOCAL/bare, HYBRID/floor, HYBRID/store floor and degraded/LOCAL, and of
//! LOCAL/bare and HYBRID/bare with the millisecond of work; per row the
//! CPU time per request of this process (the server: `getrusage`) and of
//! the Redis server the HYBRID and floor rows share (`INFO cpu`), which
//! on a machine that runs the server, Redis and wrk on the same cores is
//! what the rows' throughput divides; and for the rows with work, how
//! often the handler ran per request answered.
//!
//! ```text
//! scripts/http-bench                       # installs wrk if missing
//! HTTP_ROUNDS=3 HTTP_SECS=5 cargo bench -p flightdeck-benches --bench http_stack
//! ```
//!
//! With `HTTP_SERVE=1` it prints each row's address and serves them until
//! killed, for a profiler or a tracer driven from outside (`perf stat -p`,
//! `strace -c -p`, wrk by hand).
//!
//! With `HTTP_ROW=<row>` (`bare`, `local`, `degraded`, each also `-hot`;
//! `local-bypass`, the layer whose one rule names another route, so that
//! every request passes it by, and `local-bypass-hot`, the same on one
//! path, as a health check or a metrics scrape comes; `hybrid`, `floor` and `store-floor` over a
//! `redis-server` started for the row) and
//! `HTTP_ITERS=<n>` it instead runs `n` requests of that row in process,
//! one after another, through `tower::Service::call` on the same axum
//! `Router` (its routes made once, as `axum::serve` makes them; no
//! socket), each response body read to its end, on one
//! thread: what `scripts/http-instructions` counts under callgrind (the
//! client's side only: Redis is another process). With `HTTP_THREADS=<k>`
//! too (the rows without Redis), the requests are split among `k` tasks on
//! `k` worker threads and it prints requests per second of wall time;
//! `HTTP_LAYER_PER_THREAD=1` gives each task an app and a layer of its own
//! (what `scripts/http-threads` compares).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use flightdeck::breaker::Outcome;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::redis::{RedisBackend, RedisConfig};
use flightdeck::{Mode, SingleFlightLayer, StageConfig};
use flightdeck_benches::cpu_time;
use flightdeck_benches::l2::{floor_client, load_floor};
use flightdeck_harness::RedisServer;
use flightdeck_test::MemoryBackend;
use fred::prelude::*;
use http::Request;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};

const STAGE: &str = "item";
const ROUTE: &str = "/item/{id}";

/// The stage's policy: `mode`, over `backend`; the breaker opens after two
/// failed coordination calls and stays open for the run.
fn stage(mode: Mode, backend: Option<&str>) -> StageConfig {
    let mut cfg = StageConfig::new().mode(mode);
    cfg.backend = backend.map(str::to_owned);
    cfg.breaker.consecutive_failures = Some(2);
    cfg.breaker.wait_in_open = Duration::from_secs(3600);
    cfg
}

/// The layer of one row: one GET route rule, one stage.
fn layer(mode: Mode, backend: Option<(&str, RedisOrMemory)>) -> SingleFlightLayer {
    layer_for(ROUTE, mode, backend)
}

/// The layer with its one rule for `route`.
fn layer_for(route: &str, mode: Mode, backend: Option<(&str, RedisOrMemory)>) -> SingleFlightLayer {
    let keys = HttpKeyExtractor::builder()
        .route(Route::get(route, STAGE))
        .build()
        .expect("key rules");
    let mut b = SingleFlightLayer::builder()
        .keys(keys)
        .stage(STAGE, stage(mode, backend.as_ref().map(|b| b.0)));
    match backend {
        Some((name, RedisOrMemory::Redis(r))) => b = b.backend(name, r),
        Some((name, RedisOrMemory::Memory(m))) => b = b.backend(name, m),
        None => {}
    }
    b.build().expect("layer")
}

enum RedisOrMemory {
    Redis(RedisBackend),
    Memory(MemoryBackend),
}

async fn answer(Path(id): Path<String>) -> String {
    id
}

/// The app: `GET /item/{id}` answers its id at once.
fn app() -> Router {
    Router::new().route(ROUTE, get(answer))
}

/// How often a [`slow_app`]'s handler ran.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicU64>);

impl Runs {
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The realistic case's handler: its work is pending at the first poll and
/// takes a millisecond (1–2 ms: tokio's timer counts whole milliseconds).
async fn slow_answer(State(runs): State<Runs>, Path(id): Path<String>) -> String {
    runs.0.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1)).await;
    id
}

/// The app of the realistic rows: `GET /item/{id}` answers its id after a
/// millisecond of work, counted in `runs`.
fn slow_app(runs: Runs) -> Router {
    Router::new()
        .route(ROUTE, get(slow_answer))
        .with_state(runs)
}

#[derive(Clone)]
struct Floor {
    client: Client,
    sha: String,
}

/// The floor: two trivial `EVALSHA`s, then the answer.
async fn floor(State(f): State<Floor>, Path(id): Path<String>) -> String {
    for _ in 0..2 {
        let _: i64 = f
            .client
            .evalsha(&f.sha, vec!["httpbench:floor"], Vec::<String>::new())
            .await
            .expect("EVALSHA");
    }
    id
}

/// The store floor's first script: what an ACQUIRE of a fresh key asks of
/// Redis (read the flight record's fields, the server's clock, write the
/// lease, set the record's life), without the protocol's decisions.
const STORE_ACQUIRE: &str = "\
local r = redis.call('HMGET', KEYS[1], 'g', 't', 'd', 's', 'b', 'x', 'w', 'rg', 'fu', 'ku', 'ct', 'su', 'wt', 'ra', 'eb', 'eg', 'ec', 'eu')
local tm = redis.call('TIME')
redis.call('HSET', KEYS[1], 'g', tm[1], 't', ARGV[1], 'd', tm[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1";

/// The store floor's second script: what a COMMIT asks of Redis (read the
/// record, the clock, write the result and its times, set the life).
const STORE_COMMIT: &str = "\
local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 's', 'w', 'x', 'rg', 'eu')
local tm = redis.call('TIME')
redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[1], 'rg', tm[1], 'fu', tm[2], 'su', tm[2], 'ku', tm[2], 'ct', tm[2], 'wt', '0', 'x', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1";

/// The store floor: the bare app sending, per request, the two scripts
/// above on a key of its own, one after the other.
#[derive(Clone)]
struct StoreFloor {
    client: Client,
    shas: [String; 2],
}

impl StoreFloor {
    async fn new(client: Client) -> Self {
        let mut shas = [String::new(), String::new()];
        for (sha, src) in shas.iter_mut().zip([STORE_ACQUIRE, STORE_COMMIT]) {
            *sha = client.script_load(src).await.expect("SCRIPT LOAD");
        }
        Self { client, shas }
    }

    fn router(self) -> Router {
        Router::new()
            .route(ROUTE, get(store_floor))
            .with_state(self)
    }
}

async fn store_floor(State(f): State<StoreFloor>, Path(id): Path<String>) -> String {
    let key = format!("httpbench:{{{id}}}");
    for sha in &f.shas {
        let _: i64 = f
            .client
            .evalsha(sha, vec![key.as_str()], vec![id.as_str(), "2200"])
            .await
            .expect("EVALSHA");
    }
    id
}

/// A backend whose calls time out after `timeout` (the in-process rows run
/// under callgrind, some 50 times slower than the wrk rows).
async fn backend(url: String, timeout: Duration) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(url)
            .command_timeout(timeout)
            .connect_timeout(timeout)
            .reconnect_max_delay(Duration::from_millis(500)),
    )
    .await
    .expect("redis")
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("a free loopback port");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// One request through `svc`, its body read to the end.
async fn once<S>(svc: &mut S, path: &str)
where
    S: Service<Request<Body>, Response = axum::response::Response, Error = Infallible>,
{
    let req = Request::get(path).body(Body::empty()).expect("request");
    let resp = svc
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("infallible");
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body().collect().await.expect("body");
}

/// Sends two requests of a fresh key through `svc` so that the dead
/// Redis's two failures open the breaker.
async fn open_breaker(router: &Router, layer: &SingleFlightLayer) {
    for i in 0..2 {
        once(&mut router.clone(), &format!("/item/open-{i}")).await;
    }
    assert!(
        layer.stage(STAGE).expect("stage").is_degraded(),
        "breaker open"
    );
}

/// The rows that need no Redis: the app, and whether its requests share
/// one key. `None` for another row.
fn memory_row(row: &str) -> Option<(Router, bool)> {
    Some(match row {
        "bare" => (app(), false),
        "bare-hot" => (app(), true),
        "local" | "local-hot" => (
            app().layer(layer(Mode::LocalOnly, None)),
            row == "local-hot",
        ),
        // No rule names the app's route: every request passes the layer
        // by (the cost of the layer for the routes it does not coalesce).
        "local-bypass" | "local-bypass-hot" => (
            app().layer(layer_for("/elsewhere/{id}", Mode::LocalOnly, None)),
            row == "local-bypass-hot",
        ),
        "degraded" | "degraded-hot" => {
            // The breaker opened by recorded failures (a timed open, as
            // with Redis down): nothing runs in the background.
            let l = layer(
                Mode::Hybrid,
                Some(("mem", RedisOrMemory::Memory(MemoryBackend::new()))),
            );
            let handle = l.stage(STAGE).expect("stage");
            for _ in 0..2 {
                handle
                    .breaker()
                    .try_acquire()
                    .expect("closed")
                    .record(Outcome::Failure);
            }
            assert!(handle.is_degraded());
            (app().layer(l), row == "degraded-hot")
        }
        _ => return None,
    })
}

/// `HTTP_ROW`: `n` requests in process (see the module docs).
async fn in_process(row: &str, n: u64) {
    // The rows over Redis keep their server (and the layer, to wait for
    // its owners' commits) until the last request's work is done.
    let mut redis = None;
    let mut hybrid = None;
    let (router, hot) = match (memory_row(row), row) {
        (Some(made), _) => made,
        (None, "hybrid" | "floor" | "store-floor") => {
            let server = RedisServer::start().expect("redis-server");
            let url = server.url();
            redis = Some(server);
            if row == "store-floor" {
                (
                    StoreFloor::new(floor_client(&url).await).await.router(),
                    false,
                )
            } else if row == "floor" {
                let client = floor_client(&url).await;
                let sha = load_floor(&client).await;
                let app = Router::new()
                    .route(ROUTE, get(floor))
                    .with_state(Floor { client, sha });
                (app, false)
            } else {
                let l = layer(
                    Mode::Hybrid,
                    Some((
                        "redis",
                        RedisOrMemory::Redis(backend(url, Duration::from_secs(10)).await),
                    )),
                );
                hybrid = Some(l.clone());
                (app().layer(l), false)
            }
        }
        (None, other) => {
            eprintln!(
                "no row {other:?}: bare, bare-hot, local, local-hot, local-bypass, \
                 local-bypass-hot, degraded, degraded-hot, hybrid, floor, store-floor"
            );
            std::process::exit(2);
        }
    };
    // Its routes made once, as `axum::serve` makes them for each
    // connection: called as it is, a `Router<()>` builds each handler's
    // route, the layer's services included, again for every request.
    let router: Router = router.with_state(());
    let mut path = String::with_capacity(32);
    for i in 0..n {
        item(&mut path, hot, i);
        once(&mut router.clone(), &path).await;
    }
    if let Some(l) = hybrid {
        // Every owner's COMMIT sent and answered, and every request went
        // through Redis (a breaker opened by a slow reply would count the
        // local path instead).
        l.idle().await;
        assert!(!l.stage(STAGE).expect("stage").is_degraded(), "Redis up");
    }
    drop(redis);
}

/// Writes request `i`'s path into `path`: its own key, or the hot one.
fn item(path: &mut String, hot: bool, i: u64) {
    path.clear();
    path.push_str("/item/");
    if hot {
        path.push_str("hot");
    } else {
        path.push_str(&i.to_string());
    }
}

/// `HTTP_THREADS`: the row's `n` requests split among `threads` tasks on
/// as many worker threads, each task's requests one after another, in
/// process (no socket, no load generator on the cores): requests per
/// second of wall time. Everything a request touches that other requests
/// touch too (a reference count, a lock, a counter) moves between the
/// cores here, which callgrind's counts do not show. With
/// `HTTP_LAYER_PER_THREAD=1` each task builds its own app and layer, so
/// that nothing of the layer is shared: the difference is what sharing
/// one costs.
async fn in_threads(row: &str, n: u64, threads: u64, per_thread: bool) {
    let Some((router, hot)) = memory_row(row) else {
        eprintln!("no row {row:?} with HTTP_THREADS: the rows without Redis only");
        std::process::exit(2);
    };
    let router: Router = router.with_state(());
    let mut routers = vec![router.clone()];
    for _ in 1..threads {
        routers.push(match memory_row(row).filter(|_| per_thread) {
            Some((own, _)) => own.with_state(()),
            None => router.clone(),
        });
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for (t, router) in (0u64..).zip(routers) {
        tasks.push(tokio::spawn(async move {
            let mut path = String::with_capacity(32);
            for i in 0..n / threads {
                item(&mut path, hot, t * n + i);
                once(&mut router.clone(), &path).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let per_sec = (n / threads * threads) as f64 / started.elapsed().as_secs_f64();
    println!("{row} threads={threads} per_thread={per_thread} {per_sec:.0} req/s");
}

/// wrk's request script for unique keys: every request a new path, per
/// thread and per run (`args[1]`), so that no two requests of the whole
/// bench share a key (a HYBRID row would otherwise hit stored results).
const UNIQUE_LUA: &str = r#"
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function init(args)
  prefix = "/item/" .. args[1] .. "-" .. tid .. "-"
  counter = 0
end
function request()
  counter = counter + 1
  return wrk.format("GET", prefix .. counter)
end
"#;

/// Runs wrk against `addr` for `secs`: requests per second, and the
/// requests answered.
fn wrk(
    addr: SocketAddr,
    unique: bool,
    run: u64,
    secs: u64,
    script: &std::path::Path,
) -> (f64, f64) {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t2", "-c32", &format!("-d{secs}s"), "--latency"]);
    let url = if unique {
        cmd.args(["-s", script.to_str().expect("utf-8 path")]);
        format!("http://{addr}/")
    } else {
        format!("http://{addr}/item/hot")
    };
    cmd.arg(&url);
    if unique {
        cmd.args(["--", &run.to_string()]);
    }
    let out = cmd
        .output()
        .expect("wrk (scripts/http-bench installs it: apt-get install -y wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("Non-2xx") && !text.contains("Socket errors"),
        "wrk saw errors:\n{text}"
    );
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk's output:\n{text}"));
    // "  123456 requests in 5.00s, 15.38MB read"
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no request count in wrk's output:\n{text}"));
    (rps, requests)
}

/// CPU time the Redis server behind `client` has used (`INFO cpu`).
async fn redis_cpu(client: &Client) -> Duration {
    let info: String = client
        .info(Some(fred::types::InfoKind::Cpu))
        .await
        .expect("INFO cpu");
    let secs: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .map(|v| v.trim().parse::<f64>().expect("a CPU time"))
        .sum();
    Duration::from_secs_f64(secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn over_wrk() {
    let rounds: usize = env("HTTP_ROUNDS", 3);
    let secs: u64 = env("HTTP_SECS", 5);
    let redis = RedisServer::start().expect("redis-server");
    let mut down = RedisServer::start().expect("redis-server");

    // A HYBRID layer over the Redis at `url`.
    let over = |name: &'static str, url: String| async move {
        let b = backend(url, Duration::from_millis(200)).await;
        layer(Mode::Hybrid, Some((name, RedisOrMemory::Redis(b))))
    };
    let local = layer(Mode::LocalOnly, None);
    let hybrid = over("redis", redis.url()).await;
    let degraded = over("down", down.url()).await;
    let client = floor_client(&redis.url()).await;
    let sha = load_floor(&client).await;
    down.kill();
    let degraded_app = app().layer(degraded.clone());
    open_breaker(&degraded_app, &degraded).await;

    let store_floor = StoreFloor::new(client.clone()).await.router();
    let runs: [Runs; 3] = Default::default();
    let slow_local = layer(Mode::LocalOnly, None);
    let slow_hybrid = over("redis", redis.url()).await;
    let rows: [(&str, SocketAddr); 9] = [
        ("bare", serve(app()).await),
        ("local", serve(app().layer(local)).await),
        ("hybrid", serve(app().layer(hybrid)).await),
        ("degraded", serve(degraded_app).await),
        (
            "floor",
            serve(Router::new().route(ROUTE, get(floor)).with_state(Floor {
                client: client.clone(),
                sha,
            }))
            .await,
        ),
        ("store floor", serve(store_floor).await),
        ("bare 1ms", serve(slow_app(runs[0].clone())).await),
        (
            "local 1ms",
            serve(slow_app(runs[1].clone()).layer(slow_local)).await,
        ),
        (
            "hybrid 1ms",
            serve(slow_app(runs[2].clone()).layer(slow_hybrid.clone())).await,
        ),
    ];
    // The last rows: the app with a millisecond of work, in `runs`' order.
    let first_slow = rows.len() - runs.len();
    let slow = |i: usize| i.checked_sub(first_slow).map(|j| &runs[j]);
    if std::env::var_os("HTTP_SERVE").is_some() {
        // Serve the rows until killed, for a profiler or a tracer driven
        // from outside (`perf stat -p`, `strace -c -p`, wrk by hand).
        for (name, addr) in &rows {
            println!("{name} http://{addr}/item/");
        }
        std::future::pending::<()>().await;
    }
    let script =
        std::env::temp_dir().join(format!("flightdeck-http-bench-{}.lua", std::process::id()));
    std::fs::write(&script, UNIQUE_LUA).expect("write wrk script");
    println!(
        "wrk -t2 -c32, {secs} s per row, {rounds} rounds, rows alternating; req/s (every row is the same \
         axum app; its handler answers at once, or after 1 ms of work in the rows so named)"
    );
    let mut run = 0u64;
    for unique in [true, false] {
        let kind = if unique { "unique keys" } else { "one hot key" };
        let mut rps = vec![Vec::new(); rows.len()];
        // CPU per request (µs), of this process (the server) and of the
        // Redis server that the HYBRID and floor rows use.
        let mut cpu = vec![(Vec::new(), Vec::new()); rows.len()];
        // Handler runs per request answered, in the rows with work.
        let mut ran = vec![Vec::new(); rows.len()];
        for r in 0..rounds {
            let order: Vec<usize> = if r % 2 == 0 {
                (0..rows.len()).collect()
            } else {
                (0..rows.len()).rev().collect()
            };
            for i in order {
                run += 1;
                let (own, theirs) = (cpu_time(), redis_cpu(&client).await);
                let runs_before = slow(i).map(Runs::get);
                let (v, requests) =
                    tokio::task::block_in_place(|| wrk(rows[i].1, unique, run, secs, &script));
                let per = |d: Duration| d.as_secs_f64() * 1e6 / requests;
                cpu[i].0.push(per(cpu_time() - own));
                cpu[i].1.push(per(redis_cpu(&client).await - theirs));
                if let (Some(r), Some(before)) = (slow(i), runs_before) {
                    // wrk's count leaves out the requests still open when
                    // it stops (at most one per connection).
                    ran[i].push((r.get() - before) as f64 / requests);
                }
                rps[i].push(v);
            }
            let line: Vec<String> = rows
                .iter()
                .zip(&rps)
                .map(|((name, _), v)| format!("{name} {:.0}", v[r]))
                .collect();
            println!("{kind}, round {}: {}", r + 1, line.join(", "));
        }
        let ratio = |a: usize, b: usize| -> Vec<f64> {
            rps[a].iter().zip(&rps[b]).map(|(x, y)| x / y).collect()
        };
        let show = |label: &str, v: Vec<f64>| {
            let each: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
            println!(
                "{kind}: {label} median {:.2}× (rounds: {})",
                median(v),
                each.join(", ")
            );
        };
        show("LOCAL_ONLY / bare", ratio(1, 0));
        show("HYBRID / floor", ratio(2, 4));
        show("HYBRID / store floor", ratio(2, 5));
        show("degraded / LOCAL_ONLY", ratio(3, 1));
        show("HYBRID / LOCAL_ONLY", ratio(2, 1));
        show(
            "LOCAL_ONLY / bare, 1 ms of work",
            ratio(first_slow + 1, first_slow),
        );
        show(
            "HYBRID / bare, 1 ms of work",
            ratio(first_slow + 2, first_slow),
        );
        let each: Vec<String> = (first_slow..rows.len())
            .map(|i| format!("{} {:.3}", rows[i].0, median(ran[i].clone())))
            .collect();
        println!(
            "{kind}: handler runs per request answered (medians): {}",
            each.join(", ")
        );
        let each: Vec<String> = rows
            .iter()
            .zip(&cpu)
            .map(|((name, _), (own, redis))| {
                format!(
                    "{name} {:.1} + {:.1}",
                    median(own.clone()),
                    median(redis.clone())
                )
            })
            .collect();
        println!(
            "{kind}: µs of CPU per request, server + Redis (medians): {}",
            each.join(", ")
        );
    }
    assert!(
        degraded.stage(STAGE).expect("stage").is_degraded(),
        "still degraded"
    );
    assert!(
        !slow_hybrid.stage(STAGE).expect("stage").is_degraded(),
        "the HYBRID row with work ran over Redis"
    );
    let _ = std::fs::remove_file(&script);
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if let Ok(row) = std::env::var("HTTP_ROW") {
        let n: u64 = env("HTTP_ITERS", 10_000);
        let threads: u64 = env("HTTP_THREADS", 0);
        if threads > 0 {
            let per_thread = env("HTTP_LAYER_PER_THREAD", 0) == 1;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads as usize)
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(in_threads(&row, n, threads, per_thread));
            return;
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(in_process(&row, n));
        return;
    }
    // `cargo bench` passes `--bench`; a test build (`cargo test
    // --benches`) runs nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(over_wrk());
}
