//! Two layers of one stage in one process (two routers, or a layer rebuilt
//! while the old one still has flights) share each gauge's series: each
//! moves it by its own increments and decrements, so the series adds
//! their shares, never goes below zero, and is exactly zero when both are
//! idle, whichever layer was built or used first (a layer's first use
//! under a recorder registers its handles: that must reset nothing).

mod common;

use std::sync::Arc;

use common::{gauge_shard, metrics_on};
use flightdeck::core::metric;
use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::readers::DynReaders;
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
use flightdeck_test::recorded::Recorded;
use flightdeck_test::MemoryBackend;
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, ServiceExt};

/// The stage is the first part of each request, up to a `/`.
type Keys = fn(&String) -> Option<FlightKey>;
type Flights = GenericSingleFlightLayer<DynReaders<String>, CloneShare<String>>;

fn key(req: &String) -> Option<FlightKey> {
    let stage = req.split('/').next()?;
    Some(FlightKey::from_bytes(StageName::new(stage).ok()?, req))
}

/// A layer of `stage` over its own in-memory backend.
fn layer(stage: &str, mode: Mode) -> Flights {
    GenericSingleFlightLayer::builder(
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

/// Under a recorder installed after both layers of `stage` were built
/// (`b_first`: the second one built is used first): three flights on one
/// layer, then two on the other (its first use under this recorder), then
/// the first layer's end, then the second's. The active flights' gauge
/// follows 3, 5, 2, 0: never below zero, exactly zero when idle.
fn active_flights_add_up(stage: &str, b_first: bool) {
    let (a, b) = (layer(stage, Mode::LocalOnly), layer(stage, Mode::LocalOnly));
    let (first, second) = if b_first { (&b, &a) } else { (&a, &b) };
    let recorder = Recorded::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let active = || recorder.gauge(metric::ACTIVE_FLIGHTS, stage);
            let (gate_1, gate_2) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
            let held_1 = hold(first, stage, "one", 3, &gate_1).await;
            assert_eq!(active(), Some(3.0));
            let held_2 = hold(second, stage, "two", 2, &gate_2).await;
            assert_eq!(
                active(),
                Some(5.0),
                "the second layer's first use resets nothing"
            );
            gate_1.add_permits(3);
            for h in held_1 {
                h.await.unwrap().unwrap();
            }
            assert_eq!(active(), Some(2.0));
            gate_2.add_permits(2);
            for h in held_2 {
                h.await.unwrap().unwrap();
            }
            assert_eq!(active(), Some(0.0), "idle: exactly zero");
        });
    });
}

#[test]
fn active_flights_of_two_layers_add_up_first_built_used_first() {
    active_flights_add_up("two-layers-a", false);
}

#[test]
fn active_flights_of_two_layers_add_up_second_built_used_first() {
    active_flights_add_up("two-layers-b", true);
}

/// A layer built while another layer of the stage has flights running,
/// under the recorder in force: building it resets nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_layer_built_while_another_has_flights_resets_nothing() {
    metrics_on();
    let stage = "two-layers-built-late";
    let active = || gauge(metric::ACTIVE_FLIGHTS, stage);
    let gate = Arc::new(Semaphore::new(0));
    let a = layer(stage, Mode::LocalOnly);
    let held_a = hold(&a, stage, "a", 3, &gate).await;
    let b = layer(stage, Mode::LocalOnly);
    assert_eq!(active(), Some(3.0), "building a layer resets nothing");
    let held_b = hold(&b, stage, "b", 2, &gate).await;
    assert_eq!(active(), Some(5.0));
    gate.add_permits(5);
    for h in held_a.into_iter().chain(held_b) {
        h.await.unwrap().unwrap();
    }
    assert_eq!(active(), Some(0.0), "idle: exactly zero");
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
