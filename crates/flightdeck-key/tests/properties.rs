//! Property tests of the HTTP key: canonical equality, sensitivity to every
//! included field, tenant separation, and length-prefixing.
#![cfg(feature = "http")]

mod common;

use bytes::Bytes;
use common::key_now;
use flightdeck_core::{FlightKey, KeyEncoder};
use flightdeck_key::http::{HttpKeyExtractor, Route, Scope};
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use proptest::prelude::*;

const IGNORED: [&str; 3] = ["_", "ts", "nonce"];

fn extractor() -> HttpKeyExtractor {
    HttpKeyExtractor::builder()
        .default_stage("http")
        .route(Route::new(Method::POST, "/submit/{*rest}", "submit").hash_body(4096))
        .ignore_query_params(IGNORED)
        .header("x-model")
        .build()
        .unwrap()
}

/// A request in its meaningful parts.
#[derive(Debug, Clone)]
struct Req {
    post: bool,
    path: String,
    params: Vec<(String, String)>,
    accept: Option<Vec<u8>>,
    model: Option<String>,
    auth: Option<String>,
    body: Vec<u8>,
}

fn name() -> impl Strategy<Value = String> {
    // Never an ignored name.
    "[a-z][a-z0-9]{0,5}".prop_filter("ignored", |n| !IGNORED.contains(&n.as_str()))
}

fn value() -> impl Strategy<Value = String> {
    // Anything, including characters that must be percent-encoded.
    proptest::collection::vec(any::<char>(), 0..8).prop_map(|v| v.into_iter().collect())
}

fn req() -> impl Strategy<Value = Req> {
    (
        any::<bool>(),
        proptest::collection::vec("[a-z0-9]{1,6}", 0..4),
        proptest::collection::vec((name(), value()), 0..6),
        proptest::option::of(proptest::collection::vec(
            any::<u8>().prop_filter("valid header byte", |b| *b >= 0x20 && *b != 0x7f),
            0..6,
        )),
        proptest::option::of("[a-z0-9.]{1,6}"),
        proptest::option::of("[A-Za-z0-9]{1,12}"),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(post, segs, params, accept, model, auth, body)| Req {
            post,
            path: if post {
                "/submit".into()
            } else {
                format!("/{}", segs.join("/"))
            },
            params,
            accept,
            model,
            auth,
            body: if post { body } else { Vec::new() },
        })
}

/// How to write a request on the wire: which characters are percent-encoded
/// (and in which case), whether spaces are `+`, where ignored parameters go.
#[derive(Debug, Clone)]
struct Spelling {
    encode: Vec<bool>,
    lower_hex: bool,
    plus_for_space: bool,
    ignored: Vec<(usize, usize, String)>,
    empty_pieces: Vec<usize>,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (
        proptest::collection::vec(any::<bool>(), 64),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec((0usize..8, 0usize..3, "[a-z0-9]{0,6}"), 0..3),
        proptest::collection::vec(0usize..8, 0..2),
    )
        .prop_map(
            |(encode, lower_hex, plus_for_space, ignored, empty_pieces)| Spelling {
                encode,
                lower_hex,
                plus_for_space,
                ignored,
                empty_pieces,
            },
        )
}

fn encode(s: &str, sp: &Spelling) -> String {
    let mut out = String::new();
    for (i, b) in s.bytes().enumerate() {
        let must = !(b.is_ascii_alphanumeric() || b"-._~".contains(&b));
        let may = sp.encode[i % sp.encode.len()];
        if b == b' ' && sp.plus_for_space {
            out.push('+');
        } else if must || may {
            if sp.lower_hex {
                out.push_str(&format!("%{b:02x}"));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(char::from(b));
        }
    }
    out
}

fn build(r: &Req, params: &[(String, String)], sp: Option<&Spelling>) -> Request<Full<Bytes>> {
    let default = Spelling {
        encode: vec![false],
        lower_hex: false,
        plus_for_space: false,
        ignored: Vec::new(),
        empty_pieces: Vec::new(),
    };
    let sp = sp.unwrap_or(&default);
    let mut pieces: Vec<String> = params
        .iter()
        .map(|(n, v)| format!("{}={}", encode(n, sp), encode(v, sp)))
        .collect();
    for (at, which, v) in &sp.ignored {
        let at = (*at).min(pieces.len());
        pieces.insert(at, format!("{}={v}", IGNORED[*which]));
    }
    for at in &sp.empty_pieces {
        let at = (*at).min(pieces.len());
        pieces.insert(at, String::new());
    }
    let uri = if pieces.is_empty() {
        r.path.clone()
    } else {
        format!("{}?{}", r.path, pieces.join("&"))
    };
    let method = if r.post { Method::POST } else { Method::GET };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from(r.body.clone())))
        .unwrap();
    let h = req.headers_mut();
    if let Some(a) = &r.accept {
        h.insert("accept", HeaderValue::from_bytes(a).unwrap());
    }
    if let Some(m) = &r.model {
        h.insert("x-model", HeaderValue::from_str(m).unwrap());
    }
    if let Some(a) = &r.auth {
        h.insert("authorization", HeaderValue::from_str(a).unwrap());
    }
    req
}

fn key(ex: &HttpKeyExtractor, r: &Req) -> FlightKey {
    key_now(ex, build(r, &r.params, None)).expect("coalescable")
}

/// A stable reordering: sorted by name, repeated names in their order.
fn reorder(params: &[(String, String)], rotate: usize) -> Vec<(String, String)> {
    let mut names: Vec<&String> = params.iter().map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    if !names.is_empty() {
        let k = rotate % names.len();
        names.rotate_left(k);
    }
    names
        .into_iter()
        .flat_map(|n| params.iter().filter(move |(m, _)| m == n).cloned())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn equal_canonical_requests_give_equal_keys(
        r in req(), sp in spelling(), rotate in 0usize..6
    ) {
        let ex = extractor();
        let plain = key(&ex, &r);
        let respelled = build(&r, &reorder(&r.params, rotate), Some(&sp));
        prop_assert_eq!(key_now(&ex, respelled), Some(plain.clone()));
        // Deterministic, and the same in a second extractor (another node).
        prop_assert_eq!(key(&extractor(), &r), plain);
    }

    #[test]
    fn changing_any_included_field_changes_the_key(r in req(), field in 0usize..8, extra in "[a-z0-9]{1,4}") {
        let ex = extractor();
        let before = key(&ex, &r);
        let mut m = r.clone();
        match field {
            0 => {
                m.post = !m.post;
                m.path = if m.post { "/submit".into() } else { "/submit/x".into() };
                m.body.clear();
            }
            1 => m.path.push_str(&format!("/{extra}")),
            2 => m.params.push((format!("p{extra}"), extra.clone())),
            3 => match m.params.first_mut() {
                Some(p) => p.1.push_str(&extra),
                None => m.params.push(("a".into(), String::new())),
            },
            4 => m.accept = Some(match m.accept.take() {
                Some(mut a) => { a.extend_from_slice(extra.as_bytes()); a }
                None => Vec::new(),
            }),
            5 => m.model = Some(m.model.take().unwrap_or_default() + &extra),
            6 => m.auth = Some(m.auth.take().unwrap_or_default() + &extra),
            _ => { m.post = true; m.path = "/submit".into(); m.body.extend_from_slice(extra.as_bytes()); }
        }
        // Field 7 on a GET is also a method change; either way, it differs.
        prop_assert_ne!(key(&ex, &m), before);
    }

    #[test]
    fn two_tenants_never_share(r in req(), a in "[a-z0-9]{1,10}", b in "[a-z0-9]{1,10}") {
        prop_assume!(a != b);
        // Credentials (the default)...
        let ex = extractor();
        let mut ra = r.clone();
        ra.auth = Some(a.clone());
        let mut rb = r.clone();
        rb.auth = Some(b.clone());
        prop_assert_ne!(key(&ex, &ra), key(&ex, &rb));
        prop_assert_ne!(key(&ex, &ra).flight_digest(), key(&ex, &rb).flight_digest());
        // ...and a tenant header rule.
        let by_tenant = HttpKeyExtractor::builder()
            .default_stage("http")
            .route(Route::new(Method::POST, "/submit/{*rest}", "submit").hash_body(4096))
            .scope(Scope::header("x-tenant"))
            .build()
            .unwrap();
        let mut qa = build(&r, &r.params, None);
        qa.headers_mut().insert("x-tenant", HeaderValue::from_str(&a).unwrap());
        let mut qb = build(&r, &r.params, None);
        qb.headers_mut().insert("x-tenant", HeaderValue::from_str(&b).unwrap());
        let ka = key_now(&by_tenant, qa).unwrap();
        let kb = key_now(&by_tenant, qb).unwrap();
        prop_assert_ne!(ka.flight_digest(), kb.flight_digest());
    }

    #[test]
    fn ignored_parameters_and_order_do_not_matter(
        r in req(), rotate in 0usize..6, ts in "[0-9]{1,13}", nonce in "[a-z0-9]{0,8}"
    ) {
        let ex = extractor();
        let mut params = reorder(&r.params, rotate);
        params.insert(0, ("ts".into(), ts));
        params.push(("nonce".into(), nonce));
        params.push(("_".into(), String::new()));
        prop_assert_eq!(key_now(&ex, build(&r, &params, None)), Some(key(&ex, &r)));
    }

    #[test]
    fn length_prefixing_prevents_concatenation_collisions(
        s in "[a-z]{2,10}", cut_a in 1usize..10, cut_b in 1usize..10
    ) {
        let cut_a = cut_a.min(s.len() - 1);
        let cut_b = cut_b.min(s.len() - 1);
        prop_assume!(cut_a != cut_b);
        // In the encoder...
        let (a1, a2) = s.split_at(cut_a);
        let (b1, b2) = s.split_at(cut_b);
        let da = KeyEncoder::new().field(a1.as_bytes()).field(a2.as_bytes()).finish();
        let db = KeyEncoder::new().field(b1.as_bytes()).field(b2.as_bytes()).finish();
        prop_assert_ne!(da, db);
        // ...and in requests: `ab=c` vs `a=bc`, path vs query.
        let ex = extractor();
        let q = |n: &str, v: &str| {
            key_now(&ex, Request::get(format!("/p?{n}={v}")).body(Full::new(Bytes::new())).unwrap())
        };
        prop_assert_ne!(q(a1, a2), q(b1, b2));
        let g = |u: String| key_now(&ex, Request::get(u).body(Full::new(Bytes::new())).unwrap());
        prop_assert_ne!(g(format!("/{a1}?{a2}")), g(format!("/{b1}?{b2}")));
    }
}
