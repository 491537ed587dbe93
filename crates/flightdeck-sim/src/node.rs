//! One node incarnation: the real facade (L1 + L2 + breaker + bulkhead +
//! budgets) of the simulated stage over its [`SimBackend`], around the
//! simulated work.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flightdeck::core::http::HttpShare;
use flightdeck::core::BoxError;
use flightdeck::distributed::FencingToken;
use flightdeck::readers::HttpReaders;
use flightdeck::{GenericSingleFlightLayer, StageConfig, StageHandle};
use http::{Request, Response};
use http_body_util::Full;
use rand::Rng;
use tower::util::BoxCloneService;
use tower::{Layer, Service};

use crate::scenario::Settings;
use crate::world::{Incarnation, SimBackend, World};

/// The stage every node serves.
pub(crate) const STAGE: &str = "sim";

/// A caller's request: its key and id in headers (the work reads them),
/// its deadline in `x-request-timeout`.
pub(crate) type Req = Request<Full<Bytes>>;
pub(crate) type Resp = Response<Full<Bytes>>;
/// What a caller gets back through the layer.
pub(crate) type Out = Response<flightdeck::core::http::FlightBody<Full<Bytes>>>;
pub(crate) type Svc = BoxCloneService<Req, Out, BoxError>;

/// The business error of the simulated work.
#[derive(Debug)]
pub(crate) struct SimFailure;

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sim: the work failed")
    }
}

impl std::error::Error for SimFailure {}

/// What one execution of the work does, drawn when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Answers after the pause.
    Ok(Duration),
    /// Answers with `Set-Cookie` (never shared).
    Unshareable(Duration),
    /// Fails after the pause.
    Fails(Duration),
    /// Panics after the pause.
    Panics(Duration),
    /// Never ends by itself (the execution timeout cuts it).
    Hangs,
}

/// One execution of the work, as the work saw it.
#[derive(Clone, Debug)]
pub(crate) struct Exec {
    pub(crate) key: usize,
    /// The fencing token, when it ran as the flight's owner.
    pub(crate) fence: Option<(u64, String)>,
    pub(crate) behaviour: Behaviour,
    /// The node incarnation it ran on, for which caller, and that node's
    /// mode then.
    pub(crate) who: Incarnation,
    pub(crate) caller: usize,
    pub(crate) mode: Option<flightdeck::Mode>,
    /// When it started (and its place among starts and answers), and
    /// when it ended (answered, failed, or was cut: its future dropped).
    pub(crate) started: tokio::time::Instant,
    pub(crate) tick: u64,
    pub(crate) ended: Option<tokio::time::Instant>,
}

/// Marks an execution ended when its future ends or is dropped.
struct Ending {
    world: Arc<World>,
    id: usize,
}

impl Drop for Ending {
    fn drop(&mut self) {
        // A dead node's work is dropped with the runtime, at the end:
        // it never ended in the run.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut st = self.world.lock();
        let now = tokio::time::Instant::now();
        if let Some(e) = st.execs.get_mut(self.id) {
            e.ended.get_or_insert(now);
        }
    }
}

/// The simulated work of one node incarnation.
#[derive(Clone)]
struct Work {
    world: Arc<World>,
    who: Incarnation,
    faults: f64,
}

fn header(req: &Req, name: &str) -> usize {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

impl Service<Req> for Work {
    type Response = Resp;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Resp, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = header(&req, "x-sim-key");
        let caller = header(&req, "x-sim-caller");
        let fence = req
            .extensions()
            .get::<FencingToken>()
            .map(|f| (f.generation, f.owner.as_str().to_owned()));
        let (id, behaviour) = {
            let mut st = self.world.lock();
            let pause = Duration::from_millis(st.rng.random_range(1..=600));
            let behaviour = if self.faults > 0.0 && st.rng.random_bool(self.faults) {
                match st.rng.random_range(0..4) {
                    0 => Behaviour::Unshareable(pause),
                    1 => Behaviour::Fails(pause),
                    2 => Behaviour::Panics(pause),
                    _ => Behaviour::Hangs,
                }
            } else {
                Behaviour::Ok(pause)
            };
            let now = tokio::time::Instant::now();
            let failing = st.fail_windows.iter().any(|(a, b)| *a <= now && now < *b);
            let behaviour = match behaviour {
                // The work's outage: it fails, at once or slowly.
                Behaviour::Ok(d) if failing => Behaviour::Fails(d),
                b => b,
            };
            let id = st.execs.len();
            let (node, _) = self.who;
            let mode = st.modes.get(node).copied();
            let tick = st.tick();
            st.execs.push(Exec {
                key,
                fence: fence.clone(),
                behaviour,
                who: self.who,
                caller,
                mode,
                started: now,
                tick,
                ended: None,
            });
            let (n, i) = self.who;
            st.log(format!(
                "n{n}.{i} EXEC#{id} k{key} for c{caller} fence {:?}: {behaviour:?}",
                fence.as_ref().map(|f| f.0)
            ));
            (id, behaviour)
        };
        let world = Arc::clone(&self.world);
        let who = self.who;
        let ending = Ending {
            world: Arc::clone(&world),
            id,
        };
        Box::pin(async move {
            let _ending = ending;
            let pause = match behaviour {
                Behaviour::Ok(d)
                | Behaviour::Unshareable(d)
                | Behaviour::Fails(d)
                | Behaviour::Panics(d) => d,
                Behaviour::Hangs => Duration::from_secs(24 * 3600),
            };
            tokio::time::sleep(pause).await;
            if world.lock().dead.contains(&who) {
                // A dead process's work never ends.
                std::future::pending::<()>().await;
            }
            let body = format!("key=k{key} caller={caller} exec={id}");
            match behaviour {
                Behaviour::Fails(_) => Err(SimFailure.into()),
                Behaviour::Panics(_) => panic!("{PANIC}"),
                Behaviour::Unshareable(_) => Ok(Response::builder()
                    .header(http::header::SET_COOKIE, format!("c={caller}"))
                    .body(Full::new(Bytes::from(body)))
                    .expect("a valid response")),
                _ => Ok(Response::new(Full::new(Bytes::from(body)))),
            }
        })
    }
}

/// The message of the work's injected panics (kept off stderr).
pub(crate) const PANIC: &str = "sim: injected panic";

/// A running node incarnation.
pub(crate) struct Node {
    pub(crate) who: Incarnation,
    pub(crate) layer: GenericSingleFlightLayer<HttpReaders, HttpShare>,
    pub(crate) svc: Svc,
    pub(crate) handle: StageHandle,
}

impl Node {
    pub(crate) fn start(world: &Arc<World>, who: Incarnation, s: &Settings, faults: f64) -> Self {
        let mut cfg = StageConfig::new().mode(s.mode).backend("sim");
        cfg.lease_timeout = s.lease;
        cfg.heartbeat_interval = s.heartbeat;
        cfg.wait_timeout = s.wait;
        cfg.poll_interval = s.poll;
        cfg.replay_ttl = s.result_ttl;
        cfg.failure_ttl = s.failure_ttl;
        cfg.execution_timeout = Some(s.execution_timeout);
        cfg.coordination_timeout = s.coordination_timeout;
        cfg.commit_replicas_timeout = s.coordination_timeout / 2;
        cfg.on_wait_failure = s.on_wait_failure;
        cfg.allow_takeover = s.allow_takeover;
        if let Some(w) = &s.stale {
            cfg.replay_ttl = w.fresh;
            cfg.stale_while_revalidate = w.revalidate;
            cfg.stale_if_error = w.if_error;
            cfg.stale_retry_after = w.retry_after;
            cfg.soft_timeout = w.soft_timeout;
            cfg.early_refresh = w.early_refresh;
            cfg.hit_for_pass = w.hit_for_pass;
            // Tells a flight's result from a copy's (the checks' clock).
            cfg.cache_status = true;
        }
        let backend = SimBackend {
            world: Arc::clone(world),
            who,
        };
        let layer = GenericSingleFlightLayer::http()
            .backend("sim", backend)
            .stage(STAGE, cfg)
            .build()
            .expect("the simulated stage's settings are valid");
        let work = Work {
            world: Arc::clone(world),
            who,
            faults,
        };
        let svc = BoxCloneService::new(layer.layer(work));
        let handle = layer.stage(STAGE).expect("the stage exists");
        Self {
            who,
            layer,
            svc,
            handle,
        }
    }
}
