//! A TOML configuration from anywhere: a config or a typed error naming
//! the problem; never a panic.
#![no_main]

use flightdeck::SingleFlightConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Err(e) = SingleFlightConfig::from_toml(text) {
        assert!(!e.to_string().is_empty());
    }
});
