//! KeyLayer with the closure extractor: any request type, decisions stored
//! on the request, readiness passed through.

mod common;

use std::convert::Infallible;

use flightdeck_core::{FlightKey, KeyEncoder, StageName};
use flightdeck_key::{key_fn, Decision, Key, KeyLayer, Keyed, NotCoalescable, Reason};
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{service_fn, Layer, ServiceExt};
use tower_test::mock;

fn stage() -> StageName {
    StageName::new("plain").unwrap()
}

fn extractor() -> flightdeck_key::FnExtractor<impl Fn(&Keyed<String>) -> Option<FlightKey> + Clone>
{
    let s = stage();
    key_fn(move |r: &Keyed<String>| {
        (!r.get_ref().starts_with("skip")).then(|| {
            KeyEncoder::new()
                .field(r.get_ref().as_bytes())
                .finish_key(s.clone(), None)
        })
    })
}

#[tokio::test]
async fn closure_keys_plain_requests() {
    let svc = KeyLayer::new(extractor()).layer(service_fn(|r: Keyed<String>| async move {
        Ok::<_, Infallible>(r.decision().cloned())
    }));
    let d = svc.clone().oneshot(Keyed::new("a".into())).await.unwrap();
    let Some(Decision::Key(k)) = d else {
        panic!("expected a key, got {d:?}")
    };
    assert_eq!(k.stage(), &stage());
    let d = svc.oneshot(Keyed::new("skip me".into())).await.unwrap();
    assert_eq!(
        d,
        Some(Decision::Bypass(NotCoalescable::new(Reason::Declined)))
    );
}

#[cfg(feature = "http")]
#[tokio::test]
async fn bypass_removes_a_stale_key_from_http_extensions() {
    let s = stage();
    let svc = KeyLayer::new(key_fn(|_: &http::Request<()>| None::<FlightKey>)).layer(service_fn(
        |r: http::Request<()>| async move {
            Ok::<_, Infallible>((
                r.extensions().get::<FlightKey>().cloned(),
                r.extensions().get::<NotCoalescable>().copied(),
            ))
        },
    ));
    let mut req = http::Request::new(());
    req.extensions_mut()
        .insert(FlightKey::from_bytes(s, "stale"));
    let (key, marker) = svc.oneshot(req).await.unwrap();
    assert_eq!(key, None);
    assert_eq!(marker.map(|m| m.reason()), Some(Reason::Declined));
}

#[tokio::test]
async fn readiness_and_errors_pass_through() {
    let (mut svc, mut handle) =
        mock::spawn_with::<Keyed<String>, &'static str, _, _>(|inner| Key::new(inner, extractor()));
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = svc.call(Keyed::new("x".into()));
    let (req, send) = handle.next_request().await.unwrap();
    assert!(req.key().is_some());
    send.send_error("inner failed");
    let err = fut.await.unwrap_err();
    assert_eq!(err.to_string(), "inner failed");
}

#[test]
fn layer_is_clone_and_debug() {
    let layer = KeyLayer::new(extractor());
    let copy = layer.clone();
    assert!(format!("{copy:?}").contains("KeyLayer"));
    let svc = copy.layer(service_fn(|_: Keyed<String>| async {
        Ok::<_, Infallible>(())
    }));
    let mut svc = svc.clone();
    let _ = svc.get_ref();
    let _ = svc.get_mut();
    let _ = svc.into_inner();
}

#[cfg(feature = "http")]
#[tokio::test]
async fn pending_extraction_calls_the_instance_that_was_ready() {
    use bytes::Bytes;
    use flightdeck_key::http::{FlightBody, HttpKeyExtractor, Route};
    use http_body_util::BodyExt;

    let ex = HttpKeyExtractor::builder()
        .route(Route::new(http::Method::POST, "/p", "p").hash_body(64))
        .build()
        .unwrap();
    let (mut svc, mut handle) =
        mock::spawn_with::<http::Request<FlightBody<common::FrameBody>>, &'static str, _, _>(
            |inner| Key::new(inner, ex.clone()),
        );
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let req = http::Request::post("/p")
        .body(common::FrameBody::data([&b"ab"[..], &b"c"[..]]))
        .unwrap();
    // The inner call happens inside the future, once the body was read.
    let fut = tokio::spawn(svc.call(req));
    let (req, send) = handle.next_request().await.unwrap();
    assert!(req.extensions().get::<FlightKey>().is_some());
    send.send_response("done");
    assert_eq!(fut.await.unwrap().unwrap(), "done");
    let body = req.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"abc"));
    // The permit was used by that call: the next one waits for readiness.
    assert_pending!(svc.poll_ready());
}
