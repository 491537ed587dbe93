//! Every interleaving of 2 nodes × 1 key × 3 grants, every property
//! checked, one group of faults per test (all of them at once are too many
//! states for a test run; the replay's random runs mix them all).
//!
//! Each test prints the states it explored; every property must hold and
//! every "sometimes" property must be reached.

use std::time::Instant;

use flightdeck_model::model::Seen;
use flightdeck_model::{Config, ProtocolModel};
use stateright::{Checker, Model};

fn check(name: &str, config: Config) {
    let started = Instant::now();
    let checker = ProtocolModel::new(config)
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    println!(
        "model {name}: {} states explored, {} unique, depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for (property, path) in checker.discoveries() {
        if config_property_fails(&checker, property) {
            println!("{property}:");
            for a in path.into_actions() {
                println!("  {a:?}");
            }
        }
    }
    checker.assert_properties();
}

fn config_property_fails<C: Checker<ProtocolModel>>(checker: &C, property: &str) -> bool {
    checker
        .model()
        .properties()
        .iter()
        .any(|p| p.name == property && p.expectation != stateright::Expectation::Sometimes)
}

/// Only the network's faults: calls cut off, run late (an ACQUIRE past
/// its not-after is refused) or lost, leases running out and taken over,
/// orphans released.
fn base() -> Config {
    Config {
        invalidations: 0,
        failovers: 0,
        crashes: 0,
        reconnects: 0,
        clock_steps_back: false,
        cut_off: 1,
        horizon: 4,
        ..Config::small()
    }
}

#[test]
fn calls_cut_off_run_late_or_lost() {
    check(
        "network",
        Config {
            witness: Seen::KEPT_RECHECK,
            ..base()
        },
    );
}

#[test]
fn two_calls_on_their_way() {
    check(
        "two calls cut off",
        Config {
            cut_off: 2,
            horizon: 3,
            ..base()
        },
    );
}

#[test]
fn without_takeover() {
    let mut config = base();
    config.terms.takeover = false;
    check("no takeover", config);
}

#[test]
fn a_failover_with_a_clock_behind() {
    check(
        "failover",
        Config {
            failovers: 1,
            clock_steps_back: true,
            horizon: 3,
            // The known limit left: a late ACQUIRE run on a new primary
            // whose clock is behind, before its not-after by that clock.
            witness: Seen::ORPHAN_GRANT,
            ..base()
        },
    );
}

#[test]
fn an_invalidation() {
    check(
        "invalidation",
        Config {
            invalidations: 1,
            horizon: 3,
            ..base()
        },
    );
}

#[test]
fn a_crash_and_a_subscriber_reconnect() {
    check(
        "crash, reconnect",
        Config {
            crashes: 1,
            reconnects: 1,
            horizon: 3,
            ..base()
        },
    );
}

#[test]
fn results_kept_for_waiters_but_not_replayed() {
    let mut config = base();
    config.terms.result_ttl = 0;
    // Longer than a grant keeps the record: a grant must not shorten it.
    config.terms.retain = 3;
    config.witness = Seen::KEPT_RECHECK;
    check("ttl 0, retain 3", config);
}

#[test]
fn results_fresh_longer_than_kept_for_waiters() {
    let mut config = base();
    config.terms.result_ttl = 2;
    config.terms.retain = 1;
    check("ttl 2, retain 1", config);
}

/// A stage with stale windows: results answered stale past their TTL
/// while one refresh runs, a failed refresh's throttle (its failure
/// cached beside the kept result), an early refresh.
fn stale() -> Config {
    let mut config = Config {
        stale_windows: true,
        early: 2,
        ..base()
    };
    config.terms.result_ttl = 1;
    config.terms.retain = 1;
    config.terms.stale_for = 2;
    config.terms.retry_after = 1;
    config
}

#[test]
fn stale_answers_refreshes_and_throttles() {
    check(
        "stale windows",
        Config {
            witness: Seen::STALE_OWNER | Seen::STALE_FOLLOWER | Seen::THROTTLED | Seen::EARLY,
            ..stale()
        },
    );
}

#[test]
fn stale_windows_and_an_invalidation_during_a_refresh() {
    check(
        "stale windows, invalidation",
        Config {
            invalidations: 1,
            early: 0,
            horizon: 3,
            witness: Seen::PURGE_FENCED,
            ..stale()
        },
    );
}
