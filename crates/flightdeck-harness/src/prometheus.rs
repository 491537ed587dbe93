//! A real `prometheus` server (the Debian package's binary, or
//! `$PROMETHEUS_BIN`) on a free loopback port, scraping the given targets
//! at a short interval and evaluating the given alerting rules, queried
//! through its HTTP API: for tests of dashboards and alerts against the
//! numbers an operator would read.
//!
//! ```no_run
//! use std::time::Duration;
//! use flightdeck_harness::prometheus::PrometheusServer;
//!
//! let targets = ["127.0.0.1:3000".parse().unwrap()];
//! let prom = PrometheusServer::start(&targets, "groups: []\n", Duration::from_secs(1)).unwrap();
//! let up = prom.query("sum(up)").unwrap();
//! assert!(up.len() <= 1);
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::redis::{free_port, RedisServerError};

/// How long the server may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one API call may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn fail(msg: impl Into<String>) -> RedisServerError {
    RedisServerError::new(msg)
}

/// One sample of an instant vector: its labels and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series' labels (without `__name__` when the query dropped it).
    pub labels: Vec<(String, String)>,
    /// The value (NaN and ±Inf as Prometheus returned them).
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An alert as `/api/v1/alerts` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// `alertname`.
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// Every label of the alert.
    pub labels: Vec<(String, String)>,
}

/// A running `prometheus` process, killed (and its data removed) when
/// dropped.
pub struct PrometheusServer {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("PROMETHEUS_BIN") {
        return PathBuf::from(bin);
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("prometheus");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from("/usr/bin/prometheus")
}

impl PrometheusServer {
    /// Starts `prometheus` scraping `targets` every `interval` (rules
    /// evaluated at the same interval) with the alerting rules `rules`
    /// (the text of a rules file), and waits until it is ready.
    pub fn start(
        targets: &[SocketAddr],
        rules: &str,
        interval: Duration,
    ) -> Result<Self, RedisServerError> {
        let dir = std::env::temp_dir().join(format!(
            "flightdeck-prometheus-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text)
                .map_err(|e| fail(format!("cannot write {name}: {e}")))
        };
        write("rules.yml", rules)?;
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let secs = interval.as_millis();
        write(
            "prometheus.yml",
            &format!(
                "global:\n  scrape_interval: {secs}ms\n  evaluation_interval: {secs}ms\n\
                 rule_files: ['{}']\n\
                 scrape_configs:\n  - job_name: nodes\n    static_configs:\n      - targets: [{}]\n",
                dir.join("rules.yml").display(),
                list.join(", ")
            ),
        )?;
        let bin = binary();
        let mut last = None;
        // The port is free when picked; retry if another process takes it.
        for _ in 0..3 {
            let port = free_port()?;
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let child = Command::new(&bin)
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    fail(format!(
                        "cannot run {} (install the Debian package prometheus): {e}",
                        bin.display()
                    ))
                })?;
            let mut server = Self {
                child,
                addr,
                dir: dir.clone(),
            };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    // Keep the directory for the next attempt.
                    let _ = server.child.kill();
                    let _ = server.child.wait();
                    server.dir = PathBuf::new();
                    last = Some(e);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(last.unwrap_or_else(|| fail("prometheus did not start")))
    }

    fn wait_ready(&mut self) -> Result<(), RedisServerError> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(fail(format!("prometheus exited: {status}")));
            }
            if let Ok((200, _)) = self.get("/-/ready") {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(fail("prometheus was not ready within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET path` (one request per connection, within 10 s): status and
    /// body.
    pub fn get(&self, path: &str) -> Result<(u16, String), RedisServerError> {
        crate::http::get(self.addr, path, REQUEST_TIMEOUT)
    }

    fn api(&self, path: &str) -> Result<Value, RedisServerError> {
        let (status, body) = self.get(path)?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| fail(format!("prometheus {path}: {e}: {body}")))?;
        if status != 200 || v["status"] != "success" {
            return Err(fail(format!("prometheus {path}: {status} {body}")));
        }
        Ok(v["data"].clone())
    }

    /// Evaluates `expr` now; an instant vector's samples, or a scalar as
    /// one sample without labels.
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>, RedisServerError> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expr)))?;
        let number = |v: &Value| -> f64 {
            v.as_str()
                .map_or(f64::NAN, |s| s.parse().unwrap_or(f64::NAN))
        };
        match data["resultType"].as_str() {
            Some("vector") => Ok(data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| Sample {
                    labels: labels(&s["metric"]),
                    value: number(&s["value"][1]),
                })
                .collect()),
            Some("scalar") => Ok(vec![Sample {
                labels: Vec::new(),
                value: number(&data["result"][1]),
            }]),
            other => Err(fail(format!("{expr}: unexpected result type {other:?}"))),
        }
    }

    /// The alerts pending or firing now.
    pub fn alerts(&self) -> Result<Vec<Alert>, RedisServerError> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| Alert {
                name: a["labels"]["alertname"].as_str().unwrap_or("").to_owned(),
                state: a["state"].as_str().unwrap_or("").to_owned(),
                labels: labels(&a["labels"]),
            })
            .collect())
    }
}

fn labels(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
        .collect()
}

/// Percent-encodes a query parameter (all but RFC 3986's unreserved
/// characters).
fn encode(s: &str) -> String {
    const QUERY: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(s, QUERY).to_string()
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl std::fmt::Debug for PrometheusServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}
