//! The `max_flights` bound, as tokens kept per shard.
//!
//! Every running flight holds a token. Tokens are either in the pool or
//! kept by a shard (spare), so admitting and ending a flight moves a token
//! under the shard's lock and touches no shared counter in the common case:
//! a shard takes a few tokens from the pool when it has none to spare, and
//! gives some back when it has too many.
//!
//! When a shard finds no spare and the pool empty, tokens are *scarce*: it
//! collects every shard's spare into the pool ([`TokenPool::collect`]), and
//! until the pool holds plenty again, shards take one token at a time and
//! give each back as its flight ends. So a flight is turned away only when
//! `max_flights` flights are running or being admitted, and, while the
//! bound is reached, turning one away costs no sweep of the shards.
//!
//! The synchronization is small and hand-written, so it has a loom model
//! (`RUSTFLAGS="--cfg flightdeck_loom" cargo test -p flightdeck-local --lib
//! --release loom`) next to the interleaving tests of the group.

use crate::sync::{AtomicBool, AtomicUsize, Ordering};

/// A shard's part of the bound (kept under the shard's lock).
#[derive(Default)]
pub(crate) struct Tokens {
    /// Flights of this shard still running.
    pub(crate) running: usize,
    pub(crate) spare: usize,
}

/// Tokens no shard keeps, and how shards take and give them.
pub(crate) struct TokenPool {
    pool: AtomicUsize,
    /// How many tokens a shard takes from the pool at once, at most.
    batch: usize,
    shards: usize,
    /// Tokens are scarce: taken one at a time, and given straight back to
    /// the pool.
    scarce: AtomicBool,
    /// Collections of spare tokens under way.
    sweeping: AtomicUsize,
}

impl TokenPool {
    /// `max` tokens for `shards` shards.
    pub(crate) fn new(max: usize, shards: usize) -> Self {
        let batch = (max / shards.saturating_mul(4)).clamp(1, 32);
        Self {
            pool: AtomicUsize::new(max),
            batch,
            shards,
            // A bound too small for batches is scarce from the start.
            scarce: AtomicBool::new(max < shards * batch),
            sweeping: AtomicUsize::new(0),
        }
    }

    /// A pool this full ends scarcity: every shard could take a batch.
    pub(crate) fn plenty(&self) -> usize {
        self.shards * self.batch
    }

    /// Gives a new flight of the shard owning `tokens` a token, if one is
    /// left (call under that shard's lock).
    #[inline]
    pub(crate) fn admit(&self, tokens: &mut Tokens) -> bool {
        if tokens.spare == 0 {
            tokens.spare = self.take();
            if tokens.spare == 0 {
                return false;
            }
        }
        tokens.spare -= 1;
        tokens.running += 1;
        true
    }

    /// Takes tokens from the pool: a batch, or fewer as the pool runs low
    /// (so that no shard sits on tokens that others need), 0 when it is
    /// empty.
    fn take(&self) -> usize {
        let share = self.shards * 2;
        // Read under the shard's lock, as in `release`.
        let batch = if self.scarce.load(Ordering::SeqCst) {
            1
        } else {
            self.batch
        };
        let mut left = self.pool.load(Ordering::Acquire);
        loop {
            if left == 0 {
                return 0;
            }
            let n = batch.min(left.div_ceil(share));
            match self.pool.compare_exchange_weak(
                left,
                left - n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return n,
                Err(now) => left = now,
            }
        }
    }

    /// A flight of the shard owning `tokens` ended (call under that shard's
    /// lock): its token becomes spare (or goes back to the pool while tokens
    /// are scarce), and the shard gives tokens back when it keeps too many.
    #[inline]
    pub(crate) fn release(&self, tokens: &mut Tokens) {
        tokens.running -= 1;
        // Read under the shard's lock: a collection that made tokens scarce
        // before it swept this shard is seen here, or its sweep sees this
        // token.
        if self.scarce.load(Ordering::SeqCst) {
            if self.pool.fetch_add(1, Ordering::SeqCst) + 1 >= self.plenty() {
                self.scarce.store(false, Ordering::SeqCst);
            }
            return;
        }
        tokens.spare += 1;
        if tokens.spare > 2 * self.batch {
            self.pool
                .fetch_add(tokens.spare - self.batch, Ordering::AcqRel);
            tokens.spare = self.batch;
        }
    }

    /// A shard found no spare and the pool empty: tokens are scarce from
    /// now on, and every shard's spare tokens go to the pool. `visit(i, f)`
    /// must lock shard `i` and call `f` with its tokens: each shard's spare
    /// moves while its shard is locked, so another collection never misses
    /// them. Returns whether the pool has any now.
    ///
    /// While tokens are scarce and no collection is under way, no shard
    /// keeps any (a shard takes one for a flight it admits at once, and
    /// gives it back at once), so there is nothing to sweep.
    pub(crate) fn collect(
        &self,
        mut visit: impl FnMut(usize, &mut dyn FnMut(&mut Tokens)),
    ) -> bool {
        if self.scarce.load(Ordering::SeqCst) && self.sweeping.load(Ordering::SeqCst) == 0 {
            return self.pool.load(Ordering::SeqCst) > 0;
        }
        // Counted first: whoever sees tokens scarce also sees this sweep
        // under way until it is done.
        self.sweeping.fetch_add(1, Ordering::SeqCst);
        self.scarce.store(true, Ordering::SeqCst);
        for i in 0..self.shards {
            let mut moved = 0;
            visit(i, &mut |tokens| {
                moved = std::mem::take(&mut tokens.spare);
                if moved > 0 {
                    self.pool.fetch_add(moved, Ordering::SeqCst);
                }
            });
            #[cfg(test)]
            super::tests::swept_one(moved);
        }
        self.sweeping.fetch_sub(1, Ordering::SeqCst);
        self.pool.load(Ordering::SeqCst) > 0
    }

    /// The pool's tokens (tests).
    #[cfg(test)]
    pub(crate) fn pooled(&self) -> usize {
        self.pool.load(Ordering::SeqCst)
    }

    /// Takes every pooled token (tests that place tokens by hand).
    #[cfg(test)]
    pub(crate) fn drain(&self) -> usize {
        self.pool.swap(0, Ordering::SeqCst)
    }

    /// Whether tokens are scarce (tests).
    #[cfg(test)]
    pub(crate) fn is_scarce(&self) -> bool {
        self.scarce.load(Ordering::SeqCst)
    }

    /// Sets scarcity (tests that place tokens by hand).
    #[cfg(test)]
    pub(crate) fn set_scarce(&self, yes: bool) {
        self.scarce.store(yes, Ordering::SeqCst);
    }

    /// The batch size (tests).
    #[cfg(test)]
    pub(crate) fn batch(&self) -> usize {
        self.batch
    }
}

/// The loom model: every interleaving of concurrent admissions, releases
/// and collections keeps the tokens' count, and never turns a flight away
/// below the bound.
#[cfg(all(test, flightdeck_loom))]
mod loom_model {
    use loom::sync::{Arc, Mutex};

    use super::*;

    /// Every interleaving with up to three preemptions (the bugs this model
    /// guards against need two).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    fn total(pool: &TokenPool, shards: &[Mutex<Tokens>]) -> usize {
        pool.pooled()
            + shards
                .iter()
                .map(|s| {
                    let s = s.lock().unwrap();
                    s.spare + s.running
                })
                .sum::<usize>()
    }

    /// Admits a flight in shard `i` as the group does: take, or collect
    /// once and try again.
    fn admit(pool: &TokenPool, shards: &[Mutex<Tokens>], i: usize) -> bool {
        if pool.admit(&mut shards[i].lock().unwrap()) {
            return true;
        }
        let visit = |j: usize, f: &mut dyn FnMut(&mut Tokens)| f(&mut shards[j].lock().unwrap());
        pool.collect(visit) && pool.admit(&mut shards[i].lock().unwrap())
    }

    /// The review's case: all free tokens sit spare in shard 0, the pool is
    /// empty, and two admissions in two other shards race (each may have to
    /// collect). Both get in: the bound is not reached.
    #[test]
    fn loom_spare_tokens_are_never_hidden_by_a_collection() {
        model(|| {
            let pool = Arc::new(TokenPool::new(2, 3));
            let shards: Arc<Vec<Mutex<Tokens>>> =
                Arc::new((0..3).map(|_| Mutex::new(Tokens::default())).collect());
            shards[0].lock().unwrap().spare = pool.drain();
            pool.set_scarce(false);
            let threads: Vec<_> = [1, 2]
                .into_iter()
                .map(|i| {
                    let (pool, shards) = (pool.clone(), shards.clone());
                    loom::thread::spawn(move || admit(&pool, &shards, i))
                })
                .collect();
            for t in threads {
                assert!(t.join().unwrap(), "turned away below the bound");
            }
            assert_eq!(total(&pool, &shards), 2);
        });
    }

    /// At the bound: one flight runs in shard 0 and ends while another
    /// shard admits. Whatever the order, tokens are conserved, and once the
    /// first has ended a second admission gets in.
    #[test]
    fn loom_a_flight_ending_at_the_bound_frees_its_token() {
        model(|| {
            let pool = Arc::new(TokenPool::new(1, 2));
            let shards: Arc<Vec<Mutex<Tokens>>> =
                Arc::new((0..2).map(|_| Mutex::new(Tokens::default())).collect());
            assert!(admit(&pool, &shards, 0));
            let ender = {
                let (pool, shards) = (pool.clone(), shards.clone());
                loom::thread::spawn(move || pool.release(&mut shards[0].lock().unwrap()))
            };
            let first = admit(&pool, &shards, 1);
            ender.join().unwrap();
            let second = first || admit(&pool, &shards, 1);
            assert!(second, "the ended flight's token was lost");
            assert_eq!(total(&pool, &shards), 1);
        });
    }
}
