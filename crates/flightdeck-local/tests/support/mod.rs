//! What several test binaries of this crate share.

/// A runtime of its own with paused time, for tests that run more than
/// one runtime, or enter one under a recorder.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}
