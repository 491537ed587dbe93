//! Parsing, deadline choice, slices and enforcement, on tokio's paused clock.

use std::time::Duration;

use flightdeck_budget::{
    parse_grpc_timeout, parse_timeout, BudgetLayer, Deadline, FromHeaders, InvalidTimeout, Phase,
    Slices,
};
use flightdeck_core::error::DeadlineExceeded;
use flightdeck_core::ErrorClass;
use proptest::prelude::*;
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[test]
fn grpc_timeout_every_unit() {
    let p = |s: &str| parse_grpc_timeout(s.as_bytes());
    assert_eq!(p("3H"), Ok(Duration::from_secs(3 * 3600)));
    assert_eq!(p("2M"), Ok(Duration::from_secs(120)));
    assert_eq!(p("7S"), Ok(Duration::from_secs(7)));
    assert_eq!(p("250m"), Ok(Duration::from_millis(250)));
    assert_eq!(p("40u"), Ok(Duration::from_micros(40)));
    assert_eq!(p("5n"), Ok(Duration::from_nanos(5)));
    assert_eq!(p("0m"), Ok(Duration::ZERO));
    // The largest value the spec allows, in the largest unit, fits.
    assert_eq!(p("99999999H"), Ok(Duration::from_secs(99_999_999 * 3600)));
}

#[test]
fn grpc_timeout_overflow_garbage_and_empty_are_named_errors() {
    let problem = |s: &[u8]| parse_grpc_timeout(s).unwrap_err().problem();
    assert_eq!(problem(b"123456789S"), "more than 8 digits");
    assert_eq!(problem(b"99999999999999999999999H"), "more than 8 digits");
    assert_eq!(problem(b""), "empty value");
    assert_eq!(problem(b"S"), "no digits before the unit");
    assert_eq!(problem(b"100"), "missing unit (H, M, S, m, u or n)");
    assert_eq!(
        problem(b"10x"),
        "unknown unit (expected H, M, S, m, u or n)"
    );
    assert_eq!(problem(b"1.5S"), "not a number");
    assert_eq!(problem(b"-5S"), "not a number");
    assert_eq!(problem(b" 5S"), "not a number");
    assert_eq!(problem("５S".as_bytes()), "not a number");
    assert_eq!(problem(&[0xff, b'S']), "not a number");
    let e = parse_grpc_timeout(b"abc").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid grpc-timeout header: unknown unit (expected H, M, S, m, u or n)"
    );
}

#[test]
fn request_timeout_header_formats() {
    let p = |s: &str| parse_timeout("x-request-timeout", s);
    assert_eq!(p("1500"), Ok(Duration::from_millis(1500)));
    assert_eq!(p("1500ms"), Ok(Duration::from_millis(1500)));
    assert_eq!(p("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(p("3m"), Ok(Duration::from_secs(180)));
    assert_eq!(p("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(p("10us"), Ok(Duration::from_micros(10)));
    assert_eq!(p("10ns"), Ok(Duration::from_nanos(10)));
    assert_eq!(p(" 5 s "), Ok(Duration::from_secs(5)));
    assert!(p("").is_err());
    assert!(p("soon").is_err());
    assert!(p("5 minutes").is_err());
    assert_eq!(
        p("9999999999999").unwrap_err().problem(),
        "more than 12 digits"
    );
}

proptest! {
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        let _ = parse_grpc_timeout(&bytes);
        if let Ok(s) = std::str::from_utf8(&bytes) {
            let _ = parse_timeout("x", s);
        }
    }

    #[test]
    fn slices_never_exceed_the_remainder(
        total_ms in 0u64..100_000,
        elapsed_ms in 0u64..200_000,
        coord_ms in 0u64..10_000,
        exec_ms in proptest::option::of(0u64..100_000),
        result_ms in 0u64..10_000,
    ) {
        let t0 = Instant::now();
        let slices = Slices {
            coordination: Duration::from_millis(coord_ms),
            execution: exec_ms.map(Duration::from_millis),
            result: Duration::from_millis(result_ms),
        };
        let d = Deadline::new(t0 + Duration::from_millis(total_ms), slices);
        let now = t0 + Duration::from_millis(elapsed_ms);
        let remaining = d.remaining_at(now);
        prop_assert_eq!(remaining, Duration::from_millis(total_ms.saturating_sub(elapsed_ms)));
        for phase in [Phase::Coordination, Phase::Execution, Phase::Result] {
            let s = d.slice_at(phase, now);
            prop_assert!(s <= remaining);
            if let Some(cfg) = slices.of(phase) {
                prop_assert!(s <= cfg);
                prop_assert_eq!(s, cfg.min(remaining));
            } else {
                prop_assert_eq!(s, remaining);
            }
        }
    }
}

fn echo_deadline() -> impl tower::Service<
    http::Request<()>,
    Response = Deadline,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|req: http::Request<()>| async move {
        Ok(*req.extensions().get::<Deadline>().expect("attached"))
    })
}

fn req(headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder();
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn deadline_is_the_minimum_of_inbound_and_stage() {
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new(Duration::from_secs(2)))
        .service(echo_deadline());
    let remaining = |h: &'static [(&'static str, &'static str)]| {
        let svc = svc.clone();
        async move { svc.oneshot(req(h)).await.unwrap().remaining() }
    };
    assert_eq!(
        remaining(&[]).await,
        Duration::from_secs(2),
        "no inbound: the stage total"
    );
    assert_eq!(
        remaining(&[("grpc-timeout", "500m")]).await,
        Duration::from_millis(500)
    );
    assert_eq!(
        remaining(&[("grpc-timeout", "1H")]).await,
        Duration::from_secs(2),
        "stage is smaller"
    );
    assert_eq!(
        remaining(&[("x-request-timeout", "700")]).await,
        Duration::from_millis(700)
    );
    assert_eq!(
        remaining(&[("grpc-timeout", "900m"), ("x-request-timeout", "300ms")]).await,
        Duration::from_millis(300),
        "both headers: the smaller"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outer_deadline_and_a_custom_header_are_honoured() {
    let layer = BudgetLayer::new(Duration::from_secs(5))
        .inbound(FromHeaders::new().header(http::HeaderName::from_static("x-deadline-ms")));
    let svc = ServiceBuilder::new().layer(layer).service(echo_deadline());
    let d = svc
        .clone()
        .oneshot(req(&[("x-deadline-ms", "1200")]))
        .await
        .unwrap();
    assert_eq!(d.remaining(), Duration::from_millis(1200));
    let mut r = req(&[]);
    r.extensions_mut().insert(Deadline::after(
        Duration::from_millis(80),
        Slices::default(),
    ));
    let d = svc.oneshot(r).await.unwrap();
    assert_eq!(d.remaining(), Duration::from_millis(80));
}

#[tokio::test(start_paused = true)]
async fn malformed_header_is_an_error_or_ignored_by_config() {
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new(Duration::from_secs(1)))
        .service(echo_deadline());
    let err = svc
        .oneshot(req(&[("grpc-timeout", "soon")]))
        .await
        .unwrap_err();
    let invalid = err.downcast_ref::<InvalidTimeout>().expect("typed error");
    assert_eq!(invalid.header(), "grpc-timeout");
    // The client's mistake: 400 / INVALID_ARGUMENT through the adapters.
    let class = flightdeck_core::ErrorClass::of(&*err);
    assert_eq!((class.http_status(), class.grpc_code()), (400, 3));

    let svc = ServiceBuilder::new()
        .layer(
            BudgetLayer::new(Duration::from_secs(1))
                .inbound(FromHeaders::new().ignore_invalid(true)),
        )
        .service(echo_deadline());
    let mut r = req(&[("grpc-timeout", "soon")]);
    r.headers_mut().insert(
        "x-request-timeout",
        http::HeaderValue::from_bytes(b"\xff").unwrap(),
    );
    let d = svc.oneshot(r).await.unwrap();
    assert_eq!(d.remaining(), Duration::from_secs(1));
}

/// A timeout header given twice is as bad as its values joined by a comma
/// (`x-request-timeout: 5000, 100`, which HTTP makes the same field): a
/// named error, never one of the two picked in silence.
#[tokio::test(start_paused = true)]
async fn a_timeout_header_given_twice_is_a_named_error() {
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new(Duration::from_secs(10)))
        .service(echo_deadline());
    for (name, first, second) in [
        ("x-request-timeout", "5000", "100"),
        ("grpc-timeout", "5S", "100m"),
    ] {
        let err = svc
            .clone()
            .oneshot(req(&[(name, first), (name, second)]))
            .await
            .unwrap_err();
        let invalid = err.downcast_ref::<InvalidTimeout>().expect("typed error");
        assert_eq!(invalid.header(), name);
        assert_eq!(invalid.problem(), "more than one value");
        assert_eq!(ErrorClass::of(&*err).http_status(), 400);
    }
    // Ignored as any malformed value is, when asked.
    let svc = ServiceBuilder::new()
        .layer(
            BudgetLayer::new(Duration::from_secs(1))
                .inbound(FromHeaders::new().ignore_invalid(true)),
        )
        .service(echo_deadline());
    let d = svc
        .oneshot(req(&[
            ("x-request-timeout", "5000"),
            ("x-request-timeout", "100"),
        ]))
        .await
        .unwrap();
    assert_eq!(d.remaining(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_runs_within_the_execution_slice() {
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new(Duration::from_secs(10)).execution(Duration::from_millis(300)))
        .service(service_fn(|ms: http::Request<u64>| async move {
            tokio::time::sleep(Duration::from_millis(*ms.body())).await;
            Ok::<_, std::convert::Infallible>(())
        }));
    svc.clone().oneshot(http::Request::new(299)).await.unwrap();
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(http::Request::new(5_000))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    let e = err.downcast_ref::<DeadlineExceeded>().unwrap();
    assert_eq!(e.phase(), "execution");
    assert_eq!(ErrorClass::of(&*err).http_status(), 504);
    assert_eq!(ErrorClass::of(&*err).grpc_code(), 4);
    // The inbound deadline is shorter than the slice: it wins.
    let mut r = http::Request::new(5_000);
    r.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("50m"));
    let start = Instant::now();
    assert!(svc.oneshot(r).await.is_err());
    assert_eq!(start.elapsed(), Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_budget_fails_before_calling_the_inner_service() {
    let called = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c = called.clone();
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new(Duration::from_secs(1)))
        .service(service_fn(move |_: http::Request<()>| {
            c.store(true, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(()) }
        }));
    let err = svc
        .oneshot(req(&[("grpc-timeout", "0n")]))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<DeadlineExceeded>().unwrap().phase(),
        "request"
    );
    assert!(!called.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn phases_take_their_slices_within_what_remains() {
    let d = Deadline::after(Duration::from_secs(1), Slices::default());
    assert_eq!(d.slice(Phase::Coordination), Duration::from_millis(200));
    assert_eq!(d.slice(Phase::Execution), Duration::from_secs(1));
    assert_eq!(d.slice(Phase::Result), Duration::from_millis(100));
    let out = d.within(Phase::Coordination, async { 7 }).await;
    assert_eq!(out, Ok(7));
    let start = Instant::now();
    let err = d
        .within(
            Phase::Coordination,
            tokio::time::sleep(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.phase(), "coordination");
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    tokio::time::advance(Duration::from_millis(750)).await;
    assert_eq!(d.slice(Phase::Coordination), Duration::from_millis(50));
    assert_eq!(d.slice(Phase::Result), Duration::from_millis(50));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(d.is_expired());
    assert_eq!(d.slice(Phase::Execution), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn plain_budget_works_around_any_request_type() {
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::plain(Duration::from_millis(100)))
        .service(service_fn(|ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::convert::Infallible>(ms)
        }));
    assert_eq!(svc.clone().oneshot(10).await.unwrap(), 10);
    let err = svc.oneshot(1_000).await.unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
}
