//! The RedisServer harness against the real binary.

use std::time::{Duration, Instant};

use flightdeck_harness::{RedisServer, Resp};

fn process_alive(pid: u32) -> bool {
    // A reaped process has no /proc entry.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn start_cmd_pause_restart_flush_and_cleanup() {
    let mut redis = RedisServer::start().unwrap();
    assert_ne!(redis.port(), 6379, "never the system redis");
    assert_eq!(redis.cmd(&["PING"]).unwrap().as_str(), Some("PONG"));
    assert_eq!(
        redis.cmd_bytes(&[b"SET", b"k", b"\x00\xff"]).unwrap(),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        redis.cmd(&["GET", "k"]).unwrap(),
        Resp::Bulk(Some(vec![0, 0xff]))
    );
    // No persistence configured.
    match redis.cmd(&["CONFIG", "GET", "save"]).unwrap() {
        Resp::Array(Some(items)) => assert_eq!(items[1].as_str(), Some("")),
        other => panic!("{other:?}"),
    }

    // Scripts: load one, flush, it is gone.
    let sha = match redis.cmd(&["SCRIPT", "LOAD", "return 1"]).unwrap() {
        Resp::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    redis.flush_scripts().unwrap();
    match redis.cmd(&["SCRIPT", "EXISTS", &sha]).unwrap() {
        Resp::Array(Some(v)) => assert_eq!(v, vec![Resp::Int(0)]),
        other => panic!("{other:?}"),
    }
    assert!(redis.command_calls("script").unwrap() >= 2);

    // Paused: a command times out instead of answering.
    redis.pause().unwrap();
    let started = Instant::now();
    assert!(redis.cmd(&["PING"]).is_err());
    assert!(started.elapsed() >= Duration::from_secs(1));
    redis.resume().unwrap();
    assert_eq!(redis.cmd(&["PING"]).unwrap().as_str(), Some("PONG"));

    // Restart on the same port: empty.
    let port = redis.port();
    let old_pid = redis.pid().unwrap();
    redis.restart().unwrap();
    assert_eq!(redis.port(), port);
    assert!(!process_alive(old_pid));
    assert_eq!(redis.cmd(&["GET", "k"]).unwrap(), Resp::Bulk(None));

    // Killed: refused.
    redis.kill();
    assert!(redis.cmd(&["PING"]).is_err());
    redis.restart().unwrap();

    // Dropped: the process is gone, even while paused.
    let pid = redis.pid().unwrap();
    redis.pause().unwrap();
    drop(redis);
    assert!(!process_alive(pid));
}

#[test]
fn servers_get_distinct_free_ports() {
    let a = RedisServer::start().unwrap();
    let b = RedisServer::start().unwrap();
    assert_ne!(a.port(), b.port());
    assert_eq!(b.cmd(&["PING"]).unwrap().as_str(), Some("PONG"));
}

#[test]
fn a_three_node_cluster_starts_and_cleans_up() {
    let cluster = flightdeck_harness::RedisCluster::start(3).unwrap();
    assert_eq!(cluster.nodes().len(), 3);
    let url = cluster.url();
    assert!(url.starts_with("redis-cluster://127.0.0.1:"), "{url}");
    assert_eq!(url.matches("node=").count(), 2);
    // Keys with one hash tag share a slot and a node.
    let a = cluster.node_for("fd:{abc}:lease").unwrap().port();
    let b = cluster.node_for("fd:{abc}:result").unwrap().port();
    assert_eq!(a, b);
    let node = cluster.node_for("fd:{abc}:lease").unwrap();
    assert_eq!(
        node.cmd(&["SET", "fd:{abc}:lease", "x"]).unwrap(),
        Resp::Simple("OK".into())
    );
    // Every node keeps serving its slots while another is down.
    for node in cluster.nodes() {
        let Resp::Array(Some(pair)) = node
            .cmd(&["CONFIG", "GET", "cluster-require-full-coverage"])
            .unwrap()
        else {
            panic!("CONFIG GET did not answer an array");
        };
        assert_eq!(pair.get(1).and_then(Resp::as_str), Some("no"));
    }
    cluster.flush_scripts().unwrap();
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid().unwrap()).collect();
    drop(cluster);
    for pid in pids {
        assert!(!process_alive(pid));
    }
}
