//! Helpers of the tests that start and stop servers under a backend:
//! short deadlines, one lease, flights by key.

use std::time::Duration;

use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::backend::LeaseTerms;
use flightdeck_distributed::FlightId;
use flightdeck_redis::RedisConfig;

/// 500 ms per command and per connection attempt, reconnecting every
/// 100 ms at most.
pub(crate) fn config(url: String) -> RedisConfig {
    RedisConfig::new(url)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_max_delay(Duration::from_millis(100))
}

pub(crate) fn terms() -> LeaseTerms {
    LeaseTerms {
        lease: Duration::from_secs(5),
        state_ttl: Duration::from_secs(20),
        allow_takeover: true,
    }
}

pub(crate) fn flight(key: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(
        StageName::new("short").unwrap(),
        key,
    ))
}
