//! What a fresh layer exports before its first request, whatever the order
//! in which the recorder and the layer came: every stage's mode, degraded
//! state, active flights, breaker state and bulkhead state at their true
//! values, and its counters and histograms at zero (so `increase()` counts
//! the first event).

use std::time::Duration;

use flightdeck::breaker::metric as breaker;
use flightdeck::bulkhead::metric as bulkhead;
use flightdeck::core::metric as m;
use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::readers::DynReaders;
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
use flightdeck_test::MemoryBackend;

use crate::common::{gauge, gauge_by, registered};

pub(crate) type Layer = GenericSingleFlightLayer<DynReaders<String>, CloneShare<String>>;

fn key(req: &String) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(
        StageName::new("hybrid").unwrap(),
        req,
    ))
}

/// Three stages: HYBRID over an in-memory backend, LOCAL_ONLY, BYPASS.
pub(crate) fn layer() -> Layer {
    GenericSingleFlightLayer::builder(
        key as fn(&String) -> Option<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("main", MemoryBackend::new())
    .stage("hybrid", StageConfig::new().backend("main"))
    .stage("local", StageConfig::new().mode(Mode::LocalOnly))
    .stage("off", StageConfig::new().mode(Mode::Bypass))
    .build()
    .unwrap()
}

/// Waits (bounded) until the stages' gauges are exported, then checks
/// every value.
pub(crate) async fn exported_before_any_request() {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Each stage looks for a recorder every second.
    let stages = ["hybrid", "local", "off"];
    while stages.iter().any(|s| gauge(m::MODE, s).is_none())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (stage, mode) in [
        ("hybrid", Mode::Hybrid),
        ("local", Mode::LocalOnly),
        ("off", Mode::Bypass),
    ] {
        let want = f64::from(match mode {
            Mode::DistributedOnly => 0u8,
            Mode::LocalOnly => 1,
            Mode::Hybrid => 2,
            Mode::Bypass => 3,
        });
        assert_eq!(gauge(m::MODE, stage), Some(want), "{stage}: mode");
        assert_eq!(gauge(m::DEGRADED, stage), Some(0.0), "{stage}: degraded");
        assert_eq!(
            gauge(m::ACTIVE_FLIGHTS, stage),
            Some(0.0),
            "{stage}: active flights"
        );
        assert_eq!(
            gauge(bulkhead::BULKHEAD_DEGRADED, stage),
            Some(0.0),
            "{stage}: bulkhead"
        );
        assert_eq!(
            gauge_by(breaker::CIRCUIT_STATE, "breaker", stage),
            Some(0.0),
            "{stage}: breaker"
        );
        for name in [
            m::REQUEST_TOTAL,
            m::EXECUTION_TOTAL,
            m::EXECUTION_DURATION,
            m::DEGRADED_DURATION,
            m::LOCAL_OWNER_TOTAL,
            m::LOCAL_WAITER_TOTAL,
            m::FAIL_FAST_TOTAL,
            m::LOCAL_FALLBACK_TOTAL,
        ] {
            assert!(
                registered(name, stage),
                "{stage}: {name} is exported at zero"
            );
        }
    }
    for name in [m::OWNER_TOTAL, m::FOLLOWER_TOTAL, m::HIT_TOTAL] {
        assert!(
            registered(name, "hybrid"),
            "hybrid: {name} is exported at zero"
        );
    }
}
