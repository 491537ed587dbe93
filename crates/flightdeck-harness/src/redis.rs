//! Real `redis-server` processes for tests.
//!
//! (Over 600 lines on purpose: one process type with its faults and its
//! replica and cluster start-up; its `cmd` speaks RESP2 through
//! `redis-protocol`, over a plain blocking connection.)
//!
//! [`RedisServer::start`] picks a free loopback port, starts `redis-server`
//! with no persistence (`--save "" --appendonly no`) and waits until it
//! answers `PING`. The process is killed when the value is dropped. Faults:
//! [`kill`](RedisServer::kill), [`pause`](RedisServer::pause) /
//! [`resume`](RedisServer::resume) (SIGSTOP / SIGCONT),
//! [`restart`](RedisServer::restart) on the same port,
//! [`flush_scripts`](RedisServer::flush_scripts). [`cmd`](RedisServer::cmd)
//! sends one command over a plain connection (for `INFO`, `SET`, ...);
//! [`send`](RedisServer::send) sends one without waiting for its reply (a
//! long script, `DEBUG RELOAD`: commands that hold the server).
//!
//! The binary is looked up in `$FLIGHTDECK_REDIS_SERVER`, then `PATH`, then
//! `/usr/bin`; if it is missing, `start` fails with a message naming it and
//! how to install it.
//!
//! ```no_run
//! use flightdeck_harness::RedisServer;
//!
//! let mut redis = RedisServer::start().unwrap();
//! assert_eq!(redis.cmd(&["PING"]).unwrap().as_str(), Some("PONG"));
//! redis.pause().unwrap();
//! redis.resume().unwrap();
//! redis.restart().unwrap();
//! println!("{}", redis.url());
//! ```

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode;
use redis_protocol::resp2::types::{OwnedFrame, Resp2Frame};

/// How long to wait for a started server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of [`RedisServer::cmd`].
const CMD_TIMEOUT: Duration = Duration::from_secs(5);

/// A `redis-server` process owned by a test (see the module docs).
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    child: Option<Child>,
    paused: bool,
    extra: Vec<String>,
    dir: PathBuf,
    // A config file given before every other argument (sentinels need one
    // they can rewrite), and `--sentinel`.
    conf_file: Option<PathBuf>,
    sentinel: bool,
    // Listens on TLS only (`--port 0 --tls-port PORT`).
    tls: bool,
    // Sent as AUTH before every `cmd`.
    auth: Option<(String, String)>,
}

/// A config file's text for a server on `port` (see
/// [`RedisServer::start_configured`]).
pub(crate) type ConfText<'a> = &'a dyn Fn(u16) -> String;

/// Starting or controlling a [`RedisServer`] failed.
#[derive(Debug)]
pub struct RedisServerError(String);

impl fmt::Display for RedisServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedisServerError {}

impl RedisServerError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

fn err(msg: impl Into<String>) -> RedisServerError {
    RedisServerError(msg.into())
}

/// `INFO replication`, as text (empty if the reply is not a bulk string).
fn replication_info(server: &RedisServer) -> Result<String, RedisServerError> {
    Ok(match server.cmd(&["INFO", "replication"])? {
        Resp::Bulk(Some(info)) => String::from_utf8_lossy(&info).into_owned(),
        _ => String::new(),
    })
}

fn find_binary() -> Result<PathBuf, RedisServerError> {
    find_binary_in(
        std::env::var_os("FLIGHTDECK_REDIS_SERVER"),
        std::env::var_os("PATH").unwrap_or_default(),
    )
}

const INSTALL_HINT: &str =
    "install it (Debian/Ubuntu: `apt-get install -y redis-server`, macOS: `brew install redis`)";

fn find_binary_in(
    explicit: Option<std::ffi::OsString>,
    path: std::ffi::OsString,
) -> Result<PathBuf, RedisServerError> {
    if let Some(p) = explicit {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(err(format!(
            "redis-server not found at {} (from $FLIGHTDECK_REDIS_SERVER); {INSTALL_HINT}",
            p.display()
        )));
    }
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
        let cand = dir.join("redis-server");
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(err(format!(
        "redis-server not found in $FLIGHTDECK_REDIS_SERVER, PATH or /usr/bin; {INSTALL_HINT}"
    )))
}

/// Sends `signal` (`SIGSTOP`, `SIGCONT`, ...) to a process: for processes
/// a test started itself (a data node of a
/// [`RedisSentinel`](crate::RedisSentinel), a [`NodeProcess`](crate::node::NodeProcess)).
pub fn send_signal(pid: u32, signal: Signal) -> Result<(), RedisServerError> {
    let target = i32::try_from(pid).map_err(|_| err(format!("no such process id: {pid}")))?;
    kill(Pid::from_raw(target), signal).map_err(|e| err(format!("kill -{signal} {pid}: {e}")))
}

/// A free loopback port, as the OS hands out for port 0.
pub fn free_port() -> Result<u16, RedisServerError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| err(format!("cannot bind a loopback port: {e}")))?;
    let port = l
        .local_addr()
        .map_err(|e| err(format!("cannot read the bound port: {e}")))?
        .port();
    Ok(port)
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    pub fn start() -> Result<Self, RedisServerError> {
        Self::start_with(&[], free_port)
    }

    /// Starts a server with extra `redis-server` arguments, on a port chosen
    /// by `pick_port`, in a fresh working directory of its own.
    pub(crate) fn start_with(
        extra: &[&str],
        pick_port: impl Fn() -> Result<u16, RedisServerError>,
    ) -> Result<Self, RedisServerError> {
        Self::start_configured(extra, None, false, pick_port)
    }

    /// Starts a server with extra arguments, an optional config file
    /// (written once into its directory, kept across restarts) and, if
    /// `sentinel`, in sentinel mode.
    pub(crate) fn start_configured(
        extra: &[&str],
        conf: Option<ConfText<'_>>,
        sentinel: bool,
        pick_port: impl Fn() -> Result<u16, RedisServerError>,
    ) -> Result<Self, RedisServerError> {
        let binary = find_binary()?;
        let mut last = None;
        // The port is free when picked; another process may grab it before
        // redis binds it, so try a few.
        for _ in 0..5 {
            let port = pick_port()?;
            let dir = std::env::temp_dir()
                .join(format!("flightdeck-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
            let conf_file = match conf {
                Some(text) => {
                    let path = dir.join("redis.conf");
                    std::fs::write(&path, text(port))
                        .map_err(|e| err(format!("cannot write {}: {e}", path.display())))?;
                    Some(path)
                }
                None => None,
            };
            let mut server = Self {
                binary: binary.clone(),
                port,
                child: None,
                paused: false,
                extra: extra.iter().map(|a| (*a).to_owned()).collect(),
                dir,
                conf_file,
                sentinel,
                tls: extra.contains(&"--tls-port"),
                auth: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| err("could not start redis-server")))
    }

    fn spawn(&mut self) -> Result<(), RedisServerError> {
        let mut command = Command::new(&self.binary);
        if let Some(conf) = &self.conf_file {
            command.arg(conf);
        }
        if self.sentinel {
            command.arg("--sentinel");
        }
        let child = command
            .args(if self.tls {
                vec!["--port", "0", "--tls-port"]
            } else {
                vec!["--port"]
            })
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--dir",
                &self.dir.to_string_lossy(),
                "--loglevel",
                "warning",
            ])
            // `--tls-port` alone marks a TLS server (see `start_tls`).
            .args(self.extra.iter().filter(|a| *a != "--tls-port"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| err(format!("cannot run {}: {e}", self.binary.display())))?;
        self.child = Some(child);
        self.paused = false;
        let started = Instant::now();
        loop {
            if self.tls {
                // No plain port to PING: listening is ready enough, TLS
                // clients retry their handshake.
                if TcpStream::connect_timeout(&self.addr(), CMD_TIMEOUT).is_ok() {
                    return Ok(());
                }
            } else {
                match self.cmd(&["PING"]) {
                    Ok(Resp::Simple(pong)) if pong == "PONG" => return Ok(()),
                    // Up, and wants credentials.
                    Ok(Resp::Error(e)) if e.starts_with("NOAUTH") => return Ok(()),
                    _ => {}
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(err(format!(
                        "redis-server exited at start on port {} ({status})",
                        self.port
                    )));
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                self.kill();
                return Err(err(format!(
                    "redis-server did not answer PING on port {} within {READY_TIMEOUT:?}",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a server with extra `redis-server` arguments (for example
    /// `["--requirepass", "secret"]` or an ACL user
    /// `["--user", "app", "on", ">pw", "~*", "&*", "+@all"]`) on a free
    /// loopback port. A server that requires a password is ready once it
    /// answers `NOAUTH`; give [`with_auth`](Self::with_auth) the credentials
    /// for [`cmd`](Self::cmd).
    pub fn start_with_args(args: &[&str]) -> Result<Self, RedisServerError> {
        Self::start_with(args, free_port)
    }

    /// Starts a server that listens on TLS only (`--port 0 --tls-port
    /// PORT`), with the given PEM files and no client certificates
    /// required. [`cmd`](Self::cmd) does not speak TLS: use a TLS client.
    pub fn start_tls(
        cert_file: &std::path::Path,
        key_file: &std::path::Path,
        ca_file: &std::path::Path,
    ) -> Result<Self, RedisServerError> {
        let (cert, key, ca) = (
            cert_file.to_string_lossy().into_owned(),
            key_file.to_string_lossy().into_owned(),
            ca_file.to_string_lossy().into_owned(),
        );
        Self::start_with(
            &[
                "--tls-port",
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
            ],
            free_port,
        )
    }

    /// Credentials sent (`AUTH user pass`) before every [`cmd`](Self::cmd).
    pub fn with_auth(mut self, user: &str, password: &str) -> Self {
        self.auth = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// `rediss://127.0.0.1:PORT`, for a server started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn signal(&self, sig: Signal) -> Result<(), RedisServerError> {
        let pid = self
            .pid()
            .ok_or_else(|| err("redis-server is not running"))?;
        send_signal(pid, sig)
    }

    /// Kills the process (SIGKILL) and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing
    /// answers.
    pub fn pause(&mut self) -> Result<(), RedisServerError> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&mut self) -> Result<(), RedisServerError> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// Kills the process if it runs, then starts a new one on the same port
    /// (empty: no persistence) and waits until it answers.
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.kill();
        let started = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                // The old socket may linger briefly.
                Err(e) if started.elapsed() > READY_TIMEOUT => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Starts a replica of `primary` (`--replicaof`) on a free loopback
    /// port and waits (up to 10 s) until it acknowledges writes: `primary`
    /// lists it online and it acknowledged a write made after that (so
    /// that `WAIT` counts it from then on). Sets the primary's
    /// `repl-diskless-sync-delay` to 0 first, so the sync starts at once.
    pub fn start_replica_of(primary: &RedisServer) -> Result<Self, RedisServerError> {
        primary.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])?;
        let port = primary.port().to_string();
        let replica = Self::start_with_args(&["--replicaof", "127.0.0.1", &port])?;
        let online = format!("port={},state=online,offset=", replica.port());
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let mut written: Option<u64> = None;
        loop {
            let info = replication_info(primary)?;
            let field = |after: &str| -> Option<u64> {
                let rest = &info[info.find(after)? + after.len()..];
                let end = rest
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                rest[..end].parse().ok()
            };
            match (written, field(&online)) {
                (Some(w), Some(acked)) if acked >= w => return Ok(replica),
                (None, Some(_)) => {
                    primary.cmd(&["SET", "flightdeck-harness:replica-probe", "1"])?;
                    written = field("master_repl_offset:").map(|o| o + 1);
                }
                _ => {}
            }
            if std::time::Instant::now() >= until {
                return Err(err("the replica did not acknowledge a write within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `SCRIPT FLUSH`: empties the script cache (as a restart or failover
    /// would).
    pub fn flush_scripts(&self) -> Result<(), RedisServerError> {
        match self.cmd(&["SCRIPT", "FLUSH"])? {
            Resp::Simple(s) if s == "OK" => Ok(()),
            other => Err(err(format!("SCRIPT FLUSH answered {other:?}"))),
        }
    }

    /// Sends one command on a fresh connection and reads the reply.
    pub fn cmd(&self, args: &[&str]) -> Result<Resp, RedisServerError> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd_bytes(&args)
    }

    /// Like [`cmd`](Self::cmd), with binary arguments.
    pub fn cmd_bytes(&self, args: &[&[u8]]) -> Result<Resp, RedisServerError> {
        self.send_bytes(args)?.reply()
    }

    /// Sends one command on a fresh connection and returns without reading
    /// the reply, for a command that holds the server (`EVAL` of a long
    /// script, `DEBUG RELOAD`, `DEBUG SLEEP`) while the test goes on. The
    /// connection stays open until the [`Pending`] is dropped or its
    /// [`reply`](Pending::reply) read.
    pub fn send(&self, args: &[&str]) -> Result<Pending, RedisServerError> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_bytes(&args)
    }

    fn send_bytes(&self, args: &[&[u8]]) -> Result<Pending, RedisServerError> {
        let port = self.port;
        let io = |e: std::io::Error| err(format!("redis on port {port}: {e}"));
        let stream = TcpStream::connect_timeout(&self.addr(), CMD_TIMEOUT).map_err(io)?;
        stream.set_read_timeout(Some(CMD_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(CMD_TIMEOUT)).map_err(io)?;
        let out = encode_command(args).map_err(io)?;
        let mut reader = BufReader::new(stream);
        if let Some((user, pass)) = &self.auth {
            let auth = encode_command(&[b"AUTH", user.as_bytes(), pass.as_bytes()]).map_err(io)?;
            reader.get_ref().write_all(&auth).map_err(io)?;
            match read_resp(&mut reader).map_err(io)? {
                Resp::Simple(ok) if ok == "OK" => {}
                other => return Err(err(format!("AUTH answered {other:?}"))),
            }
        }
        reader.get_ref().write_all(&out).map_err(io)?;
        Ok(Pending { reader, port })
    }

    /// Sum of `calls` over every command in `INFO commandstats` whose name
    /// starts with `prefix` (e.g. `evalsha`, `publish`).
    pub fn command_calls(&self, prefix: &str) -> Result<u64, RedisServerError> {
        self.command_stat(prefix, "calls")
    }

    /// Sum of `usec` (server time, µs) over every command in `INFO
    /// commandstats` whose name starts with `prefix`: a script's includes
    /// the commands it ran.
    pub fn command_usec(&self, prefix: &str) -> Result<u64, RedisServerError> {
        self.command_stat(prefix, "usec")
    }

    /// Sum of the field `stat` (`calls`, `usec`) of `INFO commandstats`
    /// over the commands whose name starts with `prefix`.
    fn command_stat(&self, prefix: &str, stat: &str) -> Result<u64, RedisServerError> {
        let info = self.cmd(&["INFO", "commandstats"])?;
        let text = info
            .as_str()
            .ok_or_else(|| err("INFO did not answer text"))?
            .to_owned();
        let field = format!("{stat}=");
        let mut total = 0;
        for line in text.lines() {
            // cmdstat_evalsha:calls=3,usec=...
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, stats)) = rest.split_once(':') else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            if let Some(n) = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(field.as_str()))
                .and_then(|v| v.parse::<u64>().ok())
            {
                total += n;
            }
        }
        Ok(total)
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("extra", &self.extra)
            .field("pid", &self.pid())
            .field("paused", &self.paused)
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.paused {
            // A stopped process still dies of SIGKILL; resume anyway so it
            // never lingers stopped if the kill fails.
            let _ = self.signal(Signal::SIGCONT);
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command sent by [`RedisServer::send`] whose reply is not read yet.
#[derive(Debug)]
pub struct Pending {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl Pending {
    /// Reads the reply (waiting up to 5 s for it).
    pub fn reply(mut self) -> Result<Resp, RedisServerError> {
        read_resp(&mut self.reader).map_err(|e| err(format!("redis on port {}: {e}", self.port)))
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$n ...` (None for nil: `$-1`, and `*-1`, which decodes the same)
    Bulk(Option<Vec<u8>>),
    /// `*n ...` (never None: a nil array is read as `Bulk(None)`)
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text, for simple strings and UTF-8 bulk strings.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Simple(s) => Some(s),
            Self::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

fn bad(e: impl fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// A command as RESP2 (an array of bulk strings).
fn encode_command(args: &[&[u8]]) -> std::io::Result<Vec<u8>> {
    let frame = OwnedFrame::Array(
        args.iter()
            .map(|a| OwnedFrame::BulkString(a.to_vec()))
            .collect(),
    );
    let mut out = vec![0; frame.encode_len(false)];
    encode(&mut out, &frame, false).map_err(bad)?;
    Ok(out)
}

/// Reads one reply, and no byte past it.
pub(crate) fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut buf = Vec::new();
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed before a whole reply",
            ));
        }
        let before = buf.len();
        buf.extend_from_slice(chunk);
        match decode(&buf).map_err(bad)? {
            Some((frame, used)) => {
                r.consume(used - before);
                return Ok(Resp::from(frame));
            }
            None => {
                let read = buf.len() - before;
                r.consume(read);
            }
        }
    }
}

impl From<OwnedFrame> for Resp {
    fn from(frame: OwnedFrame) -> Self {
        match frame {
            OwnedFrame::SimpleString(s) => Self::Simple(String::from_utf8_lossy(&s).into_owned()),
            OwnedFrame::Error(e) => Self::Error(e),
            OwnedFrame::Integer(n) => Self::Int(n),
            OwnedFrame::BulkString(b) => Self::Bulk(Some(b)),
            OwnedFrame::Array(items) => {
                Self::Array(Some(items.into_iter().map(Self::from).collect()))
            }
            // RESP2 has two nils (`$-1` and `*-1`), read as one.
            OwnedFrame::Null => Self::Bulk(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_named_with_the_install_command() {
        let e = find_binary_in(Some("/nonexistent/redis-server".into()), "".into()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("redis-server not found at /nonexistent/redis-server"),
            "{msg}"
        );
        assert!(msg.contains("apt-get install -y redis-server"), "{msg}");
    }

    #[test]
    fn resp_replies_parse() {
        let mut input: &[u8] = b"*3\r\n+OK\r\n$-1\r\n:-2\r\n";
        assert_eq!(
            read_resp(&mut input).unwrap(),
            Resp::Array(Some(vec![
                Resp::Simple("OK".into()),
                Resp::Bulk(None),
                Resp::Int(-2)
            ]))
        );
        for bad in [&b""[..], b"?x\r\n", b"$x\r\n", b"$5\r\nab"] {
            let mut input = bad;
            assert!(read_resp(&mut input).is_err());
        }
    }
}
