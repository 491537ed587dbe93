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

/// Flight keys (for [`flight`]) by the cluster node serving them: entry `i`
/// holds `n` keys whose slot node `i` serves now (by the cluster's own
/// `CLUSTER SLOTS`, asked of node 0). The harness's cluster keeps serving
/// the other primaries' slots while one is down
/// (`cluster-require-full-coverage no`).
pub(crate) fn keys_by_node(
    cluster: &flightdeck_harness::RedisCluster,
    b: &flightdeck_redis::RedisBackend,
    n: usize,
) -> Vec<Vec<String>> {
    let mut by_node = vec![Vec::new(); cluster.nodes().len()];
    for i in 0.. {
        let key = format!("k-{i}");
        let slot = fred::util::redis_keyslot(b.record_key(&flight(&key)).as_bytes());
        let owner = cluster.slot_owner(slot).expect("slot owner");
        if by_node[owner].len() < n {
            by_node[owner].push(key);
        }
        if by_node.iter().all(|keys| keys.len() == n) {
            break;
        }
    }
    by_node
}
