//! Unkeyed tenant scopes: reported by the extractor, never warned about
//! by it. The extractor cannot tell whether its keys leave the process
//! (a LOCAL_ONLY service keeps them in memory, where the digests reveal
//! nothing): the layer that stores results in a shared backend warns
//! (the `flightdeck` facade, at build). Alone in its binary: a scoped
//! subscriber does not reliably see an event whose callsite another test
//! thread registers at the same time with no subscriber.
#![cfg(feature = "grpc")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use flightdeck_key::grpc::GrpcKeyExtractor;
use flightdeck_key::http::{HttpKeyExtractor, HttpKeyExtractorBuilder};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

fn builder() -> HttpKeyExtractorBuilder {
    HttpKeyExtractor::builder().default_stage("http")
}

/// Counts `warn` events.
struct Collect(Arc<AtomicUsize>);

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
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn warnings_of(build: impl FnOnce()) -> usize {
    let seen = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::with_default(Collect(Arc::clone(&seen)), build);
    seen.load(Ordering::SeqCst)
}

#[test]
fn building_without_a_secret_reports_unkeyed_scopes_and_does_not_warn() {
    let warnings = warnings_of(|| {
        assert!(builder().build().unwrap().scope_digests_unkeyed());
        let grpc = GrpcKeyExtractor::builder()
            .method("/a.B/C", "grpc")
            .build()
            .unwrap();
        assert!(grpc.scope_digests_unkeyed(), "gRPC reports the same");
        assert!(!builder()
            .scope_secret("a-deployment-secret")
            .build()
            .unwrap()
            .scope_digests_unkeyed());
        // No scope digest at all: nothing to key.
        assert!(!builder()
            .shared_across_users()
            .build()
            .unwrap()
            .scope_digests_unkeyed());
    });
    assert_eq!(warnings, 0, "the extractor cannot know where keys go");
}

#[test]
fn a_secret_given_to_built_rules_keys_them_and_is_set_in_one_place() {
    let built = builder().build().unwrap();
    let keyed = built.with_scope_secret("deployment-secret").unwrap();
    assert!(!keyed.scope_digests_unkeyed());
    // The same secret again: nothing changes; another one: refused.
    let keyed = keyed.with_scope_secret("deployment-secret").unwrap();
    let err = keyed
        .with_scope_secret("another-deployment-secret")
        .unwrap_err();
    assert!(err.to_string().contains("one place"), "{err}");
    let err = builder()
        .build()
        .unwrap()
        .with_scope_secret("")
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let grpc = GrpcKeyExtractor::builder()
        .method("/a.B/C", "grpc")
        .build()
        .unwrap()
        .with_scope_secret("deployment-secret")
        .unwrap();
    assert!(!grpc.scope_digests_unkeyed());
}
