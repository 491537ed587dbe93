//! Load generator: N nodes × C concurrent callers × K keys (hot-key skew)
//! for D seconds against a Redis, through `GenericSingleFlightLayer` in HYBRID
//! mode; prints a summary table and writes an SVG report.
//!
//! Each node is a full flightdeck stack (L1, L2 over its own Redis
//! connection, breaker, bulkhead) in front of a simulated model that takes
//! `--latency` ms. Callers pick keys from a Zipf distribution (`--skew`),
//! so a few keys are hot. Results are replayed for `--result-ttl` (a cache
//! entry expiring under load). With `--fault`, Redis is frozen for
//! `--fault-for` seconds in the middle of the run (SIGSTOP when the
//! generator started the server, `CLIENT PAUSE` for an external one): the
//! report shows the stages falling back to local single-flight and
//! recovering.
//!
//! Uses `REDIS_URL` when set, else starts a `redis-server` on a free port
//! (flightdeck-harness).
//!
//! ```text
//! cargo run --release -p flightdeck-examples --example loadgen -- --fault
//! cargo run --release -p flightdeck-examples --example loadgen -- --nodes 4 --concurrency 64 --keys 1000 --duration 30 --out report.svg
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck::core::error::ErrorClass;
use flightdeck::core::{BoxError, CloneShare, KeyEncoder, StageName};
use flightdeck::distributed::{FencingToken, PostcardCodec};
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use plotters::prelude::*;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};

/// Command-line settings.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) nodes: usize,
    pub(crate) concurrency: usize,
    pub(crate) keys: usize,
    pub(crate) skew: f64,
    pub(crate) duration: u64,
    pub(crate) latency_ms: u64,
    pub(crate) result_ttl_ms: u64,
    pub(crate) fault: bool,
    pub(crate) fault_at: u64,
    pub(crate) fault_for: u64,
    pub(crate) out: String,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            nodes: 3,
            concurrency: 32,
            keys: 500,
            skew: 1.1,
            duration: 20,
            latency_ms: 100,
            result_ttl_ms: 2000,
            fault: false,
            fault_at: 8,
            fault_for: 3,
            out: "target/loadgen-report.svg".to_owned(),
        }
    }
}

const USAGE: &str = "usage: loadgen [--nodes N] [--concurrency C] [--keys K] [--skew S] \
[--duration SECS] [--latency MS] [--result-ttl MS] [--fault] [--fault-at SECS] [--fault-for SECS] [--out FILE.svg]";

fn parse_args() -> Result<Args, BoxError> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--fault" {
            a.fault = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}\n{USAGE}");
        match flag.as_str() {
            "--nodes" => a.nodes = value.parse().map_err(|e| bad(&e))?,
            "--concurrency" => a.concurrency = value.parse().map_err(|e| bad(&e))?,
            "--keys" => a.keys = value.parse().map_err(|e| bad(&e))?,
            "--skew" => a.skew = value.parse().map_err(|e| bad(&e))?,
            "--duration" => a.duration = value.parse().map_err(|e| bad(&e))?,
            "--latency" => a.latency_ms = value.parse().map_err(|e| bad(&e))?,
            "--result-ttl" => a.result_ttl_ms = value.parse().map_err(|e| bad(&e))?,
            "--fault-at" => a.fault_at = value.parse().map_err(|e| bad(&e))?,
            "--fault-for" => a.fault_for = value.parse().map_err(|e| bad(&e))?,
            "--out" => a.out = value,
            _ => return Err(format!("unknown option {flag}\n{USAGE}").into()),
        }
    }
    if a.nodes == 0 || a.concurrency == 0 || a.keys == 0 || a.duration == 0 {
        return Err(
            format!("nodes, concurrency, keys and duration must be positive\n{USAGE}").into(),
        );
    }
    if a.fault && a.fault_at + a.fault_for >= a.duration {
        return Err(
            "the fault must end before the run does (--fault-at + --fault-for < --duration)".into(),
        );
    }
    Ok(a)
}

/// One request: which key, who sent it, and (for owners of a distributed
/// flight) the fencing token.
#[derive(Debug)]
struct Req {
    key: u32,
    node: u32,
    id: u64,
    token: Option<FencingToken>,
}

/// How a caller got its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// Its own request ran the model.
    Executed,
    /// Shared an execution of its own node (local waiter, or local replay).
    LocalFollower,
    /// Got another node's result through Redis (follower or stored hit).
    RemoteFollower,
    /// An error.
    Error,
}

impl Role {
    const ALL: [Role; 4] = [
        Role::Executed,
        Role::LocalFollower,
        Role::RemoteFollower,
        Role::Error,
    ];
    fn name(self) -> &'static str {
        match self {
            Role::Executed => "executed (leader)",
            Role::LocalFollower => "follower, same node",
            Role::RemoteFollower => "follower via Redis",
            Role::Error => "error",
        }
    }
}

/// What one caller saw in one second of the run.
struct Second {
    latency: Histogram<u64>,
    roles: [u64; 4],
}

impl Second {
    fn new() -> Self {
        Self {
            latency: Histogram::new_with_bounds(1, 120_000_000, 2).expect("valid bounds"),
            roles: [0; 4],
        }
    }
}

/// What every caller of the run saw, merged.
struct Totals {
    by_role: BTreeMap<Role, Histogram<u64>>,
    seconds: Vec<Second>,
    errors: BTreeMap<String, u64>,
}

/// Executions of the model, per second of the run, by kind.
struct Executions {
    coordinated: Vec<AtomicU64>,
    local: Vec<AtomicU64>,
}

/// A Zipf(s) sampler over `n` keys.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }
    fn sample(&self, u: f64) -> u32 {
        self.cdf.partition_point(|c| *c < u).min(self.cdf.len() - 1) as u32
    }
}

/// xorshift64*: enough randomness for key choice, no dependency.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The Redis the run uses: ours (started here) or the one in `REDIS_URL`.
enum Target {
    Own(RedisServer),
    External { url: String, addr: String },
}

impl Target {
    fn url(&self) -> String {
        match self {
            Target::Own(s) => s.url(),
            Target::External { url, .. } => url.clone(),
        }
    }
    fn cmd(&self, args: &[&str]) -> Result<String, BoxError> {
        match self {
            Target::Own(s) => Ok(format!("{:?}", s.cmd(args)?)),
            Target::External { addr, .. } => resp_command(addr, args),
        }
    }
    /// Sum of `calls` over `INFO commandstats`, per command.
    fn command_stats(&self) -> Result<BTreeMap<String, u64>, BoxError> {
        let text = match self {
            Target::Own(s) => s
                .cmd(&["INFO", "commandstats"])?
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            Target::External { addr, .. } => resp_command(addr, &["INFO", "commandstats"])?,
        };
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some((name, stats)) = line
                .strip_prefix("cmdstat_")
                .and_then(|r| r.split_once(':'))
            else {
                continue;
            };
            if let Some(calls) = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
            {
                out.insert(name.to_owned(), calls);
            }
        }
        Ok(out)
    }
    fn freeze(&mut self, secs: u64) -> Result<&'static str, BoxError> {
        match self {
            Target::Own(s) => {
                s.pause()?;
                Ok("SIGSTOP")
            }
            Target::External { .. } => {
                self.cmd(&["CLIENT", "PAUSE", &(secs * 1000).to_string(), "ALL"])?;
                Ok("CLIENT PAUSE")
            }
        }
    }
    fn thaw(&mut self) -> Result<(), BoxError> {
        if let Target::Own(s) = self {
            s.resume()?;
        }
        Ok(())
    }
}

/// One command to an external Redis over RESP2 (bulk or simple replies).
fn resp_command(addr: &str, args: &[&str]) -> Result<String, BoxError> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    (&stream).write_all(out.as_bytes())?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line)?;
    match line.as_bytes().first() {
        Some(b'$') => {
            let n: usize = line[1..].trim().parse()?;
            let mut buf = vec![0; n + 2];
            std::io::Read::read_exact(&mut r, &mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        }
        Some(b'-') => Err(format!("redis: {}", line.trim()).into()),
        _ => Ok(line.trim().to_owned()),
    }
}

fn redis_target() -> Result<Target, BoxError> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let rest = url
                .strip_prefix("redis://")
                .ok_or("REDIS_URL must look like redis://host:port")?;
            let addr = rest.split('/').next().unwrap_or(rest).to_owned();
            Ok(Target::External { url, addr })
        }
        Err(_) => Ok(Target::Own(RedisServer::start()?)),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let s = run(parse_args()?).await?;
    // One machine-readable line, like the quickstart's.
    println!(
        "requests={} executions={} errors={}",
        s.requests, s.executions, s.errors
    );
    Ok(())
}

/// What a run measured (the table has more).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    /// Requests sent.
    pub(crate) requests: u64,
    /// Model executions, all kinds.
    pub(crate) executions: u64,
    /// Requests that ended in an error.
    pub(crate) errors: u64,
}

/// Runs the load, prints the table, writes the SVG.
pub(crate) async fn run(args: Args) -> Result<Summary, BoxError> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Another recorder may be installed (a test binary): the flightdeck
    // counters of the table then read 0.
    let _ = recorder.install();

    let mut redis = redis_target()?;
    let url = redis.url();

    // The stage: HYBRID over Redis, short lease and result TTL so keys
    // expire (and are recomputed) during the run.
    let mut cfg = StageConfig::new().mode(Mode::Hybrid).backend("redis");
    cfg.lease_timeout = Duration::from_secs(3);
    cfg.heartbeat_interval = Duration::from_secs(1);
    cfg.wait_timeout = Duration::from_secs(4);
    cfg.poll_interval = Duration::from_millis(100);
    cfg.result_ttl = Duration::from_millis(args.result_ttl_ms.max(200));
    cfg.breaker.consecutive_failures = Some(5);
    cfg.breaker.wait_in_open = Duration::from_secs(1);
    cfg.bulkhead.limit = 4096;

    let duration = Duration::from_secs(args.duration);
    let seconds = args.duration as usize + 1;
    let execs = Arc::new(Executions {
        coordinated: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
        local: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
    });
    let stage = StageName::new("work")?;
    let started = Instant::now();
    let latency = Duration::from_millis(args.latency_ms);

    let mut nodes = Vec::new();
    let mut layers = Vec::new();
    for _ in 0..args.nodes {
        let stage = stage.clone();
        let layer = GenericSingleFlightLayer::builder(
            move |r: &Req| {
                Some(
                    KeyEncoder::new()
                        .field(&r.key.to_le_bytes())
                        .finish_key(stage.clone(), None),
                )
            },
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
        )
        .fence(|r: &mut Req, t: FencingToken| r.token = Some(t))
        .backend(
            "redis",
            RedisBackend::connect(RedisConfig::new(url.clone())).await?,
        )
        .stage("work", cfg.clone())
        .build()?;
        let execs = execs.clone();
        let svc = layer.layer(service_fn(move |r: Req| {
            let execs = execs.clone();
            async move {
                let sec = (started.elapsed().as_secs() as usize).min(execs.local.len() - 1);
                // The owner of a distributed flight carries its fencing
                // token; a local fallback (or LOCAL_ONLY) does not.
                let kind = if r.token.is_some() {
                    &execs.coordinated
                } else {
                    &execs.local
                };
                kind[sec].fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(latency).await;
                Ok::<_, std::convert::Infallible>(format!("{}:{}:{}", r.node, r.id, r.key))
            }
        }));
        nodes.push(svc);
        layers.push(layer);
    }
    let before = redis.command_stats()?;

    // Progress.
    let bar = ProgressBar::new(args.duration);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len}s {msg}")
            .expect("valid template"),
    );
    let sent = Arc::new(AtomicU64::new(0));
    let degraded: Arc<Mutex<Vec<bool>>> = Arc::new(Mutex::new(vec![false; seconds]));

    // Callers.
    let zipf = Arc::new(Zipf::new(args.keys, args.skew));
    let mut callers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for c in 0..args.concurrency {
            let (node, zipf, sent) = (node.clone(), zipf.clone(), sent.clone());
            let seed = 0x9e37_79b9_7f4a_7c15 ^ ((n as u64) << 32 | c as u64);
            callers.push(tokio::spawn(async move {
                let mut rng = Rng(seed | 1);
                let mut secs: Vec<Second> = (0..seconds).map(|_| Second::new()).collect();
                let mut by_role: BTreeMap<Role, Histogram<u64>> = BTreeMap::new();
                let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                let mut id = (n as u64) << 48 | (c as u64) << 32;
                while started.elapsed() < duration {
                    id += 1;
                    let key = zipf.sample(rng.next_f64());
                    let t0 = Instant::now();
                    let req = Req {
                        key,
                        node: n as u32,
                        id,
                        token: None,
                    };
                    let res = node.clone().oneshot(req).await;
                    let us = t0.elapsed().as_micros().max(1) as u64;
                    let role = match &res {
                        Ok(v) => {
                            let mut parts = v.split(':');
                            let from_node: u32 = parts
                                .next()
                                .and_then(|p| p.parse().ok())
                                .unwrap_or(u32::MAX);
                            let from_id: u64 =
                                parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                            if from_id == id {
                                Role::Executed
                            } else if from_node == n as u32 {
                                Role::LocalFollower
                            } else {
                                Role::RemoteFollower
                            }
                        }
                        Err(e) => {
                            *errors
                                .entry(format!("{:?}", ErrorClass::of(&**e)))
                                .or_default() += 1;
                            // Do not spin on instant failures.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            Role::Error
                        }
                    };
                    let sec = (t0.duration_since(started).as_secs() as usize).min(seconds - 1);
                    let s = &mut secs[sec];
                    s.latency.saturating_record(us);
                    s.roles[role as usize] += 1;
                    by_role
                        .entry(role)
                        .or_insert_with(|| {
                            Histogram::new_with_bounds(1, 120_000_000, 2).expect("valid bounds")
                        })
                        .saturating_record(us);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                (secs, by_role, errors)
            }));
        }
    }

    // The fault, the degraded-state sampler and the progress bar.
    let fault_window = args
        .fault
        .then(|| (args.fault_at, args.fault_at + args.fault_for));
    let mut fault_how = "";
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut frozen = false;
    while started.elapsed() < duration {
        tick.tick().await;
        let now = started.elapsed();
        let sec = (now.as_secs() as usize).min(seconds - 1);
        if layers
            .iter()
            .any(|l| l.stage("work").is_some_and(|s| s.is_degraded()))
        {
            degraded.lock().expect("not poisoned")[sec] = true;
        }
        if let Some((from, to)) = fault_window {
            if !frozen && now >= Duration::from_secs(from) && now < Duration::from_secs(to) {
                fault_how = redis.freeze(to - from)?;
                frozen = true;
            } else if frozen && now >= Duration::from_secs(to) {
                redis.thaw()?;
                frozen = false;
            }
        }
        let executed: u64 = execs
            .coordinated
            .iter()
            .chain(execs.local.iter())
            .map(|a| a.load(Ordering::Relaxed))
            .sum();
        let n = sent.load(Ordering::Relaxed);
        bar.set_position(now.as_secs().min(args.duration));
        bar.set_message(format!(
            "requests {n}, executions {executed}{}",
            if frozen { ", REDIS FROZEN" } else { "" }
        ));
    }
    if frozen {
        redis.thaw()?;
    }
    bar.finish_and_clear();

    let mut totals = Totals {
        by_role: BTreeMap::new(),
        seconds: (0..seconds).map(|_| Second::new()).collect(),
        errors: BTreeMap::new(),
    };
    for c in callers {
        // Callers finish their last request; bounded by the wait timeout.
        let (secs, by_role, errors) = tokio::time::timeout(Duration::from_secs(30), c).await??;
        for (t, s) in totals.seconds.iter_mut().zip(secs) {
            t.latency.add(&s.latency)?;
            for (a, b) in t.roles.iter_mut().zip(s.roles) {
                *a += b;
            }
        }
        for (role, h) in by_role {
            totals
                .by_role
                .entry(role)
                .or_insert_with(|| {
                    Histogram::new_with_bounds(1, 120_000_000, 2).expect("valid bounds")
                })
                .add(&h)?;
        }
        for (k, v) in errors {
            *totals.errors.entry(k).or_default() += v;
        }
    }
    let after = redis.command_stats()?;

    // Counters recorded by flightdeck itself.
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(v) = value {
            let mut name = key.key().name().to_owned();
            if let Some(reason) = key.key().labels().find(|l| l.key() == "reason") {
                name = format!("{name}{{{}}}", reason.value());
            }
            *counters.entry(name).or_default() += v;
        }
    }

    let degraded = degraded.lock().expect("not poisoned").clone();
    report(
        &args,
        &totals,
        &execs,
        &before,
        &after,
        &counters,
        fault_window,
        fault_how,
        &degraded,
    )
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    t: &Totals,
    execs: &Executions,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    counters: &BTreeMap<String, u64>,
    fault: Option<(u64, u64)>,
    fault_how: &str,
    degraded: &[bool],
) -> Result<Summary, BoxError> {
    let count = |r: Role| t.by_role.get(&r).map_or(0, |h| h.len());
    let requests: u64 = Role::ALL.iter().map(|r| count(*r)).sum();
    let answered = requests - count(Role::Error);
    let coordinated: u64 = execs
        .coordinated
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum();
    let local: u64 = execs.local.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    let executions = coordinated + local;
    let followers = count(Role::LocalFollower) + count(Role::RemoteFollower);
    let commands: BTreeMap<&str, u64> = after
        .iter()
        .map(|(k, v)| (k.as_str(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .filter(|(k, v)| *v > 0 && *k != "info")
        .collect();
    let total_cmds: u64 = commands.values().sum();
    let per_req = |n: u64| n as f64 / requests.max(1) as f64;

    println!(
        "flightdeck loadgen: {} nodes × {} callers × {} keys (Zipf s={}), {} s, model {} ms, result TTL {} ms, HYBRID{}",
        args.nodes,
        args.concurrency,
        args.keys,
        args.skew,
        args.duration,
        args.latency_ms,
        args.result_ttl_ms,
        match fault {
            Some((a, b)) => format!(", Redis frozen ({fault_how}) from {a} s to {b} s"),
            None => String::new(),
        }
    );
    println!();
    println!("| metric | value |");
    println!("|---|---|");
    println!("| requests | {requests} |");
    println!(
        "| executions (model calls) | {executions} ({coordinated} as Redis owner, {local} local: fallback while degraded) |"
    );
    println!(
        "| merge ratio (followers / requests) | {:.1} % |",
        100.0 * followers as f64 / requests.max(1) as f64
    );
    println!(
        "| executions saved (requests − executions) | {} |",
        answered.saturating_sub(executions.min(answered))
    );
    let errs: Vec<String> = t.errors.iter().map(|(k, v)| format!("{v} {k}")).collect();
    if errs.is_empty() {
        println!("| errors | 0 |");
    } else {
        println!("| errors | {} ({}) |", count(Role::Error), errs.join(", "));
    }
    // INFO commandstats also counts the commands the Lua scripts run;
    // round trips are what the clients sent.
    const CLIENT_SENT: [&str; 8] = [
        "evalsha",
        "eval",
        "script",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "ping",
    ];
    let sent: Vec<String> = commands
        .iter()
        .filter(|(k, _)| CLIENT_SENT.iter().any(|c| k.split('|').next() == Some(*c)))
        .map(|(k, v)| format!("{k} {:.3}", per_req(*v)))
        .collect();
    let sent_total: u64 = commands
        .iter()
        .filter(|(k, _)| CLIENT_SENT.iter().any(|c| k.split('|').next() == Some(*c)))
        .map(|(_, v)| *v)
        .sum();
    println!(
        "| Redis round trips per request | {:.3} ({}) |",
        per_req(sent_total),
        sent.join(", ")
    );
    println!(
        "| Redis commands per request, scripts' inner commands included | {:.3} |",
        per_req(total_cmds)
    );
    let degraded_secs = degraded.iter().filter(|d| **d).count();
    let fallbacks: Vec<String> = counters
        .iter()
        .filter(|(k, _)| k.starts_with("singleflight_local_fallback_total"))
        .map(|(k, v)| {
            format!(
                "{v} {}",
                k.trim_start_matches("singleflight_local_fallback_total")
            )
        })
        .collect();
    println!(
        "| degraded | {degraded_secs} s; local fallbacks: {} |",
        if fallbacks.is_empty() {
            "0".to_owned()
        } else {
            fallbacks.join(", ")
        }
    );
    for (name, label) in [
        ("singleflight_wait_timeout_total", "wait timeouts"),
        (
            "singleflight_result_write_failure_total",
            "result write failures",
        ),
        ("singleflight_takeover_total", "takeovers"),
    ] {
        println!("| {label} | {} |", counters.get(name).copied().unwrap_or(0));
    }
    println!();
    println!("| role | requests | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for role in Role::ALL {
        if let Some(h) = t.by_role.get(&role) {
            println!(
                "| {} | {} | {} | {} | {} |",
                role.name(),
                h.len(),
                ms(h.value_at_quantile(0.5)),
                ms(h.value_at_quantile(0.99)),
                ms(h.max())
            );
        }
    }
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    chart(args, t, execs, fault, degraded)?;
    println!();
    println!("report: {}", args.out);
    Ok(Summary {
        requests,
        executions,
        errors: count(Role::Error),
    })
}

/// One line of a chart: its name, colour and value in each second.
type Line<'a> = (
    &'static str,
    RGBColor,
    Box<dyn Fn(usize) -> Option<f64> + 'a>,
);

/// The SVG: latency percentiles per second (top), requests and executions
/// per second (bottom); the fault window and degraded seconds shaded.
fn chart(
    args: &Args,
    t: &Totals,
    execs: &Executions,
    fault: Option<(u64, u64)>,
    degraded: &[bool],
) -> Result<(), BoxError> {
    let secs = args.duration as usize;
    let root = SVGBackend::new(&args.out, (1100, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "flightdeck loadgen: {} nodes × {} callers × {} keys (Zipf {}), model {} ms",
            args.nodes, args.concurrency, args.keys, args.skew, args.latency_ms
        ),
        ("sans-serif", 20),
    )?;
    let (top, bottom) = root.split_vertically(360);

    let quantile = |q: f64| -> Box<dyn Fn(usize) -> Option<f64> + '_> {
        Box::new(move |s| {
            let h = &t.seconds[s].latency;
            (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
        })
    };
    let panel = |area, caption, lines: Vec<Line<'_>>| {
        draw_panel(area, caption, secs, fault, degraded, lines)
    };
    panel(
        &top,
        "latency per second (ms)",
        vec![
            ("p50", BLUE, quantile(0.5)),
            ("p90", GREEN, quantile(0.9)),
            ("p99", RED, quantile(0.99)),
        ],
    )?;
    let per_sec = |v: &[AtomicU64], s: usize| Some(v[s].load(Ordering::Relaxed) as f64);
    panel(
        &bottom,
        "executions and requests per second",
        vec![
            (
                "executions as Redis owner",
                BLUE,
                Box::new(|s| per_sec(&execs.coordinated, s)),
            ),
            (
                "executions in local fallback",
                RED,
                Box::new(|s| per_sec(&execs.local, s)),
            ),
            (
                "requests / 100",
                BLACK,
                Box::new(|s| Some(t.seconds[s].roles.iter().sum::<u64>() as f64 / 100.0)),
            ),
            (
                "errors",
                MAGENTA,
                Box::new(|s| Some(t.seconds[s].roles[Role::Error as usize] as f64)),
            ),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// One chart of the report, with the fault window (grey) and the seconds a
/// stage was degraded (pink) shaded.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    secs: usize,
    fault: Option<(u64, u64)>,
    degraded: &[bool],
    lines: Vec<Line<'_>>,
) -> Result<(), BoxError> {
    let ymax = lines
        .iter()
        .flat_map(|(_, _, f)| (0..secs).filter_map(f))
        .fold(1.0_f64, f64::max)
        * 1.15;
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..secs as f64, 0.0..ymax)?;
    c.configure_mesh().x_desc("seconds").draw()?;
    for (s, d) in degraded.iter().enumerate().take(secs) {
        if *d {
            c.draw_series(std::iter::once(Rectangle::new(
                [(s as f64, 0.0), (s as f64 + 1.0, ymax)],
                RGBColor(255, 200, 200).mix(0.5).filled(),
            )))?;
        }
    }
    if let Some((a, b)) = fault {
        c.draw_series(std::iter::once(Rectangle::new(
            [(a as f64, 0.0), (b as f64, ymax)],
            RGBColor(120, 120, 120).mix(0.25).filled(),
        )))?
        .label("Redis frozen (grey) / stage degraded (pink)")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 15, y + 5)],
                RGBColor(160, 160, 160).filled(),
            )
        });
    }
    for (name, color, f) in lines {
        c.draw_series(LineSeries::new(
            (0..secs).filter_map(|s| f(s).map(|v| (s as f64 + 0.5, v))),
            color.stroke_width(2),
        ))?
        .label(name)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
