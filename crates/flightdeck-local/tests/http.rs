//! HTTP responses through the local single-flight layer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::http::HttpShare;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tower::{service_fn, Layer, ServiceExt};

/// Frames with no declared length (like a gRPC or streaming body).
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

fn keyed(path: &str) -> Request<()> {
    let mut req = Request::get(path).body(()).unwrap();
    req.extensions_mut()
        .insert(FlightKey::from_bytes(StageName::new("http").unwrap(), path));
    req
}

/// A gRPC-like reply: non-UTF-8 header, body in frames, grpc-status in
/// trailers.
fn grpc_reply(body: &'static [&'static str]) -> Response<Frames> {
    let mut frames: VecDeque<Frame<Bytes>> = body
        .iter()
        .map(|d| Frame::data(Bytes::from_static(d.as_bytes())))
        .collect();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers.insert("grpc-message", HeaderValue::from_static("ok"));
    frames.push_back(Frame::trailers(trailers));
    let mut resp = Response::new(Frames(frames));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    resp.headers_mut().insert(
        "x-raw",
        HeaderValue::from_bytes(&[b'v', 0xfe, 0xff]).unwrap(),
    );
    resp
}

#[tokio::test(start_paused = true)]
async fn buffered_response_is_replayed_identically() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_req: Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, Infallible>(grpc_reply(&["hello ", "world"]))
        }
    });
    let svc = LocalFlightLayer::http(FlightPolicy::new()).layer(inner);
    let futs: Vec<_> = (0..20)
        .map(|_| tokio::spawn(svc.clone().oneshot(keyed("/score"))))
        .collect();
    for f in futs {
        let resp = f.await.unwrap().unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-raw"].as_bytes(), &[b'v', 0xfe, 0xff]);
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers replayed");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["grpc-message"], "ok");
        assert_eq!(collected.to_bytes(), "hello world");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn unshared_case(resp: fn() -> Response<Frames>, share: HttpShare, expect_body: &str) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_req: Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, Infallible>(resp())
        }
    });
    let l = LocalFlightLayer::new(FlightPolicy::new(), flightdeck_core::FromExtension, share);
    let svc = l.layer(inner);
    let leader = tokio::spawn(svc.clone().oneshot(keyed("/big")));
    tokio::task::yield_now().await;
    let waiters: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(keyed("/big"))))
        .collect();
    let resp = leader.await.unwrap().unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    assert_eq!(collected.to_bytes(), expect_body, "leader's body is intact");
    for w in waiters {
        let resp = w.await.unwrap().unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, expect_body);
    }
    // The leader ran once, and each waiter ran the service itself.
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    assert_eq!(l.running_flights(), 0);
}

#[tokio::test(start_paused = true)]
async fn oversize_body_goes_to_the_leader_and_waiters_run_alone() {
    unshared_case(
        || grpc_reply(&["0123456789", "abcdefghij", "KLMNOPQRST"]),
        HttpShare::new().max_body(15),
        "0123456789abcdefghijKLMNOPQRST",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn event_streams_are_not_shared() {
    unshared_case(
        || {
            let mut r = grpc_reply(&["data: 1\n\n", "data: 2\n\n"]);
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("text/event-stream"),
            );
            r
        },
        HttpShare::new(),
        "data: 1\n\ndata: 2\n\n",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_key_extension_pass_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_req: Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(grpc_reply(&["x"])) }
    });
    let svc = LocalFlightLayer::http(FlightPolicy::new()).layer(inner);
    let plain = || Request::get("/").body(()).unwrap();
    let (a, b) = tokio::join!(svc.clone().oneshot(plain()), svc.clone().oneshot(plain()));
    assert!(!a.unwrap().body().is_replay());
    assert!(!b.unwrap().body().is_replay());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn unshared_original_goes_to_a_waiter_when_the_leader_left() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_req: Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, Infallible>(grpc_reply(&["0123456789", "abcdefghij"]))
        }
    });
    let l = LocalFlightLayer::new(
        FlightPolicy::new(),
        flightdeck_core::FromExtension,
        HttpShare::new().max_body(5),
    );
    let svc = l.layer(inner);
    let leader = tokio::spawn(svc.clone().oneshot(keyed("/big")));
    tokio::task::yield_now().await;
    let first = tokio::spawn(svc.clone().oneshot(keyed("/big")));
    tokio::task::yield_now().await;
    let second = tokio::spawn(svc.clone().oneshot(keyed("/big")));
    tokio::task::yield_now().await;
    leader.abort();
    let _ = leader.await;
    for w in [first, second] {
        let body = w
            .await
            .unwrap()
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, "0123456789abcdefghij");
    }
    // The original went to the first waiter; only the second ran alone.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
