//! A fixed set of seeds of the simulation (see the crate docs), and the
//! replay check: a seed run twice gives the same trace, line for line.

use flightdeck_sim::run;

/// Seeds run by `cargo test` (debug build: well under a minute on two
/// cores). `scripts/simulate N` runs more.
const SEEDS: std::ops::Range<u64> = 0..6_000;

#[test]
fn a_fixed_set_of_seeds_keeps_every_invariant() {
    let mut failed = Vec::new();
    for seed in SEEDS {
        let report = run(seed);
        if !report.passed() {
            println!("{report}");
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "failing seeds: {failed:?} (schedules and traces above)"
    );
}

#[test]
fn a_seed_replays_byte_for_byte() {
    for seed in [3, 77, 151, 1_000_003] {
        let a = run(seed);
        let b = run(seed);
        assert!(!a.trace.is_empty());
        let first_difference = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y);
        assert!(
            first_difference.is_none() && a.trace.len() == b.trace.len(),
            "seed {seed} diverged at line {first_difference:?}:\n{}\n{}",
            first_difference.map_or("", |i| a.trace[i].as_str()),
            first_difference.map_or("", |i| b.trace[i].as_str()),
        );
        assert_eq!(a.violations, b.violations);
    }
}

/// Seed 34 found it: a waiter whose flight's response was not shareable
/// ran its own request past its own deadline (the own run had no bound).
#[test]
fn seed_34_a_waiter_running_its_own_request_ends_by_its_deadline() {
    let report = run(34);
    assert!(report.passed(), "{report}");
}

/// Seed 111 found it: when a flight's leader had left, its response with
/// `Set-Cookie` went to the first waiter instead of to nobody.
#[test]
fn seed_111_a_response_meant_for_its_caller_never_goes_to_a_waiter() {
    let report = run(111);
    assert!(report.passed(), "{report}");
}

/// Seed 562 found it: the work panicked in a waiter's own run (after an
/// unshareable response) and the panic reached the caller instead of a
/// `WorkPanicked` error.
#[test]
fn seed_562_a_panic_in_a_waiters_own_run_is_a_typed_error() {
    let report = run(562);
    assert!(report.passed(), "{report}");
}

/// Seed 491 found it: an ACQUIRE timed out (the backend was frozen), its
/// retry was refused, and the refusal marked the token as holding no
/// lease: nobody released it, and the first ACQUIRE, run at the thaw,
/// left a lease nobody worked on.
#[test]
fn seed_491_a_token_whose_acquire_may_still_run_is_released() {
    let report = run(491);
    assert!(report.passed(), "{report}");
}
