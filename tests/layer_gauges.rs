//! Two layers of one stage in one process (two routers, or a layer rebuilt
//! while the old one still has flights) share each gauge's series: each
//! moves it by its own increments and decrements, so the series adds
//! their shares, never goes below zero, and is exactly zero when both are
//! idle, whichever layer was built or used first.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{gauge_shard, metrics_on};
use flightdeck::core::metric;
use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{Mode, SingleFlightBuilder, SingleFlightLayer, StageConfig};
use flightdeck_testkit::MemoryBackend;
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, ServiceExt};

/// The stage is the first part of each request, up to a `/`.
type Keys = fn(&String) -> Option<FlightKey>;
type Flights = SingleFlightLayer<Keys, CloneShare<String>, PostcardCodec<String>>;

fn key(req: &String) -> Option<FlightKey> {
    let stage = req.split('/').next()?;
    Some(FlightKey::from_bytes(StageName::new(stage).ok()?, req))
}

/// A layer of `stage` over its own in-memory backend.
fn layer(stage: &str, mode: Mode) -> Flights {
    SingleFlightBuilder::new(
        key as Keys,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("mem", MemoryBackend::new())
    .stage(stage, StageConfig::new().mode(mode).backend("mem"))
    .build()
    .unwrap()
}

/// `singleflight_{name}{stage}` now (the series without a shard).
fn gauge(name: &str, stage: &str) -> Option<f64> {
    gauge_shard(name, stage, None)
}

/// Starts `n` flights of fresh keys on `layer`, each held until `gate`
/// gives it a permit; resolves once they all run.
async fn hold(
    layer: &Flights,
    stage: &str,
    prefix: &str,
    n: usize,
    gate: &Arc<Semaphore>,
) -> Vec<tokio::task::JoinHandle<Result<String, flightdeck::core::BoxError>>> {
    let mut running = Vec::new();
    for i in 0..n {
        let gate = Arc::clone(gate);
        let svc = layer.layer(service_fn(move |req: String| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, std::convert::Infallible>(req)
            }
        }));
        running.push(tokio::spawn(svc.oneshot(format!("{stage}/{prefix}-{i}"))));
    }
    while layer.running_flights(stage) != Some(n) {
        tokio::task::yield_now().await;
    }
    running
}

/// Builds layer `a`, runs three flights on it, builds `b` while they run
/// and runs two on it, then ends `a`'s first (`a_ends_first`) or `b`'s:
/// the active flights' gauge follows 3, 5, then 2 or 3, then 0.
async fn active_flights_add_up(stage: &str, a_ends_first: bool) {
    metrics_on();
    let active = || gauge(metric::ACTIVE_FLIGHTS, stage);
    let (gate_a, gate_b) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let a = layer(stage, Mode::LocalOnly);
    let held_a = hold(&a, stage, "a", 3, &gate_a).await;
    assert_eq!(active(), Some(3.0));
    // A second layer of the stage, built and used while the first one's
    // flights run.
    let b = layer(stage, Mode::LocalOnly);
    assert_eq!(active(), Some(3.0), "building a layer resets nothing");
    let held_b = hold(&b, stage, "b", 2, &gate_b).await;
    assert_eq!(active(), Some(5.0));

    let ((first, first_n), (second, second_n)) = if a_ends_first {
        ((&gate_a, 3u32), (&gate_b, 2u32))
    } else {
        ((&gate_b, 2u32), (&gate_a, 3u32))
    };
    first.add_permits(first_n as usize);
    while active() != Some(f64::from(5 - first_n)) {
        assert!(active().unwrap() >= 0.0, "never negative");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    second.add_permits(second_n as usize);
    for h in held_a.into_iter().chain(held_b) {
        h.await.unwrap().unwrap();
    }
    assert_eq!(active(), Some(0.0), "idle: exactly zero");
    assert_eq!(a.running_flights(stage), Some(0));
    assert_eq!(b.running_flights(stage), Some(0));
}

#[tokio::test(flavor = "current_thread")]
async fn active_flights_of_two_layers_add_up_when_the_first_ends_first() {
    active_flights_add_up("two-layers-a", true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn active_flights_of_two_layers_add_up_when_the_second_ends_first() {
    active_flights_add_up("two-layers-b", false).await;
}

/// A layer built while another layer of its stage is degraded does not
/// hide it: `singleflight_degraded{stage}` stays 1 until that one
/// recovers, then is exactly 0 (and 1 again while the new one is).
#[tokio::test(flavor = "current_thread")]
async fn a_layer_built_while_another_is_degraded_does_not_hide_it() {
    metrics_on();
    let stage = "two-layers-degraded";
    let degraded = || gauge(metric::DEGRADED, stage);
    let a = layer(stage, Mode::Hybrid);
    let a_stage = a.stage(stage).unwrap();
    assert_eq!(degraded(), Some(0.0));
    a_stage.breaker().force_open();
    assert!(a_stage.is_degraded());
    assert_eq!(degraded(), Some(1.0));

    let b = layer(stage, Mode::Hybrid);
    let b_stage = b.stage(stage).unwrap();
    assert!(!b_stage.is_degraded());
    assert_eq!(degraded(), Some(1.0), "the first layer is still degraded");

    a_stage.breaker().reset();
    assert!(!a_stage.is_degraded());
    assert_eq!(degraded(), Some(0.0));
    b_stage.breaker().force_open();
    assert!(b_stage.is_degraded());
    assert_eq!(degraded(), Some(1.0));
    b_stage.breaker().reset();
    assert!(!b_stage.is_degraded());
    assert_eq!(degraded(), Some(0.0));

    // A layer that goes away while degraded takes its share with it.
    b_stage.breaker().force_open();
    assert!(b_stage.is_degraded());
    assert_eq!(degraded(), Some(1.0));
    drop((b, b_stage));
    assert_eq!(degraded(), Some(0.0));
    assert!(!a_stage.is_degraded());
}
