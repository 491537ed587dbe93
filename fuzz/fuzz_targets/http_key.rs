//! HTTP key extraction over any method, path, query, headers and body:
//! a key, a bypass or a typed error; never a panic, and the same request
//! always gets the same decision.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use arbitrary::Arbitrary;
use bytes::Bytes;
use flightdeck_key::http::{HttpKeyExtractor, Route, Scope};
use flightdeck_key::{Decision, Extraction, KeyExtractor};
use http::{Method, Request};
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    method: Vec<u8>,
    uri: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    scoped: bool,
}

fn extractor(scoped: bool) -> HttpKeyExtractor {
    let b = HttpKeyExtractor::builder()
        .default_stage("http")
        .route(Route::new(Method::POST, "/submit/{*rest}", "submit").hash_body(4096))
        .route(Route::new(Method::PUT, "/items/{id}", "items").coalesce_without_body())
        .route(Route::new(Method::GET, "/reports/{year}/{name}", "reports"))
        .ignore_query_params(["_", "ts"])
        .header("x-model")
        .hash_bodies(1024);
    let b = if scoped { b.scope(Scope::header("x-tenant")) } else { b };
    b.build().expect("a valid configuration")
}

fn request(input: &Input) -> Option<Request<Full<Bytes>>> {
    let method = Method::from_bytes(&input.method).ok()?;
    let mut req = Request::builder().method(method).uri(input.uri.as_str());
    for (name, value) in &input.headers {
        req = req.header(name.as_slice(), value.as_slice());
    }
    req.body(Full::new(Bytes::copy_from_slice(&input.body))).ok()
}

/// The decision, as comparable text (`None`: an error).
fn decide(ex: &HttpKeyExtractor, req: Request<Full<Bytes>>) -> Option<String> {
    let res = match ex.extract(req) {
        Extraction::Ready(r) => r,
        Extraction::Pending(f) => {
            let mut f = pin!(f);
            let mut cx = Context::from_waker(Waker::noop());
            loop {
                if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                    break r;
                }
            }
        }
    };
    res.ok().map(|e| match e.decision {
        Decision::Key(k) => format!("key {k:?}"),
        Decision::Bypass(why) => format!("bypass {why:?}"),
    })
}

fuzz_target!(|input: Input| {
    let Some(first) = request(&input) else { return };
    let second = request(&input).expect("built once, builds again");
    let a = decide(&extractor(input.scoped), first);
    let b = decide(&extractor(input.scoped), second);
    assert_eq!(a, b, "one request, two decisions");
});
