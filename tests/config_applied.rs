//! A configuration is applied whole or refused: the key settings of a file
//! given to `SingleFlightLayer::builder().keys(keys).config(..)` change the layer's
//! key rules, a builder that cannot apply them fails naming them, and a
//! name typed wrong gets a suggestion.
#![cfg(all(feature = "toml", feature = "testing"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use flightdeck::core::{CloneShare, FlightKey};
use flightdeck::distributed::PostcardCodec;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::testing::{body_text, MemoryBackend};
use flightdeck::{
    GenericSingleFlightLayer, Mode, SingleFlightConfig, SingleFlightLayer, StageConfig,
};
use http::{Method, Request};
use tower::ServiceExt;

fn score_keys() -> HttpKeyExtractor {
    HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "/v1/score", "score"))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn ignore_authority_in_the_file_changes_the_layers_keys() {
    let cfg = SingleFlightConfig::from_toml(
        r#"
        [single-flight.stages.score]
        mode = "local-only"
        [single-flight.keys]
        ignore-authority = true
        "#,
    )
    .unwrap();
    let flights = SingleFlightLayer::builder()
        .keys(score_keys())
        .config(cfg)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/v1/score",
            get(move || {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "scored"
                }
            }),
        )
        .layer(flights);
    let mut calls = tokio::task::JoinSet::new();
    // One service reached under two names (each node's own address).
    for host in ["node-a.internal", "node-b.internal"].repeat(10) {
        let req = Request::get("/v1/score")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        calls.spawn(app.clone().oneshot(req));
    }
    while let Some(resp) = calls.join_next().await {
        assert_eq!(body_text(resp.unwrap().unwrap()).await.unwrap(), "scored");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_builder_without_key_rules_refuses_key_settings_by_name() {
    let cfg = SingleFlightConfig::from_toml(
        "[single-flight.stages.score]\nmode = \"local-only\"\n\
         [single-flight.keys]\nignore-authority = true\n",
    )
    .unwrap();
    let err = GenericSingleFlightLayer::builder(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .config(cfg)
    .build()
    .unwrap_err();
    assert_eq!(err.field(), Some("keys.ignore-authority"), "{err}");
    assert!(
        err.to_string().contains("SingleFlightLayer::builder()"),
        "{err}"
    );
}

#[test]
fn the_scope_secret_comes_from_the_variable_the_file_names() {
    let var = "FLIGHTDECK_TEST_CONFIG_APPLIED_SECRET";
    let cfg = |var: &str| {
        SingleFlightConfig::from_toml(&format!(
            "[single-flight.stages.score]\nmode = \"local-only\"\n\
             [single-flight.keys]\nscope-secret-env = \"{var}\"\n"
        ))
        .unwrap()
    };
    let build = |cfg, keys| SingleFlightLayer::builder().keys(keys).config(cfg).build();

    // Unset: refused, naming the setting and the variable.
    let err = build(cfg(var), score_keys()).unwrap_err();
    assert_eq!(err.field(), Some("keys.scope-secret-env"), "{err}");
    assert!(err.to_string().contains(var), "{err}");

    std::env::set_var(var, "a-random-secret-of-the-deployment");
    let layer = build(cfg(var), score_keys()).unwrap();
    assert!(!layer.keys().scope_digests_unkeyed());
    assert!(score_keys().scope_digests_unkeyed());
    // Another secret in the code: set in two places, refused.
    let keyed = HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "/v1/score", "score"))
        .scope_secret("another-deployment-secret")
        .build()
        .unwrap();
    let err = build(cfg(var), keyed).unwrap_err();
    assert_eq!(err.field(), Some("keys.scope-secret-env"), "{err}");
    assert!(err.to_string().contains("one place"), "{err}");

    let empty = "FLIGHTDECK_TEST_CONFIG_APPLIED_EMPTY";
    std::env::set_var(empty, "");
    let err = build(cfg(empty), score_keys()).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");

    // Shorter than the minimum: refused, naming the variable, never the value.
    let short = "FLIGHTDECK_TEST_CONFIG_APPLIED_SHORT";
    std::env::set_var(short, "hunter2");
    let err = build(cfg(short), score_keys()).unwrap_err();
    assert_eq!(err.field(), Some("keys.scope-secret-env"), "{err}");
    assert!(err.to_string().contains(short), "{err}");
    assert!(err.to_string().contains("7 bytes"), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[test]
fn names_typed_wrong_get_a_suggestion() {
    // A configuration key.
    let err =
        SingleFlightConfig::from_toml("[single-flight.stages.score]\nlease-timout = \"5s\"\n")
            .unwrap_err();
    assert_eq!(err.field(), Some("lease-timout"), "{err}");
    assert!(
        err.to_string().contains("did you mean `lease-timeout`?"),
        "{err}"
    );
    let err = SingleFlightConfig::from_toml("[single-flight.keys]\nignore_authority = true\n")
        .unwrap_err();
    assert!(
        err.to_string().contains("did you mean `ignore-authority`?"),
        "{err}"
    );
    // A stage the key rules name, configured under another spelling.
    let err = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("scroe", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap_err();
    assert_eq!(err.stage(), Some("score"));
    assert!(
        err.to_string().contains("the configuration has \"scroe\""),
        "{err}"
    );
    // A backend.
    let err = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage(
            "score",
            StageConfig::new().mode(Mode::Hybrid).backend("rediss"),
        )
        .backend("redis", MemoryBackend::new())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("backend"));
    assert!(err.to_string().contains("did you mean \"redis\"?"), "{err}");
}

#[test]
fn a_stage_config_with_nothing_set_builds_and_runs_in_this_process() {
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", StageConfig::new())
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::LocalOnly);
    // Without a backend, it cannot be switched to a distributed mode.
    assert!(layer
        .stage("score")
        .unwrap()
        .set_mode(Mode::Hybrid)
        .is_err());
    // The same from a file: an empty table.
    let cfg = SingleFlightConfig::from_toml("[single-flight.stages.score]\n").unwrap();
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .config(cfg)
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::LocalOnly);
    // A mode chosen on purpose that needs a backend still needs one.
    let err = SingleFlightConfig::from_toml("[single-flight.stages.score]\nmode = \"hybrid\"\n")
        .unwrap_err();
    assert_eq!(err.field(), Some("backend"), "{err}");
    let err = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", StageConfig::new().mode(Mode::Hybrid))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("backend"), "{err}");
    // With a backend named, the default is HYBRID.
    let layer = SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", StageConfig::new().backend("mem"))
        .backend("mem", MemoryBackend::new())
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::Hybrid);
}

#[test]
fn local_only_needs_no_stage_declarations() {
    let keys = HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "/v1/score", "score"))
        .route(Route::new(Method::GET, "/v1/search", "search"))
        .build()
        .unwrap();
    let layer = SingleFlightLayer::builder()
        .keys(keys)
        .stage("search", StageConfig::new().mode(Mode::Bypass))
        .local_only()
        .build()
        .unwrap();
    assert_eq!(layer.stage("score").unwrap().mode(), Mode::LocalOnly);
    assert_eq!(layer.stage("search").unwrap().mode(), Mode::Bypass);
}

#[test]
fn http_sharing_settings_for_an_adapter_without_them_are_refused() {
    let mut cfg = StageConfig::new().mode(Mode::LocalOnly);
    cfg.sharing.set_cookie = Some(flightdeck::core::http::SetCookie::Strip);
    let err = GenericSingleFlightLayer::builder(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .stage("score", cfg.clone())
    .build()
    .unwrap_err();
    assert_eq!((err.stage(), err.field()), (Some("score"), Some("sharing")));
    // The HTTP layer applies them.
    SingleFlightLayer::builder()
        .keys(score_keys())
        .stage("score", cfg)
        .build()
        .unwrap();
}
