//! Load generator: N nodes × C concurrent callers × K keys (hot-key skew)
//! for D seconds against a Redis, through `GenericSingleFlightLayer` in HYBRID
//! mode; prints a summary table and writes an SVG report.
//!
//! Each node is a full flightdeck stack (L1, L2 over its own Redis
//! connection, breaker, bulkhead) in front of a simulated model that works
//! for `--work` (e.g. `200ms`). Callers pick keys from a Zipf distribution
//! (`--zipf s`), so a few keys are hot. Results are replayed for
//! `--replay-ttl` (a cache entry expiring under load). With `--fault`,
//! Redis is frozen for `--fault-for` seconds in the middle of the run
//! (SIGSTOP when the generator started the server, `CLIENT PAUSE` for an
//! external one): the report shows the stages falling back to local
//! single-flight and recovering. With `--fail-at`/`--fail-for`, the model
//! itself fails for a window (an error of class `Unavailable`, what a 503
//! from a provider becomes): with the stage's stale windows on
//! (`--stage stale-if-error=60s`, any key of the stage's TOML table),
//! watch callers keep getting answers.
//!
//! The summary has a row per phase (before, during and after the failure
//! window): requests, failed responses (and those of keys that had a
//! result within the stale-if-error window), stale answers (answers whose
//! work finished longer than the replay TTL before the request started,
//! and flightdeck's own `singleflight_stale_served_total`), executions per
//! key, p50/p99. `--churn N` sends N requests to N distinct keys instead
//! (and reports the process's RSS growth); `--local-only` runs without
//! Redis.
//!
//! Uses `REDIS_URL` when set, else starts a `redis-server` on a free port
//! (flightdeck-harness).
//!
//! ```text
//! cargo run --release -p flightdeck-examples --example loadgen -- --fault
//! cargo run --release -p flightdeck-examples --example loadgen -- --nodes 4 --concurrency 64 --keys 1000 --duration 30 --out report.svg
//! cargo run --release -p flightdeck-examples --example loadgen -- --work 200ms --duration 40 \
//!     --fail-at 10s --fail-for 20s --stage stale-if-error=60s --stage stale-retry-after=5s
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck::core::error::{ErrorClass, RemoteFailure};
use flightdeck::core::{BoxError, CloneShare, KeyEncoder, StageName};
use flightdeck::distributed::{FencingToken, PostcardCodec};
use flightdeck::{GenericSingleFlightLayer, SingleFlightConfig};
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
    /// When the model starts failing (`None`: it never does).
    pub(crate) fail_at: Option<Duration>,
    /// For how long it fails.
    pub(crate) fail_for: Duration,
    /// Extra keys of the stage's TOML table (`stale-if-error` → `"60s"`),
    /// given as they are written after `=` (strings quoted here).
    pub(crate) stage: Vec<(String, String)>,
    /// Every stage in this process only: no Redis.
    pub(crate) local_only: bool,
    /// Send this many requests, each to a key of its own, then stop.
    pub(crate) churn: Option<u64>,
    /// Bytes of padding in every answer (a bigger result to keep).
    pub(crate) payload: usize,
    /// Split the answers of keys answered before by how each was answered
    /// (the store's answer to its own acquire, its time in store calls),
    /// and list the failures of keys a node had answered.
    pub(crate) split: bool,
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
            fail_at: None,
            fail_for: Duration::from_secs(10),
            stage: Vec::new(),
            local_only: false,
            churn: None,
            payload: 0,
            split: false,
            out: "target/loadgen-report.svg".to_owned(),
        }
    }
}

const USAGE: &str = "usage: loadgen [--nodes N] [--concurrency C] [--keys K] [--zipf S] \
[--duration SECS] [--work DUR] [--replay-ttl DUR] [--fault] [--fault-at SECS] [--fault-for SECS] \
[--fail-at DUR] [--fail-for DUR] [--stage KEY=VALUE]... [--local-only] [--churn N] [--payload BYTES] \
[--split] [--out FILE.svg]
  DUR: 200ms, 2s, 1m (a bare number: milliseconds for --work/--replay-ttl, seconds for --fail-*)
  --stage: any key of the stage's TOML table, e.g. --stage stale-while-revalidate=5s";

/// `200ms`, `2s`, `1m`, `1m30s`; a bare number is `bare` units.
pub(crate) fn parse_duration(text: &str, bare: Duration) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(bare * u32::try_from(n).map_err(|_| format!("{text:?} is too large"))?);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{text:?} needs a unit (ms, s, m)"))?;
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?} is not a duration"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(n), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(n), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(n.saturating_mul(60)), 1)
        } else {
            return Err(format!("{text:?}: unknown unit (ms, s, m)"));
        };
        total += unit;
        rest = &rest[len..];
    }
    Ok(total)
}

/// A `--stage` value as TOML: numbers and booleans as they are, the rest
/// (durations) quoted.
fn toml_value(v: &str) -> String {
    if v == "true" || v == "false" || v.parse::<f64>().is_ok() || v.starts_with('"') {
        v.to_owned()
    } else {
        format!("{v:?}")
    }
}

fn parse_args() -> Result<Args, BoxError> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--fault" {
            a.fault = true;
            continue;
        }
        if flag == "--local-only" {
            a.local_only = true;
            continue;
        }
        if flag == "--split" {
            a.split = true;
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
            "--skew" | "--zipf" => a.skew = value.parse().map_err(|e| bad(&e))?,
            "--duration" => a.duration = value.parse().map_err(|e| bad(&e))?,
            "--latency" | "--work" => {
                a.latency_ms = parse_duration(&value, Duration::from_millis(1))
                    .map_err(|e| bad(&e))?
                    .as_millis() as u64
            }
            "--result-ttl" | "--replay-ttl" => {
                a.result_ttl_ms = parse_duration(&value, Duration::from_millis(1))
                    .map_err(|e| bad(&e))?
                    .as_millis() as u64
            }
            "--fail-at" => {
                a.fail_at =
                    Some(parse_duration(&value, Duration::from_secs(1)).map_err(|e| bad(&e))?)
            }
            "--fail-for" => {
                a.fail_for = parse_duration(&value, Duration::from_secs(1)).map_err(|e| bad(&e))?
            }
            "--stage" => {
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| bad(&"expected KEY=VALUE"))?;
                a.stage.push((k.trim().to_owned(), toml_value(v.trim())));
            }
            "--churn" => a.churn = Some(value.parse().map_err(|e| bad(&e))?),
            "--payload" => a.payload = value.parse().map_err(|e| bad(&e))?,
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
    if a.fault && a.local_only {
        return Err("--fault freezes Redis, which --local-only does not use".into());
    }
    if let Some(at) = a.fail_at {
        if at + a.fail_for > Duration::from_secs(a.duration) {
            return Err(
                "the failure window must end by the end of the run (--fail-at + --fail-for <= --duration)"
                    .into(),
            );
        }
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
    /// Answers whose work finished over the replay TTL before.
    stale: u64,
}

impl Second {
    fn new() -> Self {
        Self {
            latency: hist(),
            roles: [0; 4],
            stale: 0,
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

/// The phases of a run: before, during and after the model's failure
/// window (one phase, "run", without a window).
const PHASES: [&str; 3] = ["before", "during", "after"];

/// An answer whose work finished longer than the replay TTL plus this
/// before its request started counts as stale (the commit that follows
/// the work takes a round trip; a fresh replay may be that much older);
/// one within the replay TTL counts as a hit; one between is neither (the
/// hits' latency must not hold stale answers).
const STALE_SLACK: Duration = Duration::from_millis(100);

/// When the model fails, and the phase of a moment of the run.
#[derive(Debug, Clone, Copy)]
struct Window {
    fail: Option<(Duration, Duration)>,
}

impl Window {
    fn failing(&self, t: Duration) -> bool {
        self.fail.is_some_and(|(a, b)| t >= a && t < b)
    }
    fn phase(&self, t: Duration) -> usize {
        match self.fail {
            Some((a, _)) if t < a => 0,
            Some((_, b)) if t < b => 1,
            Some(_) => 2,
            None => 0,
        }
    }
}

/// Executions of one key grouped by expiry: a second execution within
/// half the replay TTL of the first of its group is a duplicate (the same
/// expiry refreshed twice), a later one refreshes the next expiry.
#[derive(Debug, Default, Clone, Copy)]
struct Epoch {
    start_us: u64,
    executions: u32,
}

/// Over every key: expiries seen, executions, the most in one expiry.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Refreshes {
    pub(crate) expiries: u64,
    pub(crate) executions: u64,
    pub(crate) max_per_expiry: u32,
}

/// What the model and the callers know of each key.
struct Keys {
    /// Per key: 1 + when (µs into the run) the work of the newest good
    /// answer any caller got finished; 0: none yet.
    last_good: Vec<AtomicU64>,
    /// The same per node, as that node's callers saw it.
    last_good_on: Vec<Vec<AtomicU64>>,
    /// Executions per key, per phase.
    executions: [Vec<AtomicU32>; 3],
    /// Executions grouped by expiry (successful ones only).
    epochs: Mutex<(HashMap<u32, Epoch>, Refreshes)>,
    epoch_gap_us: u64,
}

impl Keys {
    fn new(keys: usize, nodes: usize, ttl: Duration) -> Self {
        let zeros = |n| (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        let counts = || (0..keys).map(|_| AtomicU32::new(0)).collect::<Vec<_>>();
        Self {
            last_good: zeros(keys),
            last_good_on: (0..nodes).map(|_| zeros(keys)).collect(),
            executions: [counts(), counts(), counts()],
            epochs: Mutex::new((HashMap::new(), Refreshes::default())),
            epoch_gap_us: ttl.as_micros() as u64 / 2,
        }
    }

    fn executed(&self, key: u32, phase: usize, at_us: u64, failing: bool) {
        self.executions[phase][key as usize].fetch_add(1, Ordering::Relaxed);
        if failing || self.epoch_gap_us == 0 {
            return;
        }
        let mut guard = self.epochs.lock().expect("not poisoned");
        let (epochs, totals) = &mut *guard;
        totals.executions += 1;
        let e = epochs.entry(key).or_default();
        if e.executions == 0 || at_us.saturating_sub(e.start_us) > self.epoch_gap_us {
            *e = Epoch {
                start_us: at_us,
                executions: 1,
            };
            totals.expiries += 1;
        } else {
            e.executions += 1;
        }
        totals.max_per_expiry = totals.max_per_expiry.max(e.executions);
    }

    /// Whether a good answer for `key` (on `node`, or anywhere) finished
    /// within `within` before `t_us`.
    fn had_result(&self, node: Option<usize>, key: u32, t_us: u64, within: Duration) -> bool {
        let slot = match node {
            Some(n) => &self.last_good_on[n][key as usize],
            None => &self.last_good[key as usize],
        };
        let last = slot.load(Ordering::Relaxed);
        last != 0 && t_us.saturating_sub(last - 1) <= within.as_micros() as u64
    }

    fn answered(&self, node: usize, key: u32, finished_us: u64) {
        self.last_good[key as usize].fetch_max(finished_us + 1, Ordering::Relaxed);
        self.last_good_on[node][key as usize].fetch_max(finished_us + 1, Ordering::Relaxed);
    }
}

/// What the callers saw in one phase.
struct Phase {
    latency: Histogram<u64>,
    /// Answers replayed from a fresh result.
    hit_latency: Histogram<u64>,
    /// Requests for keys that had been answered before (expiries included).
    warm_latency: Histogram<u64>,
    requests: u64,
    failed: u64,
    /// Failed although a good answer of the key (any node) finished
    /// within the replay TTL plus the stale-if-error window.
    failed_had_result: u64,
    /// Failed although this node's callers had such an answer.
    failed_node_had_result: u64,
    /// Answers whose work finished more than the replay TTL (+ slack)
    /// before.
    stale: u64,
    /// Answers whose work finished within the replay TTL before.
    hits: u64,
}

impl Phase {
    fn new() -> Self {
        Self {
            latency: hist(),
            hit_latency: hist(),
            warm_latency: hist(),
            requests: 0,
            failed: 0,
            failed_had_result: 0,
            failed_node_had_result: 0,
            stale: 0,
            hits: 0,
        }
    }
    fn add(&mut self, o: &Phase) -> Result<(), BoxError> {
        self.latency.add(&o.latency)?;
        self.hit_latency.add(&o.hit_latency)?;
        self.warm_latency.add(&o.warm_latency)?;
        self.requests += o.requests;
        self.failed += o.failed;
        self.failed_had_result += o.failed_had_result;
        self.failed_node_had_result += o.failed_node_had_result;
        self.stale += o.stale;
        self.hits += o.hits;
        Ok(())
    }
}

/// The process's resident set (Linux; 0 elsewhere), in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
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
async fn main() {
    match parse_args() {
        Ok(args) => match run(args).await {
            // One machine-readable line, like the quickstart's
            // (scripts/stale-bench reads it).
            Ok(s) => println!("{}", s.line()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        },
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}

/// What a run measured (the table has more).
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    /// Requests sent.
    pub(crate) requests: u64,
    /// Model executions, all kinds.
    pub(crate) executions: u64,
    /// Requests that ended in an error.
    pub(crate) errors: u64,
    /// p99 of answers replayed from a fresh result, ns.
    pub(crate) hit_p99_ns: u64,
    /// p99 of requests for keys answered before (expiries included), ns.
    pub(crate) warm_p99_ns: u64,
    /// Executions grouped by expiry, outside the failure window.
    pub(crate) refreshes: Refreshes,
    /// Per phase: requests, failed, failed for keys that had a result
    /// within the stale-if-error window (any node / this node), stale
    /// answers (by age), stale answers flightdeck counted, most executions
    /// of one key.
    pub(crate) phases: Vec<PhaseSummary>,
    /// The window a key's result counts for in `failed_had_result`.
    pub(crate) window: Duration,
    /// Resident set before and after the load, KiB.
    pub(crate) rss_kib: (u64, u64),
    /// With `--split`: the p99 of stale answers, and the p99 of hits in the
    /// same slices of the run weighted by the stale answers in each, ns.
    pub(crate) split: Option<(u64, u64)>,
}

impl PhaseSummary {
    /// Its figures, named as in the summary's last line.
    fn columns(&self) -> [(&'static str, String); 12] {
        [
            ("seconds", format!("{:.1}", self.seconds)),
            ("requests", self.requests.to_string()),
            ("failed", self.failed.to_string()),
            ("failed_had_result", self.failed_had_result.to_string()),
            (
                "failed_node_had_result",
                self.failed_node_had_result.to_string(),
            ),
            ("stale", self.stale.to_string()),
            ("stale_counted", self.stale_counted.to_string()),
            ("executions", self.executions.to_string()),
            ("keys_executed", self.keys_executed.to_string()),
            (
                "max_executions_per_key",
                self.max_executions_per_key.to_string(),
            ),
            ("p50_us", us(self.p50_ns)),
            ("p99_us", us(self.p99_ns)),
        ]
    }
}

/// One phase of [`Summary`].
#[derive(Debug, Clone, Default)]
pub(crate) struct PhaseSummary {
    pub(crate) name: &'static str,
    pub(crate) seconds: f64,
    pub(crate) requests: u64,
    pub(crate) failed: u64,
    pub(crate) failed_had_result: u64,
    pub(crate) failed_node_had_result: u64,
    pub(crate) stale: u64,
    pub(crate) stale_counted: u64,
    pub(crate) executions: u64,
    pub(crate) keys_executed: u64,
    pub(crate) max_executions_per_key: u64,
    pub(crate) p50_ns: u64,
    pub(crate) p99_ns: u64,
}

impl Summary {
    /// `name=value` pairs on one line.
    pub(crate) fn line(&self) -> String {
        let mut out = format!(
            "requests={} executions={} errors={} hit_p99_us={} warm_p99_us={} expiries={} executions_in_expiries={} max_executions_per_expiry={} window_s={} rss_before_kib={} rss_after_kib={}",
            self.requests,
            self.executions,
            self.errors,
            us(self.hit_p99_ns),
            us(self.warm_p99_ns),
            self.refreshes.expiries,
            self.refreshes.executions,
            self.refreshes.max_per_expiry,
            self.window.as_secs_f64(),
            self.rss_kib.0,
            self.rss_kib.1,
        );
        if let Some((stale, hits)) = self.split {
            out.push_str(&format!(
                " stale_p99_us={} hit_p99_same_slices_us={}",
                us(stale),
                us(hits)
            ));
        }
        for p in &self.phases {
            for (k, v) in p.columns() {
                out.push_str(&format!(" {}_{k}={v}", p.name));
            }
        }
        out
    }
}

/// The stage's TOML table: the run's settings, where `--stage` does not
/// give the key, and `--stage`'s keys.
fn stage_toml(args: &Args) -> String {
    let ttl = format!("\"{}ms\"", args.result_ttl_ms.max(200));
    // Short lease and replay TTL so keys expire (and are recomputed)
    // during the run.
    let mut keys: Vec<(&str, String)> = [
        ("mode", "\"hybrid\""),
        ("backend", "\"redis\""),
        ("lease-timeout", "\"3s\""),
        ("heartbeat-interval", "\"1s\""),
        ("wait-timeout", "\"4s\""),
        ("poll-interval", "\"100ms\""),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    keys.push(("replay-ttl", ttl));
    keys.retain(|(k, _)| !args.stage.iter().any(|(given, _)| given == k));
    keys.extend(args.stage.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let mut t = String::from("[single-flight.stages.work]\n");
    for (k, v) in keys {
        t.push_str(&format!("{k} = {v}\n"));
    }
    t.push_str(
        "[single-flight.stages.work.breaker]\nconsecutive-failures = 5\nwait-in-open = \"1s\"\n",
    );
    t.push_str("[single-flight.stages.work.bulkhead]\nlimit = 4096\n");
    t
}

/// The stage's configuration; a refused key (a `--stage` key this build
/// does not have) is an error naming it.
pub(crate) fn stage_config(args: &Args) -> Result<SingleFlightConfig, BoxError> {
    SingleFlightConfig::from_toml(&stage_toml(args))
        .map_err(|e| format!("the stage's configuration: {e}").into())
}

/// Runs the load, prints the table, writes the SVG.
pub(crate) async fn run(mut args: Args) -> Result<Summary, BoxError> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Another recorder may be installed (a test binary): the flightdeck
    // counters of the table then read 0.
    let _ = recorder.install();
    // Each snapshot takes the counters (and zeroes them): one per phase.
    let take = |into: &mut BTreeMap<String, u64>| {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let DebugValue::Counter(v) = value {
                let mut name = key.key().name().to_owned();
                if let Some(label) = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "reason" || l.key() == "outcome")
                {
                    name = format!("{name}{{{}}}", label.value());
                }
                *into.entry(name).or_default() += v;
            }
        }
    };
    let mut phase_counters: [BTreeMap<String, u64>; 3] = Default::default();
    take(&mut phase_counters[0]);
    phase_counters[0].clear();

    if let Some(n) = args.churn {
        args.keys = usize::try_from(n)?.max(1);
    }
    let config = stage_config(&args)?;
    let ttl = Duration::from_millis(args.result_ttl_ms.max(200));
    // The window in which a key's earlier answer "had a result" for the
    // failures: the stale-if-error window past the replay TTL, or any
    // earlier answer when the stage has none.
    let window = match args.stage.iter().find(|(k, _)| k == "stale-if-error") {
        Some((_, v)) => ttl + parse_duration(v.trim_matches('"'), Duration::from_millis(1))?,
        None => Duration::from_secs(args.duration),
    };

    let mut redis = if args.local_only {
        None
    } else {
        Some(redis_target()?)
    };

    let duration = Duration::from_secs(args.duration);
    let seconds = args.duration as usize + 1;
    let execs = Arc::new(Executions {
        coordinated: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
        local: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
    });
    // A churn has no expiries to group (and a map of a million keys would
    // be in the RSS it measures).
    let epochs_of = if args.churn.is_some() {
        Duration::ZERO
    } else {
        ttl
    };
    let keys = Arc::new(Keys::new(args.keys, args.nodes, epochs_of));
    let stage = StageName::new("work")?;
    let latency = Duration::from_millis(args.latency_ms);
    let win = Window {
        fail: args.fail_at.map(|a| (a, a + args.fail_for)),
    };

    let mut nodes = Vec::new();
    let mut layers = Vec::new();
    let started = Instant::now();
    for _ in 0..args.nodes {
        let stage = stage.clone();
        let mut builder = GenericSingleFlightLayer::builder(
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
        .stale_weigher(|s: &String| std::mem::size_of::<String>() + s.capacity())
        .config(config.clone());
        builder = match &redis {
            Some(r) => {
                let redis = RedisBackend::connect(RedisConfig::new(r.url())).await?;
                if args.split {
                    builder.backend("redis", probe::Probing { inner: redis })
                } else {
                    builder.backend("redis", redis)
                }
            }
            None => builder.local_only(),
        };
        let layer = builder.build()?;
        let (execs, keys, payload) = (execs.clone(), keys.clone(), args.payload);
        let svc = layer.layer(service_fn(move |r: Req| {
            let (execs, keys) = (execs.clone(), keys.clone());
            async move {
                let now = started.elapsed();
                let sec = (now.as_secs() as usize).min(execs.local.len() - 1);
                // The owner of a distributed flight carries its fencing
                // token; a local fallback (or LOCAL_ONLY) does not.
                let kind = if r.token.is_some() {
                    &execs.coordinated
                } else {
                    &execs.local
                };
                kind[sec].fetch_add(1, Ordering::Relaxed);
                let failing = win.failing(now);
                keys.executed(r.key, win.phase(now), now.as_micros() as u64, failing);
                if failing {
                    // What a provider's 503 becomes: a failure a stale
                    // result may answer for (stale-if-error).
                    return Err(RemoteFailure::new(
                        ErrorClass::Unavailable,
                        "the model is down (503)",
                    ));
                }
                tokio::time::sleep(latency).await;
                Ok::<_, RemoteFailure>(format!(
                    "{}:{}:{}:{}:{:payload$}",
                    r.node,
                    r.id,
                    r.key,
                    started.elapsed().as_micros(),
                    ""
                ))
            }
        }));
        nodes.push(svc);
        layers.push(layer);
    }
    let before = match &redis {
        Some(r) => r.command_stats()?,
        None => BTreeMap::new(),
    };
    let rss_before = rss_kib();

    // Progress.
    let bar = ProgressBar::new(args.duration);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len}s {msg}")
            .expect("valid template"),
    );
    let sent = Arc::new(AtomicU64::new(0));
    let next_key = Arc::new(AtomicU64::new(0));
    let degraded: Arc<Mutex<Vec<bool>>> = Arc::new(Mutex::new(vec![false; seconds]));

    // Callers.
    let zipf = Arc::new(Zipf::new(
        if args.churn.is_some() { 1 } else { args.keys },
        args.skew,
    ));
    let churn = args.churn;
    let split = args.split;
    let mut callers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for c in 0..args.concurrency {
            let (node, zipf, sent, keys, next_key) = (
                node.clone(),
                zipf.clone(),
                sent.clone(),
                keys.clone(),
                next_key.clone(),
            );
            let seed = 0x9e37_79b9_7f4a_7c15 ^ ((n as u64) << 32 | c as u64);
            callers.push(tokio::spawn(async move {
                let mut rng = Rng(seed | 1);
                // Made when first used: a churn's long --duration must not
                // fill the RSS it measures with empty histograms.
                let mut secs: Vec<Option<Second>> = (0..seconds).map(|_| None).collect();
                let mut phases: Vec<Phase> = (0..3).map(|_| Phase::new()).collect();
                let mut by_role: BTreeMap<Role, Histogram<u64>> = BTreeMap::new();
                let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                let mut samples: Vec<Sample> = Vec::new();
                let mut failures: Vec<Failure> = Vec::new();
                let mut id = (n as u64) << 48 | (c as u64) << 32;
                while started.elapsed() < duration {
                    id += 1;
                    let key = match churn {
                        Some(total) => {
                            let k = next_key.fetch_add(1, Ordering::Relaxed);
                            if k >= total {
                                break;
                            }
                            k as u32
                        }
                        None => zipf.sample(rng.next_f64()),
                    };
                    let t0 = Instant::now();
                    let t0_us = t0.duration_since(started).as_micros() as u64;
                    let warm = keys.had_result(None, key, t0_us, duration);
                    let req = Req {
                        key,
                        node: n as u32,
                        id,
                        token: None,
                    };
                    let (res, probed) = if split {
                        let fut = Box::pin(node.clone().oneshot(req));
                        probe::Probed {
                            fut,
                            probe: probe::Probe::default(),
                        }
                        .await
                    } else {
                        (node.clone().oneshot(req).await, probe::Probe::default())
                    };
                    let ns = t0.elapsed().as_nanos().max(1) as u64;
                    // An answer from a node's copy is ready at once: a
                    // caller that never waits must still hand its thread
                    // back now and then, or the runtime's timers and its
                    // other tasks (flights, their wait timeouts, this run's
                    // own clock) starve while every answer is a copy's.
                    tokio::task::consume_budget().await;
                    let phase = &mut phases[win.phase(t0.duration_since(started))];
                    phase.requests += 1;
                    phase.latency.saturating_record(ns);
                    if warm {
                        phase.warm_latency.saturating_record(ns);
                    }
                    let mut stale = false;
                    let mut answer = Answer::Ran;
                    let role = match &res {
                        Ok(v) => {
                            let mut parts = v.split(':');
                            let mut field = || parts.next().and_then(|p| p.parse::<u64>().ok());
                            let from_node = field().unwrap_or(u64::MAX);
                            let from_id = field().unwrap_or(0);
                            let _key = field();
                            let finished_us = field().unwrap_or(0);
                            keys.answered(n, key, finished_us);
                            if finished_us <= t0_us {
                                let age = Duration::from_micros(t0_us - finished_us);
                                if age > ttl + STALE_SLACK {
                                    phase.stale += 1;
                                    stale = true;
                                    answer = Answer::Stale;
                                } else if age <= ttl {
                                    phase.hits += 1;
                                    phase.hit_latency.saturating_record(ns);
                                    answer = Answer::Hit;
                                } else {
                                    // Within the slack: a hit whose commit
                                    // came late, or a stale answer. Neither
                                    // count takes it, so that the hits'
                                    // latency holds only sure hits.
                                    answer = Answer::Edge;
                                }
                            }
                            if from_id == id {
                                Role::Executed
                            } else if from_node == n as u64 {
                                Role::LocalFollower
                            } else {
                                Role::RemoteFollower
                            }
                        }
                        Err(e) => {
                            phase.failed += 1;
                            if keys.had_result(None, key, t0_us, window) {
                                phase.failed_had_result += 1;
                            }
                            answer = Answer::Failed;
                            if keys.had_result(Some(n), key, t0_us, window) {
                                phase.failed_node_had_result += 1;
                                if split && failures.len() < MAX_FAILURES {
                                    failures.push(Failure {
                                        node: n as u32,
                                        key,
                                        t0_us,
                                        last_us: keys.last_good_on[n][key as usize]
                                            .load(Ordering::Relaxed)
                                            .saturating_sub(1),
                                        error: e.to_string(),
                                        store: probed.first.unwrap_or(probe::Store::NoCall),
                                    });
                                }
                            }
                            *errors
                                .entry(format!("{:?}", ErrorClass::of(&**e)))
                                .or_default() += 1;
                            // Do not spin on instant failures.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            Role::Error
                        }
                    };
                    let sec = (t0.duration_since(started).as_secs() as usize).min(seconds - 1);
                    let s = secs[sec].get_or_insert_with(Second::new);
                    s.latency.saturating_record(ns);
                    s.roles[role as usize] += 1;
                    s.stale += u64::from(stale);
                    by_role
                        .entry(role)
                        .or_insert_with(hist)
                        .saturating_record(ns);
                    if split && warm {
                        samples.push(Sample {
                            t0_us,
                            ns,
                            store_ns: probed.in_store_ns,
                            answer,
                            store: probed.first.unwrap_or(probe::Store::NoCall),
                            calls: probed.acquires.saturating_add(probed.others),
                        });
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                (secs, phases, by_role, errors, samples, failures)
            }));
        }
    }

    // The fault, the failure window's phases, the degraded-state sampler
    // and the progress bar.
    let fault_window = args
        .fault
        .then(|| (args.fault_at, args.fault_at + args.fault_for));
    let mut fault_how = "";
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut frozen = false;
    let mut phase_now = 0;
    loop {
        tick.tick().await;
        let now = started.elapsed();
        let churned = churn.is_some_and(|total| {
            next_key.load(Ordering::Relaxed) >= total && callers.iter().all(|c| c.is_finished())
        });
        if now >= duration || churned {
            break;
        }
        let sec = (now.as_secs() as usize).min(seconds - 1);
        if layers
            .iter()
            .any(|l| l.stage("work").is_some_and(|s| s.is_degraded()))
        {
            degraded.lock().expect("not poisoned")[sec] = true;
        }
        let phase = win.phase(now);
        if phase != phase_now {
            take(&mut phase_counters[phase_now]);
            phase_now = phase;
        }
        if let (Some((from, to)), Some(redis)) = (fault_window, redis.as_mut()) {
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
            "requests {n}, executions {executed}{}{}",
            if frozen { ", REDIS FROZEN" } else { "" },
            if win.failing(now) { ", MODEL DOWN" } else { "" }
        ));
    }
    if frozen {
        if let Some(redis) = redis.as_mut() {
            redis.thaw()?;
        }
    }
    bar.finish_and_clear();
    // The callers are done (a churn waits for them all); what they hold
    // is in the RSS, as the layers' state is.
    let rss_after = rss_kib();

    let mut totals = Totals {
        by_role: BTreeMap::new(),
        seconds: (0..seconds).map(|_| Second::new()).collect(),
        errors: BTreeMap::new(),
    };
    let mut phases: Vec<Phase> = (0..3).map(|_| Phase::new()).collect();
    let mut samples: Vec<Sample> = Vec::new();
    let mut failures: Vec<Failure> = Vec::new();
    for c in callers {
        // Callers finish their last request; bounded by the wait timeout.
        let (secs, caller_phases, by_role, errors, caller_samples, caller_failures) =
            tokio::time::timeout(Duration::from_secs(30), c).await??;
        samples.extend(caller_samples);
        failures.extend(caller_failures);
        for (t, s) in totals
            .seconds
            .iter_mut()
            .zip(secs)
            .filter_map(|(t, s)| Some((t, s?)))
        {
            t.latency.add(&s.latency)?;
            for (a, b) in t.roles.iter_mut().zip(s.roles) {
                *a += b;
            }
            t.stale += s.stale;
        }
        for (t, p) in phases.iter_mut().zip(&caller_phases) {
            t.add(p)?;
        }
        for (role, h) in by_role {
            totals.by_role.entry(role).or_insert_with(hist).add(&h)?;
        }
        for (k, v) in errors {
            *totals.errors.entry(k).or_default() += v;
        }
    }
    let ran = started.elapsed();
    let after = match &redis {
        Some(r) => r.command_stats()?,
        None => BTreeMap::new(),
    };
    take(&mut phase_counters[phase_now]);

    // Counters recorded by flightdeck itself, over the run.
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for pc in &phase_counters {
        for (k, v) in pc {
            *counters.entry(k.clone()).or_default() += v;
        }
    }

    let mut summary = Summary {
        window,
        rss_kib: (rss_before, rss_after),
        refreshes: keys.epochs.lock().expect("not poisoned").1,
        ..Summary::default()
    };
    let (mut hits, mut warm) = (hist(), hist());
    let bounds = match win.fail {
        Some((a, b)) => vec![(0, Duration::ZERO, a), (1, a, b), (2, b, ran.max(b))],
        None => vec![(0, Duration::ZERO, ran)],
    };
    for (i, from, to) in bounds {
        let p = &phases[i];
        hits.add(&p.hit_latency)?;
        warm.add(&p.warm_latency)?;
        let per_key: Vec<u64> = keys.executions[i]
            .iter()
            .map(|a| u64::from(a.load(Ordering::Relaxed)))
            .filter(|n| *n > 0)
            .collect();
        let stale_counted = phase_counters[i]
            .iter()
            .filter(|(k, _)| k.starts_with("singleflight_stale_served_total"))
            .map(|(_, v)| *v)
            .sum();
        summary.phases.push(PhaseSummary {
            name: if win.fail.is_some() { PHASES[i] } else { "run" },
            seconds: to.saturating_sub(from).as_secs_f64(),
            requests: p.requests,
            failed: p.failed,
            failed_had_result: p.failed_had_result,
            failed_node_had_result: p.failed_node_had_result,
            stale: p.stale,
            stale_counted,
            executions: per_key.iter().sum(),
            keys_executed: per_key.len() as u64,
            max_executions_per_key: per_key.iter().copied().max().unwrap_or(0),
            p50_ns: p.latency.value_at_quantile(0.5),
            p99_ns: p.latency.value_at_quantile(0.99),
        });
    }
    summary.hit_p99_ns = hits.value_at_quantile(0.99);
    summary.warm_p99_ns = warm.value_at_quantile(0.99);

    let degraded = degraded.lock().expect("not poisoned").clone();
    let fault_how = if redis.is_some() { fault_how } else { "" };
    let mut summary = report(
        &args,
        &totals,
        &execs,
        &before,
        &after,
        &counters,
        fault_window,
        fault_how,
        &degraded,
        summary,
    )?;
    if args.split {
        let from = args
            .fail_at
            .or(fault_window.map(|(a, _)| Duration::from_secs(a)));
        let hit_p99 = summary.hit_p99_ns;
        split_report(&samples, &failures, hit_p99, window, from, &mut summary);
    }
    Ok(summary)
}

/// Milliseconds to the microsecond, of a moment or an age in µs.
fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

/// Microseconds to 10 ns, of a latency in ns: a copy's hit of a few µs
/// prints with its fraction, and a ratio of two of them is not one whole
/// microsecond's step.
fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
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
    mut summary: Summary,
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
        "flightdeck loadgen: {} nodes × {} callers × {} keys ({}), {} s, work {} ms, replay-ttl {} ms, {}{}{}{}",
        args.nodes,
        args.concurrency,
        args.keys,
        if args.churn.is_some() {
            "each once".to_owned()
        } else {
            format!("Zipf s={}", args.skew)
        },
        args.duration,
        args.latency_ms,
        args.result_ttl_ms.max(200),
        if args.local_only { "LOCAL_ONLY" } else { "HYBRID" },
        match fault {
            Some((a, b)) => format!(", Redis frozen ({fault_how}) from {a} s to {b} s"),
            None => String::new(),
        },
        match args.fail_at {
            Some(a) => format!(
                ", model failing from {:.1} s to {:.1} s",
                a.as_secs_f64(),
                (a + args.fail_for).as_secs_f64()
            ),
            None => String::new(),
        },
        args.stage
            .iter()
            .map(|(k, v)| format!(", {k} = {v}"))
            .collect::<String>(),
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
    // A counter's values by label (`{reason}` or `{outcome}`), those
    // above zero; "0" when none is.
    let by_label = |name: &str| {
        let by: Vec<String> = counters
            .iter()
            .filter(|(_, v)| **v > 0)
            .filter_map(|(k, v)| Some(format!("{v} {}", k.strip_prefix(name)?)))
            .collect();
        if by.is_empty() {
            "0".to_owned()
        } else {
            by.join(", ")
        }
    };
    println!(
        "| degraded | {degraded_secs} s; local fallbacks: {} |",
        by_label("singleflight_local_fallback_total")
    );
    for (name, label) in [
        ("singleflight_wait_timeout_total", "wait timeouts"),
        (
            "singleflight_result_write_failure_total",
            "result write failures",
        ),
        ("singleflight_takeover_total", "takeovers"),
        ("singleflight_hit_for_pass_total", "hit-for-pass"),
    ] {
        println!("| {label} | {} |", counters.get(name).copied().unwrap_or(0));
    }
    for (name, label) in [
        ("singleflight_stale_served_total", "served stale"),
        ("singleflight_refresh_total", "refreshes"),
    ] {
        println!("| {label} (`{name}`) | {} |", by_label(name));
    }
    println!();
    println!("| role | requests | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|");
    for role in Role::ALL {
        if let Some(h) = t.by_role.get(&role) {
            println!(
                "| {} | {} | {} | {} | {} |",
                role.name(),
                h.len(),
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99)),
                us(h.max())
            );
        }
    }
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    println!();
    println!(
        "Per phase (a request counts in the phase it started in). stale: answers whose work finished over the replay TTL (+{} ms) before the request; \
stale_counted: singleflight_stale_served_total; failed_had_result (failed_node_had_result): \
failures of keys with a good answer on any node (on this node) within {:.0} s before (replay TTL \
+ stale-if-error, or the run).",
        STALE_SLACK.as_millis(),
        summary.window.as_secs_f64()
    );
    println!();
    if let Some(first) = summary.phases.first() {
        let names: Vec<&str> = first.columns().iter().map(|(k, _)| *k).collect();
        println!("| phase | {} |", names.join(" | "));
        println!("|---|{}", "---|".repeat(names.len()));
    }
    for p in &summary.phases {
        let values: Vec<String> = p.columns().into_iter().map(|(_, v)| v).collect();
        println!("| {} | {} |", p.name, values.join(" | "));
    }
    let r = summary.refreshes;
    println!();
    println!(
        "hit p99 {} µs, p99 of keys answered before (expiries included) {} µs; executions per expiry per key: {:.3} mean, {} max ({} executions over {} expiries, first fills included, failure window left out)",
        us(summary.hit_p99_ns),
        us(summary.warm_p99_ns),
        r.executions as f64 / r.expiries.max(1) as f64,
        r.max_per_expiry,
        r.executions,
        r.expiries,
    );
    if args.churn.is_some() {
        println!(
            "RSS: {} KiB before the load, {} KiB after (+{} KiB)",
            summary.rss_kib.0,
            summary.rss_kib.1,
            summary.rss_kib.1.saturating_sub(summary.rss_kib.0)
        );
    }
    chart(args, t, execs, fault, degraded)?;
    println!();
    println!("report: {}", args.out);
    summary.requests = requests;
    summary.executions = executions;
    summary.errors = count(Role::Error);
    Ok(summary)
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
            (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1e6)
        })
    };
    let shaded = Shaded {
        fault,
        failing: args
            .fail_at
            .map(|a| (a.as_secs_f64(), (a + args.fail_for).as_secs_f64())),
        degraded,
    };
    let panel =
        |area, caption, lines: Vec<Line<'_>>| draw_panel(area, caption, secs, &shaded, lines);
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
            (
                "stale answers",
                CYAN,
                Box::new(|s| Some(t.seconds[s].stale as f64)),
            ),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// What a chart shades: Redis frozen, the model failing, the seconds a
/// stage was degraded.
struct Shaded<'a> {
    fault: Option<(u64, u64)>,
    failing: Option<(f64, f64)>,
    degraded: &'a [bool],
}

/// One chart of the report, with the fault window (grey), the model's
/// failure window (orange) and the seconds a stage was degraded (pink)
/// shaded.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    secs: usize,
    shaded: &Shaded<'_>,
    lines: Vec<Line<'_>>,
) -> Result<(), BoxError> {
    let Shaded {
        fault,
        failing,
        degraded,
    } = *shaded;
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
    if let Some((a, b)) = failing {
        c.draw_series(std::iter::once(Rectangle::new(
            [(a, 0.0), (b, ymax)],
            RGBColor(255, 165, 0).mix(0.2).filled(),
        )))?
        .label("model failing (orange)")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 15, y + 5)],
                RGBColor(255, 200, 120).filled(),
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

/// `--split`: how the store answered each request's own acquire, read by
/// a wrapper of the Redis backend while the request's future is polled
/// (a flight's leader runs its acquire inline, in its caller's task; a
/// caller that joined a flight, or was answered by this node's copy,
/// made no call).
mod probe {
    use std::cell::Cell;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use flightdeck::distributed::backend::{
        Acquired, Ask, Backend, BackendError, BackendFuture, CommitArgs, Committed, LeaseTerms,
        Subscription,
    };
    use flightdeck::distributed::{forward_backend, FlightId, OwnerToken};
    use tokio::time::Instant;

    /// The store's answer to a request's first acquire.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub(crate) enum Store {
        /// No acquire: it joined a flight of its node (or its node's copy
        /// answered).
        NoCall,
        /// A fresh stored result.
        Hit,
        /// Granted the refresh of a result past its freshness.
        GrantedStale,
        /// Granted the flight, nothing kept.
        Granted,
        /// Another caller refreshes; the kept result came along.
        FollowerStale,
        /// Another caller runs the flight, nothing kept.
        Follower,
        /// A failed refresh is throttled: the kept result.
        Throttled,
        /// The owner's lease expired.
        Expired,
        /// The call failed.
        Failed,
    }

    impl Store {
        pub(crate) fn name(self) -> &'static str {
            match self {
                Store::NoCall => "joined a flight of its node (no store call)",
                Store::Hit => "store hit",
                Store::GrantedStale => "granted the refresh, kept result beside",
                Store::Granted => "granted the flight",
                Store::FollowerStale => "follower, kept result beside",
                Store::Follower => "follower",
                Store::Throttled => "throttled refresh, kept result",
                Store::Expired => "expired lease",
                Store::Failed => "acquire failed",
            }
        }
        fn of(r: &Result<Acquired, BackendError>) -> Self {
            match r {
                Ok(Acquired::Hit(_)) => Store::Hit,
                Ok(Acquired::Owner { stale: Some(_), .. }) => Store::GrantedStale,
                Ok(Acquired::Owner { .. }) => Store::Granted,
                Ok(Acquired::Follower { stale: Some(_), .. }) => Store::FollowerStale,
                Ok(Acquired::Follower { .. }) => Store::Follower,
                Ok(Acquired::Stale(_)) => Store::Throttled,
                Ok(Acquired::Expired { .. }) => Store::Expired,
                Err(_) => Store::Failed,
            }
        }
    }

    /// What one request's calls to the store were.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct Probe {
        /// Acquires (a re-check after an ambiguous one, a follower's
        /// re-check).
        pub(crate) acquires: u8,
        /// Other calls made in the request's task (subscribe, commit).
        pub(crate) others: u8,
        /// The first acquire's answer.
        pub(crate) first: Option<Store>,
        /// Time from each call's start to its answer, summed, ns.
        pub(crate) in_store_ns: u64,
    }

    thread_local! {
        static CURRENT: Cell<Option<Probe>> = const { Cell::new(None) };
    }

    /// Notes a call that ended `started` ago, in the request polled now.
    fn note(started: Instant, first: Option<Store>) {
        CURRENT.with(|c| {
            if let Some(mut p) = c.get() {
                p.in_store_ns += started.elapsed().as_nanos() as u64;
                match first {
                    Some(s) => {
                        p.acquires = p.acquires.saturating_add(1);
                        p.first.get_or_insert(s);
                    }
                    None => p.others = p.others.saturating_add(1),
                }
                c.set(Some(p));
            }
        });
    }

    /// A request's future, with its probe in place while it is polled.
    pub(crate) struct Probed<F> {
        pub(crate) fut: F,
        pub(crate) probe: Probe,
    }

    impl<F: Future + Unpin> Future for Probed<F> {
        type Output = (F::Output, Probe);
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = &mut *self;
            let outer = CURRENT.with(|c| c.replace(Some(this.probe)));
            let polled = Pin::new(&mut this.fut).poll(cx);
            this.probe = CURRENT.with(|c| c.replace(outer)).unwrap_or(this.probe);
            polled.map(|out| (out, this.probe))
        }
    }

    /// The Redis backend, noting each call made in a probed request.
    pub(crate) struct Probing<B> {
        pub(crate) inner: B,
    }

    /// `call`, noted when it answers: `first` names an acquire's answer
    /// (`None`: another call).
    fn noted<'a, T: Send + 'a>(
        call: BackendFuture<'a, T>,
        first: fn(&Result<T, BackendError>) -> Option<Store>,
    ) -> BackendFuture<'a, T> {
        let started = Instant::now();
        Box::pin(async move {
            let r = call.await;
            note(started, first(&r));
            r
        })
    }

    impl<B: Backend> Backend for Probing<B> {
        fn acquire_with<'a>(
            &'a self,
            flight: &'a FlightId,
            token: &'a OwnerToken,
            ask: Ask,
            terms: &'a LeaseTerms,
        ) -> BackendFuture<'a, Acquired> {
            let call = self.inner.acquire_with(flight, token, ask, terms);
            noted(call, |r| Some(Store::of(r)))
        }
        fn commit<'a>(
            &'a self,
            flight: &'a FlightId,
            token: &'a OwnerToken,
            generation: u64,
            args: &'a CommitArgs,
        ) -> BackendFuture<'a, Committed> {
            noted(self.inner.commit(flight, token, generation, args), |_| None)
        }
        fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
            noted(self.inner.subscribe(flight), |_| None)
        }
        forward_backend!(inner => heartbeat, abandon, invalidate, join_subscription, release,
            reject_early, held_back, shard, sharded, shards, unreachable, connection,
            invalidated_since, wait_replicas, call_timeout_hint);
    }
}

/// What answered a request (`--split`), by the age of the answer's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Answer {
    /// Work that finished within the replay TTL before.
    Hit,
    /// Work that finished longer ago.
    Stale,
    /// Work that finished between the replay TTL and the slack before:
    /// a hit or a stale answer, which this side cannot tell.
    Edge,
    /// Work that finished after the request started (it waited for it).
    Ran,
    /// An error.
    Failed,
}

impl Answer {
    fn name(self) -> &'static str {
        match self {
            Answer::Hit => "hit",
            Answer::Stale => "stale",
            Answer::Edge => "hit or stale",
            Answer::Ran => "waited for work",
            Answer::Failed => "failed",
        }
    }
}

/// One request for a key answered before (`--split`).
#[derive(Debug, Clone, Copy)]
struct Sample {
    t0_us: u64,
    /// Its latency, and the part of it in store calls, ns.
    ns: u64,
    store_ns: u64,
    answer: Answer,
    store: probe::Store,
    calls: u8,
}

/// A failure of a key its node had answered within the window
/// (`--split`).
#[derive(Debug, Clone)]
struct Failure {
    node: u32,
    key: u32,
    t0_us: u64,
    /// When the work of the node's newest answer of the key finished.
    last_us: u64,
    error: String,
    /// The store's answer to the request's own acquire.
    store: probe::Store,
}

/// The most failures one caller lists.
const MAX_FAILURES: usize = 10_000;

/// The slices of the run in which hits and stale answers are compared
/// (their timeline: both measured in the same moments).
const SLICE_US: u64 = 100_000;

/// A latency histogram, in nanoseconds: from 1 ns to 120 s, two
/// significant digits (a hit's few microseconds are told apart to 1 %).
fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 2).expect("valid bounds")
}

/// `--split`'s tables: the answers of keys answered before by how each
/// was answered and what it waited on; hits and stale answers on the
/// same timeline; the failures of keys a node had answered.
fn split_report(
    samples: &[Sample],
    failures: &[Failure],
    hit_p99_ns: u64,
    window: Duration,
    started_failing: Option<Duration>,
    summary: &mut Summary,
) {
    let mut groups: BTreeMap<(probe::Store, Answer), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        groups.entry((s.store, s.answer)).or_default().push(s);
    }
    let total = samples.len().max(1) as f64;
    let above_all = samples.iter().filter(|s| s.ns > hit_p99_ns).count().max(1) as f64;
    println!();
    println!(
        "Keys answered before, by the store's answer to the request's own acquire and by the age of what answered it (hit p99 {} µs; \"in store\": from each call's start to its answer, the calls made in the request's task):",
        us(hit_p99_ns)
    );
    println!();
    println!("| store's answer | answered | requests | share % | p50 µs | p99 µs | max µs | above hit p99 (share of all above) | store calls per request | in store p50 µs | in store p99 µs | p99 less store µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for ((store, answer), v) in &groups {
        let (mut lat, mut st, mut rest) = (hist(), hist(), hist());
        let mut calls = 0u64;
        for s in v {
            lat.saturating_record(s.ns);
            st.saturating_record(s.store_ns.max(1));
            rest.saturating_record(s.ns.saturating_sub(s.store_ns).max(1));
            calls += u64::from(s.calls);
        }
        let above = v.iter().filter(|s| s.ns > hit_p99_ns).count();
        println!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} ({:.1} %) | {:.2} | {} | {} | {} |",
            store.name(),
            answer.name(),
            v.len(),
            100.0 * v.len() as f64 / total,
            us(lat.value_at_quantile(0.5)),
            us(lat.value_at_quantile(0.99)),
            us(lat.max()),
            above,
            100.0 * above as f64 / above_all,
            calls as f64 / v.len() as f64,
            us(st.value_at_quantile(0.5)),
            us(st.value_at_quantile(0.99)),
            us(rest.value_at_quantile(0.99)),
        );
    }
    // Hits and stale answers on the same timeline: the hits of each
    // slice of the run weighted by the stale answers in it.
    let mut hits_in: HashMap<u64, (Histogram<u64>, u64)> = HashMap::new();
    let mut stale_in: HashMap<u64, u64> = HashMap::new();
    let (mut stale, mut hits) = (hist(), hist());
    for s in samples {
        let slice = s.t0_us / SLICE_US;
        match s.answer {
            Answer::Hit => {
                let (h, n) = hits_in.entry(slice).or_insert_with(|| (hist(), 0));
                h.saturating_record(s.ns);
                *n += 1;
                hits.saturating_record(s.ns);
            }
            Answer::Stale => {
                *stale_in.entry(slice).or_default() += 1;
                stale.saturating_record(s.ns);
            }
            _ => {}
        }
    }
    let mut matched = hist();
    for (slice, n_stale) in &stale_in {
        let Some((h, n)) = hits_in.get(slice) else {
            continue;
        };
        for v in h.iter_recorded() {
            let w = v.count_at_value() as f64 * *n_stale as f64 / *n as f64 * 1000.0;
            let _ = matched.record_n(v.value_iterated_to(), w.round() as u64);
        }
    }
    summary.split = Some((
        stale.value_at_quantile(0.99),
        matched.value_at_quantile(0.99),
    ));
    println!();
    println!(
        "Same timeline ({} ms slices): stale answers' p99 {} µs ({} answers); hits' p99 in the slices of the stale answers, weighted by them, {} µs; hits' p99 over the run {} µs ({} hits)",
        SLICE_US / 1000,
        us(stale.value_at_quantile(0.99)),
        stale.len(),
        us(matched.value_at_quantile(0.99)),
        us(hits.value_at_quantile(0.99)),
        hits.len(),
    );
    if failures.is_empty() {
        return;
    }
    // The failures of keys a node had answered: by error, and by when
    // (seconds from the start of the model's failure window, or of the
    // run), with the age of the node's answer against the window.
    let from = started_failing.unwrap_or_default().as_micros() as i64;
    let mut by: BTreeMap<(String, probe::Store, i64), (u64, u64)> = BTreeMap::new();
    for f in failures {
        let at_ms = (f.t0_us as i64 - from) / 1000;
        let at = at_ms.div_euclid(250) * 250;
        let e = by.entry((f.error.clone(), f.store, at)).or_default();
        e.0 += 1;
        e.1 = e.1.max(f.t0_us.saturating_sub(f.last_us));
    }
    println!();
    println!(
        "Failures of keys their node had answered within {:.0} s (the window): by error and by when, in 250 ms steps from the model's failure (the age is of the node's newest answer of the key):",
        window.as_secs_f64()
    );
    println!();
    println!("| error | store's answer | from ms | failures | oldest age ms |");
    println!("|---|---|---|---|---|");
    for ((error, store, at), (n, age)) in &by {
        println!("| {error} | {} | {at} | {n} | {} |", store.name(), ms(*age));
    }
    println!();
    let mut first: Vec<&Failure> = failures.iter().collect();
    first.sort_by_key(|f| f.t0_us);
    for f in first.iter().take(10) {
        println!(
            "failure: node {} key {} at {} ms into the run, the node's answer {} ms old, {}: {}",
            f.node,
            f.key,
            ms(f.t0_us),
            ms(f.t0_us.saturating_sub(f.last_us)),
            f.store.name(),
            f.error
        );
    }
}
