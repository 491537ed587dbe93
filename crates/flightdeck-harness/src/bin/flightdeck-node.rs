//! `flightdeck-node`: one node of a multi-process test. An L1
//! (`LocalFlightLayer`) + L2 (`DistributedFlightLayer` over `RedisBackend`)
//! stack in front of a fake expensive call, served over a minimal HTTP/1.1
//! on a free loopback port (printed as the first stdout line,
//! `listening 127.0.0.1:PORT`). Driven by
//! `flightdeck_harness::node::NodeProcess`.
//!
//! ```text
//! flightdeck-node --redis redis://127.0.0.1:6390 [--work-ms 200] [--lease-ms 1500]
//!                 [--chaos 1] [--journal PATH]
//! GET /flight/{key}  -> 200 "{key}|{generation}|{pid}" or 503 "{ErrorClass:?} {error}"
//! GET /stats         -> 200 "executions N\nworking N\nrunning N\nentries N\nsubscriptions N\n"
//! GET /idle          -> 200 "idle" once the L2 background work (commits,
//!                       abandons, lease releases) is done, 503 "busy" after 10 s
//! ```
//!
//! `--chaos 1` takes the chaos suite's settings (`flightdeck_harness::chaos`:
//! its L2 policy and L1 wait timeout, short Redis timeouts, work lasting
//! `chaos::work_duration(key)`); `--work-ms` and `--lease-ms` are then
//! ignored. `--journal PATH` appends every grant, commit, lost or failed
//! heartbeat and execution start and end to PATH as JSON lines, flushed one
//! by one (a `Recorder` logging to an `EventLog`), for the test to merge
//! after the run, also from killed processes.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::{BoxError, ErrorClass};
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedPolicy, FencingToken, PostcardCodec,
};
use flightdeck_harness::chaos;
use flightdeck_harness::recorder::EventLog;
use flightdeck_harness::Recorder;
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

#[derive(Clone, Debug)]
struct Req {
    key: String,
    fence: Option<FencingToken>,
}

type Svc = BoxCloneService<Req, String, BoxError>;

fn key_of(req: &Req) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(
        StageName::new("node").expect("valid stage"),
        &req.key,
    ))
}

struct Args {
    redis: String,
    work: Duration,
    lease: Duration,
    chaos: bool,
    journal: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        redis: String::new(),
        work: Duration::from_millis(200),
        lease: Duration::from_millis(1500),
        chaos: false,
        journal: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let ms = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--redis" => out.redis = value.clone(),
            "--work-ms" => out.work = ms()?,
            "--lease-ms" => out.lease = ms()?,
            "--chaos" => out.chaos = value == "1",
            "--journal" => out.journal = Some(PathBuf::from(&value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if out.redis.is_empty() {
        return Err(
            "usage: flightdeck-node --redis URL [--work-ms N] [--lease-ms N] [--chaos 1] [--journal PATH]"
                .into(),
        );
    }
    Ok(out)
}

/// Counts a running execution while alive (the work may be cancelled).
struct Working(Arc<AtomicU64>);

impl Working {
    fn start(count: &Arc<AtomicU64>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args = args()?;
    let mut config = RedisConfig::new(args.redis.clone()).command_timeout(chaos::CALL_TIMEOUT);
    if args.chaos {
        config = config
            .connect_timeout(Duration::from_secs(1))
            .reconnect_max_delay(Duration::from_millis(200));
    }
    let backend = RedisBackend::connect(config).await?;
    let log = match &args.journal {
        Some(path) => Some(EventLog::append_to(path)?),
        None => None,
    };
    let mut recorder = Recorder::new(backend.clone());
    if let Some(log) = &log {
        recorder = recorder.logging_to(log.clone());
    }
    let policy = if args.chaos {
        chaos::distributed_policy()
    } else {
        DistributedPolicy::new()
            .lease(args.lease)
            .heartbeat(args.lease / 4)
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(args.lease * 4)
            .result_ttl(Duration::from_secs(60))
            .call_timeout(Duration::from_millis(300))
    };
    let l2 = DistributedFlightLayer::new(
        recorder,
        policy,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        key_of,
    )
    .map(|l| l.fence(|req: &mut Req, token: FencingToken| req.fence = Some(token)))?;
    let local = if args.chaos {
        FlightPolicy::new().wait_timeout(Some(chaos::LOCAL_WAIT_TIMEOUT))
    } else {
        FlightPolicy::new()
    };
    let l1 = LocalFlightLayer::with_key(local, key_of as fn(&Req) -> Option<FlightKey>);
    let executions = Arc::new(AtomicU64::new(0));
    let working = Arc::new(AtomicU64::new(0));
    let work = {
        let (executions, working) = (executions.clone(), working.clone());
        let (chaos, pause) = (args.chaos, args.work);
        service_fn(move |req: Req| {
            let (executions, working, log) = (executions.clone(), working.clone(), log.clone());
            async move {
                let _working = Working::start(&working);
                executions.fetch_add(1, Ordering::SeqCst);
                let generation = req.fence.map_or(0, |f| f.generation);
                if let Some(log) = &log {
                    chaos::log_exec_start(log, &req.key, generation);
                }
                let pause = if chaos {
                    chaos::work_duration(&req.key)
                } else {
                    pause
                };
                tokio::time::sleep(pause).await;
                if let Some(log) = &log {
                    chaos::log_exec_end(log, &req.key, generation);
                }
                Ok::<_, BoxError>(format!("{}|{generation}|{}", req.key, std::process::id()))
            }
        })
    };
    let flights = l2.flights().clone();
    let svc: Svc = BoxCloneService::new(l1.clone().layer(l2.layer(work)));

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let (svc, l1, backend) = (svc.clone(), l1.clone(), backend.clone());
        let flights = flights.clone();
        let (executions, working) = (executions.clone(), working.clone());
        tokio::spawn(async move {
            let stats = || {
                format!(
                    "executions {}\nworking {}\nrunning {}\nentries {}\nsubscriptions {}\n",
                    executions.load(Ordering::SeqCst),
                    working.load(Ordering::SeqCst),
                    l1.running_flights(),
                    l1.map_entries(),
                    backend.followed_flights()
                )
            };
            let idle = async move {
                tokio::time::timeout(Duration::from_secs(10), flights.idle())
                    .await
                    .is_ok()
            };
            let _ = serve(stream, svc, stats, idle).await;
        });
    }
}

/// One request per connection (`Connection: close`).
async fn serve(
    stream: TcpStream,
    svc: Svc,
    stats: impl Fn() -> String,
    idle: impl std::future::Future<Output = bool>,
) -> Result<(), Infallible> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).await.is_err() {
        return Ok(());
    }
    // Skip the headers.
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header).await {
            Ok(0) | Err(_) => break,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => {}
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if let Some(key) = path.strip_prefix("/flight/") {
        let req = Req {
            key: key.to_owned(),
            fence: None,
        };
        match svc.oneshot(req).await {
            Ok(v) => ("200 OK", v),
            Err(e) => (
                "503 Service Unavailable",
                format!("{:?} {e}", ErrorClass::of(&*e)),
            ),
        }
    } else if path == "/stats" {
        ("200 OK", stats())
    } else if path == "/idle" {
        if idle.await {
            ("200 OK", "idle".to_owned())
        } else {
            ("503 Service Unavailable", "busy".to_owned())
        }
    } else {
        ("404 Not Found", "not found".to_owned())
    };
    let mut stream = reader.into_inner();
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
    Ok(())
}
