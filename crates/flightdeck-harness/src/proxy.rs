//! A TCP fault proxy between a client and a server on loopback, switchable
//! at run time: the network faults that a killed or paused Redis cannot
//! show.
//!
//! [`FaultProxy::start`] listens on a free loopback port and forwards every
//! connection to the upstream address. [`FaultProxy::set`] switches the
//! [`Fault`] for new AND open connections:
//!
//! - [`Fault::Pass`]: bytes flow untouched;
//! - [`Fault::Latency`]: every chunk is delivered that much later, in both
//!   directions (chunks stay in order; throughput is not serialized);
//! - [`Fault::Blackhole`]: connections are accepted but nothing is read or
//!   delivered: a partition. Data already sent waits in the socket buffers
//!   and flows again when the fault is lifted (as TCP does when a short
//!   partition heals); combine with [`reset_all`](FaultProxy::reset_all)
//!   for a partition long enough to kill the connections;
//! - [`Fault::Reset`]: new connections, and open ones as soon as they carry
//!   a byte, are reset (RST);
//! - [`Fault::CutMidReply`]: the next server-to-client chunk of each
//!   connection is delivered only in part (half its bytes), then the
//!   connection is reset: a reply cut in the middle.
//!
//! [`reset_all`](FaultProxy::reset_all) resets every open connection at
//! once. [`sever_subscribers`](FaultProxy::sever_subscribers) silently
//! severs the open connections that carried a `SUBSCRIBE` (a subscriber):
//! from then on nothing is forwarded either way and the server's side is
//! closed, but the client's socket stays open (no FIN, no RST), as when a
//! NAT, firewall or load balancer forgets an idle connection. Dropping the proxy stops it and closes every connection; it runs
//! on a thread of its own, so it works with any (or no) tokio runtime and
//! keeps running while a test's runtime is busy.
//!
//! ```no_run
//! use std::time::Duration;
//! use flightdeck_harness::proxy::{Fault, FaultProxy};
//! use flightdeck_harness::RedisServer;
//!
//! let redis = RedisServer::start().unwrap();
//! let proxy = FaultProxy::start(redis.addr()).unwrap();
//! let url = proxy.url(); // give this to the client under test
//! proxy.set(Fault::Latency(Duration::from_millis(50)));
//! proxy.set(Fault::Blackhole);
//! proxy.reset_all();
//! proxy.set(Fault::Pass);
//! println!("{url}: {:?}", proxy.stats());
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::redis::RedisServerError;

/// What the proxy does to the traffic (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward untouched.
    Pass,
    /// Deliver every chunk this much later.
    Latency(Duration),
    /// Accept, never read, never answer.
    Blackhole,
    /// Reset connections (new ones at once, open ones on their next byte).
    Reset,
    /// Deliver half of the next reply chunk, then reset the connection.
    CutMidReply,
}

/// Counters of a [`FaultProxy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub open: u64,
    /// Connections reset by a fault or by [`FaultProxy::reset_all`].
    pub resets: u64,
    /// Replies cut in the middle.
    pub cuts: u64,
    /// Bytes delivered, both directions.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
    resets: AtomicU64,
    cuts: AtomicU64,
    bytes: AtomicU64,
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    fault: watch::Sender<Fault>,
    // Bumped by reset_all: every connection open at that moment is reset.
    epoch: watch::Sender<u64>,
    // Bumped by sever_subscribers: every connection open at that moment
    // is severed once it is (or becomes) a subscriber.
    sever: watch::Sender<u64>,
    counters: Counters,
}

/// A running fault proxy (see the module docs). Stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn fail(msg: impl Into<String>) -> RedisServerError {
    RedisServerError::new(msg)
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards to `upstream`,
    /// in [`Fault::Pass`].
    pub fn start(upstream: SocketAddr) -> Result<Self, RedisServerError> {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| fail(format!("proxy: cannot bind a loopback port: {e}")))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| fail(format!("proxy: {e}")))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| fail(format!("proxy: {e}")))?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            fault: watch::channel(Fault::Pass).0,
            epoch: watch::channel(0).0,
            sever: watch::channel(0).0,
            counters: Counters::default(),
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(format!("proxy: cannot build a runtime: {e}")))?;
        let run_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stop_rx => {}
                        () = accept_loop(listener, run_shared) => {}
                    }
                });
                // Dropping the runtime drops every connection task, which
                // closes their sockets.
                drop(rt);
            })
            .map_err(|e| fail(format!("proxy: cannot spawn its thread: {e}")))?;
        Ok(Self {
            addr,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// Switches the fault, for new and open connections.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Points new connections at another upstream (open ones keep theirs).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = upstream;
    }

    /// Resets (RST) every connection open now.
    pub fn reset_all(&self) {
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// Silently severs every connection open now that carried a
    /// `SUBSCRIBE` (or, still open, carries one later): nothing more is
    /// forwarded either way, the server's side is closed (Redis drops the
    /// subscriptions), the client's is left open and silent. Connections
    /// made afterwards are forwarded.
    pub fn sever_subscribers(&self) {
        self.shared.sever.send_modify(|e| *e += 1);
    }

    /// The counters.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            open: c.open.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            cuts: c.cuts.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("fault", &self.fault())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        shared.counters.open.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(client, &shared).await;
            shared.counters.open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

fn reset(stream: &TcpStream) {
    // Zero linger: closing sends RST instead of FIN.
    let _ = stream.set_zero_linger();
}

/// Whether a connection is a subscriber, and whether it is to be severed
/// as one.
#[derive(Default)]
struct Sever {
    /// It carried a `SUBSCRIBE` (any kind) from the client.
    subscriber: AtomicBool,
    /// `sever_subscribers` was called while it was open.
    asked: AtomicBool,
}

impl Sever {
    fn now(&self) -> bool {
        self.subscriber.load(Ordering::SeqCst) && self.asked.load(Ordering::SeqCst)
    }
}

/// Why a connection ended.
enum End {
    /// A subscriber severed: close the server's side, keep the client's
    /// open and silent.
    Severed,
    /// A peer closed or failed: close normally.
    Closed,
    /// A fault: reset both sides.
    Reset,
    /// A cut reply: reset both sides.
    Cut,
}

async fn connection(client: TcpStream, shared: &Shared) {
    let _ = client.set_nodelay(true);
    let mut fault = shared.fault.subscribe();
    let mut epoch = shared.epoch.subscribe();
    epoch.borrow_and_update();
    let mut sever_calls = shared.sever.subscribe();
    sever_calls.borrow_and_update();
    let sever = Sever::default();
    // Blackholed: hold the client, connect upstream only once healed.
    loop {
        let now = *fault.borrow_and_update();
        match now {
            Fault::Blackhole => {}
            Fault::Reset => {
                reset(&client);
                shared.counters.resets.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => break,
        }
        tokio::select! {
            changed = fault.changed() => if changed.is_err() { return },
            _ = epoch.changed() => {
                reset(&client);
                shared.counters.resets.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let upstream = *shared.upstream.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let end = {
        let up = pump(&mut cr, &mut sw, shared, false, &sever);
        let down = pump(&mut sr, &mut cw, shared, true, &sever);
        let severed = async {
            if sever_calls.changed().await.is_err() {
                return std::future::pending().await;
            }
            sever.asked.store(true, Ordering::SeqCst);
            // A subscriber now; or severed by the reply pump on its next
            // chunk, once it becomes one.
            if !sever.now() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            e = up => e,
            e = down => e,
            _ = epoch.changed() => End::Reset,
            () = severed => End::Severed,
        }
    };
    match end {
        End::Closed => {}
        End::Severed => {
            // The server's side goes; the client's halves are held, unread
            // and unwritten, until the proxy stops.
            drop((sr, sw));
            let _client = (cr, cw);
            std::future::pending::<()>().await
        }
        End::Reset | End::Cut => {
            reset(cr.as_ref());
            reset(sr.as_ref());
            let counter = if matches!(end, End::Cut) {
                &shared.counters.cuts
            } else {
                &shared.counters.resets
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Moves bytes one way, applying the current fault. `reply` is the
/// server-to-client direction.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    shared: &Shared,
    reply: bool,
    sever: &Sever,
) -> End {
    let mut fault = shared.fault.subscribe();
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let now = *fault.borrow_and_update();
        let blackholed = now == Fault::Blackhole;
        let due = queue.front().map(|(at, _)| *at);
        tokio::select! {
            biased;
            changed = fault.changed() => {
                if changed.is_err() {
                    return End::Closed;
                }
            }
            () = async { sleep_until(due.unwrap_or_else(Instant::now)).await }, if due.is_some() && !blackholed => {
                if let Some((_, chunk)) = queue.pop_front() {
                    if to.write_all(&chunk).await.is_err() {
                        return End::Closed;
                    }
                    shared.counters.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            }
            read = from.read(&mut buf), if !blackholed => {
                let n = match read {
                    Ok(0) | Err(_) => {
                        // Deliver what is queued, then pass the close on.
                        for (at, chunk) in queue.drain(..) {
                            sleep_until(at).await;
                            let _ = to.write_all(&chunk).await;
                        }
                        let _ = to.shutdown().await;
                        return End::Closed;
                    }
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                if !reply
                    && chunk
                        .windows(9)
                        .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
                {
                    sever.subscriber.store(true, Ordering::SeqCst);
                }
                if reply && sever.now() {
                    return End::Severed;
                }
                let current = *fault.borrow();
                match current {
                    Fault::Reset => return End::Reset,
                    Fault::CutMidReply if reply => {
                        let half = n / 2;
                        // Whatever is queued goes first, then part of this.
                        for (_, queued) in queue.drain(..) {
                            let _ = to.write_all(&queued).await;
                        }
                        if half > 0 {
                            let _ = to.write_all(&chunk[..half]).await;
                            let _ = to.flush().await;
                            // Let the partial reply reach the client before
                            // the reset (an RST can discard unread data).
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        return End::Cut;
                    }
                    Fault::Latency(d) => {
                        queue.push_back((Instant::now() + d, chunk.to_vec()));
                    }
                    _ if queue.is_empty() => {
                        if to.write_all(chunk).await.is_err() {
                            return End::Closed;
                        }
                        shared.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    _ => {
                        // Latency was lifted: keep the order behind the queue.
                        queue.push_back((Instant::now(), chunk.to_vec()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Write};
    use std::net::TcpStream as StdStream;

    use super::*;
    use crate::redis::{read_resp, Resp};
    use crate::RedisServer;

    fn try_send(stream: &StdStream, args: &[&str]) -> std::io::Result<()> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        (&*stream).write_all(out.as_bytes())
    }

    fn send(stream: &StdStream, args: &[&str]) {
        try_send(stream, args).unwrap();
    }

    fn connect(proxy: &FaultProxy) -> StdStream {
        let s = StdStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    fn ping(s: &StdStream) -> std::io::Result<Resp> {
        try_send(s, &["PING"])?;
        read_resp(&mut BufReader::new(s))
    }

    #[test]
    fn pass_latency_and_drop() {
        let redis = RedisServer::start().unwrap();
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let s = connect(&proxy);
        assert_eq!(ping(&s).unwrap(), Resp::Simple("PONG".into()));
        proxy.set(Fault::Latency(Duration::from_millis(200)));
        let started = std::time::Instant::now();
        assert_eq!(ping(&s).unwrap(), Resp::Simple("PONG".into()));
        // Both directions are delayed: a lower bound, not a timing claim.
        assert!(started.elapsed() >= Duration::from_millis(400));
        proxy.set(Fault::Pass);
        assert_eq!(ping(&s).unwrap(), Resp::Simple("PONG".into()));
        assert_eq!(proxy.stats().accepted, 1);
        let addr = proxy.addr();
        drop(proxy);
        // Stopped: the open connection is closed, the port refuses.
        let mut buf = [0u8; 1];
        assert!(matches!(
            std::io::Read::read(&mut &s, &mut buf),
            Ok(0) | Err(_)
        ));
        assert!(StdStream::connect(addr).is_err());
    }

    #[test]
    fn blackhole_stalls_and_heals() {
        let redis = RedisServer::start().unwrap();
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let open = connect(&proxy);
        assert_eq!(ping(&open).unwrap(), Resp::Simple("PONG".into()));
        proxy.set(Fault::Blackhole);
        // An open connection and a new one: accepted, never answered.
        let fresh = connect(&proxy);
        for s in [&open, &fresh] {
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            send(s, &["PING"]);
            let e = read_resp(&mut BufReader::new(s)).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{e}"
            );
        }
        // Healed: the stalled PINGs are delivered.
        proxy.set(Fault::Pass);
        for s in [&open, &fresh] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(
                read_resp(&mut BufReader::new(s)).unwrap(),
                Resp::Simple("PONG".into())
            );
        }
    }

    #[test]
    fn resets_new_and_open_connections() {
        let redis = RedisServer::start().unwrap();
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let open = connect(&proxy);
        assert_eq!(ping(&open).unwrap(), Resp::Simple("PONG".into()));
        proxy.reset_all();
        assert!(ping(&open).is_err(), "reset_all reset the open connection");
        crate::wait_until("the reset counted", Duration::from_secs(5), || {
            proxy.stats().resets == 1
        });

        proxy.set(Fault::Reset);
        let fresh = connect(&proxy);
        assert!(ping(&fresh).is_err(), "new connections are reset");
        proxy.set(Fault::Pass);
        let again = connect(&proxy);
        assert_eq!(ping(&again).unwrap(), Resp::Simple("PONG".into()));
        assert!(proxy.stats().resets >= 2);
    }

    #[test]
    fn cuts_a_reply_in_the_middle() {
        let redis = RedisServer::start().unwrap();
        let value = "x".repeat(4000);
        redis.cmd(&["SET", "big", &value]).unwrap();
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let s = connect(&proxy);
        assert_eq!(ping(&s).unwrap(), Resp::Simple("PONG".into()));
        proxy.set(Fault::CutMidReply);
        send(&s, &["GET", "big"]);
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut &s, &mut got);
        assert!(!got.is_empty(), "part of the reply arrived");
        assert!(got.len() < value.len(), "but not all of it: {}", got.len());
        crate::wait_until("the cut counted", Duration::from_secs(5), || {
            proxy.stats().cuts == 1
        });
        proxy.set(Fault::Pass);
        let again = connect(&proxy);
        send(&again, &["GET", "big"]);
        assert_eq!(
            read_resp(&mut BufReader::new(&again)).unwrap().as_str(),
            Some(value.as_str())
        );
    }
}
