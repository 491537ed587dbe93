//! The randomness of flightdeck's crates: owner tokens and jitter. Not an
//! API: public only because those are other crates, hidden from the docs.
//!
//! Every draw goes through here so that a deterministic simulation
//! (`crates/flightdeck-sim`) can replay a run from its seed:
//! [`seed_this_thread`] makes this thread draw from a generator seeded
//! with a number instead of the thread's random one, until called again
//! with `None`. A current-thread tokio runtime polls every task on the
//! thread that drives it, so one call covers a whole simulated cluster.
//! Outside a simulation nothing calls it, and every draw is the thread's
//! random generator's, as before.

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Draws from a generator seeded with `seed` on this thread from now on
/// (`None`: the thread's random generator again). For deterministic
/// simulation only.
pub fn seed_this_thread(seed: Option<u64>) {
    SEEDED.with(|s| *s.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// Runs `f` with this thread's generator: the seeded one when
/// [`seed_this_thread`] installed one, else the thread's random one.
fn with_rng<T>(f: impl FnOnce(&mut dyn rand::RngCore) -> T) -> T {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => f(rng),
        None => f(&mut rand::rng()),
    })
}

/// A random `u128` (owner tokens).
pub fn u128() -> u128 {
    with_rng(|r| r.random())
}

/// A random float in `lo..=hi` (`lo < hi`; jitter factors).
pub fn range_f64(lo: f64, hi: f64) -> f64 {
    with_rng(|r| r.random_range(lo..=hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_repeats_its_draws() {
        seed_this_thread(Some(7));
        let a = (u128(), range_f64(0.5, 1.0));
        seed_this_thread(Some(7));
        let b = (u128(), range_f64(0.5, 1.0));
        seed_this_thread(None);
        assert_eq!(a, b);
        assert_ne!(u128(), u128(), "random again");
        let f = range_f64(0.5, 1.0);
        assert!((0.5..=1.0).contains(&f), "{f}");
    }
}
