//! Degraded state is never silent: entering and leaving it logs a `warn`
//! naming the stage, as does a mode switch.

mod common;

use common::capture_warnings;
use flightdeck::core::{CloneShare, FlightKey};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};
use flightdeck_test::MemoryBackend;

#[tokio::test(flavor = "current_thread")]
async fn entering_and_leaving_degraded_mode_log_warnings() {
    let (logs, _guard) = capture_warnings();

    let layer = GenericSingleFlightLayer::builder(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("main", MemoryBackend::new())
    .stage("quiet-never", StageConfig::new().backend("main"))
    .build()
    .unwrap();
    let handle = layer.stage("quiet-never").unwrap();

    handle.breaker().force_open();
    assert!(handle.is_degraded());
    assert!(handle.degraded_for().is_some());
    handle.breaker().reset();
    assert!(!handle.is_degraded());
    assert_eq!(handle.degraded_for(), None);
    handle.set_mode(Mode::LocalOnly).unwrap();

    let text = logs.text();
    let warns: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert!(
        warns
            .iter()
            .any(|l| l.contains("stage degraded") && l.contains("quiet-never")),
        "{text}"
    );
    assert!(
        warns
            .iter()
            .any(|l| l.contains("left degraded mode") && l.contains("quiet-never")),
        "{text}"
    );
    assert!(
        warns
            .iter()
            .any(|l| l.contains("mode switched") && l.contains("local-only")),
        "{text}"
    );
}
