//! A multi-process harness: [`NodeProcess`] starts the `flightdeck-node`
//! binary (feature `node`: an L1 + L2 stack over Redis behind a minimal
//! HTTP server) as a separate process and drives it over HTTP. Several
//! processes against one Redis are a small deployment; they can be paused
//! (SIGSTOP) or killed like the Redis processes. Each is killed when
//! dropped.
//!
//! The binary's path comes from the caller: in this crate's integration
//! tests `env!("CARGO_BIN_EXE_flightdeck-node")`.
//!
//! ```no_run
//! use std::path::Path;
//! use flightdeck_harness::node::NodeProcess;
//! use flightdeck_harness::RedisServer;
//!
//! let redis = RedisServer::start().unwrap();
//! let node = NodeProcess::start(Path::new("target/debug/flightdeck-node"), &redis.url(), &[]).unwrap();
//! let (status, body) = node.get("/flight/report-42").unwrap();
//! assert_eq!(status, 200);
//! assert!(body.starts_with("report-42|"));
//! ```

use std::fmt;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::redis::RedisServerError;

/// How long a request to a node may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `flightdeck-node` process (see the module docs).
pub struct NodeProcess {
    child: Child,
    addr: SocketAddr,
    paused: bool,
}

fn fail(msg: impl Into<String>) -> RedisServerError {
    RedisServerError::new(msg)
}

impl NodeProcess {
    /// Starts `binary --redis redis_url EXTRA...` and waits for its
    /// `listening ADDR` line.
    pub fn start(binary: &Path, redis_url: &str, extra: &[&str]) -> Result<Self, RedisServerError> {
        let mut child = Command::new(binary)
            .args(["--redis", redis_url])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", binary.display())))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| fail("node stdout not captured"))?;
        // The first line, read on a thread so a silent node cannot hang us.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(
                    "flightdeck-node did not report its address within 20 s",
                ));
            }
        };
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(fail(format!(
                "flightdeck-node said {line:?}, not `listening ADDR`"
            )));
        };
        Ok(Self {
            child,
            addr,
            paused: false,
        })
    }

    /// The node's HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET path` (one request per connection, within 30 s): the status
    /// and the body.
    pub fn get(&self, path: &str) -> Result<(u16, String), RedisServerError> {
        crate::http::get(self.addr, path, REQUEST_TIMEOUT)
    }

    /// `GET /stats`.
    pub fn stats(&self) -> Result<NodeStats, RedisServerError> {
        let (_, body) = self.get("/stats")?;
        NodeStats::parse(&body)
    }

    fn signal(&self, sig: Signal) -> Result<(), RedisServerError> {
        crate::redis::send_signal(self.child.id(), sig)
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&mut self) -> Result<(), RedisServerError> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&mut self) -> Result<(), RedisServerError> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if self.paused {
            let _ = self.signal(Signal::SIGCONT);
            self.paused = false;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` from the node at `addr` without blocking the runtime.
pub use crate::http::get_async;

/// A node's `GET /stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Executions of the work so far.
    pub executions: u64,
    /// Executions running now.
    pub working: u64,
    /// L1 flights running.
    pub running: u64,
    /// L1 in-flight map entries.
    pub entries: u64,
    /// Flights this node's followers wait on (registered on its inbox).
    pub subscriptions: u64,
}

impl NodeStats {
    /// Parses the body of `GET /stats`.
    pub fn parse(body: &str) -> Result<Self, RedisServerError> {
        let field = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .ok_or_else(|| fail(format!("no {name} in {body:?}")))
        };
        Ok(Self {
            executions: field("executions")?,
            working: field("working")?,
            running: field("running")?,
            entries: field("entries")?,
            subscriptions: field("subscriptions")?,
        })
    }

    /// Nothing in flight: no L1 flight, no map entry, no subscription.
    pub fn idle(&self) -> bool {
        (self.running, self.entries, self.subscriptions) == (0, 0, 0)
    }
}

impl fmt::Debug for NodeProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeProcess")
            .field("pid", &self.child.id())
            .field("addr", &self.addr)
            .field("paused", &self.paused)
            .finish()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
