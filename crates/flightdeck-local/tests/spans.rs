//! The `flight` span: a leader's and a waiter's carry their role, stage and
//! short digest; a replayed call has no flight, so no span.

use std::time::Duration;

use flightdeck_core::{FlightKey, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use tower::{service_fn, Layer, ServiceExt};
use tracing_subscriber::fmt::format::FmtSpan;

mod support;
use support::LogBuffer;

#[tokio::test(start_paused = true)]
async fn leaders_and_waiters_have_a_flight_span_with_their_role() {
    let buffer = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::NEW)
        .with_ansi(false)
        .with_writer(buffer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let key = FlightKey::from_bytes(StageName::new("spans").unwrap(), "q");
    let short = key.digest().short().to_string();
    let layer = LocalFlightLayer::with_key(
        FlightPolicy::new().replay_ttl(Duration::from_secs(60)),
        move |_: &String| Some(key.clone()),
    );
    let svc = layer.layer(service_fn(|q: String| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, std::convert::Infallible>(q)
    }));
    let (a, b) = tokio::join!(
        svc.clone().oneshot("q".to_owned()),
        svc.clone().oneshot("q".to_owned())
    );
    assert_eq!((a.unwrap(), b.unwrap()), ("q".to_owned(), "q".to_owned()));
    // Replayed: no new span.
    assert_eq!(svc.clone().oneshot("q".to_owned()).await.unwrap(), "q");

    let out = buffer.text();
    let spans: Vec<&str> = out.lines().filter(|l| l.contains("flight{")).collect();
    assert_eq!(spans.len(), 2, "{out}");
    for role in ["leader", "waiter"] {
        let want = format!("role=\"{role}\" stage=spans key={short}");
        assert!(spans.iter().any(|l| l.contains(&want)), "{want} in {out}");
    }
}
