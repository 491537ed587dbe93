use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;

use crate::share::{Share, Shareable};

use super::error_response::percent_encode_grpc;
use super::*;
use crate::error::{BulkheadFull, WaitTimeout};
use http_body_util::Full;
use std::time::Duration;

async fn collect<B: Body<Data = Bytes> + Unpin>(b: B) -> (Bytes, Option<HeaderMap>)
where
    B::Error: fmt::Debug,
{
    let c = b.collect().await.unwrap();
    let t = c.trailers().cloned();
    (c.to_bytes(), t)
}

/// A body of given frames with no declared length, like a stream.
struct TestBody(std::collections::VecDeque<Frame<Bytes>>);

impl Body for TestBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

fn body_with_trailers(data: &'static [&'static str], trailers: HeaderMap) -> TestBody {
    let mut frames: std::collections::VecDeque<Frame<Bytes>> = data
        .iter()
        .map(|d| Frame::data(Bytes::from_static(d.as_bytes())))
        .collect();
    frames.push_back(Frame::trailers(trailers));
    TestBody(frames)
}

#[tokio::test]
async fn replays_status_headers_body_and_trailers() {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut resp = Response::new(body_with_trailers(&["hel", "lo"], trailers));
    *resp.status_mut() = StatusCode::CREATED;
    resp.headers_mut().insert(
        "x-bin",
        HeaderValue::from_bytes(&[0xff, 0xfe, b'a']).unwrap(),
    );
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let share = HttpShare::new();
    let Shareable::Shared(shared) = share.share(resp).await.unwrap() else {
        panic!("expected shared");
    };
    for _ in 0..2 {
        let r: Response<FlightBody<Full<Bytes>>> = share.restore(&shared);
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()["x-bin"].as_bytes(), &[0xff, 0xfe, b'a']);
        let (body, t) = collect(r.into_body()).await;
        assert_eq!(body, "hello");
        assert_eq!(t.unwrap()["grpc-status"], "0");
    }
}

#[tokio::test]
async fn oversize_goes_back_to_the_leader_intact() {
    let mut resp = Response::new(body_with_trailers(
        &["aaaa", "bbbb", "cccc"],
        HeaderMap::new(),
    ));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let share = HttpShare::new().max_body(6);
    match share.share(resp).await.unwrap() {
        Shareable::Unshared(r, _) => {
            let (body, _) = collect(r.into_body()).await;
            assert_eq!(body, "aaaabbbbcccc");
        }
        Shareable::Shared(_) => panic!("must not share an oversize body"),
    }
}

#[tokio::test]
async fn streams_and_declared_oversize_are_not_shared() {
    let share = HttpShare::new().max_body(4);
    let mut sse = Response::new(Full::new(Bytes::from_static(b"data: x\n\n")));
    sse.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    assert!(matches!(
        share.share(sse).await.unwrap(),
        Shareable::Unshared(..)
    ));
    let big = Response::new(Full::new(Bytes::from_static(b"0123456789")));
    assert!(matches!(
        share.share(big).await.unwrap(),
        Shareable::Unshared(..)
    ));
    let unknown = Response::new(body_with_trailers(&["ab"], HeaderMap::new()));
    assert!(matches!(
        share.share(unknown).await.unwrap(),
        Shareable::Unshared(..)
    ));
    let small = Response::new(Full::new(Bytes::from_static(b"ok")));
    assert!(matches!(
        share.share(small).await.unwrap(),
        Shareable::Shared(_)
    ));
}

/// A content type is judged by its text: one with a streaming type's
/// prefix but bytes that are not text (obs-text) is not a stream, and a
/// stream's type with parameters still is.
#[tokio::test]
async fn a_streaming_content_type_is_judged_by_its_text() {
    let share = HttpShare::new();
    let typed = |ctype: HeaderValue| {
        let mut r = Response::new(Full::new(Bytes::from_static(b"data: x\n\n")));
        r.headers_mut().insert(CONTENT_TYPE, ctype);
        r
    };
    let sse = typed(HeaderValue::from_static("text/event-stream; charset=utf-8"));
    assert!(matches!(
        share.share(sse).await.unwrap(),
        Shareable::Unshared(..)
    ));
    let not_text = HeaderValue::from_bytes(b"text/event-stream\xff").unwrap();
    assert!(matches!(
        share.share(typed(not_text)).await.unwrap(),
        Shareable::Shared(_)
    ));
    let plain = typed(HeaderValue::from_static("text/plain; charset=utf-8"));
    assert!(matches!(
        share.share(plain).await.unwrap(),
        Shareable::Shared(_)
    ));
}

#[tokio::test]
async fn errors_map_to_http_and_grpc() {
    let r: Response<FlightBody<Full<Bytes>>> = error_response(&BulkheadFull::new(None), false);
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    let (body, _) = collect(r.into_body()).await;
    assert_eq!(body, "bulkhead full\n");

    let t = WaitTimeout::new(None, Duration::from_millis(5));
    let r: Response<FlightBody<Full<Bytes>>> = error_response(&t, true);
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["grpc-status"], "4");
    assert!(r.headers()["grpc-message"]
        .to_str()
        .unwrap()
        .starts_with("wait timed out"));

    let other = std::io::Error::other("secret db password wrong");
    let r: Response<FlightBody<Full<Bytes>>> = error_response(&other, false);
    assert_eq!(r.status(), 500);
    let (body, _) = collect(r.into_body()).await;
    assert_eq!(body, "internal error\n");

    // A misconfiguration is a 500 too, but says what is missing.
    let unknown = crate::error::UnknownStage::new(crate::StageName::new("scroe").unwrap());
    let r: Response<FlightBody<Full<Bytes>>> = error_response(&unknown, false);
    assert_eq!(r.status(), 500);
    let (body, _) = collect(r.into_body()).await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("\"scroe\""), "{body}");
    let r: Response<FlightBody<Full<Bytes>>> = error_response(&unknown, true);
    assert_eq!(r.headers()["grpc-status"], "13");
}

#[test]
fn grpc_message_is_percent_encoded() {
    assert_eq!(percent_encode_grpc("a b%\n"), "a b%25%0A");
    assert_eq!(percent_encode_grpc("é"), "%C3%A9");
}
