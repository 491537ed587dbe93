//! The warning when tenant scopes are unkeyed. Alone in its binary: a
//! scoped subscriber does not reliably see an event whose callsite another
//! test thread registers at the same time with no subscriber.
#![cfg(feature = "grpc")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use flightdeck_key::grpc::GrpcKeyExtractor;
use flightdeck_key::http::{HttpKeyBuilder, HttpKeyExtractor};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

fn builder() -> HttpKeyBuilder {
    HttpKeyExtractor::builder().default_stage("http")
}

/// Counts `warn` events and keeps their messages.
#[derive(Default)]
struct Warnings {
    count: AtomicUsize,
    messages: Mutex<Vec<String>>,
}

struct Collect(Arc<Warnings>);

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
            self.0.count.fetch_add(1, Ordering::SeqCst);
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.messages.lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn warnings_of(build: impl FnOnce()) -> Arc<Warnings> {
    let seen = Arc::new(Warnings::default());
    tracing::subscriber::with_default(Collect(Arc::clone(&seen)), build);
    seen
}

#[test]
fn building_without_a_secret_warns_once_that_scopes_are_unkeyed() {
    let seen = warnings_of(|| {
        builder().build().unwrap();
    });
    assert_eq!(seen.count.load(Ordering::SeqCst), 1);
    let msg = seen.messages.lock().unwrap()[0].clone();
    assert!(msg.contains("unkeyed"), "{msg}");
    assert!(msg.contains("scope_secret"), "{msg}");

    let seen = warnings_of(|| {
        GrpcKeyExtractor::builder()
            .method("/a.B/C", "grpc")
            .build()
            .unwrap();
    });
    assert_eq!(seen.count.load(Ordering::SeqCst), 1, "gRPC warns the same");

    let seen = warnings_of(|| {
        builder().scope_secret("s").build().unwrap();
        // No scope digest at all: nothing to key, nothing to warn about.
        builder().shared_across_users().build().unwrap();
    });
    assert_eq!(seen.count.load(Ordering::SeqCst), 0);
}
