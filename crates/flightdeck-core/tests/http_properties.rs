//! Properties of `HttpShare` over random response heads and policies: a
//! response the rules make unshareable is never turned into a shared form
//! (its leader gets it untouched), no copy for another caller carries a
//! cookie unless cookies are shared, and a response with `Vary` serves
//! exactly the requests whose named headers equal the leader's.
#![cfg(feature = "http")]

use bytes::Bytes;
use flightdeck_core::http::{CacheControl, HttpShare, SetCookie, SharedResponse};
use flightdeck_core::{Serves, Share, Shareable};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;

/// One `Cache-Control` directive, as a model: its name, its value, and how
/// it is spelled.
#[derive(Debug, Clone)]
struct Directive {
    name: &'static str,
    value: Option<String>,
    upper: bool,
}

const DIRECTIVES: [&str; 8] = [
    "private",
    "no-store",
    "no-cache",
    "public",
    "max-age",
    "s-maxage",
    "must-revalidate",
    "x-ext",
];

fn forbids(name: &str) -> bool {
    matches!(name, "private" | "no-store" | "no-cache")
}

fn directive() -> impl Strategy<Value = Directive> {
    let value = prop_oneof![
        Just(None),
        "[0-9]{1,3}".prop_map(Some),
        // Quoted values may hold commas and directive names: they are
        // values all the same.
        prop::sample::select(vec![
            "\"private\"",
            "\"no-store, no-cache\"",
            "\"set-cookie, x-user\"",
            "\"a\\\"b\"",
        ])
        .prop_map(|v| Some(v.to_owned())),
    ];
    (
        prop::sample::select(DIRECTIVES.to_vec()),
        value,
        any::<bool>(),
    )
        .prop_map(|(name, value, upper)| Directive { name, value, upper })
}

fn render(d: &Directive) -> String {
    let name = if d.upper {
        d.name.to_ascii_uppercase()
    } else {
        d.name.to_owned()
    };
    match &d.value {
        Some(v) => format!("{name}={v}"),
        None => name,
    }
}

/// A response head, as a model.
#[derive(Debug, Clone)]
struct Head {
    cookies: Vec<String>,
    /// `Cache-Control` lines, each a list of directives.
    cache_control: Vec<Vec<Directive>>,
    /// `Vary` lines, each a list of names (or `*`).
    vary: Vec<Vec<&'static str>>,
    /// Other headers, some of them not UTF-8.
    other: Vec<Vec<u8>>,
}

const VARY_NAMES: [&str; 5] = ["x-flavor", "X-Flavor", "accept-language", "x-tier", "*"];

fn head() -> impl Strategy<Value = Head> {
    (
        prop::collection::vec("[a-z]{1,4}=[a-z0-9]{0,6}", 0..3),
        prop::collection::vec(prop::collection::vec(directive(), 0..4), 0..3),
        prop::collection::vec(
            prop::collection::vec(prop::sample::select(VARY_NAMES.to_vec()), 0..3),
            0..3,
        ),
        prop::collection::vec(
            prop::collection::vec(
                any::<u8>().prop_filter("header byte", |b| *b >= 0x20 && *b != 0x7f),
                0..6,
            ),
            0..3,
        ),
    )
        .prop_map(|(cookies, cache_control, vary, other)| Head {
            cookies,
            cache_control,
            vary,
            other,
        })
}

fn policy() -> impl Strategy<Value = (SetCookie, CacheControl)> {
    (
        prop::sample::select(vec![SetCookie::Refuse, SetCookie::Strip, SetCookie::Share]),
        prop::sample::select(vec![CacheControl::Respect, CacheControl::Ignore]),
    )
}

/// Joins list members with a separator of random spacing.
fn join(items: Vec<String>, wide: bool) -> String {
    items.join(if wide { " ,  " } else { "," })
}

fn response(h: &Head, wide: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(b"body")));
    let headers = r.headers_mut();
    for c in &h.cookies {
        headers.append("set-cookie", HeaderValue::from_str(c).unwrap());
    }
    for line in &h.cache_control {
        let line = join(line.iter().map(render).collect(), wide);
        headers.append("cache-control", HeaderValue::from_str(&line).unwrap());
    }
    for line in &h.vary {
        let line = join(line.iter().map(|n| (*n).to_owned()).collect(), wide);
        headers.append("vary", HeaderValue::from_str(&line).unwrap());
    }
    for v in &h.other {
        headers.append("x-other", HeaderValue::from_bytes(v).unwrap());
    }
    r
}

/// What the rules say, from the model alone.
fn unshareable(h: &Head, (set_cookie, cache_control): (SetCookie, CacheControl)) -> bool {
    let cookie = set_cookie == SetCookie::Refuse && !h.cookies.is_empty();
    let cc = cache_control == CacheControl::Respect
        && h.cache_control.iter().flatten().any(|d| forbids(d.name));
    let star = h.vary.iter().flatten().any(|n| *n == "*");
    cookie || cc || star
}

/// The lowercase names the model's `Vary` lines list.
fn vary_names(h: &Head) -> Vec<String> {
    let mut names: Vec<String> = h
        .vary
        .iter()
        .flatten()
        .map(|n| n.to_ascii_lowercase())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A request: a value (or none) for each header responses may vary on.
fn request() -> impl Strategy<Value = Vec<(&'static str, Option<&'static str>)>> {
    let names = ["x-flavor", "accept-language", "x-tier"];
    prop::collection::vec(
        prop::option::of(prop::sample::select(vec!["vanilla", "chocolate", "fr", ""])),
        3,
    )
    .prop_map(move |vals| names.into_iter().zip(vals).collect())
}

fn to_request(values: &[(&'static str, Option<&'static str>)]) -> Request<()> {
    let mut r = Request::new(());
    for (name, v) in values {
        if let Some(v) = v {
            r.headers_mut().insert(*name, HeaderValue::from_static(v));
        }
    }
    r
}

/// The model request's value of one header.
fn pick(r: &[(&'static str, Option<&'static str>)], name: &str) -> Option<&'static str> {
    r.iter().find(|(k, _)| *k == name).and_then(|(_, v)| *v)
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn headers_of(r: &Response<impl Sized>) -> HeaderMap {
    r.headers().clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn unshareable_responses_are_never_shared(
        h in head(),
        policy in policy(),
        wide in any::<bool>(),
    ) {
        let share = HttpShare::new().set_cookie(policy.0).cache_control(policy.1);
        let original = response(&h, wide);
        let before = headers_of(&original);
        let out = run(share.share(original)).unwrap();
        let refused = unshareable(&h, policy);
        match out {
            Shareable::Unshared(resp, _) => {
                prop_assert!(refused, "a shareable response was refused: {h:?} {policy:?}");
                // The leader's response, untouched.
                prop_assert_eq!(resp.headers(), &before);
                let body = run(resp.into_body().collect()).unwrap().to_bytes();
                prop_assert_eq!(&body[..], b"body");
            }
            Shareable::Shared(shared) => {
                prop_assert!(!refused, "an unshareable response was shared: {h:?} {policy:?}");
                // No copy for another caller carries a cookie unless
                // cookies are shared; the leader's copy has all of its own.
                let other = Share::<Response<Full<Bytes>>>::restore(&share, &shared);
                let leader = Share::<Response<Full<Bytes>>>::restore_leader(&share, &shared);
                let n = |r: &Response<_>| r.headers().get_all("set-cookie").iter().count();
                if policy.0 != SetCookie::Share {
                    prop_assert_eq!(n(&other), 0);
                    prop_assert_eq!(shared.headers().get_all("set-cookie").iter().count(), 0);
                } else {
                    prop_assert_eq!(n(&other), h.cookies.len());
                }
                prop_assert_eq!(n(&leader), h.cookies.len());
            }
        }
    }

    #[test]
    fn vary_serves_exactly_the_requests_with_the_leaders_values(
        h in head(),
        wide in any::<bool>(),
        leader in request(),
        others in prop::collection::vec(request(), 1..6),
    ) {
        // Only the Vary rule is under test: let cookies and Cache-Control by.
        let share = HttpShare::new()
            .set_cookie(SetCookie::Share)
            .cache_control(CacheControl::Ignore);
        let out = run(share.share(response(&h, wide))).unwrap();
        let Shareable::Shared(shared) = out else {
            prop_assert!(h.vary.iter().flatten().any(|n| *n == "*"));
            return Ok(());
        };
        let lead = to_request(&leader);
        let snap = Serves::<Request<()>>::leader(&share, &lead);
        let shared: SharedResponse = Serves::<Request<()>>::record(&share, shared, snap);
        let names = vary_names(&h);
        for other in &others {
            let expected = names.iter().all(|n| {
                pick(&leader, n) == pick(other, n)
            });
            let req = to_request(other);
            prop_assert_eq!(
                Serves::<Request<()>>::serves(&share, &shared, &req),
                expected,
                "vary {:?}, leader {:?}, other {:?}", names, leader, other
            );
        }
        // The leader's own request always matches its values.
        prop_assert!(Serves::<Request<()>>::serves(&share, &shared, &lead));
    }
}
