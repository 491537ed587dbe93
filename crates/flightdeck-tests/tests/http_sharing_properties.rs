//! Over random response heads, through the whole facade (HYBRID over the
//! in-memory backend): a response HTTP's rules make unshareable is never
//! delivered to a second caller, never written to the backend and never
//! replayed; a shareable one runs once for concurrent callers and is
//! stored.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::fast;
use flightdeck::core::{FlightKey, StageName};
use flightdeck::{GenericSingleFlightLayer, Mode};
use flightdeck_test::MemoryBackend;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tower::{service_fn, Layer, ServiceExt};

/// A response head, as a model.
#[derive(Debug, Clone)]
struct Head {
    cookie: bool,
    cache_control: Vec<&'static str>,
    vary: Option<&'static str>,
}

impl Head {
    /// HTTP's rules for shared caches, stated independently of the code.
    fn shareable(&self) -> bool {
        !self.cookie
            && !self
                .cache_control
                .iter()
                .any(|d| matches!(*d, "private" | "no-store" | "no-cache"))
            && self.vary != Some("*")
    }
}

fn head() -> impl Strategy<Value = Head> {
    (
        any::<bool>(),
        prop::collection::vec(
            prop::sample::select(vec![
                "private",
                "no-store",
                "no-cache",
                "public",
                "max-age=60",
            ]),
            0..3,
        ),
        prop::option::of(prop::sample::select(vec![
            "*",
            "x-flavor",
            "accept-language",
        ])),
    )
        .prop_map(|(cookie, cache_control, vary)| Head {
            cookie,
            cache_control,
            vary,
        })
}

fn request(n: u64) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .uri("/page")
        .header("x-flavor", "vanilla")
        .body(Full::new(Bytes::new()))
        .unwrap();
    req.extensions_mut().insert(FlightKey::from_bytes(
        StageName::new("props").unwrap(),
        n.to_le_bytes(),
    ));
    req
}

/// Two concurrent callers, then a third once the first two are done.
/// Returns (executions, commits, bodies the three got).
async fn three_callers(head: Head, key: u64) -> (usize, u64, Vec<Bytes>) {
    let backend = MemoryBackend::new();
    let layer = GenericSingleFlightLayer::http()
        .backend("redis", backend.clone())
        .stage("props", fast(Mode::Hybrid))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(service_fn({
        let runs = runs.clone();
        move |_req: Request<Full<Bytes>>| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            let head = head.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let body = Bytes::from(format!("run {n}"));
                let mut b = Response::builder().header("content-length", body.len());
                if head.cookie {
                    b = b.header("set-cookie", format!("sid={n}"));
                }
                if !head.cache_control.is_empty() {
                    b = b.header("cache-control", head.cache_control.join(", "));
                }
                if let Some(v) = head.vary {
                    b = b.header("vary", v);
                }
                Ok::<_, std::convert::Infallible>(b.body(Full::new(body)).unwrap())
            }
        }
    }));
    type Reply = Response<flightdeck::core::http::FlightBody<Full<Bytes>>>;
    let body = |r: Result<Reply, flightdeck::core::BoxError>| async {
        r.unwrap().into_body().collect().await.unwrap().to_bytes()
    };
    let (a, b) = tokio::join!(svc.clone().oneshot(request(key)), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        svc.clone().oneshot(request(key)).await
    });
    let (a, b) = (body(a).await, body(b).await);
    layer.idle().await;
    let c = body(svc.oneshot(request(key)).await).await;
    (
        runs.load(Ordering::SeqCst),
        backend.calls().commit,
        vec![a, b, c],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_unshareable_response_reaches_its_caller_alone(head in head(), key in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let shareable = head.shareable();
        let (runs, commits, bodies) = rt.block_on(three_callers(head.clone(), key));
        if shareable {
            prop_assert_eq!(runs, 1, "{:?}: shared and replayed", head);
            prop_assert_eq!(commits, 1, "{:?}: stored", head);
            prop_assert!(bodies.iter().all(|b| b == &bodies[0]), "{:?}", bodies);
        } else {
            prop_assert_eq!(runs, 3, "{:?}: every caller ran its own", head);
            prop_assert_eq!(commits, 0, "{:?}: nothing written to the backend", head);
            prop_assert!(bodies[0] != bodies[1] && bodies[1] != bodies[2], "{:?}", bodies);
        }
    }
}
