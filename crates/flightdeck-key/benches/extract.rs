//! Key extraction for a typical GET and a 4 KiB JSON POST, against the bare
//! BLAKE3 hash of the same bytes (the request as it would be on the wire),
//! in one criterion group so the figures are comparable as ratios. A second
//! group (`key_encoder`) shows where the GET time goes: the per-field cost of
//! the core `KeyEncoder` (two `blake3::Hasher::update` calls per field).
//!
//! Run: `cargo bench -p flightdeck-key --all-features --bench extract`

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{criterion_main, BatchSize, Criterion, Throughput};
use flightdeck_key::http::{HttpKeyExtractor, Route};
use flightdeck_key::{Decision, Extraction, KeyExtractor};
use http::{Method, Request};
use http_body_util::Full;

const GET_HEADERS: [(&str, &str); 6] = [
    ("host", "api.example.com"),
    ("accept", "application/json"),
    ("accept-encoding", "gzip, br"),
    ("accept-language", "en-US,en;q=0.9"),
    ("user-agent", "bench/1.0"),
    (
        "authorization",
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTQyIn0.sig",
    ),
];
const GET_URI: &str = "/v1/score/42?lang=en&model=v2&_=1700000000000&page=3";
const POST_URI: &str = "/v1/report";

fn json_4k() -> Bytes {
    let mut s = String::from("{\"items\":[");
    let mut i = 0;
    while s.len() < 4096 - 40 {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!("{{\"id\":{i},\"name\":\"item-{i}\",\"ok\":true}}"));
        i += 1;
    }
    s.push_str("]}");
    while s.len() < 4096 {
        s.insert(s.len() - 1, ' ');
    }
    Bytes::from(s)
}

fn request(method: Method, uri: &str, body: Bytes) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in GET_HEADERS {
        b = b.header(k, v);
    }
    if !body.is_empty() {
        b = b.header("content-type", "application/json");
        b = b.header("content-length", body.len().to_string());
    }
    b.body(Full::new(body)).expect("valid request")
}

/// The request as HTTP/1.1 wire bytes: what a bare hash would see.
fn wire(method: &str, uri: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {uri} HTTP/1.1\r\n").into_bytes();
    for (k, v) in GET_HEADERS {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if !body.is_empty() {
        out.extend_from_slice(b"content-type: application/json\r\n");
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

fn run<E: KeyExtractor<R>, R>(ex: &E, req: R) -> Decision {
    match ex.extract(req) {
        Extraction::Ready(r) => r.expect("extraction").decision,
        Extraction::Pending(f) => {
            let mut f = pin!(f);
            let mut cx = Context::from_waker(Waker::noop());
            loop {
                if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                    return r.expect("extraction").decision;
                }
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let ex = HttpKeyExtractor::builder()
        .route(Route::new(Method::GET, "/v1/score/{id}", "score"))
        .route(Route::new(Method::POST, POST_URI, "report").hash_body(64 * 1024))
        .ignore_query_params(["_", "ts", "nonce"])
        .build()
        .expect("valid config");
    let body = json_4k();
    assert_eq!(body.len(), 4096);
    assert!(matches!(
        run(&ex, request(Method::GET, GET_URI, Bytes::new())),
        Decision::Key(_)
    ));
    assert!(matches!(
        run(&ex, request(Method::POST, POST_URI, body.clone())),
        Decision::Key(_)
    ));
    let get_wire = wire("GET", GET_URI, b"");
    let post_wire = wire("POST", POST_URI, &body);

    let mut g = c.benchmark_group("key_extraction");
    g.throughput(Throughput::Elements(1));
    g.bench_function("get/extract", |b| {
        b.iter_batched(
            || request(Method::GET, GET_URI, Bytes::new()),
            |req| black_box(run(&ex, req)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("get/bare_hash", |b| {
        b.iter(|| black_box(blake3::hash(black_box(&get_wire))))
    });
    g.bench_function("post_4k_json/extract", |b| {
        b.iter_batched(
            || request(Method::POST, POST_URI, body.clone()),
            |req| black_box(run(&ex, req)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("post_4k_json/bare_hash", |b| {
        b.iter(|| black_box(blake3::hash(black_box(&post_wire))))
    });
    g.finish();

    // Where the GET time goes: the same number of small fields as a typical
    // GET key, through the core encoder, against one hash of their bytes.
    let fields: Vec<Vec<u8>> = (0..28u8).map(|i| vec![i; 12]).collect();
    let concat = fields.concat();
    let mut g = c.benchmark_group("key_encoder");
    g.bench_function("28_fields", |b| {
        b.iter(|| {
            let mut enc = flightdeck_core::KeyEncoder::new();
            for f in &fields {
                enc.push(black_box(f));
            }
            black_box(enc.finish())
        })
    });
    g.bench_function("bare_hash_same_bytes", |b| {
        b.iter(|| black_box(blake3::hash(black_box(&concat))))
    });
    g.finish();
}

// criterion_group! generates an undocumented `pub fn`.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
use group::benches;
criterion_main!(benches);
