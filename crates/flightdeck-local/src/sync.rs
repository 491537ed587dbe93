//! The atomics of the hand-written synchronization core, swapped for
//! loom's under `--cfg flightdeck_loom` (see `group::tokens`).

#[cfg(flightdeck_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(flightdeck_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
