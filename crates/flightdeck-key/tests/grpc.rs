//! Behaviour of the gRPC extractor.
#![cfg(feature = "grpc")]

mod common;

use bytes::Bytes;
use common::{extract, key_now, FrameBody};
use flightdeck_core::http::ErrorResponseLayer;
use flightdeck_core::FlightKey;
use flightdeck_key::grpc::GrpcKeyExtractor;
use flightdeck_key::{Decision, KeyLayer, NotCoalescable, Reason};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";

fn extractor() -> GrpcKeyExtractor {
    GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .metadata("x-model-version")
        .build()
        .unwrap()
}

/// One length-prefixed, uncompressed gRPC frame.
fn frame(msg: &[u8]) -> Bytes {
    let mut out = vec![0u8];
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    Bytes::from(out)
}

fn call(path: &str, msg: &[u8]) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame(msg)))
        .unwrap()
}

fn key(req: Request<Full<Bytes>>) -> Option<FlightKey> {
    key_now(&extractor(), req)
}

#[test]
fn allowlisted_unary_call_is_keyed() {
    let ex = extractor();
    let a = key_now(&ex, call(CHECK, b"\x0a\x03svc")).unwrap();
    assert_eq!(a.stage().as_str(), "health");
    assert_eq!(a, key_now(&ex, call(CHECK, b"\x0a\x03svc")).unwrap());
    assert_ne!(a, key_now(&ex, call(CHECK, b"\x0a\x03abc")).unwrap());
}

#[test]
fn grpc_encoding_and_metadata_are_part_of_the_key() {
    let plain = key(call(CHECK, b"m")).unwrap();
    let mut r = call(CHECK, b"m");
    r.headers_mut()
        .insert("grpc-encoding", HeaderValue::from_static("identity"));
    assert_eq!(key(r).unwrap(), plain, "absent grpc-encoding is identity");
    let mut r = call(CHECK, b"m");
    r.headers_mut()
        .insert("grpc-encoding", HeaderValue::from_static("gzip"));
    assert_ne!(key(r).unwrap(), plain);
    let mut r = call(CHECK, b"m");
    r.headers_mut()
        .insert("x-model-version", HeaderValue::from_static("2"));
    assert_ne!(key(r).unwrap(), plain);
    let mut r = call(CHECK, b"m");
    r.headers_mut()
        .insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
    assert_ne!(key(r).unwrap(), plain, "the shared reply must be decodable");
    let mut r = call(CHECK, b"m");
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/grpc+json"),
    );
    assert_ne!(key(r).unwrap(), plain, "another codec");
    // Deadlines and unselected metadata never split flights.
    let mut r = call(CHECK, b"m");
    r.headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("100m"));
    r.headers_mut()
        .insert("x-request-id", HeaderValue::from_static("abc"));
    assert_eq!(key(r).unwrap(), plain);
}

#[test]
fn authorization_metadata_scopes_calls() {
    let with = |auth: &'static str| {
        let mut r = call(CHECK, b"m");
        r.headers_mut()
            .insert("authorization", HeaderValue::from_static(auth));
        key(r).unwrap()
    };
    assert_ne!(with("Bearer a"), with("Bearer b"));
    let shared = GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .shared_across_users()
        .build()
        .unwrap();
    let mut a = call(CHECK, b"m");
    a.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer a"));
    assert_eq!(key_now(&shared, a), key_now(&shared, call(CHECK, b"m")));
}

#[tokio::test]
async fn non_listed_method_passes_through_untouched() {
    let ex = extractor();
    let out = extract(&ex, call(WATCH, b"streaming")).await.unwrap();
    assert_eq!(
        out.decision,
        Decision::Bypass(NotCoalescable::new(Reason::NotAllowlisted))
    );
    assert!(
        !out.request.body().is_replay(),
        "the body was not even read"
    );
    let body = out.request.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, frame(b"streaming"));
    // Not gRPC at all.
    let r = Request::post(CHECK).body(Full::new(frame(b"m"))).unwrap();
    let out = extract(&ex, r).await.unwrap();
    assert_eq!(
        out.decision,
        Decision::Bypass(NotCoalescable::new(Reason::NotGrpc))
    );
}

#[tokio::test]
async fn message_is_reattached_and_oversize_passes_intact() {
    let ex = GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .message_cap(16)
        .build()
        .unwrap();
    // Under the cap, in two frames: keyed, re-attached byte for byte.
    let whole = frame(b"0123456789");
    let (a, b) = whole.split_at(7);
    let r = Request::post(CHECK)
        .header("content-type", "application/grpc+proto")
        .body(FrameBody::chunks(vec![a.to_vec(), b.to_vec()]))
        .unwrap();
    let out = extract(&ex, r).await.unwrap();
    assert!(matches!(out.decision, Decision::Key(_)));
    let body = out.request.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, whole);
    // Over the cap: not coalesced, intact.
    let big = frame(&[7u8; 40]);
    let (a, b) = big.split_at(20);
    let r = Request::post(CHECK)
        .header("content-type", "application/grpc")
        .body(FrameBody::chunks(vec![a.to_vec(), b.to_vec()]))
        .unwrap();
    let out = extract(&ex, r).await.unwrap();
    assert_eq!(
        out.decision,
        Decision::Bypass(NotCoalescable::new(Reason::BodyTooLarge))
    );
    let body = out.request.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, big);
}

#[tokio::test]
async fn body_error_becomes_invalid_argument() {
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new())
        .layer(KeyLayer::new(extractor()))
        .service(service_fn(|_req: Request<_>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
        }));
    let r = Request::post(CHECK)
        .header("content-type", "application/grpc")
        .body(FrameBody::data([&b"\0\0"[..]]).then_error())
        .unwrap();
    let resp = svc.oneshot(r).await.unwrap();
    assert_eq!(resp.headers()["grpc-status"], "3");
}

#[test]
fn bad_method_paths_are_config_errors() {
    for bad in ["Check", "/Check", "/a/b/c", "//b", "/a/"] {
        assert!(
            GrpcKeyExtractor::builder()
                .method(bad, "s")
                .build()
                .is_err(),
            "{bad}"
        );
    }
}

/// A method listed in two stages is a contradiction, named at build: the
/// later one never silently wins.
#[test]
fn a_method_in_two_stages_is_a_config_error() {
    let err = GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .method(CHECK, "other")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains(CHECK), "{err}");
    assert!(err.contains("health") && err.contains("other"), "{err}");
    // The same listing twice is no contradiction.
    assert!(GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .method(CHECK, "health")
        .build()
        .is_ok());
}

/// Every message is at least its 5-byte frame header: a smaller cap would
/// coalesce no call of the allowlist, and nothing would say so.
#[test]
fn a_message_cap_under_a_frame_header_is_a_config_error() {
    for cap in [0, 4] {
        let err = GrpcKeyExtractor::builder()
            .method(CHECK, "health")
            .message_cap(cap)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("message cap"), "{err}");
    }
    let ex = GrpcKeyExtractor::builder()
        .method(CHECK, "health")
        .message_cap(5)
        .build()
        .unwrap();
    assert!(
        key_now(&ex, call(CHECK, b"")).is_some(),
        "an empty message fits"
    );
}

#[tokio::test]
async fn layer_sets_the_extension_for_the_service() {
    let svc = KeyLayer::new(extractor()).layer(service_fn(|req: Request<_>| async move {
        Ok::<_, std::convert::Infallible>(req.extensions().get::<FlightKey>().is_some())
    }));
    assert!(svc.clone().oneshot(call(CHECK, b"m")).await.unwrap());
    assert!(!svc.oneshot(call(WATCH, b"m")).await.unwrap());
}
