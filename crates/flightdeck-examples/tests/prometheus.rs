//! The dashboard and the alerts against a real Prometheus.
//!
//! Two processes run `examples/axum.rs` (this binary, started again as a
//! child: each process has its own global recorder, as real nodes do; the
//! example installs its recorder after building the layer). A real
//! `prometheus` (harness) scrapes both every second and evaluates
//! `deploy/prometheus/alerts.yml` (every `for:` kept, but the BYPASS
//! alert's 5 minutes shortened to 2 s). The test drives known traffic
//! (bursts that share one execution across the nodes), a Redis outage of
//! known length and a stage switched to BYPASS, and checks every
//! expression of `deploy/grafana/flightdeck.json` (Grafana's variables
//! replaced by the test's range) and every alert against what really
//! happened: the requests sent, the model calls the nodes counted, the
//! degraded periods the nodes reported.
//!
//! `harness = false`: `main` is the test, or, with `FLIGHTDECK_PROM_NODE`
//! set, a node.

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod axum_example;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use flightdeck::Mode;
use flightdeck_harness::prometheus::{PrometheusServer, Sample};
use flightdeck_harness::{wait_until, RedisServer};
use http::StatusCode;
use serde_json::Value;

const NODE_ENV: &str = "FLIGHTDECK_PROM_NODE";
const MODEL_LATENCY: Duration = Duration::from_millis(300);
const INTERVAL: Duration = Duration::from_secs(1);
const STAGE: &str = "score";

fn main() {
    match std::env::var(NODE_ENV) {
        Ok(redis_url) => node(redis_url),
        Err(_) => {
            let started = Instant::now();
            test();
            println!(
                "test dashboard_and_alerts_against_a_real_prometheus ... ok ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A child: one node of the example; answers `state` and `bypass` lines
/// on stdin, ends when stdin closes.
fn node(redis_url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        axum_example::init_logging(std::io::stderr);
        let mut opts = axum_example::Options::local(MODEL_LATENCY);
        opts.redis_url = Some(redis_url);
        let node = axum_example::run(opts).await.expect("the node starts");
        let stage = node.flights.stage(STAGE).expect("the score stage");
        println!("listening {}", node.addr);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            match line.trim() {
                "state" => println!(
                    "state {} {} {}",
                    node.model.calls.load(Ordering::SeqCst),
                    u8::from(stage.is_degraded()),
                    stage.degraded_for().map_or(0.0, |d| d.as_secs_f64())
                ),
                "bypass" => {
                    stage.set_mode(Mode::Bypass).expect("BYPASS needs nothing");
                    println!("ok");
                }
                other => println!("unknown {other}"),
            }
        }
    });
}

/// A node process, driven through its stdin and stdout.
struct NodeChild {
    child: Child,
    addr: SocketAddr,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// What a node reports.
#[derive(Debug, Clone, Copy, Default)]
struct State {
    calls: u64,
    degraded: bool,
    degraded_for: f64,
}

impl NodeChild {
    fn start(redis: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env(NODE_ENV, redis)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the node process starts");
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the node's first line");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the node did not start: {line:?}"));
        Self {
            child,
            addr,
            stdin,
            stdout,
        }
    }

    fn command(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("the node reads commands");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the node answers");
        line.trim().to_owned()
    }

    fn state(&mut self) -> State {
        let line = self.command("state");
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.first(), Some(&"state"), "{line}");
        State {
            calls: parts[1].parse().unwrap(),
            degraded: parts[2] == "1",
            degraded_for: parts[3].parse().unwrap(),
        }
    }
}

impl Drop for NodeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The truth, as the nodes report it every 100 ms.
#[derive(Debug, Default)]
struct Truth {
    now: Vec<State>,
    /// Seconds each node spent degraded.
    degraded_secs: Vec<f64>,
    /// Lengths of each node's finished degraded periods.
    periods: Vec<f64>,
}

fn poll_truth(nodes: Arc<Mutex<Vec<NodeChild>>>, truth: Arc<Mutex<Truth>>, stop: Arc<Mutex<bool>>) {
    let mut last = Instant::now();
    let mut prev: Vec<State> = Vec::new();
    while !*stop.lock().unwrap() {
        let states: Vec<State> = nodes
            .lock()
            .unwrap()
            .iter_mut()
            .map(|n| n.state())
            .collect();
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        let mut t = truth.lock().unwrap();
        t.degraded_secs.resize(states.len(), 0.0);
        for (i, s) in states.iter().enumerate() {
            let was = prev.get(i).copied().unwrap_or_default();
            if s.degraded && was.degraded {
                t.degraded_secs[i] += dt;
            } else if s.degraded {
                t.degraded_secs[i] += s.degraded_for.min(dt);
            } else if was.degraded {
                // Ended between two polls: count up to the end of the
                // period as last seen.
                t.degraded_secs[i] += dt / 2.0;
                t.periods.push(was.degraded_for + dt / 2.0);
            }
        }
        t.now = states.clone();
        prev = states;
        drop(t);
        std::thread::sleep(Duration::from_millis(100));
    }
}

type HttpClient = axum_example::HttpClient;

/// Sends one request per node, all at once, `per_node` times each, for
/// `answer`; returns how many were sent (every one must succeed).
async fn burst(client: &HttpClient, addrs: &[SocketAddr], per_node: usize, answer: &str) -> u64 {
    let barrier = Arc::new(tokio::sync::Barrier::new(per_node * addrs.len()));
    let mut tasks = Vec::new();
    for &addr in addrs {
        for _ in 0..per_node {
            let (client, barrier, answer) = (client.clone(), barrier.clone(), answer.to_owned());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                axum_example::score_once(&client, addr, &answer).await
            }));
        }
    }
    for t in &mut tasks {
        let (status, body) = t.await.unwrap().expect("the request completes");
        assert_eq!(status, StatusCode::OK, "{body:?}");
    }
    tasks.len() as u64
}

fn one(prom: &PrometheusServer, expr: &str) -> f64 {
    let samples = prom.query(expr).unwrap();
    assert_eq!(samples.len(), 1, "{expr}: {samples:?}");
    samples[0].value
}

fn values(prom: &PrometheusServer, expr: &str) -> Vec<Sample> {
    prom.query(expr).unwrap()
}

fn firing(prom: &PrometheusServer, name: &str) -> bool {
    prom.alerts()
        .unwrap()
        .iter()
        .any(|a| a.name == name && a.state == "firing")
}

fn close(what: &str, got: f64, want: f64, tolerance: f64) {
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: Prometheus says {got}, the truth is {want} (± {tolerance})"
    );
}

/// The dashboard's expressions: (panel title, expr) for every target.
fn panels() -> Vec<(String, String)> {
    let d: Value =
        serde_json::from_str(include_str!("../../../deploy/grafana/flightdeck.json")).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap().to_owned(),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// Grafana's variables, for a range of `range_s` seconds ending now.
fn grafana(expr: &str, range_s: u64) -> String {
    expr.replace("$__rate_interval", &format!("{range_s}s"))
        .replace("$__range_s", &range_s.to_string())
        .replace("$__range", &format!("{range_s}s"))
        .replace("$stage", STAGE)
}

fn expr_of(panels: &[(String, String)], title: &str, nth: usize) -> String {
    panels
        .iter()
        .filter(|(t, _)| t == title)
        .nth(nth)
        .unwrap_or_else(|| {
            panic!(
                "the dashboard has a panel {title:?} with {} targets",
                nth + 1
            )
        })
        .1
        .clone()
}

fn test() {
    let mut redis = RedisServer::start().unwrap();
    let nodes: Vec<NodeChild> = (0..2).map(|_| NodeChild::start(&redis.url())).collect();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let nodes = Arc::new(Mutex::new(nodes));
    let alerts = include_str!("../../../deploy/prometheus/alerts.yml");
    assert!(
        alerts.contains("for: 5m"),
        "the BYPASS alert waits 5 minutes"
    );
    let rules = alerts.replace("for: 5m", "for: 2s");
    // Every range below starts here: before Prometheus's first scrape, so
    // every counter's first sample in it is its zero.
    let t0 = Instant::now();
    let prom = PrometheusServer::start(&addrs, &rules, INTERVAL).unwrap();
    let dashboard = panels();
    let n_panels = dashboard.len();
    let checked = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let check = |title: &str, nth: usize, range_s: u64| -> String {
        checked.borrow_mut().insert((title.to_owned(), nth));
        grafana(&expr_of(&dashboard, title, nth), range_s)
    };

    // Before any request, both nodes export their stage (the example
    // installs its recorder after building the layer).
    wait_until(
        "both nodes scraped with their stage's gauges",
        Duration::from_secs(15),
        || {
            let n = |q: &str| values(&prom, q).len();
            n("singleflight_mode{stage=\"score\"} == 2") == 2
                && n("singleflight_degraded{stage=\"score\"} == 0") == 2
                && n("singleflight_active_flights{stage=\"score\"} == 0") == 2
                && n("singleflight_circuit_state{breaker=\"score\"} == 0") == 2
                && n("singleflight_request_total{stage=\"score\"} == 0") == 2
                && n("singleflight_execution_total{stage=\"score\"}") == 8
        },
    );
    let truth = Arc::new(Mutex::new(Truth::default()));
    let stop = Arc::new(Mutex::new(false));
    let poller = {
        let (nodes, truth, stop) = (nodes.clone(), truth.clone(), stop.clone());
        std::thread::spawn(move || poll_truth(nodes, truth, stop))
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<Body>();
    let mut sent = 0u64;

    // 1. Redis up: bursts shared across the nodes.
    rt.block_on(async {
        for j in 0..5 {
            sent += burst(&client, &addrs, 8, &format!("shared answer {j}")).await;
        }
    });
    let calls = |t: &Truth| t.now.iter().map(|s| s.calls).sum::<u64>();
    wait_until("the nodes report", Duration::from_secs(5), || {
        truth.lock().unwrap().now.len() == 2
    });
    std::thread::sleep(Duration::from_millis(300));
    let shared_calls = calls(&truth.lock().unwrap());
    assert!(
        shared_calls <= 6,
        "5 bursts, about one model call each: {shared_calls}"
    );

    // 2. A Redis outage: requests run locally, the breakers open, the
    // alert fires; Redis comes back, the breakers close, the alert
    // resolves.
    // The "current degraded period" panel measures from the last 5 s step
    // at which a stage was seen not degraded: wait until Prometheus has
    // such a step, however short the phase before was on this machine.
    wait_until(
        "Prometheus saw the stage not degraded at a 5 s step",
        Duration::from_secs(20),
        || {
            !values(
                &prom,
                r#"max by (stage) (max_over_time(timestamp(singleflight_degraded{stage=~"score"} == 0)[12h:5s]))"#,
            )
            .is_empty()
        },
    );
    redis.kill();
    let outage = Instant::now();
    let traffic_stop = Arc::new(Mutex::new(false));
    let traffic = {
        let (client, addrs, stop) = (client.clone(), addrs.clone(), traffic_stop.clone());
        rt.spawn(async move {
            let mut sent = 0u64;
            let mut i = 0;
            while !*stop.lock().unwrap() {
                sent += burst(&client, &addrs, 1, &format!("outage answer {i}")).await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sent
        })
    };
    wait_until("both nodes degraded", Duration::from_secs(15), || {
        let t = truth.lock().unwrap();
        t.now.iter().all(|s| s.degraded)
    });
    wait_until(
        "FlightdeckStageDegraded fires",
        Duration::from_secs(5),
        || firing(&prom, "FlightdeckStageDegraded"),
    );
    std::thread::sleep(INTERVAL * 2);
    let range = || t0.elapsed().as_secs_f64().ceil() as u64 + INTERVAL.as_secs();
    {
        let since = truth
            .lock()
            .unwrap()
            .now
            .iter()
            .map(|s| s.degraded_for)
            .fold(f64::INFINITY, f64::min);
        let got = one(&prom, &check("Current degraded period", 0, range()));
        let i = INTERVAL.as_secs_f64();
        assert!(
            got >= since - 2.0 * i && got <= since + 5.0 + 2.0 * i,
            "current degraded period: {got} s, the nodes say {since} s"
        );
    }
    assert_eq!(one(&prom, &check("Stages degraded now", 0, range())), 1.0);
    assert_eq!(one(&prom, &check("Degraded stages", 0, range())), 1.0);
    assert!(
        one(&prom, &check("Breaker state", 0, range())) >= 1.0,
        "open or probing"
    );
    assert!(
        !firing(&prom, "FlightdeckStageDegradedLong"),
        "not for 10 minutes"
    );
    // The outage lasts 10 s in all.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed()));
    redis.restart().unwrap();
    wait_until("both nodes recover", Duration::from_secs(30), || {
        let t = truth.lock().unwrap();
        t.now.iter().all(|s| !s.degraded) && t.periods.len() >= 2
    });
    *traffic_stop.lock().unwrap() = true;
    sent += rt.block_on(traffic).unwrap();
    wait_until(
        "FlightdeckStageDegraded resolves",
        Duration::from_secs(5),
        || !firing(&prom, "FlightdeckStageDegraded"),
    );
    assert_eq!(one(&prom, &check("Stages degraded now", 0, range())), 0.0);
    assert!(values(&prom, &check("Current degraded period", 0, range())).is_empty());

    // 3. The kill switch: one node's stage in BYPASS; every request runs
    // the model.
    assert_eq!(nodes.lock().unwrap()[0].command("bypass"), "ok");
    rt.block_on(async {
        for _ in 0..3 {
            let (status, _) = axum_example::score_once(&client, addrs[0], "bypassed answer")
                .await
                .unwrap();
            assert_eq!(status, StatusCode::OK);
            sent += 1;
        }
    });
    wait_until(
        "FlightdeckStageBypassed fires",
        Duration::from_secs(10),
        || firing(&prom, "FlightdeckStageBypassed"),
    );

    // Everything scraped: the raw counters equal the truth exactly.
    std::thread::sleep(Duration::from_millis(300));
    *stop.lock().unwrap() = true;
    poller.join().unwrap();
    let truth = std::mem::take(&mut *truth.lock().unwrap());
    let executions = calls(&truth) as f64;
    let requests = sent as f64;
    wait_until("the last requests scraped", Duration::from_secs(5), || {
        one(&prom, "sum(singleflight_request_total)") == requests
            && one(&prom, "sum(singleflight_execution_total)") == executions
    });
    std::thread::sleep(INTERVAL);
    assert_eq!(
        one(&prom, "sum(singleflight_execution_duration_count)"),
        executions,
        "one execution-time sample per model call"
    );
    assert_eq!(
        one(&prom, "sum(singleflight_execution_total{path=\"bypass\"})"),
        3.0
    );
    let raw = |expr: &str| one(&prom, expr);
    let fallbacks = raw("sum(singleflight_local_fallback_total)");
    assert!(fallbacks > 0.0);
    assert_eq!(
        raw("sum(singleflight_execution_total{path=\"fallback\"})"),
        fallbacks
    );
    assert_eq!(raw("sum(singleflight_fail_fast_total)"), 0.0);

    // Every panel, over the test's range (a counter's `increase` may
    // extrapolate by up to one scrape interval of the range).
    let r = range();
    let rel = 1.0 + 1.5 * INTERVAL.as_secs_f64() / r as f64;
    let within = |what: &str, got: f64, want: f64| close(what, got, want, want * (rel - 1.0) + 0.5);
    within("Requests", one(&prom, &check("Requests", 0, r)), requests);
    within(
        "Executions saved",
        one(&prom, &check("Executions saved", 0, r)),
        requests - executions,
    );
    let ratio = 1.0 - executions / requests;
    close(
        "Merge ratio",
        one(&prom, &check("Merge ratio", 0, r)),
        ratio,
        0.02,
    );
    close(
        "Merge ratio by stage",
        one(&prom, &check("Merge ratio by stage", 0, r)),
        ratio,
        0.02,
    );
    within(
        "Requests vs executions: requests",
        one(&prom, &check("Requests vs executions", 0, r)) * r as f64,
        requests,
    );
    let by_path = values(&prom, &check("Requests vs executions", 1, r));
    within(
        "Requests vs executions: executions",
        by_path.iter().map(|s| s.value).sum::<f64>() * r as f64,
        executions,
    );
    assert!(by_path.iter().any(|s| s.label("path") == Some("owner")));

    let degraded_truth = truth.degraded_secs.iter().copied().fold(0.0, f64::max);
    close(
        "Time degraded",
        one(&prom, &check("Time degraded", 0, r)),
        degraded_truth,
        2.0 * INTERVAL.as_secs_f64() + degraded_truth * (rel - 1.0) + 0.5,
    );
    let p95 = one(&prom, &check("Time degraded", 1, r));
    let longest = truth.periods.iter().copied().fold(0.0, f64::max);
    let shortest = truth.periods.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        p95.is_finite() && p95 <= bucket_above(longest) && p95 >= bucket_below(shortest),
        "p95 degraded period {p95} s; periods {:?}",
        truth.periods
    );
    assert_eq!(
        one(&prom, &check("Breaker state", 0, r)),
        0.0,
        "closed again"
    );
    assert_eq!(one(&prom, &check("Degraded stages", 0, r)), 0.0);

    let rated = |title: &str, nth: usize| -> f64 {
        values(&prom, &check(title, nth, r))
            .iter()
            .map(|s| s.value)
            .sum::<f64>()
            * r as f64
    };
    within("fallbacks", rated("Fallbacks and failures", 0), fallbacks);
    assert_eq!(
        rated("Fallbacks and failures", 1),
        0.0,
        "no fail fast in HYBRID"
    );
    assert_eq!(rated("Fallbacks and failures", 2), 0.0, "no wait timeout");
    within(
        "result-write failures",
        rated("Fallbacks and failures", 3),
        raw("sum(singleflight_result_write_failure_total)"),
    );
    assert_eq!(rated("Fallbacks and failures", 4), 0.0, "no protocol error");
    assert_eq!(
        rated("Fallbacks and failures", 5),
        0.0,
        "every score is shareable"
    );
    assert_eq!(raw("sum(singleflight_local_unshared_total)"), 0.0);

    // Latencies: the model takes 300 ms (bucket 0.25..0.5 s); waiters wait
    // about as long.
    for (nth, q) in [(0, "p50"), (1, "p95"), (2, "p99")] {
        let got = one(&prom, &check("Execution latency", nth, r));
        assert!(
            (0.25..=0.5).contains(&got),
            "execution latency {q}: {got} s"
        );
        let got = one(&prom, &check("Wait latency", nth, r));
        assert!(got > 0.0 && got <= 1.0, "wait latency {q}: {got} s");
    }
    let waits = raw("sum(singleflight_wait_duration_count)");
    let inf = values(&prom, &check("Wait latency distribution", 0, r))
        .into_iter()
        .find(|s| s.label("le") == Some("+Inf"))
        .expect("a +Inf bucket")
        .value;
    within("Wait latency distribution", inf * r as f64, waits);

    assert_eq!(one(&prom, &check("Active flights and roles", 0, r)), 0.0);
    for (nth, metric) in [(1, "owner"), (2, "follower"), (3, "hit"), (4, "takeover")] {
        within(
            metric,
            rated("Active flights and roles", nth),
            raw(&format!("sum(singleflight_{metric}_total)")),
        );
    }
    assert!(raw("sum(singleflight_follower_total) + sum(singleflight_hit_total)") >= 1.0);

    // The example's stage keeps no stale results (its windows are
    // commented out): the stale panels' queries run and find nothing.
    for (title, nth) in [
        ("Served stale", 0),
        ("Stale age", 0),
        ("Stale age", 1),
        ("Refreshes and hit-for-pass", 0),
        ("Refreshes and hit-for-pass", 1),
    ] {
        let got = values(&prom, &check(title, nth, r));
        assert!(
            got.iter().all(|s| s.value == 0.0 || s.value.is_nan()),
            "{title}: {got:?}"
        );
    }
    assert_eq!(
        raw("sum(singleflight_stale_served_total) or vector(0)"),
        0.0
    );

    // The alerts: fallbacks before the breakers opened alert; nothing
    // else happened.
    assert!(firing(&prom, "FlightdeckLocalFallback"));
    assert!(firing(&prom, "FlightdeckStageBypassed"));
    for quiet in [
        "FlightdeckStageDegraded",
        "FlightdeckStageDegradedLong",
        "FlightdeckWaitTimeouts",
        "FlightdeckProtocolErrors",
        "FlightdeckFailingFast",
        "FlightdeckStageServingStale",
    ] {
        assert!(!firing(&prom, quiet), "{quiet} fired");
    }
    assert_eq!(
        firing(&prom, "FlightdeckResultWriteFailures"),
        raw("sum(singleflight_result_write_failure_total)") > 0.0
    );
    assert_eq!(
        firing(&prom, "FlightdeckResultsLost"),
        raw("sum(singleflight_result_lost_total)") > 0.0
    );
    let every_alert: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect();
    assert_eq!(every_alert.len(), 10, "{every_alert:?}");

    let checked = checked.into_inner();
    assert_eq!(
        checked.len(),
        n_panels,
        "every target of every panel is checked: {checked:?}"
    );
}

/// The example's histogram buckets (seconds).
const BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

fn bucket_above(v: f64) -> f64 {
    BUCKETS
        .iter()
        .copied()
        .find(|b| *b >= v)
        .unwrap_or(f64::INFINITY)
}

fn bucket_below(v: f64) -> f64 {
    BUCKETS
        .iter()
        .copied()
        .rev()
        .find(|b| *b < v)
        .unwrap_or(0.0)
}
