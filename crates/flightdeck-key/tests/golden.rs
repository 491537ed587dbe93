//! The key encoding, pinned: the request digest and the scope digest of a
//! fixed set of HTTP and gRPC requests.
//!
//! Keys are compared across processes and across versions during a rolling
//! deploy, and they name entries in Redis: a digest that changes by
//! accident splits a deployment into nodes that never share (or, worse, a
//! new encoding that collides with an old one). Any change to this table
//! must be deliberate, and a change of what a digest means must come with a
//! new version in its domain.
//!
//! The `port` rows pin the one deliberate change without a new version:
//! the authority field holds the host without its port. A request with no
//! port keeps its digest; one with a port now has the digest the same
//! request without it always had. The two forms could only ever meet as
//! "the same host", which is what the new encoding means, so no old key
//! collides with a new one of different meaning (see CHANGELOG.md).
#![cfg(feature = "grpc")]

mod common;

use bytes::Bytes;
use common::{grpc_call, key_now};
use flightdeck_core::FlightKey;
use flightdeck_key::grpc::GrpcKeyExtractor;
use flightdeck_key::http::HttpKeyExtractor;
use http::Request;
use http_body_util::Full;

fn http(secret: Option<&str>) -> HttpKeyExtractor {
    let b = HttpKeyExtractor::builder()
        .default_stage("http")
        .ignore_query_params(["ts"]);
    match secret {
        Some(s) => b.scope_secret(s),
        None => b,
    }
    .build()
    .unwrap()
}

fn get(headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    get_at("http://api.example/v1/items?b=2&a=1&ts=9", headers)
}

fn get_at(uri: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(uri).header("accept", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

fn row(name: &str, key: Option<FlightKey>) -> String {
    let key = key.expect("keyed");
    let scope = key.scope().map_or("-".to_owned(), |s| s.to_hex());
    format!("{name} {} {scope}", key.digest().to_hex())
}

fn table() -> String {
    let plain = http(None);
    let salted = http(Some("deployment-secret"));
    let grpc_keys = GrpcKeyExtractor::builder()
        .method("/grpc.health.v1.Health/Check", "health")
        .build()
        .unwrap();
    let rows = [
        row("anonymous", key_now(&plain, get(&[]))),
        row(
            "authorization",
            key_now(&plain, get(&[("authorization", "Bearer alice")])),
        ),
        row("cookie", key_now(&plain, get(&[("cookie", "sid=1")]))),
        row(
            "both",
            key_now(
                &plain,
                get(&[("authorization", "Bearer alice"), ("cookie", "sid=1")]),
            ),
        ),
        row("x-api-key", key_now(&plain, get(&[("x-api-key", "A")]))),
        row(
            "proxy-authorization",
            key_now(&plain, get(&[("proxy-authorization", "Basic dTpw")])),
        ),
        // The port is not part of the key (nginx's `$host`): the same
        // digest as `anonymous`, whether the port is in the URI or in Host.
        row(
            "port",
            key_now(
                &plain,
                get_at("http://api.example:8443/v1/items?b=2&a=1&ts=9", &[]),
            ),
        ),
        row(
            "host-header-port",
            key_now(
                &plain,
                get_at("/v1/items?b=2&a=1&ts=9", &[("host", "API.example:3201")]),
            ),
        ),
        row("salted-anonymous", key_now(&salted, get(&[]))),
        row(
            "salted-authorization",
            key_now(&salted, get(&[("authorization", "Bearer alice")])),
        ),
        row("grpc-anonymous", key_now(&grpc_keys, grpc_call(&[]))),
        row(
            "grpc-authorization",
            key_now(&grpc_keys, grpc_call(&[("authorization", "Bearer alice")])),
        ),
    ];
    rows.join("\n")
}

const GOLDEN: &str = "\
anonymous c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d -\n\
authorization c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d 6e0858832194144d0c662541df1101a7c3689fbeb3d586bac05b9fb45b02287b\n\
cookie c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d 531f7e36435ecba4db6e3251ec648548d95cfd30698d4b53cef39dc29f5936f3\n\
both c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d 89500c9a58050decf3c310976e4cb889dbed97f6d2174a43c41e95e8789a77f3\n\
x-api-key c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d 11b59d79fcc91006911e84bc009e8b671f02d230c1844aa8318aa87b57ece1df\n\
proxy-authorization c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d ef4aa1c11843334bd24d60f6aacf71b8ba2bb27e5806d7f969197b890b88fa77\n\
port c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d -\n\
host-header-port c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d -\n\
salted-anonymous c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d -\n\
salted-authorization c92990c18e0a78f2cb61c5a373b519fe983b0a2ccd38e8d71eacbda65deacc8d 7afce8fb1abdee95f0d554a2d8ef5a13bf3a2cfe31227dbd194e64b0dcd79f9e\n\
grpc-anonymous fb4b6f287e3f23698b6ac7d037f9f6d98b3cbac6c44e68c4637894af325b9d80 -\n\
grpc-authorization fb4b6f287e3f23698b6ac7d037f9f6d98b3cbac6c44e68c4637894af325b9d80 6e0858832194144d0c662541df1101a7c3689fbeb3d586bac05b9fb45b02287b";

#[test]
fn the_key_encoding_is_pinned() {
    let table = table();
    assert_eq!(
        table, GOLDEN,
        "the key encoding changed; if on purpose, paste the new table:\n{table}"
    );
}
