//! The atomics and the lock of the slot count, swapped for loom's under
//! `--cfg flightdeck_loom` (see `slots`).

#[cfg(flightdeck_loom)]
pub(crate) use loom::sync::atomic::{AtomicIsize, Ordering};
#[cfg(flightdeck_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(flightdeck_loom))]
pub(crate) use std::sync::atomic::{AtomicIsize, Ordering};
#[cfg(not(flightdeck_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Locks `m`; a panic while it was held left the queue whole (no code
/// under the lock leaves it half-changed), so poisoning is ignored.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
