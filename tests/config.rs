//! `StageConfig` from TOML and YAML: a good file loads with its defaults,
//! and each kind of bad value is rejected with a message naming the stage
//! and the field.

#![cfg(all(feature = "toml", feature = "yaml"))]

use std::time::Duration;

use flightdeck::core::{CloneShare, FlightKey};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{ConfigError, Mode, OnWaitFailure, SingleFlightBuilder, SingleFlightConfig};
use flightdeck_testkit::MemoryBackend;

const GOOD_YAML: &str = r#"
single-flight:
  stages:
    interview-score:
      backend: main
      lease-timeout: 30s
      heartbeat-interval: 5s
      wait-timeout: 35s
      result-ttl: 60s

    resume-question:
      backend: main
      lease-timeout: 90s
      heartbeat-interval: 10s
      wait-timeout: 100s
      result-ttl: 10m
      compress-result: true

    final-report:
      mode: distributed-only
      backend: main
      lease-timeout: 180s
      heartbeat-interval: 15s
      wait-timeout: 200s
      result-ttl: 30m
      on-wait-failure: in-progress
      bulkhead:
        limit: 20
        degraded-limit: 5
        degraded-rate-limit: 50
      breaker:
        consecutive-failures: 3
        wait-in-open: 2s
        half-open-probes: 1

    local-summary:
      mode: local-only
      local-replay-ttl: 500ms
"#;

const GOOD_TOML: &str = r#"
[single-flight.stages.interview-score]
backend = "main"
lease-timeout = "30s"
heartbeat-interval = "5s"
wait-timeout = "35s"
result-ttl = "60s"

[single-flight.stages.image-render]
mode = "hybrid"
backend = "main"
on-wait-failure = "local"
coordination-timeout = "150ms"
execution-timeout = "1m30s"

[single-flight.stages.image-render.bulkhead]
limit = 8
degraded-rate-limit = 3
queue = 4
queue-timeout = "250ms"

[single-flight.stages.image-render.breaker]
failure-rate = 0.25
ramp = [0.1, 0.5]
ramp-step = "10s"
"#;

#[test]
fn a_good_yaml_file_loads_with_defaults() {
    let cfg = SingleFlightConfig::from_yaml(GOOD_YAML).unwrap();
    assert_eq!(cfg.stages.len(), 4);
    let score = &cfg.stages["interview-score"];
    assert_eq!(score.mode, Mode::Hybrid, "default mode");
    assert_eq!(score.lease_timeout, Duration::from_secs(30));
    assert_eq!(score.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(score.result_ttl, Duration::from_secs(60));
    assert!(score.allow_takeover, "default");
    assert_eq!(
        score.coordination_timeout,
        Duration::from_millis(200),
        "default"
    );
    let resume = &cfg.stages["resume-question"];
    assert_eq!(resume.result_ttl, Duration::from_secs(600));
    let report = &cfg.stages["final-report"];
    assert_eq!(report.mode, Mode::DistributedOnly);
    assert_eq!(report.on_wait_failure, OnWaitFailure::InProgress);
    assert_eq!(report.bulkhead.limit, 20);
    assert_eq!(report.bulkhead.effective_degraded_limit(), 5);
    assert_eq!(report.bulkhead.degraded_rate_limit, Some(50));
    assert_eq!(score.bulkhead.degraded_rate_limit, None, "default");
    assert_eq!(report.breaker.consecutive_failures, Some(3));
    assert_eq!(report.breaker.half_open_probes, 1);
    let local = &cfg.stages["local-summary"];
    assert_eq!(local.mode, Mode::LocalOnly);
    assert_eq!(local.local_replay_ttl, Duration::from_millis(500));
}

#[test]
fn a_good_toml_file_loads_and_builds_a_layer() {
    let cfg = SingleFlightConfig::from_toml(GOOD_TOML).unwrap();
    let img = &cfg.stages["image-render"];
    assert_eq!(img.on_wait_failure, OnWaitFailure::Local);
    assert_eq!(img.execution_timeout, Some(Duration::from_secs(90)));
    assert_eq!(img.coordination_timeout, Duration::from_millis(150));
    assert_eq!(img.bulkhead.queue, 4);
    assert_eq!(img.bulkhead.degraded_rate_limit, Some(3));
    assert_eq!(img.breaker.ramp, vec![0.1, 0.5]);

    let layer = SingleFlightBuilder::new(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("main", MemoryBackend::new())
    .config(cfg)
    .build()
    .unwrap();
    let handle = layer.stage("image-render").unwrap();
    assert_eq!(handle.mode(), Mode::Hybrid);
    assert_eq!(handle.bulkhead().limit(), 8);
    assert_eq!(handle.config().breaker.failure_rate, 0.25);
    assert!(layer.stage("interview-score").is_some());
}

fn yaml_stage(body: &str) -> ConfigError {
    let text = format!("single-flight:\n  stages:\n    my-stage:\n{body}");
    SingleFlightConfig::from_yaml(&text).unwrap_err()
}

fn assert_names(err: &ConfigError, field: &str) {
    assert_eq!(err.stage(), Some("my-stage"), "{err}");
    assert_eq!(err.field(), Some(field), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("my-stage") && msg.contains(field), "{msg}");
}

#[test]
fn heartbeat_of_half_the_lease_is_rejected() {
    let err = yaml_stage(
        "      backend: main\n      lease-timeout: 30s\n      heartbeat-interval: 15s\n",
    );
    assert_names(&err, "heartbeat-interval");
    assert!(err.to_string().contains("third of lease-timeout"), "{err}");
}

#[test]
fn a_wait_shorter_than_the_lease_is_rejected_when_takeover_is_allowed() {
    let err =
        yaml_stage("      backend: main\n      lease-timeout: 30s\n      wait-timeout: 10s\n");
    assert_names(&err, "wait-timeout");
}

#[test]
fn distributed_modes_need_a_backend() {
    let err = yaml_stage("      mode: distributed-only\n");
    assert_names(&err, "backend");
    assert!(err.to_string().contains("distributed-only"));
}

#[test]
fn local_execution_after_a_failed_wait_is_not_for_distributed_only() {
    let err = yaml_stage(
        "      mode: distributed-only\n      backend: main\n      on-wait-failure: local\n",
    );
    assert_names(&err, "on-wait-failure");
}

#[test]
fn bulkhead_and_breaker_values_are_checked() {
    let err = yaml_stage(
        "      mode: local-only\n      bulkhead:\n        limit: 4\n        degraded-limit: 9\n",
    );
    assert_names(&err, "bulkhead.degraded-limit");
    let err = yaml_stage("      mode: local-only\n      bulkhead:\n        limit: 0\n");
    assert_names(&err, "bulkhead.limit");
    let err =
        yaml_stage("      mode: local-only\n      bulkhead:\n        degraded-rate-limit: 0\n");
    assert_names(&err, "bulkhead.degraded-rate-limit");
    assert!(err.to_string().contains("permits per second"), "{err}");
    let err = yaml_stage("      mode: local-only\n      breaker:\n        failure-rate: 2.0\n");
    assert_names(&err, "breaker");
    assert!(err.to_string().contains("failure rate"), "{err}");
    let err = yaml_stage("      mode: local-only\n      coordination-timeout: 0\n");
    assert_names(&err, "coordination-timeout");
    let err = yaml_stage("      mode: local-only\n      max-waiters: 0\n");
    assert_names(&err, "max-waiters");
}

#[test]
fn parse_errors_name_the_value() {
    let cases = [
        ("      mode: sometimes\n", "sometimes"),
        ("      lease-timeout: 30\n", "missing unit"),
        ("      lease-timeout: 30 parsecs\n", "unknown unit"),
        ("      lease: 30s\n", "lease"),
        ("      on-wait-failure: retry\n", "retry"),
        (
            "      bulkhead:\n        degraded-rate-limit: -5\n",
            "degraded-rate-limit",
        ),
        (
            "      bulkhead:\n        degraded-rate-limit: fast\n",
            "degraded-rate-limit",
        ),
    ];
    for (body, needle) in cases {
        let err = yaml_stage(body);
        assert!(
            matches!(err, ConfigError::Parse { format: "yaml", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let err = SingleFlightConfig::from_toml(
        "[single-flight.stages.my-stage]\nheartbeat-interval = \"5 s\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("heartbeat-interval"), "{err}");
    let err = SingleFlightConfig::from_toml("[single-flight.stages.my-stage]\nleese = \"5s\"\n")
        .unwrap_err();
    assert!(err.to_string().contains("leese"), "{err}");
}

#[test]
fn a_stage_naming_an_unregistered_backend_is_rejected_at_build() {
    let cfg = SingleFlightConfig::from_yaml(
        "single-flight:\n  stages:\n    my-stage:\n      backend: elsewhere\n",
    )
    .unwrap();
    let err = SingleFlightBuilder::new(
        |_: &String| None::<FlightKey>,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
    )
    .backend("main", MemoryBackend::new())
    .config(cfg)
    .build()
    .unwrap_err();
    assert_names(&err, "backend");
    assert!(err.to_string().contains("elsewhere"));
}

#[test]
fn a_bad_stage_name_is_rejected() {
    let err = SingleFlightConfig::from_yaml(
        "single-flight:\n  stages:\n    \"\":\n      mode: local-only\n",
    )
    .unwrap_err();
    assert_eq!(err.field(), Some("stage"), "{err}");
}
