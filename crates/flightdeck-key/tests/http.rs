//! Behaviour of the HTTP extractor, alone and in an axum stack.
#![cfg(feature = "http")]

mod common;

use axum::body::Body as AxumBody;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use common::{extract, extract_now, key_now, FrameBody};
use flightdeck_core::error::{IdempotencyConflict, RequestBodyError};
use flightdeck_core::http::ErrorResponseLayer;
use flightdeck_core::FlightKey;
use flightdeck_key::http::{HttpKeyExtractor, Route, Scope};
use flightdeck_key::{Decision, KeyLayer, NotCoalescable, Reason};
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use tower::{Layer, ServiceBuilder, ServiceExt};

fn basic() -> HttpKeyExtractor {
    HttpKeyExtractor::builder()
        .default_stage("http")
        .ignore_query_params(["_", "ts", "nonce"])
        .build()
        .unwrap()
}

fn get_req(uri: &str) -> Request<Empty<Bytes>> {
    Request::get(uri).body(Empty::new()).unwrap()
}

fn key(ex: &HttpKeyExtractor, req: Request<Empty<Bytes>>) -> Option<FlightKey> {
    key_now(ex, req)
}

fn key_of(ex: &HttpKeyExtractor, req: Request<Full<Bytes>>) -> FlightKey {
    match extract_now(ex, req).unwrap().decision {
        Decision::Key(k) => k,
        Decision::Bypass(n) => panic!("not keyed: {n}"),
    }
}

fn reason(ex: &HttpKeyExtractor, req: Request<Full<Bytes>>) -> Option<Reason> {
    match extract_now(ex, req).unwrap().decision {
        Decision::Key(_) => None,
        Decision::Bypass(n) => Some(n.reason()),
    }
}

#[test]
fn get_is_keyed_and_stable() {
    let ex = basic();
    let a = key(&ex, get_req("/v1/items?id=1")).unwrap();
    let b = key(&ex, get_req("/v1/items?id=1")).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.stage().as_str(), "http");
    assert_eq!(a.scope(), None, "no credentials, no scope rule: no scope");
    assert_ne!(a, key(&ex, get_req("/v1/items?id=2")).unwrap());
    assert_ne!(a, key(&ex, get_req("/v1/other?id=1")).unwrap());
    let head = Request::head("/v1/items?id=1").body(Empty::new()).unwrap();
    assert_ne!(
        a,
        key(&ex, head).unwrap(),
        "HEAD and GET are different work"
    );
}

#[test]
fn keys_never_show_raw_input() {
    let ex = basic();
    let k = key(&ex, get_req("/secret-path?token=secret-value")).unwrap();
    let shown = format!("{k} {k:?} {}", k.flight_digest().to_hex());
    assert!(!shown.contains("secret"), "{shown}");
}

/// The digest of a request's fields is computed when asked for (by L2,
/// the wire, a log line), not on extraction; a key over a long body (past
/// the encoder's buffer, hashed while it was read) has it already. Keys
/// compare equal by their fields either way.
#[test]
fn a_key_is_hashed_only_when_its_digest_is_asked_for() {
    let ex = HttpKeyExtractor::builder()
        .default_stage("http")
        .route(Route::post("/render", "render").hash_body(4096))
        .build()
        .unwrap();
    let a = key(&ex, get_req("/v1/items?id=1")).unwrap();
    let b = key(&ex, get_req("/v1/items?id=1")).unwrap();
    assert!(!a.has_digest() && !b.has_digest());
    assert_eq!(a, b);
    assert_ne!(a, key(&ex, get_req("/v1/items?id=2")).unwrap());
    assert!(!a.has_digest(), "compared by their fields");
    assert_eq!(a.digest(), b.digest());
    assert!(a.has_digest());
    let post = |body: Vec<u8>| {
        key_of(
            &ex,
            Request::post("/render").body(Full::from(body)).unwrap(),
        )
    };
    assert!(!post(vec![b'x'; 16]).has_digest());
    let long = post(vec![b'x'; 1000]);
    assert!(long.has_digest());
    assert_eq!(long, post(vec![b'x'; 1000]));
    assert_ne!(long, post(vec![b'y'; 1000]));
}

#[test]
fn empty_query_forms_are_one_key() {
    let ex = basic();
    let plain = key(&ex, get_req("/p")).unwrap();
    for uri in ["/p?", "/p?&", "/p?&&", "/p?_=123", "/p?ts=1&nonce=2"] {
        assert_eq!(key(&ex, get_req(uri)).unwrap(), plain, "{uri}");
    }
}

#[test]
fn percent_encoding_variants_in_query_are_one_key_but_not_in_path() {
    let ex = basic();
    let a = key(&ex, get_req("/p?q=A")).unwrap();
    assert_eq!(key(&ex, get_req("/p?q=%41")).unwrap(), a);
    assert_eq!(key(&ex, get_req("/p?%71=%41")).unwrap(), a);
    assert_eq!(
        key(&ex, get_req("/p?q=a+b")).unwrap(),
        key(&ex, get_req("/p?q=a%20b")).unwrap()
    );
    assert_ne!(
        key(&ex, get_req("/p?q=a+b")).unwrap(),
        key(&ex, get_req("/p?q=a%2Bb")).unwrap()
    );
    // Paths are taken byte for byte: routers may treat them differently.
    assert_ne!(
        key(&ex, get_req("/a%41")).unwrap(),
        key(&ex, get_req("/aA")).unwrap()
    );
}

#[test]
fn repeated_parameters_keep_order_and_count() {
    let ex = basic();
    let k = |u| key(&ex, get_req(u)).unwrap();
    assert_ne!(k("/p?a=1&a=2"), k("/p?a=2&a=1"));
    assert_ne!(k("/p?a=1&a=1"), k("/p?a=1"));
    assert_eq!(k("/p?a=1&b=2&a=3"), k("/p?b=2&a=1&a=3"));
    assert_eq!(k("/p?a"), k("/p?a="));
}

#[test]
fn non_utf8_header_values_are_hashed_as_raw_bytes() {
    let ex = basic();
    let with = |v: &[u8]| {
        let mut r = get_req("/p");
        r.headers_mut()
            .insert("accept-language", HeaderValue::from_bytes(v).unwrap());
        key(&ex, r).unwrap()
    };
    let latin1 = with(b"fr-\xe9");
    assert_eq!(latin1, with(b"fr-\xe9"));
    assert_ne!(
        latin1,
        with("fr-\u{fffd}".as_bytes()),
        "never replaced lossily"
    );
    assert_ne!(latin1, with(b"fr-"), "never dropped");
    assert_ne!(
        with(b""),
        key(&ex, get_req("/p")).unwrap(),
        "empty ≠ absent"
    );
}

#[test]
fn selected_headers_only() {
    let ex = HttpKeyExtractor::builder()
        .default_stage("http")
        .header("x-model-version")
        .build()
        .unwrap();
    let with = |name: &'static str, v: &'static str| {
        let mut r = get_req("/p");
        r.headers_mut().insert(name, HeaderValue::from_static(v));
        key(&ex, r).unwrap()
    };
    let plain = key(&ex, get_req("/p")).unwrap();
    assert_eq!(with("user-agent", "curl"), plain, "not selected");
    assert_ne!(with("x-model-version", "2"), plain);
    assert_ne!(
        with("accept", "text/html"),
        with("accept", "application/json")
    );
    assert_ne!(with("accept-encoding", "gzip"), plain);
    // Multiple values: all, in order.
    let mut r = get_req("/p");
    r.headers_mut()
        .append("accept", HeaderValue::from_static("a"));
    r.headers_mut()
        .append("accept", HeaderValue::from_static("b"));
    let ab = key(&ex, r).unwrap();
    let mut r = get_req("/p");
    r.headers_mut()
        .append("accept", HeaderValue::from_static("b"));
    r.headers_mut()
        .append("accept", HeaderValue::from_static("a"));
    assert_ne!(ab, key(&ex, r).unwrap());
}

#[test]
fn authority_is_part_of_the_key() {
    let ex = basic();
    let host = |h: &'static str| {
        let mut r = get_req("/p");
        r.headers_mut().insert("host", HeaderValue::from_static(h));
        key(&ex, r).unwrap()
    };
    assert_ne!(host("a.example"), host("b.example"));
    assert_eq!(host("A.Example"), host("a.example"));
    // The port is not: the nodes of one service, each reached on its own
    // port, share (nginx keys on `$host`, the name without the port).
    assert_eq!(host("a.example:3201"), host("a.example:3202"));
    assert_eq!(host("a.example:3201"), host("a.example"));
    assert_ne!(host("a.example:3201"), host("b.example:3201"));
    assert_eq!(host("[::1]:3201"), host("[::1]:3202"));
    assert_eq!(
        key(&ex, get_req("http://a.example/p")).unwrap(),
        host("a.example")
    );
}

#[test]
fn authorization_without_scope_rule_gives_per_credential_keys() {
    let ex = basic();
    let with = |name: &'static str, v: &'static str| {
        let mut r = get_req("/p");
        r.headers_mut().insert(name, HeaderValue::from_static(v));
        key(&ex, r).unwrap()
    };
    let alice = with("authorization", "Bearer alice");
    let bob = with("authorization", "Bearer bob");
    assert_ne!(alice, bob);
    assert_ne!(alice.flight_digest(), bob.flight_digest());
    assert_eq!(
        alice.digest(),
        bob.digest(),
        "same request, different scope"
    );
    assert!(alice.scope().is_some());
    assert_eq!(alice, with("authorization", "Bearer alice"));
    let anon = key(&ex, get_req("/p")).unwrap();
    assert_ne!(alice, anon);
    let c1 = with("cookie", "session=1");
    assert_ne!(c1, with("cookie", "session=2"));
    assert_ne!(c1, anon);
}

#[test]
fn shared_across_users_shares() {
    let ex = HttpKeyExtractor::builder()
        .default_stage("http")
        .shared_across_users()
        .build()
        .unwrap();
    let with = |v: &'static str| {
        let mut r = get_req("/p");
        r.headers_mut()
            .insert("authorization", HeaderValue::from_static(v));
        key(&ex, r).unwrap()
    };
    assert_eq!(with("Bearer alice"), with("Bearer bob"));
    assert_eq!(with("Bearer alice"), key(&ex, get_req("/p")).unwrap());
    assert_eq!(with("Bearer alice").scope(), None);
}

#[derive(Clone)]
struct TenantId(String);

impl flightdeck_key::http::ScopeId for TenantId {
    fn scope_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.0.scope_bytes()
    }
}

#[test]
fn scope_rules_replace_credentials_and_missing_scope_bypasses() {
    let by_header = HttpKeyExtractor::builder()
        .default_stage("http")
        .scope(Scope::header("x-tenant"))
        .build()
        .unwrap();
    let req = |tenant: Option<&'static str>, auth: &'static str| {
        let mut r = Request::get("/p").body(Full::new(Bytes::new())).unwrap();
        r.headers_mut()
            .insert("authorization", HeaderValue::from_static(auth));
        if let Some(t) = tenant {
            r.headers_mut()
                .insert("x-tenant", HeaderValue::from_static(t));
        }
        r
    };
    let t1 = key_now(&by_header, req(Some("t1"), "a")).unwrap();
    assert_eq!(t1, key_now(&by_header, req(Some("t1"), "b")).unwrap());
    assert_ne!(t1, key_now(&by_header, req(Some("t2"), "a")).unwrap());
    assert_eq!(reason(&by_header, req(None, "a")), Some(Reason::NoScope));

    let by_ext = HttpKeyExtractor::builder()
        .default_stage("http")
        .scope(Scope::extension::<TenantId>())
        .build()
        .unwrap();
    let mut a = get_req("/p");
    a.extensions_mut().insert(TenantId("t1".into()));
    let mut b = get_req("/p");
    b.extensions_mut().insert(TenantId("t2".into()));
    assert_ne!(key(&by_ext, a).unwrap(), key(&by_ext, b).unwrap());
    assert!(key(&by_ext, get_req("/p")).is_none());

    let by_fn = HttpKeyExtractor::builder()
        .default_stage("http")
        .scope(Scope::from_fn(|p: &http::request::Parts| {
            p.headers.get("x-org").map(|v| v.as_bytes().to_vec())
        }))
        .build()
        .unwrap();
    let mut a = get_req("/p");
    a.headers_mut()
        .insert("x-org", HeaderValue::from_static("o1"));
    assert!(key(&by_fn, a).unwrap().scope().is_some());
}

#[test]
fn scope_secret_changes_scope_digests() {
    let plain = basic();
    let salted = HttpKeyExtractor::builder()
        .default_stage("http")
        .ignore_query_params(["_", "ts", "nonce"])
        .scope_secret("deployment-secret")
        .build()
        .unwrap();
    let req = || {
        let mut r = get_req("/p");
        r.headers_mut()
            .insert("authorization", HeaderValue::from_static("Basic dTpw"));
        r
    };
    assert_ne!(
        key(&plain, req()).unwrap().scope(),
        key(&salted, req()).unwrap().scope()
    );
}

#[test]
fn routes_and_stage_header_choose_stages() {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "/v1/score/{id}", "score"))
        .route(Route::new(Method::GET, "/v1/report/:id", "report"))
        .stage_header("x-stage", ["summary"])
        .build()
        .unwrap();
    let stage = |r: Request<Empty<Bytes>>| key(&ex, r).map(|k| k.stage().to_string());
    assert_eq!(stage(get_req("/v1/score/1")).as_deref(), Some("score"));
    assert_eq!(stage(get_req("/v1/report/1")).as_deref(), Some("report"));
    assert_eq!(stage(get_req("/v1/other")), None, "no default stage");
    let mut r = get_req("/v1/other");
    r.headers_mut()
        .insert("x-stage", HeaderValue::from_static("summary"));
    assert_eq!(stage(r).as_deref(), Some("summary"));
    let mut r = Request::get("/v1/other")
        .body(Full::new(Bytes::new()))
        .unwrap();
    r.headers_mut()
        .insert("x-stage", HeaderValue::from_static("made-up"));
    assert_eq!(reason(&ex, r), Some(Reason::UnknownStage));
}

/// A stage header given twice names no stage, whichever comes first: the
/// request is not coalesced (as with two `Idempotency-Key`s), rather than
/// keyed by one of the two in silence.
#[test]
fn a_stage_header_given_twice_names_no_stage() {
    let ex = HttpKeyExtractor::builder()
        .stage_header("x-stage", ["summary", "report"])
        .build()
        .unwrap();
    for second in ["report", "summary"] {
        let mut r = Request::get("/v1/other")
            .body(Full::new(Bytes::new()))
            .unwrap();
        r.headers_mut()
            .append("x-stage", HeaderValue::from_static("summary"));
        r.headers_mut()
            .append("x-stage", HeaderValue::from_static(second));
        assert_eq!(reason(&ex, r), Some(Reason::UnknownStage), "{second}");
    }
}

#[test]
fn bad_configuration_is_a_typed_error() {
    let e = HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "no-slash", "s"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("route pattern"), "{e}");
    assert!(HttpKeyExtractor::builder()
        .default_stage("bad stage")
        .build()
        .is_err());
    assert!(HttpKeyExtractor::builder()
        .header("bad header")
        .build()
        .is_err());
    assert!(HttpKeyExtractor::builder()
        .scope(Scope::header("bad header"))
        .build()
        .is_err());
}

#[test]
fn post_without_idempotency_key_or_route_is_not_coalescable() {
    let ex = basic().clone();
    let r = Request::post("/p")
        .body(Full::new(Bytes::from("{}")))
        .unwrap();
    assert_eq!(reason(&ex, r), Some(Reason::Method));
    let r = Request::put("/p").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(reason(&ex, r), Some(Reason::Method));
}

#[test]
fn bodies_are_not_merged_unless_hashed() {
    // A GET with a body, body hashing off: the body could change the answer.
    let ex = basic();
    let r = Request::get("/p")
        .body(Full::new(Bytes::from("x")))
        .unwrap();
    assert_eq!(reason(&ex, r), Some(Reason::UnhashedBody));
    // A POST route that says its requests carry no body: one that does
    // anyway is not merged.
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/render", "render").coalesce_without_body())
        .build()
        .unwrap();
    let r = Request::post("/render")
        .body(Full::new(Bytes::from("x")))
        .unwrap();
    assert_eq!(reason(&ex, r), Some(Reason::UnhashedBody));
    // An empty POST is fine.
    let r = Request::post("/render")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(reason(&ex, r), None);
}

#[test]
fn a_body_route_that_hashes_nothing_is_a_build_error() {
    for method in [Method::POST, Method::PUT, Method::PATCH] {
        let err = HttpKeyExtractor::builder()
            .route(Route::new(method.clone(), "/v1/score", "score"))
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("{method} /v1/score")), "{err}");
        assert!(err.contains("stage score"), "{err}");
        assert!(err.contains("hash_body"), "{err}");
        assert!(err.contains("coalesce_without_body"), "{err}");
    }
    // Either choice builds: hashing (per route or for every route), or
    // saying the route has no body.
    let route = || Route::new(Method::POST, "/v1/score", "score");
    assert!(HttpKeyExtractor::builder()
        .route(route().hash_body(1024))
        .build()
        .is_ok());
    assert!(HttpKeyExtractor::builder()
        .route(route())
        .hash_bodies(1024)
        .build()
        .is_ok());
    assert!(HttpKeyExtractor::builder()
        .route(route().coalesce_without_body())
        .build()
        .is_ok());
    let err = HttpKeyExtractor::builder()
        .route(route().hash_body(0))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("hash_body(0)"), "{err}");
    // GET, HEAD, DELETE rules need neither.
    for method in [Method::GET, Method::HEAD, Method::DELETE] {
        assert!(HttpKeyExtractor::builder()
            .route(Route::new(method, "/v1/items/{id}", "items"))
            .build()
            .is_ok());
    }
}

/// `hash_bodies(0)` hashes nothing, as `hash_body(0)` does: refused too,
/// rather than letting a body route build that coalesces no request with a
/// body.
#[test]
fn hashing_every_body_up_to_zero_bytes_is_a_build_error() {
    let err = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score"))
        .hash_bodies(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("hash_bodies(0)"), "{err}");
    let err = HttpKeyExtractor::builder()
        .default_stage("items")
        .hash_bodies(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("hash_bodies(0)"), "{err}");
}

#[test]
fn the_authority_can_be_left_out_of_the_key() {
    let at = |ex: &HttpKeyExtractor, host: &str| {
        let r = Request::get("/v1/items/1")
            .header(http::header::HOST, host)
            .body(Full::new(Bytes::new()))
            .unwrap();
        key_of(ex, r)
    };
    let keyed = HttpKeyExtractor::builder()
        .default_stage("items")
        .build()
        .unwrap();
    assert_ne!(at(&keyed, "10.0.0.7:3113"), at(&keyed, "10.0.0.8:3113"));
    let any_host = HttpKeyExtractor::builder()
        .default_stage("items")
        .ignore_authority()
        .build()
        .unwrap();
    assert_eq!(
        at(&any_host, "127.0.0.1:3113"),
        at(&any_host, "127.0.0.1:3114")
    );
    let absolute = Request::get("http://10.0.0.7:8080/v1/items/1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        key_of(&any_host, absolute),
        at(&any_host, "scoring.internal")
    );
    // Never equal to a key that names an authority (or names none).
    let none = Request::get("/v1/items/1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_ne!(at(&any_host, "a"), key_of(&keyed, none));
}

#[test]
fn hashed_bodies_are_part_of_the_key() {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/render", "render").hash_body(1024))
        .build()
        .unwrap();
    let post = |b: &'static str| {
        key_now(
            &ex,
            Request::post("/render")
                .body(Full::new(Bytes::from(b)))
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(post("{\"a\":1}"), post("{\"a\":1}"));
    let typed = key_now(
        &ex,
        Request::post("/render")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from("{\"a\":1}")))
            .unwrap(),
    )
    .unwrap();
    assert_ne!(typed, post("{\"a\":1}"), "content type is part of the key");
    assert_ne!(post("{\"a\":1}"), post("{\"a\":2}"));
    // Frames do not matter, only bytes.
    let framed = key_now(
        &ex,
        Request::post("/render")
            .body(FrameBody::data([&b"{\"a\""[..], &b":1}"[..]]))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(framed, post("{\"a\":1}"));
    // Empty body hashed ≡ no body.
    assert_eq!(
        post(""),
        key_now(
            &ex,
            Request::post("/render")
                .body(Empty::<Bytes>::new())
                .unwrap()
        )
        .unwrap()
    );
}

#[test]
fn oversize_bodies_pass_intact_without_key() {
    let ex = HttpKeyExtractor::builder()
        .default_stage("http")
        .hash_bodies(8)
        .build()
        .unwrap();
    // Declared too large: not even read.
    let r = Request::get("/p")
        .header("content-length", "9")
        .body(Full::new(Bytes::from("123456789")))
        .unwrap();
    assert_eq!(reason(&ex, r), Some(Reason::BodyTooLarge));
    // Discovered too large while reading a stream.
    let r = Request::get("/p")
        .body(FrameBody::data([&b"12345"[..], &b"67890"[..], &b"abc"[..]]))
        .unwrap();
    let out = extract_now(&ex, r).unwrap();
    assert_eq!(
        out.decision,
        Decision::Bypass(NotCoalescable::new(Reason::BodyTooLarge))
    );
    let rest = futures_collect(out.request.into_body());
    assert_eq!(&rest[..], b"1234567890abc");
}

fn futures_collect<B>(body: B) -> Bytes
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut fut = std::pin::pin!(body.collect());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            return r.unwrap().to_bytes();
        }
    }
}

use std::future::Future;

#[tokio::test]
async fn body_read_error_is_typed() {
    let ex = HttpKeyExtractor::builder()
        .default_stage("http")
        .hash_bodies(1024)
        .build()
        .unwrap();
    let r = Request::get("/p")
        .body(FrameBody::data([&b"part"[..]]).then_error())
        .unwrap();
    let err = extract(&ex, r).await.unwrap_err();
    assert!(err.is::<RequestBodyError>(), "{err}");
    assert_eq!(err.to_string(), "failed to read the request body");
    assert!(std::error::Error::source(&*err).is_some());
}

// ---- in an axum stack ----

fn echo_app(ex: HttpKeyExtractor) -> Router {
    async fn echo(req: Request<AxumBody>) -> Vec<u8> {
        let (parts, body) = req.into_parts();
        let tag = match (
            parts.extensions.get::<FlightKey>(),
            parts.extensions.get::<NotCoalescable>(),
        ) {
            (Some(k), None) => format!("key:{}", k.digest().to_hex()),
            (None, Some(n)) => format!("bypass:{}", n.reason()),
            _ => "none".to_owned(),
        };
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let mut out = tag.into_bytes();
        out.push(b'|');
        out.extend_from_slice(&bytes);
        out
    }
    Router::new()
        .route("/echo", post(echo).get(echo))
        .route("/orders", post(echo))
        .layer(
            ServiceBuilder::new()
                .layer(ErrorResponseLayer::new())
                .layer(KeyLayer::new(ex)),
        )
}

async fn call(app: &Router, req: Request<AxumBody>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

fn split(body: &[u8]) -> (String, Vec<u8>) {
    let i = body.iter().position(|&b| b == b'|').unwrap();
    (
        String::from_utf8(body[..i].to_vec()).unwrap(),
        body[i + 1..].to_vec(),
    )
}

#[tokio::test]
async fn body_is_reattached_byte_for_byte_for_axum() {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/echo", "echo").hash_body(1024))
        .build()
        .unwrap();
    let app = echo_app(ex);
    let payload: Vec<Vec<u8>> = vec![b"\x00\xff{\"a\":".to_vec(), b"1}\r\n\xfe".to_vec()];
    let whole: Vec<u8> = payload.concat();
    let req = Request::post("/echo")
        .body(AxumBody::new(FrameBody::chunks(payload)))
        .unwrap();
    let (status, body) = call(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    let (tag, echoed) = split(&body);
    assert!(tag.starts_with("key:"), "{tag}");
    assert_eq!(echoed, whole);
    // Same bytes in one frame: same key.
    let req = Request::post("/echo")
        .body(AxumBody::from(whole.clone()))
        .unwrap();
    let (_, body2) = call(&app, req).await;
    assert_eq!(split(&body2).0, tag);
}

#[tokio::test]
async fn oversize_body_reaches_axum_intact() {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/echo", "echo").hash_body(1024))
        .build()
        .unwrap();
    let app = echo_app(ex);
    let chunks: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 300]).collect();
    let whole = chunks.concat();
    let req = Request::post("/echo")
        .body(AxumBody::new(FrameBody::chunks(chunks)))
        .unwrap();
    let (status, body) = call(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    let (tag, echoed) = split(&body);
    assert_eq!(tag, "bypass:body_too_large");
    assert_eq!(echoed.len(), 2400);
    assert_eq!(echoed, whole);
}

#[tokio::test]
async fn body_read_error_maps_to_400_in_axum() {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/echo", "echo").hash_body(1024))
        .build()
        .unwrap();
    let app = echo_app(ex);
    let req = Request::post("/echo")
        .body(AxumBody::new(FrameBody::data([&b"x"[..]]).then_error()))
        .unwrap();
    let (status, body) = call(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        !String::from_utf8_lossy(&body).contains("reset"),
        "no internals leaked"
    );
}

fn order(key: &'static str, body: &'static str) -> Request<AxumBody> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(AxumBody::from(body))
        .unwrap()
}

#[tokio::test]
async fn idempotency_key_coalesces_same_payload_and_rejects_a_different_one() {
    let app = echo_app(basic());
    let (s1, b1) = call(&app, order("\"k-1\"", "{\"qty\":1}")).await;
    assert_eq!(s1, StatusCode::OK);
    let (t1, echoed) = split(&b1);
    assert!(t1.starts_with("key:"), "{t1}");
    assert_eq!(echoed, b"{\"qty\":1}");
    // Same key, same payload (quoted or not): same flight key.
    let (s2, b2) = call(&app, order("k-1", "{\"qty\":1}")).await;
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(split(&b2).0, t1);
    // Same key, different payload: 422, the handler never runs.
    let (s3, b3) = call(&app, order("k-1", "{\"qty\":2}")).await;
    assert_eq!(s3, StatusCode::UNPROCESSABLE_ENTITY);
    let msg = String::from_utf8(b3).unwrap();
    assert!(msg.contains("idempotency key reused"), "{msg}");
    assert!(!msg.contains("k-1"), "the key is not echoed: {msg}");
    // Another key with that payload is fine.
    let (s4, b4) = call(&app, order("k-2", "{\"qty\":2}")).await;
    assert_eq!(s4, StatusCode::OK);
    assert_ne!(split(&b4).0, t1);
}

#[tokio::test]
async fn idempotency_conflicts_are_per_tenant() {
    let app = echo_app(basic());
    let with_auth = |who: &'static str, body: &'static str| {
        Request::post("/orders")
            .header("idempotency-key", "same")
            .header("authorization", who)
            .body(AxumBody::from(body))
            .unwrap()
    };
    let (s1, b1) = call(&app, with_auth("Bearer alice", "a")).await;
    let (s2, b2) = call(&app, with_auth("Bearer bob", "b")).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_ne!(split(&b1).0, split(&b2).0);
}

#[tokio::test]
async fn idempotency_conflict_is_a_typed_error_without_axum() {
    let ex = basic();
    let req = |b: &'static str| {
        Request::post("/orders")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::from(b)))
            .unwrap()
    };
    assert!(extract(&ex, req("1")).await.is_ok());
    let err = extract(&ex, req("2")).await.unwrap_err();
    assert!(err.is::<IdempotencyConflict>());
    // Two idempotency keys: ambiguous, not coalesced.
    let mut r = req("1");
    r.headers_mut()
        .append("idempotency-key", HeaderValue::from_static("other"));
    assert_eq!(reason(&ex, r), Some(Reason::BadIdempotencyKey));
}

#[tokio::test]
async fn get_in_axum_gets_a_key_and_post_passes_through() {
    let app = echo_app(basic());
    let (_, b) = call(
        &app,
        Request::get("/echo?x=1").body(AxumBody::empty()).unwrap(),
    )
    .await;
    assert!(split(&b).0.starts_with("key:"));
    let (s, b) = call(
        &app,
        Request::post("/echo").body(AxumBody::from("hi")).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(split(&b), ("bypass:method".to_owned(), b"hi".to_vec()));
}

#[tokio::test]
async fn layer_works_on_a_plain_service_too() {
    let ex = basic();
    let svc = KeyLayer::new(ex).layer(tower::service_fn(|req: Request<_>| async move {
        let _: &flightdeck_core::http::FlightBody<Empty<Bytes>> = req.body();
        Ok::<_, std::convert::Infallible>(req.extensions().get::<FlightKey>().cloned())
    }));
    let k = svc.oneshot(get_req("/x")).await.unwrap();
    assert!(k.is_some());
}

#[test]
fn named_stages_are_every_stage_a_rule_can_key_into() {
    use flightdeck_key::NamedStages;
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::POST, "/v1/score", "score").hash_body(1024))
        .route(Route::new(Method::GET, "/v1/report/{id}", "report"))
        .route(Route::new(Method::GET, "/v1/report2/{id}", "report"))
        .stage_header("x-stage", ["search", "score"])
        .default_stage("http")
        .build()
        .unwrap();
    let names: Vec<String> = ex.stages().iter().map(|s| s.to_string()).collect();
    assert_eq!(names, ["http", "report", "score", "search"]);
    assert!(HttpKeyExtractor::builder()
        .build()
        .unwrap()
        .stages()
        .is_empty());
}
