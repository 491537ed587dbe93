//! Looking a stage up by name never uses up the process's stage names: a
//! health check or admin endpoint may pass names it got from a request,
//! and the names a process keeps are bounded (4096). Alone in its binary:
//! the interner is per process.

use flightdeck::core::{CloneShare, FlightKey, StageName};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{GenericSingleFlightLayer, Mode, StageConfig};

fn layer(stage: &str) -> Result<(), flightdeck::ConfigError> {
    GenericSingleFlightLayer::builder(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .stage(stage, StageConfig::new().mode(Mode::LocalOnly))
    .build()
    .map(drop)
}

#[test]
fn looking_up_unknown_stages_leaves_the_names_for_real_stages() {
    let l = GenericSingleFlightLayer::builder(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .stage("known", StageConfig::new().mode(Mode::LocalOnly))
    .build()
    .unwrap();
    for i in 0..flightdeck::core::key::MAX_STAGE_NAMES {
        let asked = format!("asked-{i}");
        assert!(l.stage(&asked).is_none());
        assert!(l.running_flights(&asked).is_none());
    }
    assert_eq!(l.stage("known").unwrap().name().as_str(), "known");
    assert_eq!(l.running_flights("known"), Some(0));
    // A stage built after all those lookups still gets its name.
    layer("built-later").unwrap();
    assert!(StageName::new("another-later").is_ok());
}
