//! `simulate N`: runs N seeds of the simulation and ends with one line,
//! `seeds=N failures=F seeds_per_s=R` (exit 1 when F > 0). A failing
//! seed's schedule and trace are printed before it.
//!
//! - `SIM_SEED=s simulate 1` replays seed `s` (and `SIM_SEED=s simulate N`
//!   runs `s`, `s+1`, …).
//! - Otherwise the seeds start at one drawn from the wall clock (printed
//!   first), so that each run explores new schedules.
//! - `SIM_TRACE=1` prints every run's trace, failing or not.

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn main() -> ExitCode {
    let n: u64 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) => n,
        _ => {
            eprintln!("usage: simulate N   (SIM_SEED=s to start at seed s)");
            return ExitCode::from(2);
        }
    };
    let first = match std::env::var("SIM_SEED") {
        Ok(s) => match s.parse::<u64>() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("SIM_SEED={s}: not a number: {e}");
                return ExitCode::from(2);
            }
        },
        Err(_) => {
            // The wall clock picks where to start only, never what a run does.
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t % 1_000_000_000_000
        }
    };
    let trace_all = std::env::var_os("SIM_TRACE").is_some();
    println!("first seed {first}");
    let began = Instant::now();
    let mut failures = 0u64;
    let mut causes = std::collections::BTreeMap::<String, u64>::new();
    let mut faults = std::collections::BTreeMap::<&str, u64>::new();
    let mut exercised = std::collections::BTreeMap::<&str, u64>::new();
    for seed in first..first.saturating_add(n) {
        let report = flightdeck_sim::run(seed);
        for (c, k) in &report.causes {
            *causes.entry(c.clone()).or_default() += k;
        }
        for (f, k) in &report.faults {
            *faults.entry(f).or_default() += k;
        }
        for (f, k) in &report.exercised {
            *exercised.entry(f).or_default() += k;
        }
        if !report.passed() || trace_all {
            println!("{report}");
        }
        if !report.passed() {
            failures += 1;
        }
    }
    let secs = began.elapsed().as_secs_f64().max(1e-9);
    println!("executions by cause:");
    for (c, k) in &causes {
        println!("  {k:>8}  {c}");
    }
    println!("backend commands faulted:");
    for (f, k) in &faults {
        println!("  {k:>8}  {f}");
    }
    println!("exercised (answering anyway, checked; late grants, allowed):");
    for (f, k) in &exercised {
        println!("  {k:>8}  {f}");
    }
    println!(
        "seeds={n} failures={failures} seeds_per_s={:.1}",
        n as f64 / secs
    );
    if failures > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
