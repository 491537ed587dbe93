//! A stage whose backend is not connected when the layer is built is
//! degraded from its first moment, before any request: the gauge is 1 and
//! a `warn` says "starting degraded" with the stage and why. When the
//! backend connects, the stage goes distributed by itself (an idle node
//! does not stay degraded), and says so.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{capture_warnings, counter_with, gauge_shard, metrics_on};
use flightdeck::core::{metric, CloneShare, FlightKey, StageName};
use flightdeck::distributed::backend::{Connection, ConnectionWatch};
use flightdeck::distributed::{Backend, PostcardCodec};
use flightdeck::readers::DynReaders;
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
use flightdeck_test::MemoryBackend;
use tokio::sync::watch;
use tower::{service_fn, Layer, ServiceExt};

/// The memory backend, with a connection state set by the test.
struct Connecting {
    inner: MemoryBackend,
    state: watch::Sender<Connection>,
}

impl Connecting {
    fn not_connected() -> Arc<Self> {
        let why = Connection::NotConnected(Arc::from("test store not connected yet"));
        Arc::new(Self {
            inner: MemoryBackend::new(),
            state: watch::channel(why).0,
        })
    }
}

impl Backend for Connecting {
    fn connection(&self) -> ConnectionWatch {
        self.state.subscribe()
    }

    flightdeck::distributed::forward_backend!(inner => acquire_with, heartbeat, commit, abandon, invalidate, subscribe, join_subscription, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);
}

type Keys = fn(&String) -> Option<FlightKey>;
type Flights = GenericSingleFlightLayer<DynReaders<String>, CloneShare<String>>;

fn key(req: &String) -> Option<FlightKey> {
    let stage = req.split('/').next()?;
    Some(FlightKey::from_bytes(StageName::new(stage).ok()?, req))
}

fn layer(stage: &str, mode: Mode, backend: Arc<Connecting>) -> Flights {
    GenericSingleFlightLayer::builder(
        key as Keys,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("store", backend)
    .stage(stage, StageConfig::new().mode(mode).backend("store"))
    .build()
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_stage_over_a_backend_not_connected_is_degraded_before_any_request() {
    metrics_on();
    let (logs, _guard) = capture_warnings();
    let stage = "start-not-connected";
    let backend = Connecting::not_connected();
    let layer = layer(stage, Mode::Hybrid, Arc::clone(&backend));
    let handle = layer.stage(stage).unwrap();

    assert!(handle.is_degraded(), "degraded before any request");
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(1.0));
    let text = logs.text();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("starting degraded")
            && l.contains(stage)
            && l.contains("test store not connected yet")),
        "{text}"
    );

    // Idle, it connects: the stage goes distributed without a request.
    backend.state.send_replace(Connection::Connected);
    for _ in 0..100 {
        if !handle.is_degraded() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(!handle.is_degraded(), "distributed once connected");
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(0.0));
    let text = logs.text();
    assert!(
        text.lines()
            .any(|l| l.contains("backend connected") && l.contains(stage)),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("left degraded mode") && l.contains(stage)),
        "{text}"
    );

    // The next leader coordinates through the backend: it owns its flight.
    let svc = layer.layer(service_fn(|req: String| async move {
        Ok::<_, std::convert::Infallible>(req)
    }));
    svc.oneshot(format!("{stage}/first")).await.unwrap();
    assert_eq!(
        counter_with(metric::EXECUTION_TOTAL, stage, "path", "owner"),
        1
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_local_only_stage_over_a_backend_not_connected_is_not_degraded() {
    metrics_on();
    let stage = "start-not-connected-local";
    let layer = layer(stage, Mode::LocalOnly, Connecting::not_connected());
    let handle = layer.stage(stage).unwrap();
    assert!(!handle.is_degraded(), "it does not coordinate");
    assert_eq!(gauge_shard(metric::DEGRADED, stage, None), Some(0.0));
}
