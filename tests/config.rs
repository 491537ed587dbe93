//! `StageConfig` from TOML and YAML: a good file loads with its defaults,
//! and each kind of bad value is rejected with a message naming the stage
//! and the field.

#![cfg(all(feature = "toml", feature = "yaml"))]

use std::time::Duration;

use flightdeck::core::{CloneShare, FlightKey};
use flightdeck::distributed::PostcardCodec;
use flightdeck::{ConfigError, GenericSingleFlightLayer, Mode, OnWaitFailure, SingleFlightConfig};
use flightdeck_test::MemoryBackend;

const GOOD_YAML: &str = r#"
single-flight:
  stages:
    interview-score:
      backend: main
      lease-timeout: 30s
      heartbeat-interval: 5s
      wait-timeout: 35s
      replay-ttl: 60s

    resume-question:
      backend: main
      lease-timeout: 90s
      heartbeat-interval: 10s
      wait-timeout: 100s
      replay-ttl: 10m
      compress-result: true

    final-report:
      mode: distributed-only
      backend: main
      lease-timeout: 180s
      heartbeat-interval: 15s
      wait-timeout: 200s
      replay-ttl: 30m
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
      replay-ttl: 500ms
"#;

const GOOD_TOML: &str = r#"
[single-flight.stages.interview-score]
backend = "main"
lease-timeout = "30s"
heartbeat-interval = "5s"
wait-timeout = "35s"
replay-ttl = "60s"

[single-flight.stages.image-render]
mode = "hybrid"
backend = "main"
on-wait-failure = "local"
coordination-timeout = "150ms"
execution-timeout = "1m30s"
commit-replicas = 1
commit-replicas-timeout = "50ms"

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
    assert_eq!(score.replay_ttl, Duration::from_secs(60));
    assert!(score.allow_takeover, "default");
    assert_eq!(
        score.coordination_timeout,
        Duration::from_millis(200),
        "default"
    );
    let resume = &cfg.stages["resume-question"];
    assert_eq!(resume.replay_ttl, Duration::from_secs(600));
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
    assert_eq!(local.replay_ttl, Duration::from_millis(500));
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
    let policy = img.distributed_policy();
    assert_eq!(policy.commit_replica_count(), 1);
    assert_eq!(
        policy.commit_replicas_timeout_duration(),
        Duration::from_millis(50)
    );
    let score = cfg.stages["interview-score"].distributed_policy();
    assert_eq!(score.commit_replica_count(), 0, "no wait by default");

    let layer = GenericSingleFlightLayer::builder(
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

/// The keys `replay-ttl` replaced are refused in YAML too, naming it and
/// saying why (never dropped silently).
#[test]
fn the_old_replay_keys_are_refused_naming_replay_ttl() {
    for old in ["result-ttl", "local-replay-ttl"] {
        let err = yaml_stage(&format!("      mode: local-only\n      {old}: 60s\n"));
        assert_names(&err, "replay-ttl");
        assert!(err.to_string().contains(old), "{err}");
        assert!(err.to_string().contains("every mode"), "{err}");
    }
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
    assert_names(&err, "breaker.failure-rate");
    assert!(err.to_string().contains("failure rate"), "{err}");
    let err = yaml_stage("      mode: local-only\n      coordination-timeout: 0\n");
    assert_names(&err, "coordination-timeout");
    let err = yaml_stage("      mode: local-only\n      max-waiters: 0\n");
    assert_names(&err, "max-waiters");
}

#[test]
fn parse_errors_name_the_stage_and_the_field() {
    let cases = [
        ("      mode: sometimes\n", "mode", "sometimes"),
        ("      lease-timeout: 30\n", "lease-timeout", "missing unit"),
        (
            "      lease-timeout: 30 parsecs\n",
            "lease-timeout",
            "unknown unit",
        ),
        ("      lease: 30s\n", "lease", "lease"),
        ("      on-wait-failure: retry\n", "on-wait-failure", "retry"),
        (
            "      bulkhead:\n        degraded-rate-limit: -5\n",
            "bulkhead.degraded-rate-limit",
            "-5",
        ),
        (
            "      bulkhead:\n        degraded-rate-limit: fast\n",
            "bulkhead.degraded-rate-limit",
            "fast",
        ),
    ];
    for (body, field, needle) in cases {
        let err = yaml_stage(body);
        assert_names(&err, field);
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let err = SingleFlightConfig::from_toml(
        "[single-flight.stages.my-stage]\nheartbeat-interval = \"5 s\"\n",
    )
    .unwrap_err();
    assert_names(&err, "heartbeat-interval");
    let err = SingleFlightConfig::from_toml("[single-flight.stages.my-stage]\nleese = \"5s\"\n")
        .unwrap_err();
    assert_names(&err, "leese");
    // A document that is not TOML at all is a parse error, with its line.
    let err = SingleFlightConfig::from_toml("[single-flight.stages.my-stage\n").unwrap_err();
    assert!(
        matches!(err, ConfigError::Parse { format: "toml", .. }),
        "{err:?}"
    );
}

/// Every key of the configuration table, with a bad value: the error names
/// the stage and the field (as the file spells it), for values the parser
/// refuses and for values the validation refuses alike.
#[test]
fn every_bad_value_names_its_stage_and_field() {
    let cases: &[(&str, &str)] = &[
        ("mode = \"often\"", "mode"),
        ("mode = \"hybrid\"", "backend"),
        ("lease-timeout = \"5ms\"", "lease-timeout"),
        ("lease-timeout = \"31d\"", "lease-timeout"),
        ("lease-timeout = 30", "lease-timeout"),
        ("heartbeat-interval = \"0\"", "heartbeat-interval"),
        ("heartbeat-interval = \"20s\"", "heartbeat-interval"),
        ("wait-timeout = \"0\"", "wait-timeout"),
        ("wait-timeout = \"10s\"", "wait-timeout"),
        ("poll-interval = \"0\"", "poll-interval"),
        ("replay-ttl = \"40d\"", "replay-ttl"),
        ("failure-ttl = \"40d\"", "failure-ttl"),
        // The keys `replay-ttl` replaced are refused, naming it.
        ("result-ttl = \"60s\"", "replay-ttl"),
        ("local-replay-ttl = \"500ms\"", "replay-ttl"),
        ("compress-result = \"yes\"", "compress-result"),
        ("compress-above = -1", "compress-above"),
        ("inline-publish-below = \"8k\"", "inline-publish-below"),
        ("max-result-bytes = 0", "max-result-bytes"),
        ("max-result-bytes = 1000000000", "max-result-bytes"),
        ("allow-takeover = 1", "allow-takeover"),
        ("on-wait-failure = \"panic\"", "on-wait-failure"),
        ("coordination-timeout = \"0\"", "coordination-timeout"),
        ("coordination-timeout = \"40s\"", "coordination-timeout"),
        ("execution-timeout = \"0\"", "execution-timeout"),
        ("commit-attempts = 0", "commit-attempts"),
        ("commit-attempts = 4294967295", "commit-attempts"),
        ("commit-replicas = 17", "commit-replicas"),
        ("commit-replicas = -1", "commit-replicas"),
        (
            "commit-replicas = 1\ncommit-replicas-timeout = \"1s\"",
            "commit-replicas-timeout",
        ),
        (
            "commit-replicas-timeout = \"40d\"",
            "commit-replicas-timeout",
        ),
        ("max-flights = 0", "max-flights"),
        ("max-flights = 18446744073709551615", "max-flights"),
        ("max-waiters = 0", "max-waiters"),
        ("max-waiters = 18446744073709551615", "max-waiters"),
        ("bulkhead.limit = 0", "bulkhead.limit"),
        ("bulkhead.limit = 18446744073709551615", "bulkhead.limit"),
        ("bulkhead.degraded-limit = 0", "bulkhead.degraded-limit"),
        ("bulkhead.degraded-limit = 5000", "bulkhead.degraded-limit"),
        (
            "bulkhead.degraded-rate-limit = 0",
            "bulkhead.degraded-rate-limit",
        ),
        (
            "bulkhead.degraded-rate-limit = -5",
            "bulkhead.degraded-rate-limit",
        ),
        ("bulkhead.queue = 18446744073709551615", "bulkhead.queue"),
        (
            "bulkhead.queue = 4\nbulkhead.queue-timeout = \"0\"",
            "bulkhead.queue-timeout",
        ),
        ("breaker.window = 0", "breaker.window"),
        ("breaker.window = 4294967295", "breaker.window"),
        ("breaker.min-calls = 1000", "breaker.min-calls"),
        ("breaker.failure-rate = 2.0", "breaker.failure-rate"),
        (
            "breaker.consecutive-failures = 0",
            "breaker.consecutive-failures",
        ),
        ("breaker.wait-in-open = \"31d\"", "breaker.wait-in-open"),
        ("breaker.jitter = 11.0", "breaker.jitter"),
        ("breaker.half-open-probes = 0", "breaker.half-open-probes"),
        (
            "breaker.half-open-probes = 4294967295",
            "breaker.half-open-probes",
        ),
        ("breaker.probe-timeout = \"0\"", "breaker.probe-timeout"),
        ("breaker.ramp = [2.0]", "breaker.ramp"),
        (
            "breaker.ramp = [0.5]\nbreaker.ramp-step = \"0\"",
            "breaker.ramp-step",
        ),
        ("sharing.set-cookie = \"keep\"", "sharing.set-cookie"),
        ("sharing.cache-control = \"maybe\"", "sharing.cache-control"),
        ("stale-while-revalidate = \"40d\"", "stale-while-revalidate"),
        ("stale-while-revalidate = 5", "stale-while-revalidate"),
        ("stale-if-error = \"5 s\"", "stale-if-error"),
        ("stale-retry-after = \"10s\"", "stale-retry-after"),
        ("stale-retry-after = \"40d\"", "stale-retry-after"),
        (
            "stale-if-error = \"1m\"\nexecution-timeout = \"1s\"\nsoft-timeout = \"1s\"",
            "soft-timeout",
        ),
        ("soft-timeout = \"100ms\"", "soft-timeout"),
        ("early-refresh = \"1s\"", "early-refresh"),
        ("soft-timeout = \"-1s\"", "soft-timeout"),
        ("early-refresh = \"31d\"", "early-refresh"),
        ("hit-for-pass = \"forever\"", "hit-for-pass"),
        ("cache-status = \"yes\"", "cache-status"),
        (
            "stale-if-error = \"1m\"\nstale-max-entries = 0",
            "stale-max-entries",
        ),
        (
            "stale-if-error = \"1m\"\nstale-max-bytes = 0",
            "stale-max-bytes",
        ),
        (
            "stale-max-entries = 18446744073709551615",
            "stale-max-entries",
        ),
        (
            "stale-if-error = \"1m\"\nsoft-timeout = \"35s\"",
            "soft-timeout",
        ),
        (
            "hit-for-pass = \"1m\"\nstale-max-entries = 0",
            "stale-max-entries",
        ),
        (
            "hit-for-pass = \"1m\"\nstale-max-bytes = 0",
            "stale-max-bytes",
        ),
        (
            "cache-status = true\nreplay-ttl = \"5s\"\nstale-max-entries = 0",
            "stale-max-entries",
        ),
    ];
    for (line, field) in cases {
        // Every case is a local-only stage (no backend needed) unless the
        // line says otherwise.
        let mode = if line.starts_with("mode") {
            ""
        } else {
            "mode = \"local-only\"\n"
        };
        let text = format!("[single-flight.stages.my-stage]\n{mode}{line}\n");
        let err = SingleFlightConfig::from_toml(&text).unwrap_err();
        assert_names(&err, field);
    }
    // Every stage key of the configuration reference has a case above.
    let reference = include_str!("../docs/configuration.md");
    let documented = reference
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split(" |").next())
        .flat_map(|keys| keys.split(" / "))
        .map(|k| k.trim_matches('`'))
        .filter(|k| !k.starts_with("keys."));
    for key in documented {
        assert!(
            cases.iter().any(|(_, field)| *field == key),
            "docs/configuration.md lists `{key}`, which no case here checks"
        );
    }
}

/// A stage name too long to be one is cut in the message (the whole name
/// stays in the error's fields).
#[test]
fn long_stage_names_are_cut_in_messages() {
    let name = "x".repeat(500);
    let err = SingleFlightConfig::from_toml(&format!(
        "[single-flight.stages.{name}]\nmode = \"local-only\"\n"
    ))
    .unwrap_err();
    assert_eq!(err.stage(), Some(name.as_str()));
    assert!(err.to_string().len() < 200, "{err}");
}

#[test]
fn a_stage_naming_an_unregistered_backend_is_rejected_at_build() {
    let cfg = SingleFlightConfig::from_yaml(
        "single-flight:\n  stages:\n    my-stage:\n      backend: elsewhere\n",
    )
    .unwrap();
    let err = GenericSingleFlightLayer::builder(
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

#[test]
fn the_keys_table_is_read_and_checked() {
    let cfg =
        SingleFlightConfig::from_toml("[single-flight.keys]\nignore-authority = true\n").unwrap();
    assert!(cfg.keys.ignore_authority);
    assert!(!SingleFlightConfig::default().keys.ignore_authority);
    let err =
        SingleFlightConfig::from_toml("[single-flight.keys]\nignore-host = true\n").unwrap_err();
    match &err {
        ConfigError::Invalid { stage, field, .. } => {
            assert_eq!(stage.as_deref(), None);
            assert_eq!(field.as_ref(), "keys.ignore-host", "{err}");
        }
        other => panic!("{other:?}"),
    }
    let err = SingleFlightConfig::from_toml("[single-flight.keys]\nignore-authority = \"yes\"\n")
        .unwrap_err();
    match &err {
        ConfigError::Invalid { field, .. } => {
            assert_eq!(field.as_ref(), "keys.ignore-authority", "{err}");
        }
        other => panic!("{other:?}"),
    }
}

/// The stale keys: each parsed into its field (off when absent), the
/// windows read back as `StaleWindows`, and a typo gets a suggestion.
#[test]
fn the_stale_keys_are_parsed_and_suggested() {
    let cfg = SingleFlightConfig::from_toml(
        r#"
[single-flight.stages.page]
mode = "local-only"
replay-ttl = "2s"
stale-while-revalidate = "30s"
stale-if-error = "10m"
stale-retry-after = "15s"
soft-timeout = "300ms"
execution-timeout = "5s"
early-refresh = "1s"
hit-for-pass = "2m"
stale-max-entries = 500
stale-max-bytes = 1048576
cache-status = true

[single-flight.stages.plain]
mode = "local-only"
"#,
    )
    .unwrap();
    let page = &cfg.stages["page"];
    let w = page.stale_windows();
    assert_eq!(w.revalidate, Duration::from_secs(30));
    assert_eq!(w.if_error, Duration::from_secs(600));
    assert_eq!(w.retry_after, Duration::from_secs(15));
    assert_eq!(w.soft_timeout, Duration::from_millis(300));
    assert_eq!(w.early_refresh, Duration::from_secs(1));
    assert_eq!(page.hit_for_pass, Duration::from_secs(120));
    assert_eq!(
        (page.stale_max_entries, page.stale_max_bytes),
        (500, 1 << 20)
    );
    assert!(page.cache_status);
    let plain = &cfg.stages["plain"];
    assert!(!plain.stale_windows().any(), "off unless asked for");
    assert!(plain.hit_for_pass.is_zero() && !plain.cache_status);

    let err = SingleFlightConfig::from_toml(
        "[single-flight.stages.page]\nstale-while-revalidat = \"1s\"\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("`stale-while-revalidate`"),
        "{err}"
    );
}

/// "Every duration is bounded by 30 days": the execution timeout and the
/// bulkhead's queue timeout too, in a file as in code.
#[test]
fn execution_and_queue_timeouts_are_bounded_like_every_duration() {
    let cases = [
        ("execution-timeout = \"31d\"", "execution-timeout"),
        (
            "bulkhead.queue = 4\nbulkhead.queue-timeout = \"31d\"",
            "bulkhead.queue-timeout",
        ),
    ];
    for (line, field) in cases {
        let text = format!("[single-flight.stages.my-stage]\nmode = \"local-only\"\n{line}\n");
        let err = SingleFlightConfig::from_toml(&text).unwrap_err();
        assert_names(&err, field);
        assert!(err.to_string().contains("30 days"), "{err}");
    }
    let mut cfg = flightdeck::StageConfig::new().mode(Mode::LocalOnly);
    cfg.execution_timeout = Some(Duration::MAX);
    assert_names(&cfg.validate("my-stage").unwrap_err(), "execution-timeout");
    let mut cfg = flightdeck::StageConfig::new().mode(Mode::LocalOnly);
    cfg.bulkhead.queue = 1;
    cfg.bulkhead.queue_timeout = Duration::MAX;
    assert_names(
        &cfg.validate("my-stage").unwrap_err(),
        "bulkhead.queue-timeout",
    );
}

/// A stage given twice in one YAML document is refused, naming it: the
/// second table never silently replaces the first (TOML refuses a
/// duplicate table as a syntax error).
#[test]
fn a_stage_given_twice_is_refused() {
    let err = SingleFlightConfig::from_yaml(
        "single-flight:\n  stages:\n    my-stage:\n      mode: local-only\n      \
         replay-ttl: 5s\n    my-stage:\n      mode: bypass\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("my-stage"), "{err}");
    assert!(err.to_string().contains("twice"), "{err}");
    let err = SingleFlightConfig::from_toml(
        "[single-flight.stages.my-stage]\nmode = \"local-only\"\n\
         [single-flight.stages.my-stage]\nmode = \"bypass\"\n",
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
}
