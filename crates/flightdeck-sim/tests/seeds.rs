//! A fixed set of seeds of the simulation (see the crate docs), and the
//! replay check: a seed run twice gives the same trace, line for line.

use flightdeck_sim::run;

/// Seeds run by `cargo test` (debug build: well under a minute on two
/// cores). `scripts/simulate N` runs more.
const SEEDS: std::ops::Range<u64> = 0..6_000;

/// Runs each of `seeds` and fails with the first failing one's report.
fn passes(seeds: &[u64]) {
    for &seed in seeds {
        let report = run(seed);
        assert!(report.passed(), "{report}");
    }
}

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

/// The stale windows, purges and refreshes are on in enough of the fixed
/// seeds for their checks to bite.
#[test]
fn the_fixed_seeds_answer_stale_purge_and_refresh() {
    let mut seen = std::collections::BTreeMap::<&str, u64>::new();
    for seed in 0..300 {
        for (what, n) in run(seed).exercised {
            *seen.entry(what).or_default() += n;
        }
    }
    for what in ["stale answers", "purges", "refreshes"] {
        assert!(
            seen.get(what).copied().unwrap_or(0) >= 10,
            "{what}: {seen:?}"
        );
    }
}

/// Seed 38 shows it: ACQUIREs queued on a frozen store were applied at
/// the thaw, after their caller had given them up, and granted a lease
/// nobody worked on. The layer now sends each ACQUIRE with its call
/// deadline as its not-after, and the store refuses it from then on.
#[test]
fn seed_38_an_acquire_applied_after_its_caller_gave_up_grants_nothing() {
    let report = run(38);
    assert!(report.passed(), "{report}");
    assert_eq!(report.exercised.get("late grants"), Some(&0), "{report}");
}

/// Seed 34 found it: a waiter whose flight's response was not shareable
/// ran its own request past its own deadline (the own run had no bound).
#[test]
fn seed_34_a_waiter_running_its_own_request_ends_by_its_deadline() {
    passes(&[34]);
}

/// Seed 111 found it: when a flight's leader had left, its response with
/// `Set-Cookie` went to the first waiter instead of to nobody.
#[test]
fn seed_111_a_response_meant_for_its_caller_never_goes_to_a_waiter() {
    passes(&[111]);
}

/// Seed 562 found it: the work panicked in a waiter's own run (after an
/// unshareable response) and the panic reached the caller instead of a
/// `WorkPanicked` error.
#[test]
fn seed_562_a_panic_in_a_waiters_own_run_is_a_typed_error() {
    passes(&[562]);
}

/// Seed 491 found it: an ACQUIRE timed out (the backend was frozen), its
/// retry was refused, and the refusal marked the token as holding no
/// lease: nobody released it, and the first ACQUIRE, run at the thaw,
/// left a lease nobody worked on.
#[test]
fn seed_491_a_token_whose_acquire_may_still_run_is_released() {
    passes(&[491]);
}

/// Seed 1017654 found it: a caller of a key under hit-for-pass ran its
/// work alone with no bound of its own, past its deadline (192 ms asked,
/// 566 ms taken).
#[test]
fn seed_1017654_a_run_alone_under_hit_for_pass_ends_by_the_deadline() {
    passes(&[1_017_654]);
}

/// Seed 1008810 found it: the work panicked in a hit-for-pass caller's run
/// alone, and the panic reached the caller instead of `WorkPanicked`.
#[test]
fn seed_1008810_a_panic_in_a_run_alone_under_hit_for_pass_is_typed() {
    passes(&[1_008_810]);
}

/// Seed 1006980 found it: at its soft timeout a caller got the copy it
/// had looked up when it came, though a later result, given to another
/// caller of the node meanwhile, had replaced it: a stale answer older
/// than one already given.
#[test]
fn seed_1006980_a_soft_timeout_answers_only_the_current_copy() {
    passes(&[1_006_980]);
}

/// Seed 3031915 found it: between a purge's start (the node's copy
/// dropped) and its INVALIDATE reaching a slow store, a flight on the node
/// read the old result there and kept it; callers after the purge
/// returned got it from the copy.
#[test]
fn seed_3031915_a_purge_drops_what_the_store_handed_back_meanwhile() {
    passes(&[3_031_915]);
}

/// Seed 5097118: a HYBRID follower with `on-wait-failure = local` ran the
/// work here when its wait failed, in a run with no coordination fault: a
/// documented cause (counted as `reason="wait_failure"`), now attributed.
#[test]
fn seed_5097118_a_failed_wait_run_here_is_attributed() {
    passes(&[5_097_118]);
}

/// Seed 1000391 found it: a refresh granted by the store panicked in the
/// background, and `singleflight_refresh_total` never counted it (the
/// simulation saw one refresh execution, the metric none).
#[test]
fn seed_1000391_a_panicking_refresh_is_counted() {
    passes(&[1_000_391]);
}

/// Seed 7002686 found it: a follower that fetched the kept result before
/// its node purged the key answered it at its soft timeout, after the
/// purge.
#[test]
fn seed_7002686_a_purge_keeps_a_fetched_stale_result_from_answering() {
    passes(&[7_002_686]);
}

/// Seed 1001064 found it: a node that had run the work itself (the store
/// refused it a moment) and given that result answered the store's older
/// kept result stale afterwards.
#[test]
fn seed_1001064_a_node_never_answers_older_than_its_own_copy() {
    passes(&[1_001_064]);
}

/// Seed 1001600 found it: the node's copy was of work that started after
/// the store's kept result's but ended before it; the store's result was
/// answered, older than one the node had given.
#[test]
fn seed_1001600_the_copy_of_later_started_work_answers() {
    passes(&[1_001_600]);
}

/// Seed 7000686 found it: a commit held up by a stalled store landed
/// 0.4 s after the work ended, and the node that ran the work answered it
/// stale 0.26 s past freshness + window by its own clock.
#[test]
fn seed_7000686_the_node_that_ran_the_work_counts_from_its_end() {
    passes(&[7_000_686]);
}

/// Seeds 7011144, 7017003 and 7031719 found it: a node ran the work in
/// the local fallback after its store call failed and gave that result;
/// its copy was dated from its flight's start (the failed call included),
/// before the store's kept result's work began, which then answered
/// stale: older than one the node had given.
#[test]
fn seed_7017003_a_copy_is_dated_by_its_end_against_the_store() {
    passes(&[7_011_144, 7_017_003, 7_031_719]);
}

/// Seed 7051418 found it: an early refresh across nodes asked the store
/// from a task `idle` did not wait for; its ACQUIRE, applied and its
/// answer lost, still held a lease when the node was idle.
#[test]
fn seed_7051418_an_early_refresh_ask_is_waited_for_by_idle() {
    passes(&[7_051_418]);
}

/// Seed 9021986 found it: a follower whose wait failed ran the work in
/// the local fallback (started 10 ms after the owner's on the same node)
/// and gave its result; the copy ordered results by their flights'
/// starts, so the owner's older-started result stayed the copy and later
/// answered stale. A fallback run's result is now kept from its work's
/// start, as an owner's is.
#[test]
fn seed_9021986_a_fallback_runs_result_is_kept_from_its_works_start() {
    passes(&[9_021_986]);
}

/// Seeds 9023623, 9032838, 9052612 and 9056798 found it: a node ran the
/// work in the local fallback and gave its result; its copy expired
/// (freshness plus window) while the store's kept result, of work that
/// started earlier but ended later, was still within its window, and
/// answered stale: older than one the node had given. A copy that goes
/// now leaves a floor behind (when its work ended), and no stale result of
/// the store's whose work started before it answers. Seed 9044177: a
/// failover brought back the store's result a purge had removed; the
/// purge leaves that floor too. Seed 7058018 (a commit held up by a
/// frozen store) passes by the same floor.
#[test]
fn seed_9023623_a_copy_that_went_still_keeps_older_results_out() {
    passes(&[
        9_023_623, 9_032_838, 9_052_612, 9_056_798, 9_044_177, 7_058_018,
    ]);
}

/// Seeds 9036686, 3026286 and 3018727 found it: two runs of one key on
/// one node at once (a flight a purge left running beside the next one;
/// a waiter's own run beside the key's next flight), and a caller of one
/// was told how the other was answered (stale), because callers read
/// "the last flight of the key that ended after they arrived". Each run
/// now notes its answer under its leader's arrival, and a caller reads
/// its own flight's note.
#[test]
fn seed_9036686_a_caller_is_told_of_its_own_flight() {
    passes(&[9_036_686, 3_026_286, 3_018_727]);
}

/// Seeds 9022866 and 9041767 found it: a node ran the work in the local
/// fallback while another node's owner ran it; this node's follower then
/// received the owner's result, whose work had started earlier, and kept
/// it as if it had started with its own flight: the older result became
/// the copy and answered stale. A result from the store is now ordered by
/// its work's start (its work time rides with the commit notice).
#[test]
fn seed_9022866_a_result_from_the_store_is_ordered_by_its_works_start() {
    passes(&[9_022_866, 9_041_767]);
}

/// Seeds 1046349, 7028086 and 3050253 found it: a commit held up on its
/// way by a frozen store was dated from its arrival, so the store's result
/// looked younger by the hold-up, and its work, older than a result a node
/// had given, answered stale there. A commit now says when it was sent,
/// and the store dates it from then.
#[test]
fn seed_1046349_a_commit_held_up_on_its_way_is_dated_from_its_sending() {
    passes(&[1_046_349, 7_028_086, 3_050_253]);
}

/// Seeds 3003319, 32937, 105192 and 2006125 found it (once callers past a
/// copy's freshness stopped waiting for their node's flight to ask the
/// store): the store's kept result, newer than the node's copy, answered a
/// caller stale (a flight's, or, during a refresh elsewhere, without one)
/// but was not kept; a caller during the node's next flight was then
/// answered the older copy. A stale result from the store is now kept as
/// the node's copy, ordered by its work's start.
#[test]
fn seed_3003319_a_stale_result_from_the_store_becomes_the_copy() {
    passes(&[3_003_319, 32_937, 105_192, 2_006_125]);
}

/// Seed 10224 found it: a node's follower waited with the store's kept
/// result standing by while the node's own refresh committed (its notice
/// lost), and answered that older result at its soft timeout after the
/// node had given the refresh's. A kept result standing by now answers
/// only while no copy of newer work came to its node.
#[test]
fn seed_10224_a_kept_result_standing_by_yields_to_a_newer_copy() {
    passes(&[10_224]);
}

/// Seeds 7112008 and 7116734 found it: an owner whose commit (or abandon)
/// failed on every try gave up after a lease of tries, while the
/// heartbeats it sent meanwhile had kept its lease: the node was idle with
/// a lease nobody worked on. A settling that gives up now waits until its
/// last renewal has run out; seed 5175895, until the last one that may
/// have renewed it (applied, its answer lost).
#[test]
fn seed_7112008_a_settling_that_gives_up_leaves_no_lease() {
    passes(&[7_112_008, 7_116_734, 5_175_895]);
}

/// Seeds 3123145 and 3211498 found it: a node switched to local-only
/// while its flight, led through the store, was granted a refresh; its
/// local callers past freshness then started a refresh of their own
/// beside it. A refresh the store granted now marks the node's copy while
/// it runs.
#[test]
fn seed_3211498_a_granted_refresh_holds_off_a_local_one_after_a_switch() {
    passes(&[3_123_145, 3_211_498]);
}

/// Seed 9137408 found it: a refresh in local-only whose work ran past
/// L1's wait timeout went on for nobody, and its claim on the key's
/// refresh was dropped then: a caller past freshness started a second
/// refresh beside it. The work now holds the claim itself, until it ends.
#[test]
fn seed_9137408_a_refresh_past_the_wait_timeout_keeps_its_claim() {
    passes(&[9_137_408]);
}

/// Seed 5158570 found it: a node's follower was given another node's
/// result, of work that started after the node's own copy's; a purge here
/// that the follower's flight predated kept that result from becoming the
/// copy, and the older copy then answered a later caller stale. A result
/// given but fenced now retires an older copy, and its floor stays.
#[test]
fn seed_5158570_a_newer_result_given_retires_the_older_copy() {
    passes(&[5_158_570]);
}

/// Seed 8178885 found it: an owner's first commit was lost and its retry
/// landed later; the store dated the result from the retry, so a node
/// ordered it (by its work's start: its age plus its work time) after a
/// result of its own whose work had begun later, kept it as its copy, and
/// answered it stale after the newer one. A commit is now dated from the
/// work's end, whichever attempt lands.
#[test]
fn seed_8178885_a_retried_commit_is_dated_from_the_works_end() {
    passes(&[8_178_885]);
}

/// Seeds 5416816 and 5459434 found it: the store throttled a key after a
/// failed refresh and answered its kept result, which the asking node
/// could not give (past its windows; older than a result it had given),
/// and the node ran its caller's work uncoordinated beside the throttle:
/// a run no mode or response explained. It now answers the throttled
/// failure, as a follower of the failed refresh does, and runs nothing.
#[test]
fn seed_5459434_a_throttled_key_runs_nothing_beside_the_throttle() {
    passes(&[5_459_434, 5_416_816]);
}

/// Seeds 4106302 and 4113215 found it: a node's ACQUIRE asking for stale
/// results was granted (a refresh beside the kept result) while the last
/// refresh's failure was cached; its reply was lost and the command sent
/// again, which the store answered HIT with that failure, as the kept
/// result's stale window had ended meanwhile. The node answered its caller
/// and went idle while its token held the lease: the key waited a lease
/// for nothing. The token that holds the live lease is now answered OWNER
/// again, whatever else the record says.
#[test]
fn seed_4106302_a_retry_of_the_leases_holder_is_its_owner() {
    passes(&[4_106_302, 4_113_215]);
}
