//! The examples' default log filter (`info,fred=error`, README "With
//! axum"): fred's own connection lines, logged at `warn` through `log`,
//! do not reach the output, while its errors and flightdeck's warnings do.
//! One test in its own binary: it installs the process's subscriber.

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod axum_example;

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn fred_connection_warnings_are_filtered_out_and_its_errors_kept() {
    // The default filter applies when RUST_LOG is unset.
    std::env::remove_var("RUST_LOG");
    assert_eq!(axum_example::LOG_DEFAULT, "info,fred=error");
    let out = Captured::default();
    let writer = out.clone();
    axum_example::init_logging(move || writer.clone());

    // What fred logs when a connection breaks (its module path is the
    // target), and what it logs when a command fails for good.
    log::warn!(
        target: "fred::router::utils",
        "fred-7HjC1fTq1l: Broadcasting error: Redis Error - kind: IO, details: Connection closed"
    );
    log::error!(target: "fred::router", "fred-7HjC1fTq1l: Failed to reconnect: Connection refused");
    // flightdeck's own line for the same outage.
    tracing::warn!(target: "flightdeck::stage", stage = "score", "stage degraded: coordination breaker open");

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains("Broadcasting error"), "{text}");
    assert!(text.contains("Failed to reconnect"), "{text}");
    assert!(text.contains("stage degraded"), "{text}");
}
