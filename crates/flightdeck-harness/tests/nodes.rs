//! The multi-process harness: `flightdeck-node` processes (L1 +
//! L2 over one real Redis, each its own OS process) driven over HTTP.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::FlightId;
use flightdeck_harness::node::NodeProcess;
use flightdeck_harness::RedisServer;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flightdeck-node"))
}

/// Three processes, 30 concurrent requests for one key: one execution in
/// the whole deployment, the same answer everywhere, in-flight maps empty
/// afterwards. Then the owning process is killed (SIGKILL) while it runs a
/// flight: another process takes over after the lease (with a larger
/// generation) and answers.
#[test]
fn processes_share_one_execution_and_survive_a_killed_owner() {
    let redis = RedisServer::start().unwrap();
    let nodes: Vec<Arc<NodeProcess>> = (0..3)
        .map(|_| {
            Arc::new(NodeProcess::start(binary(), &redis.url(), &["--work-ms", "300"]).unwrap())
        })
        .collect();
    let mut threads = Vec::new();
    for i in 0..30 {
        let node = nodes[i % 3].clone();
        threads.push(std::thread::spawn(move || {
            node.get("/flight/shared").unwrap()
        }));
    }
    let answers: Vec<(u16, String)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let first = &answers[0].1;
    assert!(generation_of(first) >= 1, "{first}");
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body, first, "every process got the same result");
    }
    let executions: u64 = nodes.iter().map(|n| n.stats().unwrap().executions).sum();
    assert_eq!(executions, 1, "one execution across three processes");
    for n in &nodes {
        let stats = n.stats().unwrap();
        assert_eq!((stats.running, stats.entries), (0, 0), "{stats:?}");
    }
    drop(nodes);

    // A slow owner that dies mid-flight.
    let mut owner = NodeProcess::start(
        binary(),
        &redis.url(),
        &["--work-ms", "5000", "--lease-ms", "800"],
    )
    .unwrap();
    let other = NodeProcess::start(
        binary(),
        &redis.url(),
        &["--work-ms", "100", "--lease-ms", "800"],
    )
    .unwrap();
    let addr = owner.addr();
    let doomed = std::thread::spawn(move || {
        // Never answered: the process dies first.
        let _ = std::net::TcpStream::connect(addr).map(|mut s| {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.write_all(b"GET /flight/dies HTTP/1.1\r\n\r\n");
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
    });
    // Until the owner runs the flight.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while owner.stats().unwrap().executions == 0 {
        assert!(std::time::Instant::now() < deadline, "owner never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The dead owner's generation, from its flight's record.
    let flight = FlightId::of(&FlightKey::from_bytes(
        StageName::new("node").unwrap(),
        "dies",
    ));
    let record = format!("fd:{{{}}}:{}", flight.to_hex(), flightdeck_redis::LAYOUT);
    let dead: u64 = redis
        .cmd(&["HGET", &record, "g"])
        .unwrap()
        .as_str()
        .and_then(|g| g.parse().ok())
        .expect("the running flight's generation");
    owner.kill();
    let (status, body) = other.get("/flight/dies").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("dies|") && generation_of(&body) > dead,
        "took over with a generation larger than {dead}: {body}"
    );
    assert_eq!(other.stats().unwrap().executions, 1);
    doomed.join().unwrap();
}

/// The generation in a `{key}|{generation}|{pid}` answer.
fn generation_of(body: &str) -> u64 {
    body.split('|')
        .nth(1)
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("no generation in {body:?}"))
}
