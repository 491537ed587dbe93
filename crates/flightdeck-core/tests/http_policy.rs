//! What `HttpShare` shares, and with whom: `Set-Cookie`, `Cache-Control`,
//! `Vary`, the opt-ins, gRPC replies, and the leader's own cookies.
#![cfg(feature = "http")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use flightdeck_core::http::{
    CacheControl, FlightBody, HttpShare, LeaderHeaders, SetCookie, SharedResponse, VaryValues,
};
use flightdeck_core::{Serves, Share, Shareable, Unshareable};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};

/// A body of given frames with no declared length (like a gRPC reply).
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

fn frames(data: &'static [u8], trailers: Option<HeaderMap>) -> Frames {
    let mut f = VecDeque::from([Frame::data(Bytes::from_static(data))]);
    if let Some(t) = trailers {
        f.push_back(Frame::trailers(t));
    }
    Frames(f)
}

fn resp(headers: &[(&'static str, &[u8])], body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    for (k, v) in headers {
        r.headers_mut()
            .append(*k, HeaderValue::from_bytes(v).unwrap());
    }
    r
}

type Out<B> = Shareable<SharedResponse, Response<FlightBody<B>>>;

async fn share<B>(s: &HttpShare, r: Response<B>) -> Out<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<flightdeck_core::BoxError>,
{
    s.share(r).await.unwrap()
}

async fn body_of<B>(r: Response<FlightBody<B>>) -> (Bytes, Option<HeaderMap>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let c = r.into_body().collect().await.unwrap();
    let t = c.trailers().cloned();
    (c.to_bytes(), t)
}

fn reason<B>(out: &Out<B>) -> Option<Unshareable> {
    match out {
        Shareable::Unshared(_, r) => Some(*r),
        Shareable::Shared(_) => None,
    }
}

fn shared<B>(out: Out<B>) -> SharedResponse {
    match out {
        Shareable::Shared(s) => s,
        Shareable::Unshared(_, r) => panic!("expected a shared form, unshared: {r}"),
    }
}

fn cookies(h: &HeaderMap) -> Vec<&[u8]> {
    h.get_all("set-cookie")
        .iter()
        .map(|v| v.as_bytes())
        .collect()
}

fn waiter<B>(s: &HttpShare, shared: &SharedResponse) -> Response<FlightBody<B>>
where
    HttpShare: Share<Response<B>, Output = Response<FlightBody<B>>>,
{
    Share::<Response<B>>::restore(s, shared)
}

fn leader<B>(s: &HttpShare, shared: &SharedResponse) -> Response<FlightBody<B>>
where
    HttpShare: Share<Response<B>, Output = Response<FlightBody<B>>>,
{
    Share::<Response<B>>::restore_leader(s, shared)
}

fn req(headers: &[(&'static str, &'static str)]) -> Request<()> {
    let mut r = Request::new(());
    for (k, v) in headers {
        r.headers_mut().append(*k, HeaderValue::from_static(v));
    }
    r
}

#[tokio::test]
async fn set_cookie_is_not_shared_and_the_leader_gets_it_untouched() {
    let s = HttpShare::new();
    let out = share(
        &s,
        resp(
            &[
                ("set-cookie", b"sid=1; HttpOnly"),
                ("set-cookie", b"csrf=2"),
                ("x-other", b"kept"),
            ],
            "hello",
        ),
    )
    .await;
    let Shareable::Unshared(r, why) = out else {
        panic!("shared a response with Set-Cookie");
    };
    assert_eq!(why, Unshareable::SetCookie);
    assert_eq!(why.as_str(), "set_cookie");
    assert_eq!(cookies(r.headers()), [&b"sid=1; HttpOnly"[..], b"csrf=2"]);
    assert_eq!(r.headers()["x-other"], "kept");
    assert!(!r.body().is_replay(), "the leader's own body, not a copy");
    assert_eq!(body_of(r).await.0, "hello");
}

#[tokio::test]
async fn cache_control_that_forbids_sharing() {
    let s = HttpShare::new();
    for lines in [
        &[&b"private, max-age=60"[..]][..],
        &[b"no-store"],
        &[b"no-cache"],
        &[b"Public, PRIVATE=\"x-user\""],
        &[b"max-age=60", b"No-Cache"],
        &[b"ext=\"x, y\", no-store"],
        &[&[0xff, 0xfe][..]],
    ] {
        let headers: Vec<(&'static str, &[u8])> =
            lines.iter().map(|l| ("cache-control", *l)).collect();
        let out = share(&s, resp(&headers, "x")).await;
        assert_eq!(
            reason(&out),
            Some(Unshareable::CacheControl),
            "{lines:?} must not be shared"
        );
    }
    for ok in [
        &b"public, max-age=60"[..],
        b"ext=\"private\"",
        b"s-maxage=5",
    ] {
        let out = share(&s, resp(&[("cache-control", ok)], "x")).await;
        assert_eq!(reason(&out), None, "{ok:?} may be shared");
    }
}

#[tokio::test]
async fn vary_star_is_not_shared() {
    let s = HttpShare::new();
    for v in [&b"*"[..], b"accept, *", b"x flavor"] {
        let out = share(&s, resp(&[("vary", v)], "x")).await;
        assert_eq!(reason(&out), Some(Unshareable::VaryStar), "{v:?}");
    }
    // Not even with every opt-in.
    let all_in = HttpShare::new()
        .set_cookie(SetCookie::Share)
        .cache_control(CacheControl::Ignore);
    let out = share(&all_in, resp(&[("vary", b"*")], "x")).await;
    assert_eq!(reason(&out), Some(Unshareable::VaryStar));
}

#[tokio::test]
async fn the_head_decides_before_the_body_is_read() {
    // A stream with Set-Cookie: the reason is the cookie, and not one byte
    // of the stream was read.
    let s = HttpShare::new();
    let sse = resp(
        &[
            ("set-cookie", b"a=1"),
            ("content-type", b"text/event-stream"),
        ],
        "data: 1\n\n",
    );
    let out = share(&s, sse).await;
    assert_eq!(reason(&out), Some(Unshareable::SetCookie));
    let Shareable::Unshared(r, _) = out else {
        unreachable!()
    };
    assert_eq!(body_of(r).await.0, "data: 1\n\n");
}

fn grpc_reply(set_cookie: bool) -> Response<Frames> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(frames(b"\0\0\0\0\x02\x08\x01", Some(trailers)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    if set_cookie {
        r.headers_mut()
            .insert("set-cookie", HeaderValue::from_static("route=node-3"));
    }
    r
}

#[tokio::test]
async fn grpc_reply_with_set_cookie_metadata_is_not_shared() {
    let s = HttpShare::new();
    let out = share(&s, grpc_reply(true)).await;
    let Shareable::Unshared(r, why) = out else {
        panic!("shared a gRPC reply whose metadata sets a cookie");
    };
    assert_eq!(why, Unshareable::SetCookie);
    assert_eq!(r.headers()["set-cookie"], "route=node-3");
    let (body, trailers) = body_of(r).await;
    assert_eq!(&body[..], b"\0\0\0\0\x02\x08\x01");
    assert_eq!(trailers.unwrap()["grpc-status"], "0");

    // The same reply without the cookie is shared, trailers included.
    let sh = shared(share(&s, grpc_reply(false)).await);
    let (_, trailers) = body_of(waiter::<Frames>(&s, &sh)).await;
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
}

#[tokio::test]
async fn strip_shares_without_cookies_and_the_leader_keeps_its_own() {
    let s = HttpShare::new().set_cookie(SetCookie::Strip);
    let sh = shared(
        share(
            &s,
            resp(
                &[
                    ("set-cookie", b"sid=1"),
                    ("x-other", b"kept"),
                    ("set-cookie", &[b's', b'=', 0xff]),
                ],
                "page",
            ),
        )
        .await,
    );
    assert!(cookies(sh.headers()).is_empty(), "the shared head has none");
    for _ in 0..2 {
        let w = waiter::<Full<Bytes>>(&s, &sh);
        assert!(cookies(w.headers()).is_empty(), "a waiter got a cookie");
        assert_eq!(w.headers()["x-other"], "kept");
        assert_eq!(body_of(w).await.0, "page");
        assert!(cookies(sh.to_response::<Full<Bytes>>().headers()).is_empty());
    }
    let l = leader::<Full<Bytes>>(&s, &sh);
    assert_eq!(cookies(l.headers()), [&b"sid=1"[..], &[b's', b'=', 0xff]]);
    assert_eq!(l.headers()["x-other"], "kept");
    assert_eq!(body_of(l).await.0, "page");
    // A stripped result serves waiters under the same policy.
    assert!(Serves::<Request<()>>::serves(&s, &sh, &req(&[])));
    assert!(format!("{sh:?}").contains("leader_cookies: true"));
    // The copy kept for later callers restores no cookie, not even as
    // the leader of another flight; the leader's own still has them.
    let kept = sh.without_leader_cookies();
    let l = leader::<Full<Bytes>>(&s, &kept);
    assert!(
        cookies(l.headers()).is_empty(),
        "the kept copy has a cookie"
    );
    assert_eq!(l.headers()["x-other"], "kept");
    assert_eq!(body_of(l).await.0, "page");
    assert_eq!(cookies(leader::<Full<Bytes>>(&s, &sh).headers()).len(), 2);
}

#[tokio::test]
async fn share_hands_the_cookies_to_everyone() {
    let s = HttpShare::new().set_cookie(SetCookie::Share);
    let sh = shared(share(&s, resp(&[("set-cookie", b"flag=on")], "x")).await);
    assert_eq!(
        cookies(waiter::<Full<Bytes>>(&s, &sh).headers()),
        [b"flag=on"]
    );
    assert_eq!(
        cookies(leader::<Full<Bytes>>(&s, &sh).headers()),
        [b"flag=on"]
    );
    // Nothing is hidden for the leader: it is all in the head.
    assert!(format!("{sh:?}").contains("leader_cookies: false"));
}

#[tokio::test]
async fn ignore_shares_despite_cache_control_but_not_despite_cookies() {
    let s = HttpShare::new().cache_control(CacheControl::Ignore);
    let sh = shared(share(&s, resp(&[("cache-control", b"private, no-store")], "x")).await);
    assert_eq!(
        waiter::<Full<Bytes>>(&s, &sh).headers()["cache-control"],
        "private, no-store"
    );
    let out = share(&s, resp(&[("set-cookie", b"a=1")], "x")).await;
    assert_eq!(reason(&out), Some(Unshareable::SetCookie));
}

#[tokio::test]
async fn results_made_under_another_policy_are_not_served() {
    // A result a node with opt-ins stored, replayed to a node without.
    let lax = HttpShare::new()
        .set_cookie(SetCookie::Share)
        .cache_control(CacheControl::Ignore);
    let strict = HttpShare::new();
    let strip = HttpShare::new().set_cookie(SetCookie::Strip);
    let cookie = shared(share(&lax, resp(&[("set-cookie", b"sid=1")], "x")).await);
    let private = shared(share(&lax, resp(&[("cache-control", b"private")], "x")).await);
    let any = req(&[]);
    for (policy, result, serves) in [
        (&lax, &cookie, true),
        (&lax, &private, true),
        (&strict, &cookie, false),
        (&strict, &private, false),
        // Under Strip only a stripped result may go to a waiter.
        (&strip, &cookie, false),
    ] {
        assert_eq!(
            Serves::<Request<()>>::serves(policy, result, &any),
            serves,
            "{policy:?} {result:?}"
        );
    }
    // The same via the public constructor codecs use.
    let mut h = HeaderMap::new();
    h.insert("set-cookie", HeaderValue::from_static("sid=1"));
    let stored = SharedResponse::new(StatusCode::OK, h, Bytes::new(), None);
    assert!(!Serves::<Request<()>>::serves(&strict, &stored, &any));
}

fn with_trailer_cookie() -> Response<Frames> {
    let mut t = HeaderMap::new();
    t.insert("set-cookie", HeaderValue::from_static("late=1"));
    t.insert("x-checksum", HeaderValue::from_static("abc"));
    let mut r = Response::new(frames(b"body", Some(t)));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

#[tokio::test]
async fn a_cookie_in_the_trailers_counts_as_one_in_the_head() {
    let out = share(&HttpShare::new(), with_trailer_cookie()).await;
    let Shareable::Unshared(r, why) = out else {
        panic!("shared a response whose trailers set a cookie");
    };
    assert_eq!(why, Unshareable::SetCookie);
    let (body, t) = body_of(r).await;
    assert_eq!(body, "body");
    assert_eq!(t.unwrap()["set-cookie"], "late=1");

    let s = HttpShare::new().set_cookie(SetCookie::Strip);
    let sh = shared(share(&s, with_trailer_cookie()).await);
    let (_, t) = body_of(waiter::<Frames>(&s, &sh)).await;
    let t = t.unwrap();
    assert!(t.get("set-cookie").is_none());
    assert_eq!(t["x-checksum"], "abc");
    let (_, t) = body_of(leader::<Frames>(&s, &sh)).await;
    assert_eq!(t.unwrap()["set-cookie"], "late=1");
}

#[tokio::test]
async fn vary_serves_only_requests_with_the_leaders_values() {
    let s = HttpShare::new();
    let sh = shared(
        share(
            &s,
            resp(
                &[
                    ("vary", b"X-Flavor"),
                    ("vary", b"accept-language, X-FLAVOR"),
                ],
                "vanilla",
            ),
        )
        .await,
    );
    let any = req(&[]);
    // Before the leader's values are recorded it serves no one.
    assert!(!Serves::<Request<()>>::serves(&s, &sh, &any));
    let lead = req(&[("x-flavor", "vanilla"), ("authorization", "Bearer a")]);
    let snap: LeaderHeaders = Serves::<Request<()>>::leader(&s, &lead);
    let sh = Serves::<Request<()>>::record(&s, sh, snap);
    let serves = |r: &Request<()>| Serves::<Request<()>>::serves(&s, &sh, r);
    assert!(serves(&req(&[("x-flavor", "vanilla")])));
    assert!(serves(&req(&[("X-Flavor", "vanilla"), ("x-other", "1")])));
    assert!(!serves(&req(&[("x-flavor", "chocolate")])));
    assert!(!serves(&req(&[])), "absent on one side only");
    assert!(!serves(&req(&[
        ("x-flavor", "vanilla"),
        ("accept-language", "fr")
    ])));
    assert!(
        !serves(&req(&[("x-flavor", "Vanilla")])),
        "values compare exactly"
    );
    let names: Vec<&str> = sh
        .vary_values()
        .unwrap()
        .names()
        .map(|n| n.as_str())
        .collect();
    assert_eq!(names, ["accept-language", "x-flavor"]);

    // A result keeps the values of the leader it was made for.
    let other = Serves::<Request<()>>::leader(&s, &req(&[("x-flavor", "chocolate")]));
    let again = Serves::<Request<()>>::record(&s, sh.clone(), other);
    assert!(Serves::<Request<()>>::serves(
        &s,
        &again,
        &req(&[("x-flavor", "vanilla")])
    ));
    assert!(!Serves::<Request<()>>::serves(
        &s,
        &again,
        &req(&[("x-flavor", "chocolate")])
    ));
}

#[tokio::test]
async fn without_vary_every_request_is_served_and_nothing_is_recorded() {
    let s = HttpShare::new();
    let sh = shared(share(&s, resp(&[], "x")).await);
    assert!(Serves::<Request<()>>::serves(
        &s,
        &sh,
        &req(&[("x-flavor", "a")])
    ));
    let sh = Serves::<Request<()>>::record(&s, sh, LeaderHeaders::new(&HeaderMap::new()));
    assert!(sh.vary_values().is_none());
}

#[test]
fn vary_values_must_fit_the_response() {
    let mut h = HeaderMap::new();
    h.insert("vary", HeaderValue::from_static("x-flavor"));
    let stored = SharedResponse::new(StatusCode::OK, h.clone(), Bytes::new(), None);
    let mut ask = HeaderMap::new();
    ask.insert("x-flavor", HeaderValue::from_static("vanilla"));
    let wrong = VaryValues::of(&[HeaderName::from_static("x-tier")], &ask);
    let err = stored.clone().with_vary_values(wrong).unwrap_err();
    assert!(err.to_string().contains("x-tier"), "{err}");
    let right = VaryValues::of(&[HeaderName::from_static("x-flavor")], &ask);
    let back = stored.with_vary_values(right.clone()).unwrap();
    assert!(back.serves(&ask));
    ask.insert("x-flavor", HeaderValue::from_static("chocolate"));
    assert!(!back.serves(&ask));
    // Values for a response without Vary do not fit either.
    let plain = SharedResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new(), None);
    assert!(plain.clone().with_vary_values(right).is_err());
    assert!(plain.with_vary_values(VaryValues::new()).is_ok());
    // A stored `Vary: *` serves no one.
    let mut star = HeaderMap::new();
    star.insert("vary", HeaderValue::from_static("*"));
    let star = SharedResponse::new(StatusCode::OK, star, Bytes::new(), None);
    assert!(!star.serves(&HeaderMap::new()));
}

#[tokio::test]
async fn non_utf8_header_values_never_panic() {
    let s = HttpShare::new();
    let bin: &[u8] = &[0xff, 0x80, b' ', 0xfe];
    for name in [
        "set-cookie",
        "cache-control",
        "vary",
        "x-bin",
        "content-type",
    ] {
        let out = share(&s, resp(&[(name, bin)], "x")).await;
        let expected = match name {
            "set-cookie" => Some(Unshareable::SetCookie),
            "cache-control" => Some(Unshareable::CacheControl),
            "vary" => Some(Unshareable::VaryStar),
            _ => None,
        };
        assert_eq!(reason(&out), expected, "{name}");
    }
    // Vary on a header whose request values are not UTF-8.
    let sh = shared(share(&s, resp(&[("vary", b"x-bin")], "x")).await);
    let mut lead = Request::new(());
    lead.headers_mut()
        .insert("x-bin", HeaderValue::from_bytes(bin).unwrap());
    let snap = Serves::<Request<()>>::leader(&s, &lead);
    let sh = Serves::<Request<()>>::record(&s, sh, snap);
    assert!(Serves::<Request<()>>::serves(&s, &sh, &lead));
    assert!(!Serves::<Request<()>>::serves(
        &s,
        &sh,
        &req(&[("x-bin", "ascii")])
    ));
}
