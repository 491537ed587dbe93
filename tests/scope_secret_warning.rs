//! The unkeyed-scope warning is true: it appears when a stage stores
//! results in a shared backend (whose key names carry the scope digests)
//! and no scope secret keys them, names how to set one, and stays quiet
//! for a service that coalesces in its own process only. Alone in its
//! binary: a scoped subscriber does not reliably see an event whose
//! callsite another test thread registers at the same time with no
//! subscriber.
#![cfg(all(feature = "testing", feature = "toml"))]

use std::sync::{Arc, Mutex};

use flightdeck::key::http::HttpKeyExtractor;
use flightdeck::testing::MemoryBackend;
use flightdeck::{Mode, SingleFlightConfig, SingleFlightLayer, StageConfig};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps the messages of `warn` events.
struct Collect(Arc<Mutex<Vec<String>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The warnings about unkeyed scopes that `build` logs.
fn unkeyed_warnings(build: impl FnOnce()) -> Vec<String> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(Collect(Arc::clone(&seen)), build);
    let all = seen.lock().unwrap().clone();
    all.into_iter().filter(|m| m.contains("unkeyed")).collect()
}

fn keys() -> HttpKeyExtractor {
    HttpKeyExtractor::builder()
        .default_stage("report")
        .build()
        .unwrap()
}

#[test]
fn the_warning_appears_only_where_scope_digests_reach_a_shared_store() {
    // In this process only (the quickstart): nothing leaves it.
    let quiet = unkeyed_warnings(|| {
        SingleFlightLayer::builder()
            .keys(keys())
            .stage("report", StageConfig::new().mode(Mode::LocalOnly))
            .build()
            .unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:?}");

    // A distributed stage without a secret: one warning, saying how.
    let hybrid = StageConfig::new().mode(Mode::Hybrid).backend("redis");
    let warned = unkeyed_warnings(|| {
        SingleFlightLayer::builder()
            .keys(keys())
            .stage("report", hybrid.clone())
            .backend("redis", MemoryBackend::new())
            .build()
            .unwrap();
    });
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("scope-secret-env"), "{}", warned[0]);
    assert!(warned[0].contains("scope_secret("), "{}", warned[0]);

    // The same with the secret from the file's variable: quiet.
    let var = "FLIGHTDECK_TEST_WARNING_SECRET";
    std::env::set_var(var, "a-random-secret-of-the-deployment");
    let cfg = SingleFlightConfig::from_toml(&format!(
        "[single-flight.keys]\nscope-secret-env = \"{var}\"\n"
    ))
    .unwrap();
    let quiet = unkeyed_warnings(|| {
        SingleFlightLayer::builder()
            .keys(keys())
            .config(cfg)
            .stage("report", hybrid.clone())
            .backend("redis", MemoryBackend::new())
            .build()
            .unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:?}");

    // Every stage in this process only: quiet again.
    let quiet = unkeyed_warnings(|| {
        SingleFlightLayer::builder()
            .keys(keys())
            .stage("report", hybrid)
            .local_only()
            .build()
            .unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:?}");
}
