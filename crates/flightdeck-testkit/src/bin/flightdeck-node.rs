//! `flightdeck-node`: one node of a multi-process test. An L1
//! (`LocalFlightLayer`) + L2 (`DistributedFlightLayer` over `RedisBackend`)
//! stack in front of a fake expensive call, served over a minimal HTTP/1.1
//! on a free loopback port (printed as the first stdout line,
//! `listening 127.0.0.1:PORT`). Driven by
//! `flightdeck_testkit::node::NodeProcess`.
//!
//! ```text
//! flightdeck-node --redis redis://127.0.0.1:6390 [--work-ms 200] [--lease-ms 1500]
//! GET /flight/{key}  -> 200 "{key}|{generation}|{pid}" or 503 "{error}"
//! GET /stats         -> 200 "executions N\nrunning N\nentries N\n"
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedPolicy, FencingToken, KeyFn, PostcardCodec,
};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use flightdeck_redis::{RedisBackend, RedisConfig};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

#[derive(Clone, Debug)]
struct Req {
    key: String,
    fence: Option<FencingToken>,
}

type Svc = BoxCloneService<Req, String, BoxError>;

fn key_of(req: &Req) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(
        StageName::new("node").expect("valid stage"),
        &req.key,
    ))
}

struct Args {
    redis: String,
    work: Duration,
    lease: Duration,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        redis: String::new(),
        work: Duration::from_millis(200),
        lease: Duration::from_millis(1500),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let ms = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--redis" => out.redis = value.clone(),
            "--work-ms" => out.work = ms()?,
            "--lease-ms" => out.lease = ms()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if out.redis.is_empty() {
        return Err("usage: flightdeck-node --redis URL [--work-ms N] [--lease-ms N]".into());
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args = args()?;
    let backend = RedisBackend::connect(
        RedisConfig::new(args.redis.clone()).command_timeout(Duration::from_millis(300)),
    )
    .await?;
    let executions = Arc::new(AtomicU64::new(0));
    let l2 = DistributedFlightLayer::new(
        backend,
        DistributedPolicy::new()
            .lease(args.lease)
            .heartbeat(args.lease / 4)
            .poll_interval(Duration::from_millis(100))
            .wait_timeout(args.lease * 4)
            .result_ttl(Duration::from_secs(60))
            .call_timeout(Duration::from_millis(300)),
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        KeyFn::new(key_of).with_fence(|req: &mut Req, token: FencingToken| req.fence = Some(token)),
    )?;
    let l1 =
        LocalFlightLayer::with_key(FlightPolicy::new(), key_of as fn(&Req) -> Option<FlightKey>);
    let work = {
        let executions = executions.clone();
        let pause = args.work;
        service_fn(move |req: Req| {
            let executions = executions.clone();
            async move {
                executions.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
                let generation = req.fence.map_or(0, |f| f.generation);
                Ok::<_, BoxError>(format!("{}|{generation}|{}", req.key, std::process::id()))
            }
        })
    };
    let svc: Svc = BoxCloneService::new(l1.clone().layer(l2.layer(work)));

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let (svc, l1, executions) = (svc.clone(), l1.clone(), executions.clone());
        tokio::spawn(async move {
            let stats = || {
                format!(
                    "executions {}\nrunning {}\nentries {}\n",
                    executions.load(Ordering::SeqCst),
                    l1.running_flights(),
                    l1.map_entries()
                )
            };
            let _ = serve(stream, svc, stats).await;
        });
    }
}

/// One request per connection (`Connection: close`).
async fn serve(stream: TcpStream, svc: Svc, stats: impl Fn() -> String) -> Result<(), Infallible> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).await.is_err() {
        return Ok(());
    }
    // Skip the headers.
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header).await {
            Ok(0) | Err(_) => break,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => {}
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if let Some(key) = path.strip_prefix("/flight/") {
        let req = Req {
            key: key.to_owned(),
            fence: None,
        };
        match svc.oneshot(req).await {
            Ok(v) => ("200 OK", v),
            Err(e) => ("503 Service Unavailable", e.to_string()),
        }
    } else if path == "/stats" {
        ("200 OK", stats())
    } else {
        ("404 Not Found", "not found".to_owned())
    };
    let mut stream = reader.into_inner();
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
    Ok(())
}
