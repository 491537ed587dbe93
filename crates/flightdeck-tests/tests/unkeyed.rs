//! Nothing silent: a request that no key rule matches (a path typo'd in
//! the rules, or in the client) is counted in
//! `singleflight_unkeyed_total{reason}` and logged once per method and
//! path, naming the closest rule. Alone in its binary: it installs the
//! global recorder and a log subscriber for the whole test.
#![cfg(feature = "testing")]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use flightdeck::core::metric;
use flightdeck::key::http::{HttpKeyExtractor, Route};
use flightdeck::testing::body_text;
use flightdeck::{Mode, SingleFlightLayer, StageConfig};
use http::{Method, Request};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::ServiceExt;

/// The log lines, as the fmt subscriber writes them.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A counter's name, labels and value.
type Counted = (String, Vec<(String, String)>, u64);

fn counter(snapshot: &[Counted], name: &str, label: (&str, &str)) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name && labels.iter().any(|(k, v)| k == label.0 && v == label.1)
        })
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_no_rule_matches_is_counted_and_logged_once_per_method_and_path() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logs = tracing::subscriber::set_default(subscriber);

    let keys = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(1024))
        .build()
        .unwrap();
    let flights = SingleFlightLayer::builder()
        .keys(keys)
        .stage("score", StageConfig::new().mode(Mode::LocalOnly))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter_ = runs.clone();
    let scorer = post(move |body: String| {
        let runs = counter_.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            format!("score of {body}")
        }
    });
    // The route the client calls is not the one the rule names.
    let app = Router::new().route("/v1/scores", scorer).layer(flights);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let req = Request::post("/v1/scores").body(Body::from("42")).unwrap();
        calls.spawn(app.clone().oneshot(req));
    }
    while let Some(resp) = calls.join_next().await {
        assert_eq!(
            body_text(resp.unwrap().unwrap()).await.unwrap(),
            "score of 42"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 50, "nothing coalesced");

    let snapshot: Vec<Counted> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(v) => {
                let (_, key) = key.into_parts();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                Some((key.name().to_owned(), labels, v))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        counter(&snapshot, metric::UNKEYED_TOTAL, ("reason", "method")),
        50,
        "{snapshot:?}"
    );
    assert_eq!(
        counter(&snapshot, metric::REQUEST_TOTAL, ("stage", "score")),
        0
    );

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not coalesced"))
        .collect();
    assert_eq!(logged.len(), 1, "once per method and path:\n{text}");
    for needle in [
        "POST",
        "/v1/scores",
        "closest rule: POST /v1/score",
        "reason=\"method\"",
    ] {
        assert!(logged[0].contains(needle), "{needle}: {}", logged[0]);
    }
}
