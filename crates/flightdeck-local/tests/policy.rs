//! A policy under which the layer coalesces nothing (a `0` read as "no
//! limit") is legal, does what its documentation says, and is never
//! silent: building a layer with one warns, naming the setting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::{BoxError, CloneShare, FlightKey, Shareable, StageName};
use flightdeck_local::{Caller, FlightPolicy, LocalFlightLayer, LocalFlights};
use tokio::time::sleep;

mod support;
use support::LogBuffer;

/// The warnings logged while `build` runs.
fn warnings(build: impl FnOnce()) -> Vec<String> {
    let buffer = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(buffer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, build);
    let out = buffer.text();
    out.lines().map(str::to_owned).collect()
}

#[test]
fn each_setting_that_leaves_nothing_to_coalesce_is_warned_about_by_name() {
    let cases = [
        (
            FlightPolicy::new().flight_ttl(Duration::ZERO),
            "flight_ttl",
            "Duration::MAX",
        ),
        (
            FlightPolicy::new().wait_timeout(Some(Duration::ZERO)),
            "wait_timeout",
            "WaitTimeout",
        ),
        (
            FlightPolicy::new().max_flights(0),
            "max_flights",
            "TooManyFlights",
        ),
        (
            FlightPolicy::new().max_waiters(0),
            "max_waiters",
            "TooManyWaiters",
        ),
    ];
    for (policy, setting, says) in cases {
        // Both ways a policy is built into a layer.
        let lib = warnings(|| drop(LocalFlights::<String>::new(policy.clone())));
        let layer = warnings(|| {
            drop(LocalFlightLayer::<_, CloneShare<String>>::with_key(
                policy.clone(),
                |_: &String| None::<FlightKey>,
            ));
        });
        for got in [lib, layer] {
            assert_eq!(got.len(), 1, "{setting}: {got:?}");
            assert!(got[0].contains("WARN"), "{got:?}");
            assert!(got[0].contains(setting) && got[0].contains(says), "{got:?}");
        }
    }
    // The defaults, and limits that are merely long, say nothing.
    let quiet = FlightPolicy::new()
        .flight_ttl(Duration::MAX)
        .wait_timeout(None)
        .max_flights(1)
        .max_waiters(1);
    for policy in [FlightPolicy::new(), quiet] {
        let got = warnings(|| drop(LocalFlights::<String>::new(policy)));
        assert!(got.is_empty(), "{got:?}");
    }
}

type Work = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Shareable<String, String>, BoxError>> + Send>,
>;

/// Work that counts its runs and answers after a second.
fn slow(runs: &Arc<AtomicUsize>) -> impl FnOnce() -> Work + Send + 'static {
    let runs = runs.clone();
    move || {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_secs(1)).await;
            Ok(Shareable::Shared("answer".to_owned()))
        })
    }
}

/// A flight TTL of 0 does what it says: a caller that comes while the
/// first one's work runs starts its own; under the default, it joins.
#[tokio::test(start_paused = true)]
async fn a_flight_ttl_of_zero_lets_no_caller_join() {
    for (ttl, want) in [(Duration::ZERO, 2), (Duration::from_secs(30), 1)] {
        let flights = LocalFlights::<String>::new(FlightPolicy::new().flight_ttl(ttl));
        let runs = Arc::new(AtomicUsize::new(0));
        let key = FlightKey::from_bytes(StageName::new("ttl").unwrap(), "q");
        let first = tokio::spawn(flights.run(&key, Caller::new(), slow(&runs)));
        sleep(Duration::from_millis(100)).await;
        let second = tokio::spawn(flights.run(&key, Caller::new(), slow(&runs)));
        assert!(first.await.unwrap().is_ok());
        assert!(second.await.unwrap().is_ok());
        assert_eq!(runs.load(Ordering::SeqCst), want, "flight TTL {ttl:?}");
    }
}
