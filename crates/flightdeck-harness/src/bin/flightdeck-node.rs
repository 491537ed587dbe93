//! `flightdeck-node`: one node of a multi-process test. An L1
//! (`LocalFlightLayer`) + L2 (`DistributedFlightLayer` over `RedisBackend`)
//! stack in front of a fake expensive call, served over HTTP/1.1 (axum) on
//! a free loopback port (printed as the first stdout line,
//! `listening 127.0.0.1:PORT`). Driven by
//! `flightdeck_harness::node::NodeProcess`.
//!
//! ```text
//! flightdeck-node --redis redis://127.0.0.1:6390 [--work-ms 200] [--lease-ms 1500]
//!                 [--chaos 1] [--journal PATH] [--stale EPOCH_US]
//! GET /flight/{key}  -> 200 "{key}|{generation}|{pid}" or 503 "{ErrorClass:?} {error}";
//!                       with --stale, 200 "{key}|{generation}|{pid}|{how}"
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
//!
//! `--stale EPOCH_US` (with `--chaos 1`) turns the stage's stale windows
//! on (`chaos::stale_policy`) and sends each request to L2 alone, whose
//! answer says how it was given (`how`: `chaos::answered_to_text`); the
//! work fails (as an execution timeout) while `chaos::work_down` of the
//! time since EPOCH_US (wall clock, microseconds since the Unix epoch),
//! so every node's failing phases are the same.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use flightdeck_core::error::{BoxError, DeadlineExceeded, ErrorClass};
use flightdeck_core::{CloneShare, FlightKey, Shareable, StageName};
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedFlights, DistributedPolicy, Execute, FencingToken,
    PostcardCodec, Propagate, Role,
};
use flightdeck_harness::chaos;
use flightdeck_harness::recorder::{wall_us, EventLog};
use flightdeck_harness::Recorder;
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Layer, ServiceExt};

#[derive(Clone, Debug)]
struct Req {
    key: String,
    fence: Option<FencingToken>,
}

type Svc = BoxCloneSyncService<Req, String, BoxError>;

type KeyOf = fn(&Req) -> Option<FlightKey>;

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
    /// `--stale`: the wall-clock microseconds the work's failing phases
    /// count from.
    stale: Option<u64>,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        redis: String::new(),
        work: Duration::from_millis(200),
        lease: Duration::from_millis(1500),
        chaos: false,
        journal: None,
        stale: None,
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
            "--stale" => {
                out.stale = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if out.redis.is_empty() {
        return Err(
            "usage: flightdeck-node --redis URL [--work-ms N] [--lease-ms N] [--chaos 1] [--journal PATH] [--stale EPOCH_US]"
                .into(),
        );
    }
    if out.stale.is_some() && !out.chaos {
        return Err("--stale needs --chaos 1".into());
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
    let policy = if args.stale.is_some() {
        chaos::stale_policy()
    } else if args.chaos {
        chaos::distributed_policy()
    } else {
        DistributedPolicy::new()
            .lease(args.lease)
            .heartbeat(args.lease / 4)
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(args.lease * 4)
            .replay_ttl(Duration::from_secs(60))
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
    let l1 = LocalFlightLayer::with_key(local, key_of as KeyOf);
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
    let stale = args.stale.map(|epoch_us| StaleWork {
        work: BoxCloneSyncService::new(work.clone()),
        epoch_us,
    });
    let svc: Svc = BoxCloneSyncService::new(l1.clone().layer(l2.layer(work)));

    let node = Node {
        svc,
        l1,
        backend,
        flights,
        executions,
        working,
        stale,
    };
    let app = Router::new()
        .route("/flight/{key}", get(flight))
        .route("/stats", get(stats))
        .route("/idle", get(idle))
        .with_state(node);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// What the routes read.
#[derive(Clone)]
struct Node {
    svc: Svc,
    l1: LocalFlightLayer<KeyOf, CloneShare<String>>,
    backend: RedisBackend,
    flights: DistributedFlights<Recorder<RedisBackend>, PostcardCodec<String>>,
    executions: Arc<AtomicU64>,
    working: Arc<AtomicU64>,
    /// `--stale`: requests go to L2 alone, with this work.
    stale: Option<StaleWork>,
}

/// The work of a stale run: the node's work, failing as an execution
/// timeout while [`chaos::work_down`] since the run's epoch.
#[derive(Clone)]
struct StaleWork {
    work: Svc,
    epoch_us: u64,
}

impl Execute<Req> for StaleWork {
    type Shared = String;
    type Output = String;

    async fn execute(self, req: Req, role: Role) -> Result<Shareable<String, String>, BoxError> {
        // The owner's fencing token names the generation it runs.
        let fence = match role {
            Role::Owner(token) => Some(token),
            _ => None,
        };
        let value = self.work.oneshot(Req { fence, ..req }).await?;
        let since = Duration::from_micros(wall_us().saturating_sub(self.epoch_us));
        if chaos::work_down(since) {
            return Err(Box::new(DeadlineExceeded::new("execution")));
        }
        Ok(Shareable::Shared(value))
    }
}

/// `GET /flight/{key}`. The request runs in a task of its own, to its
/// end, whether or not the client waits for the answer.
async fn flight(State(node): State<Node>, Path(key): Path<String>) -> (StatusCode, String) {
    let req = Req { key, fence: None };
    if let Some(work) = node.stale.clone() {
        let Some(flight) = key_of(&req) else {
            return (StatusCode::BAD_REQUEST, "no key".into());
        };
        let flights = node.flights.clone();
        let run = async move {
            flights
                .run_answered(&flight, req, work, &Propagate, None)
                .await
        };
        return match tokio::spawn(run).await {
            Ok(Ok((Shareable::Shared(v) | Shareable::Unshared(v, _), how))) => (
                StatusCode::OK,
                format!("{v}|{}", chaos::answered_to_text(&how)),
            ),
            Ok(Err(e)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{:?} {e}", ErrorClass::of(&*e)),
            ),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
    }
    match tokio::spawn(node.svc.oneshot(req)).await {
        Ok(Ok(v)) => (StatusCode::OK, v),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{:?} {e}", ErrorClass::of(&*e)),
        ),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /stats`.
async fn stats(State(node): State<Node>) -> String {
    format!(
        "executions {}\nworking {}\nrunning {}\nentries {}\nsubscriptions {}\n",
        node.executions.load(Ordering::SeqCst),
        node.working.load(Ordering::SeqCst),
        node.l1.running_flights(),
        node.l1.map_entries(),
        node.backend.followed_flights()
    )
}

/// `GET /idle`: the L2 background work done, within 10 s.
async fn idle(State(node): State<Node>) -> (StatusCode, &'static str) {
    let flights = node.flights;
    let done = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(10), flights.idle())
            .await
            .is_ok()
    });
    match done.await {
        Ok(true) => (StatusCode::OK, "idle"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
    }
}
