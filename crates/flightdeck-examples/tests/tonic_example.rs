//! examples/tonic.rs over real gRPC on loopback (tonic server and client):
//! a burst of identical `Summarize` calls runs the model once and every
//! caller gets the reply with its metadata and trailers (a shared reply
//! without its `grpc-status` trailer fails in the client); business errors
//! are shared too; the server-streaming method is never coalesced; our
//! errors arrive as real gRPC statuses.

#[allow(dead_code)]
#[path = "../examples/tonic.rs"]
mod tonic_example;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use flightdeck::Mode;
use flightdeck_harness::RedisServer;
use tonic::Code;
use tonic_example::{run, Options, SummarizeRequest, SummarizerClient};

/// Every test gets a bounded time: nothing here may hang CI.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the test finished within 60 s")
}

fn doc(text: &str) -> SummarizeRequest {
    SummarizeRequest {
        document: text.to_owned(),
        max_words: 3,
    }
}

/// `n` identical calls per address, released together.
async fn burst(
    addrs: &[std::net::SocketAddr],
    n: usize,
    text: &'static str,
) -> Vec<Result<tonic::Response<tonic_example::Summary>, tonic::Status>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n * addrs.len()));
    let mut tasks = Vec::new();
    for &addr in addrs {
        let client = SummarizerClient::connect(addr).await.unwrap();
        for _ in 0..n {
            let (mut client, barrier) = (client.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                client.summarize(doc(text)).await
            }));
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_burst_runs_once_and_every_caller_gets_reply_metadata_and_trailers() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(1000)))
            .await
            .unwrap();
        let replies = burst(&[node.addr], 30, "one two three four five").await;
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 1);
        let metrics = get_metrics(node.metrics_addr).await;
        assert!(
            metrics.contains("singleflight_local_waiter_total{stage=\"summarize\"}"),
            "{metrics}"
        );
        for r in replies {
            let r = r.expect("every caller got an OK status (from the shared trailers)");
            assert_eq!(r.metadata().get("x-model").unwrap(), "summarizer-v2");
            let s = r.into_inner();
            assert_eq!(s.text, "one two three");
            assert_eq!(s.execution, 1);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_two_nodes_share_one_execution_through_redis() {
    bounded(async {
        let redis = RedisServer::start().unwrap();
        let mut nodes = Vec::new();
        for _ in 0..2 {
            let mut opts = Options::local(Duration::from_millis(400));
            opts.redis_url = Some(redis.url());
            nodes.push(run(opts).await.unwrap());
        }
        let stage = nodes[0].flights.stage("summarize").unwrap();
        assert_eq!(stage.mode(), Mode::Hybrid);
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let replies = burst(&addrs, 15, "across the whole deployment").await;
        for r in replies {
            assert_eq!(r.unwrap().into_inner().text, "across the whole");
        }
        let calls: u64 = nodes
            .iter()
            .map(|n| n.model.summarize_calls.load(Ordering::SeqCst))
            .sum();
        assert_eq!(calls, 1, "one execution for 30 calls on 2 nodes");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_error_is_shared_with_its_status() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(1000)))
            .await
            .unwrap();
        let replies = burst(&[node.addr], 10, "   ").await;
        for r in replies {
            let status = r.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert_eq!(status.message(), "the document is empty");
        }
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_streaming_passes_through_untouched() {
    bounded(async {
        let node = run(Options::local(Duration::from_millis(10)))
            .await
            .unwrap();
        let client = SummarizerClient::connect(node.addr).await.unwrap();
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut stream = client
                    .stream_summary(doc("alpha beta gamma delta"))
                    .await
                    .unwrap()
                    .into_inner();
                let mut words = Vec::new();
                while let Some(chunk) = stream.message().await.unwrap() {
                    assert_eq!(chunk.index as usize, words.len());
                    words.push(chunk.text);
                }
                words
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), ["alpha", "beta", "gamma"]);
        }
        assert_eq!(
            node.model.stream_calls.load(Ordering::SeqCst),
            5,
            "streams are never coalesced"
        );
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_errors_arrive_as_grpc_statuses() {
    bounded(async {
        // DISTRIBUTED_ONLY with the breaker open: UNAVAILABLE, fast.
        let redis = RedisServer::start().unwrap();
        let mut opts = Options::local(Duration::from_millis(10));
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.unwrap();
        let stage = node.flights.stage("summarize").unwrap();
        stage.set_mode(Mode::DistributedOnly).unwrap();
        stage.breaker().force_open();
        let mut client = SummarizerClient::connect(node.addr).await.unwrap();
        let status = client.summarize(doc("a b c")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 0);

        // A model call over its execution budget: DEADLINE_EXCEEDED; a
        // second call while the only slot is taken: RESOURCE_EXHAUSTED.
        // Margins are wide so a loaded CI machine cannot blur the two.
        let mut opts = Options::local(Duration::from_millis(3000));
        opts.execution_timeout = Some(Duration::from_millis(1500));
        opts.bulkhead_limit = Some(1);
        let node = run(opts).await.unwrap();
        let client = SummarizerClient::connect(node.addr).await.unwrap();
        let slow = {
            let mut client = client.clone();
            tokio::spawn(async move { client.summarize(doc("slow work")).await })
        };
        for _ in 0..500 {
            if node.model.summarize_calls.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let status = client
            .clone()
            .summarize(doc("other work"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        let status = slow.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    })
    .await;
}

/// `GET /metrics` over HTTP/1 (hyper-util).
async fn get_metrics(addr: std::net::SocketAddr) -> String {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<axum::body::Body>();
    let resp = client
        .get(format!("http://{addr}/metrics").parse().unwrap())
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_config_file_decides_the_grpc_stage() {
    bounded(async {
        // The shipped file, no Redis: LOCAL_ONLY.
        let node = run(Options::local(Duration::from_millis(300)))
            .await
            .unwrap();
        let stage = node.flights.stage("summarize").unwrap();
        assert_eq!(stage.mode(), Mode::LocalOnly);

        // A file that bypasses the stage: every call runs.
        let mut opts = Options::local(Duration::from_millis(300));
        opts.config = "[single-flight.stages.summarize]\nmode = \"bypass\"\n".to_owned();
        let node = run(opts).await.unwrap();
        let replies = burst(&[node.addr], 3, "bypassed words here").await;
        assert!(replies.iter().all(Result::is_ok));
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 3);

        // DISTRIBUTED_ONLY with `in-progress` from the file, over Redis.
        let redis = RedisServer::start().unwrap();
        let mut opts = Options::local(Duration::from_millis(10));
        opts.config = "[single-flight.stages.summarize]\nmode = \"distributed-only\"\n\
                       backend = \"redis\"\non-wait-failure = \"in-progress\"\n"
            .to_owned();
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.unwrap();
        let stage = node.flights.stage("summarize").unwrap();
        assert_eq!(stage.mode(), Mode::DistributedOnly);
        assert_eq!(
            stage.config().on_wait_failure,
            flightdeck::OnWaitFailure::InProgress
        );
        // A message over the service's bound is refused by the server.
        let mut client = SummarizerClient::connect(node.addr).await.unwrap();
        let status = client
            .summarize(doc(&"w ".repeat(40 * 1024)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_and_serves_with_redis_down() {
    bounded(async {
        let mut redis = RedisServer::start().unwrap();
        redis.kill();
        let mut opts = Options::local(Duration::from_millis(10));
        opts.redis_url = Some(redis.url());
        let node = run(opts).await.expect("starts with Redis down");
        let stage = node.flights.stage("summarize").unwrap();
        assert_eq!(stage.mode(), Mode::Hybrid);
        assert!(stage.is_degraded(), "starts degraded");
        let replies = burst(&[node.addr], 1, "served without redis").await;
        for r in replies {
            assert_eq!(r.unwrap().into_inner().text, "served without redis");
        }
        assert_eq!(node.model.summarize_calls.load(Ordering::SeqCst), 1);
    })
    .await;
}
