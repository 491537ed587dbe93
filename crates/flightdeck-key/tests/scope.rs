//! Tenant scopes: which credential headers separate users, the configurable
//! list and keyed digests with a scope secret (how unkeyed scopes are
//! reported is `tests/unkeyed_warning.rs`).
#![cfg(feature = "grpc")]

mod common;

use bytes::Bytes;
use common::{grpc_call, key_now};
use flightdeck_core::FlightKey;
use flightdeck_key::grpc::GrpcKeyExtractor;
use flightdeck_key::http::{
    HttpKeyExtractor, HttpKeyExtractorBuilder, Scope, DEFAULT_CREDENTIAL_HEADERS,
};
use http::Request;
use http_body_util::Full;

fn builder() -> HttpKeyExtractorBuilder {
    HttpKeyExtractor::builder().default_stage("http")
}

fn get(headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get("/v1/items");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

fn key(ex: &HttpKeyExtractor, headers: &[(&str, &str)]) -> FlightKey {
    key_now(ex, get(headers)).expect("keyed")
}

#[test]
fn every_default_credential_header_separates_users() {
    let ex = builder()
        .scope_secret("a-deployment-secret")
        .build()
        .unwrap();
    let anon = key(&ex, &[]);
    assert_eq!(anon.scope(), None);
    let names: Vec<&str> = DEFAULT_CREDENTIAL_HEADERS
        .iter()
        .map(|h| h.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key"
        ]
    );
    for name in [
        "Authorization",
        "Proxy-Authorization",
        "Cookie",
        "X-Api-Key",
    ] {
        let a = key(&ex, &[(name, "A")]);
        let b = key(&ex, &[(name, "B")]);
        assert_ne!(a, b, "{name}: A and B must not share");
        assert_ne!(a, anon, "{name}: A and anonymous must not share");
        assert_eq!(a.digest(), b.digest(), "same request, other scope");
        assert_eq!(a, key(&ex, &[(name, "A")]));
    }
    // Which header a value came in matters too.
    assert_ne!(
        key(&ex, &[("x-api-key", "A")]),
        key(&ex, &[("authorization", "A")])
    );
}

#[test]
fn the_credential_list_is_configurable() {
    let ex = builder()
        .credential_header("X-Session-Token")
        .remove_credential_header("cookie")
        .scope_secret("a-deployment-secret")
        .build()
        .unwrap();
    assert_ne!(
        key(&ex, &[("x-session-token", "1")]),
        key(&ex, &[("x-session-token", "2")])
    );
    // Cookies no longer scope: the two share (and share with anonymous).
    assert_eq!(
        key(&ex, &[("cookie", "a=1")]),
        key(&ex, &[("cookie", "a=2")])
    );
    assert_eq!(key(&ex, &[("cookie", "a=1")]).scope(), None);
    // The rest of the default list still does.
    assert_ne!(
        key(&ex, &[("x-api-key", "A")]),
        key(&ex, &[("x-api-key", "B")])
    );

    let scope = Scope::credentials()
        .with_credential_header("x-tenant-key")
        .without_credential_header("Proxy-Authorization");
    let names: Vec<&str> = scope
        .credential_header_names()
        .unwrap()
        .iter()
        .map(|h| h.as_str())
        .collect();
    assert_eq!(
        names,
        ["authorization", "cookie", "x-api-key", "x-tenant-key"]
    );
    let only = Scope::credential_headers(["X-Key", "x-key"]);
    assert_eq!(only.credential_header_names().unwrap().len(), 1);
    let ex = builder()
        .scope(only)
        .scope_secret("a-deployment-secret")
        .build()
        .unwrap();
    assert_eq!(key(&ex, &[("authorization", "A")]).scope(), None);
    assert_ne!(key(&ex, &[("x-key", "1")]), key(&ex, &[("x-key", "2")]));
}

#[test]
fn credential_list_mistakes_are_config_errors() {
    let err = |b: HttpKeyExtractorBuilder| b.build().unwrap_err().to_string();
    let all_removed = DEFAULT_CREDENTIAL_HEADERS
        .iter()
        .fold(builder(), |b, h| b.remove_credential_header(h.as_str()));
    assert!(err(all_removed).contains("shared_across_users"));
    assert!(err(builder().credential_header("bad header")).contains("bad header"));
    // Credential headers with another scope rule: refused whatever the
    // order of the calls.
    let e = err(builder()
        .credential_header("x-key")
        .scope(Scope::header("x-tenant")));
    assert!(e.contains("Scope::credentials()"), "{e}");
    let e = err(builder()
        .scope(Scope::header("x-tenant"))
        .remove_credential_header("cookie"));
    assert!(e.contains("Scope::credentials()"), "{e}");
    assert!(err(builder().scope(Scope::credential_headers(["a b"]))).contains("a b"));
    assert!(err(builder().scope_secret("")).contains("scope secret"));
}

#[test]
fn a_scope_secret_shorter_than_the_minimum_is_refused_without_being_shown() {
    use flightdeck_key::http::MIN_SCOPE_SECRET_LEN;
    let short = "hunter2-secret";
    assert!(short.len() < MIN_SCOPE_SECRET_LEN);
    let e = builder()
        .scope_secret(short)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("scope secret") && e.contains("14 bytes"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let built = builder().build().unwrap();
    let e = built.with_scope_secret(short).unwrap_err().to_string();
    assert!(e.contains("14 bytes") && !e.contains("hunter2"), "{e}");
    // The minimum itself is enough.
    let least = "x".repeat(MIN_SCOPE_SECRET_LEN);
    builder().scope_secret(&least).build().unwrap();
    builder()
        .build()
        .unwrap()
        .with_scope_secret(&least)
        .unwrap();
}

#[test]
fn a_scope_secret_keys_the_digest() {
    let auth = [("authorization", "Basic dTpw")];
    let plain = builder().build().unwrap();
    let one = builder()
        .scope_secret("deployment-secret-one")
        .build()
        .unwrap();
    let same = builder()
        .scope_secret(b"deployment-secret-one")
        .build()
        .unwrap();
    let two = builder()
        .scope_secret("deployment-secret-two")
        .build()
        .unwrap();
    let unkeyed = *key(&plain, &auth).scope().unwrap();
    let keyed = *key(&one, &auth).scope().unwrap();
    assert_eq!(
        Some(&keyed),
        key(&same, &auth).scope(),
        "same secret, same scope"
    );
    assert_ne!(Some(&keyed), key(&two, &auth).scope());
    assert_ne!(keyed, unkeyed);
    // BLAKE3 keyed mode, under a key derived from the secret, of the
    // unkeyed scope digest: without the secret a guess cannot be checked.
    let k = blake3::derive_key(
        "flightdeck-key 2 tenant scope digest key",
        b"deployment-secret-one",
    );
    assert_eq!(
        keyed.as_bytes(),
        blake3::keyed_hash(&k, unkeyed.as_bytes()).as_bytes()
    );
    // Requests without credentials have no scope, secret or not.
    assert_eq!(key(&one, &[]).scope(), None);
    // The secret never shows in Debug output.
    let shown = format!("{:?}", builder().scope_secret("hunter2-deployment-secret"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn grpc_authorization_metadata_scopes_the_key_by_default() {
    let ex = GrpcKeyExtractor::builder()
        .method("/grpc.health.v1.Health/Check", "health")
        .scope_secret("a-deployment-secret")
        .build()
        .unwrap();
    let k = |h: &[(&str, &str)]| key_now(&ex, grpc_call(h)).expect("keyed");
    let alice = k(&[("authorization", "Bearer alice")]);
    let bob = k(&[("authorization", "Bearer bob")]);
    let anon = k(&[]);
    assert!(alice.scope().is_some());
    assert_ne!(alice, bob);
    assert_ne!(alice, anon);
    assert_eq!(alice.digest(), bob.digest(), "same call, other scope");
    assert_ne!(k(&[("x-api-key", "A")]), k(&[("x-api-key", "B")]));
    // The same credentials scope HTTP and gRPC alike.
    let http = builder()
        .scope_secret("a-deployment-secret")
        .build()
        .unwrap();
    assert_eq!(
        alice.scope(),
        key(&http, &[("authorization", "Bearer alice")]).scope()
    );
}

#[test]
fn a_secret_given_to_built_rules_keys_as_the_builders_does() {
    let auth = [("authorization", "Basic dTpw")];
    let built = builder().build().unwrap();
    let later = built
        .clone()
        .with_scope_secret("deployment-secret-one")
        .unwrap();
    let at_build = builder()
        .scope_secret("deployment-secret-one")
        .build()
        .unwrap();
    assert_eq!(key(&later, &auth).scope(), key(&at_build, &auth).scope());
    assert_ne!(key(&later, &auth).scope(), key(&built, &auth).scope());
    // The authority, likewise.
    let host = |ex: &HttpKeyExtractor, h: &str| {
        let r = Request::get("/v1/items")
            .header("host", h)
            .body(Full::new(Bytes::new()))
            .unwrap();
        key_now(ex, r).unwrap()
    };
    let any_host = built.clone().without_authority();
    assert_eq!(host(&any_host, "a.internal"), host(&any_host, "b.internal"));
    assert_ne!(host(&built, "a.internal"), host(&built, "b.internal"));
    let at_build = builder().ignore_authority().build().unwrap();
    assert_eq!(host(&any_host, "a.internal"), host(&at_build, "b.internal"));
}
