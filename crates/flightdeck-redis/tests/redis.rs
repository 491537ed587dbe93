//! The Redis backend and the L2 layer against real `redis-server` processes
//! started by the harness (each test its own server on a free port).
//!
//! Each test names the invariant it checks.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{find, BoxError, ErrorClass, ProtocolError};
use flightdeck_core::{metric, CloneShare, FlightKey, StageName};
use flightdeck_distributed::backend::{Acquired, Ask, Backend, CommitArgs, Committed, LeaseTerms};
use flightdeck_distributed::{
    BackendErrorKind, DistributedFlightLayer, DistributedPolicy, Envelope, FlightId, OwnerToken,
    PostcardCodec,
};
use flightdeck_harness::{RedisServer, Resp};
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::recorded::{counter, counter_where};
use flightdeck_test::{conformance, Hooked};
use fred::interfaces::ClientLike;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

const LEASE: Duration = Duration::from_millis(600);

fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(LEASE)
        .heartbeat(Duration::from_millis(150))
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(Duration::from_secs(5))
        .replay_ttl(Duration::from_secs(10))
        .call_timeout(Duration::from_millis(300))
        .commit_attempts(2)
}

async fn backend(redis: &RedisServer) -> RedisBackend {
    backend_at(redis.url()).await
}

async fn backend_at(url: String) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(url)
            .command_timeout(Duration::from_millis(300))
            .reconnect_max_delay(Duration::from_millis(200)),
    )
    .await
    .expect("connects to the test redis")
}

/// Keys: the stage plus the request text.
#[derive(Clone)]
struct Keys(StageName);

impl flightdeck_core::KeySource<String> for Keys {
    fn key(&self, req: &String) -> Option<FlightKey> {
        Some(FlightKey::from_bytes(self.0.clone(), req))
    }
}

fn stage(name: &str) -> StageName {
    StageName::new(name).unwrap()
}

type Layer2 = DistributedFlightLayer<RedisBackend, CloneShare<String>, PostcardCodec<String>, Keys>;

fn layer(b: RedisBackend, stage_name: &str, policy: DistributedPolicy) -> Layer2 {
    // Metrics recorded before the recorder is installed would be lost.
    flightdeck_test::recorded::install();
    DistributedFlightLayer::new(
        b,
        policy,
        CloneShare::new(),
        PostcardCodec::new(),
        Keys(stage(stage_name)),
    )
    .unwrap()
}

type Svc = BoxCloneService<String, String, BoxError>;

/// A service that counts its executions and answers `"{tag}:{req}"` after
/// `delay`.
fn work(calls: Arc<AtomicUsize>, tag: &'static str, delay: Duration) -> Svc {
    BoxCloneService::new(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(format!("{tag}:{req}"))
        }
    }))
}

fn flight_of(stage_name: &str, req: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(stage(stage_name), req))
}

#[tokio::test]
async fn redis_backend_conforms() {
    let redis = RedisServer::start().unwrap();
    conformance::run_all(Arc::new(backend(&redis).await)).await;
}

/// Invariant 13 (keys): one hash tag per flight, every key in one slot, no
/// raw input in key names.
#[tokio::test]
async fn keys_share_a_slot_and_hide_the_input() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let flight = flight_of("keys", "secret-user-input");
    let tok = OwnerToken::random();
    let terms = conformance::terms(true);
    b.acquire(&flight, &tok, &terms).await.unwrap();
    let record = b.record_key(&flight);
    let names = [record.clone(), format!("{record}:i"), b.inbox(&flight)];
    let slot = fred::util::redis_keyslot(record.as_bytes());
    for n in &names[..2] {
        assert_eq!(fred::util::redis_keyslot(n.as_bytes()), slot, "{n}");
        assert!(n.contains(&format!("{{{}}}", flight.to_hex())), "{n}");
        assert!(!n.contains("secret"));
    }
    assert!(!names[2].contains("secret"));
    let Resp::Array(Some(stored)) = redis.cmd(&["KEYS", "*"]).unwrap() else {
        panic!("KEYS answers an array");
    };
    assert_eq!(stored.len(), 1, "one key per flight: its record");
    for k in stored {
        let k = k.as_str().unwrap().to_owned();
        assert!(names.contains(&k), "{k}");
    }
}

/// Issue 5: 3 nodes (3 clients and stacks, L1 in front of L2) x 100
/// concurrent identical requests -> 1 execution, 300 identical results,
/// and only the L1 leaders talk to Redis. Invariant 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_one_execution() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let l2 = layer(backend(&redis).await, "three", policy());
        let l1 = flightdeck_local::LocalFlightLayer::with_key(
            flightdeck_local::FlightPolicy::new(),
            |q: &String| Some(FlightKey::from_bytes(StageName::new("three").unwrap(), q)),
        );
        let stack = l1.layer(l2.layer(work(calls.clone(), "v", Duration::from_millis(300))));
        nodes.push(Svc::new(stack));
    }
    redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(300));
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..100 {
            let svc = node.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot("same".to_owned()).await
            }));
        }
    }
    for t in tasks {
        let v = t.await.unwrap().map_err(|e| e.to_string()).unwrap();
        assert_eq!(v, "v:same");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one execution across 3 nodes"
    );
    let scripts = redis.command_calls("evalsha").unwrap();
    let subscribes = redis.command_calls("subscribe").unwrap();
    eprintln!("3 nodes x 100 requests: {scripts} EVALSHA, {subscribes} SUBSCRIBE");
    // 300 requests without L1 would need at least 300 acquires.
    assert!(
        scripts <= 30,
        "only L1 leaders reach Redis: {scripts} scripts"
    );
}

/// Issue 5: a replay within the replay TTL is 1 script call and no
/// execution. Also the command counts per role (printed).
#[tokio::test]
async fn replay_is_one_script_call_and_command_counts() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    // Long poll and heartbeat, so the counts show the protocol itself.
    let quiet = DistributedPolicy::new()
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1))
        .call_timeout(Duration::from_millis(300))
        .replay_ttl(Duration::from_secs(60));
    let a = layer(backend(&redis).await, "counts", quiet.clone());
    let a_flights = a.flights().clone();
    let a = a.layer(work(calls.clone(), "v", Duration::from_millis(300)));
    let b = layer(backend(&redis).await, "counts", quiet).layer(work(
        calls.clone(),
        "v",
        Duration::from_millis(300),
    ));

    // Owner: ACQUIRE + COMMIT.
    redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(a.clone().oneshot("x".into()).await.unwrap(), "v:x");
    // The commit goes on after the owner's callers got the value.
    a_flights.idle().await;
    let owner = redis.command_calls("evalsha").unwrap();

    // Hit: one ACQUIRE that returns the payload.
    redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(b.clone().oneshot("x".into()).await.unwrap(), "v:x");
    let hit = redis.command_calls("evalsha").unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Follower: one ACQUIRE (its node's inbox is in force) + the inline
    // notice.
    let owner_call = tokio::spawn(a.clone().oneshot("y".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(b.clone().oneshot("y".into()).await.unwrap(), "v:y");
    owner_call.await.unwrap().unwrap();
    a_flights.idle().await;
    let window_scripts = redis.command_calls("evalsha").unwrap();
    let window_subscribe = redis.command_calls("subscribe").unwrap();
    let window_get = redis.command_calls("get").unwrap() + redis.command_calls("hget").unwrap();
    eprintln!(
        "commands per flight: owner {owner} EVALSHA; hit {hit} EVALSHA; \
         follower window (follower + owner's commit) {window_scripts} EVALSHA, \
         {window_subscribe} SUBSCRIBE, {window_get} GET"
    );
    assert_eq!(owner, 2);
    assert_eq!(hit, 1);
    assert_eq!(window_scripts, 2, "follower: acquire; owner: commit");
    assert_eq!(window_subscribe, 0);
    assert_eq!(window_get, 0, "small payloads travel inline");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Issue 5 / invariant 2: the owner is stalled past its lease (its whole
/// runtime frozen, like a GC pause), a follower takes over and commits;
/// when the stale owner resumes, its commit is FENCED, it serves its value
/// locally, and the new result stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_fenced() {
    let redis = RedisServer::start().unwrap();
    let url = redis.url();
    let (acquired_tx, acquired_rx) = std::sync::mpsc::channel::<()>();
    let stale = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let b = RedisBackend::connect(
                RedisConfig::new(url).command_timeout(Duration::from_millis(300)),
            )
            .await
            .unwrap();
            let l2 = layer(b, "stale", policy());
            let flights = l2.flights().clone();
            let svc = l2.layer(service_fn(move |req: String| {
                let tx = acquired_tx.clone();
                async move {
                    let _ = tx.send(());
                    // Freezes this runtime: no heartbeat can run.
                    std::thread::sleep(LEASE * 3);
                    Ok::<_, Infallible>(format!("stale:{req}"))
                }
            }));
            let answer = svc.oneshot("k".to_owned()).await.map_err(|e| e.to_string());
            // The commit runs on this runtime, after the answer.
            flights.idle().await;
            answer
        })
    });
    acquired_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let fresh = layer(backend(&redis).await, "stale", policy()).layer(work(
        calls.clone(),
        "fresh",
        Duration::from_millis(50),
    ));
    assert_eq!(fresh.clone().oneshot("k".into()).await.unwrap(), "fresh:k");
    assert_eq!(counter(metric::TAKEOVER_TOTAL, "stale"), 1);
    let stale_answer = tokio::task::spawn_blocking(move || stale.join().unwrap())
        .await
        .unwrap();
    assert_eq!(stale_answer.unwrap(), "stale:k", "served locally");
    assert_eq!(counter(metric::FENCED_TOTAL, "stale"), 1);
    assert_eq!(
        fresh.oneshot("k".into()).await.unwrap(),
        "fresh:k",
        "the new result stands"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Issue 5 / invariant 4: a dead owner (acquired, then gone without
/// ABANDON) -> exactly one of 50 waiting followers on 2 nodes takes over
/// after lease expiry; the others get its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_owner_one_takeover_among_50() {
    let redis = RedisServer::start().unwrap();
    let raw = backend(&redis).await;
    let dead = OwnerToken::random();
    let terms = LeaseTerms {
        lease: LEASE,
        state_ttl: Duration::from_secs(30),
        allow_takeover: true,
    };
    let flight = flight_of("dead", "k");
    assert!(matches!(
        raw.acquire(&flight, &dead, &terms).await.unwrap(),
        Acquired::Owner {
            takeover: false,
            ..
        }
    ));
    let calls = Arc::new(AtomicUsize::new(0));
    let nodes = [
        layer(backend(&redis).await, "dead", policy()).layer(work(
            calls.clone(),
            "v",
            Duration::from_millis(100),
        )),
        layer(backend(&redis).await, "dead", policy()).layer(work(
            calls.clone(),
            "v",
            Duration::from_millis(100),
        )),
    ];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let svc = nodes[i % 2].clone();
        tasks.push(tokio::spawn(svc.oneshot("k".to_owned())));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "v:k");
    }
    assert!(
        started.elapsed() >= LEASE / 2,
        "nobody ran before the lease expired"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one takeover");
    assert_eq!(counter(metric::TAKEOVER_TOTAL, "dead"), 1);
}

/// Issue 5 / invariant 5-6: pub/sub broken (the subscriber connection is
/// cut while followers wait) -> followers still finish, by polling, without
/// running the work themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_finish_by_polling_when_pubsub_is_cut() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let owner = layer(backend(&redis).await, "cut", policy()).layer(work(
        calls.clone(),
        "v",
        Duration::from_millis(500),
    ));
    let follower_node = layer(backend(&redis).await, "cut", policy()).layer(work(
        calls.clone(),
        "v",
        Duration::from_millis(500),
    ));
    let owner_call = tokio::spawn(owner.oneshot("k".to_owned()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut followers = Vec::new();
    for _ in 0..20 {
        followers.push(tokio::spawn(follower_node.clone().oneshot("k".to_owned())));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let killed = redis.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    assert!(matches!(killed, Resp::Int(n) if n >= 1), "{killed:?}");
    assert_eq!(owner_call.await.unwrap().unwrap(), "v:k");
    let done = Instant::now();
    for f in followers {
        assert_eq!(f.await.unwrap().unwrap(), "v:k");
    }
    // Poll bound (100 ms) + a round trip, with generous slack for 2 shared
    // cores: the point is that nobody waited for the 5 s wait timeout.
    assert!(
        done.elapsed() < Duration::from_secs(2),
        "{:?}",
        done.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Issue 5 / invariant 5: publish-before-subscribe. The owner commits (and
/// publishes, to nobody) after the follower's ACQUIRE and before its
/// SUBSCRIBE; the re-check after subscribing finds the result, so the
/// follower does not wait for a poll (set to 5 s here).
#[tokio::test]
async fn publish_before_subscribe_is_not_a_lost_wakeup() {
    let redis = RedisServer::start().unwrap();
    let raw = backend(&redis).await;
    let flight = flight_of("race", "k");
    let tok = OwnerToken::random();
    let slow_poll = DistributedPolicy::new()
        .lease(Duration::from_secs(15))
        .heartbeat(Duration::from_secs(5))
        .poll_interval(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(20))
        .call_timeout(Duration::from_millis(300));
    let terms = LeaseTerms {
        lease: slow_poll.lease_duration(),
        state_ttl: slow_poll.state_ttl(),
        allow_takeover: true,
    };
    let Acquired::Owner { generation, .. } = raw.acquire(&flight, &tok, &terms).await.unwrap()
    else {
        panic!("a fresh flight is owned");
    };
    let owner = Arc::new(Mutex::new(Some(tok)));
    let committer = raw.clone();
    let hooked = Hooked::new(backend(&redis).await).before_subscribe(move |flight| {
        let (owner, committer) = (owner.clone(), committer.clone());
        async move {
            let Some(tok) = owner.lock().unwrap().take() else {
                return;
            };
            let payload = Envelope::new(1 << 20, 1 << 20)
                .seal(&PostcardCodec::<String>::new(), &"early".to_owned())
                .unwrap();
            let args = CommitArgs {
                payload,
                ttl: Duration::from_secs(10),
                retain: Duration::from_secs(10),
                inline_below: 1 << 20,
                state_ttl: Duration::from_secs(60),
                stale_for: Duration::ZERO,
                work_time: Duration::ZERO,
                sent: None,
            };
            let done = committer
                .commit(&flight, &tok, generation, &args)
                .await
                .unwrap();
            assert_eq!(done, Committed::Committed);
        }
    });
    flightdeck_test::recorded::install();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DistributedFlightLayer::new(
        hooked,
        slow_poll,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        Keys(stage("race")),
    )
    .unwrap();
    let svc = layer.layer(work(calls.clone(), "v", Duration::ZERO));
    let started = Instant::now();
    assert_eq!(svc.oneshot("k".into()).await.unwrap(), "early");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Issue 5 / invariant 13: SCRIPT FLUSH mid-run and a Redis restart are
/// transparent (EVALSHA reloads on NOSCRIPT; fred reconnects).
#[tokio::test]
async fn script_flush_and_restart_are_transparent() {
    let mut redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let probe = b.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(b, "flush", policy()).layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(svc.clone().oneshot("a".into()).await.unwrap(), "v:a");
    redis.flush_scripts().unwrap();
    assert_eq!(svc.clone().oneshot("b".into()).await.unwrap(), "v:b");
    assert!(redis.command_calls("script").unwrap() >= 2, "reloaded");

    redis.restart().unwrap();
    // Wait for the client to reconnect (bounded), then it must just work.
    let deadline = Instant::now() + Duration::from_secs(5);
    let flight = FlightId::of(&FlightKey::from_bytes(stage("flush"), "probe"));
    loop {
        // A read on the backend's own command connection.
        let ping = probe.invalidated_since(&flight, 0).await;
        if ping.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "client did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(svc.clone().oneshot("c".into()).await.unwrap(), "v:c");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Issue 5 / invariant 14: a corrupt or foreign value at a flight's
/// record is a protocol error, not a panic, and nothing runs: a stored
/// body the codec refuses (garbage, another envelope version), a status
/// the scripts never write, a field that does not parse, a result without
/// a generation, another type at the record's name.
#[tokio::test]
async fn corrupt_and_foreign_results_are_protocol_errors() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(b.clone(), "corrupt", policy()).layer(work(calls.clone(), "v", Duration::ZERO));

    let record = |req: &str| b.record_key(&flight_of("corrupt", req));
    let hset = |fields: &[&'static [u8]]| [&[b"HSET" as &[u8], b""][..], fields].concat();
    let cases: [(&str, Vec<&[u8]>); 6] = [
        (
            "garbage",
            hset(&[
                b"g",
                b"1",
                b"t",
                b"x",
                b"d",
                b"0",
                b"s",
                b"ok",
                b"b",
                b"\xff\x00garbage",
            ]),
        ),
        (
            "version",
            hset(&[
                b"g",
                b"1",
                b"t",
                b"x",
                b"d",
                b"0",
                b"s",
                b"ok",
                b"b",
                b"\x09\x01\x00abc",
            ]),
        ),
        (
            "status",
            hset(&[
                b"g", b"1", b"t", b"x", b"d", b"0", b"s", b"maybe", b"b", b"x",
            ]),
        ),
        ("unreadable", hset(&[b"g", b"soon", b"t", b"x", b"d", b"0"])),
        ("no-generation", hset(&[b"s", b"ok", b"b", b"x"])),
        ("wrongtype", vec![b"SET", b"", b"a plain string"]),
    ];
    for (req, mut cmd) in cases {
        let key = record(req);
        cmd[1] = key.as_bytes();
        redis.cmd_bytes(&cmd).unwrap();
        let err = svc.clone().oneshot(req.to_owned()).await.unwrap_err();
        assert!(find::<ProtocolError>(&*err).is_some(), "{req}: {err}");
        assert_eq!(ErrorClass::of(&*err), ErrorClass::Unavailable);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(counter(metric::UNKNOWN_ACTION_TOTAL, "corrupt") >= 6);
}

/// Issue 5 / invariant 7: the commit fails after execution (Redis frozen)
/// -> the value still reaches the caller, no re-execution, and
/// `singleflight_result_write_failure_total` increments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_failure_still_returns_the_value() {
    let redis = Arc::new(Mutex::new(RedisServer::start().unwrap()));
    let url = redis.lock().unwrap().url();
    let b = backend_at(url).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let (r, c) = (redis.clone(), calls.clone());
    let l2 = layer(b, "commitfail", policy());
    let flights = l2.flights().clone();
    let l2 = l2.layer(service_fn(move |req: String| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            // Give the local waiters time to join, then freeze Redis.
            tokio::time::sleep(Duration::from_millis(50)).await;
            r.lock().unwrap().pause().unwrap();
            Ok::<_, Infallible>(format!("v:{req}"))
        }
    }));
    // L1 in front: 10 local callers, one L2 flight.
    let svc = Svc::new(
        flightdeck_local::LocalFlightLayer::with_key(
            flightdeck_local::FlightPolicy::new(),
            |q: &String| {
                Some(FlightKey::from_bytes(
                    StageName::new("commitfail").unwrap(),
                    q,
                ))
            },
        )
        .layer(l2),
    );
    let started = Instant::now();
    let mut waiters = Vec::new();
    for _ in 0..10 {
        waiters.push(tokio::spawn(svc.clone().oneshot("k".to_owned())));
    }
    for w in waiters {
        assert_eq!(
            w.await.unwrap().unwrap(),
            "v:k",
            "every local caller gets the value"
        );
    }
    let took = started.elapsed();
    // The commit's attempts go on in the background, Redis still frozen,
    // until they give up.
    flights.idle().await;
    redis.lock().unwrap().resume().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(counter(metric::RESULT_WRITE_FAILURE_TOTAL, "commitfail"), 1);
    assert!(
        took < Duration::from_secs(3),
        "commit retries are bounded: {took:?}"
    );
}

/// An ACQUIRE right after Redis thawed, sent again while the connection
/// recovers (at most 5 s).
async fn acquire_after_thaw(
    b: &RedisBackend,
    flight: &FlightId,
    tok: &OwnerToken,
    terms: &LeaseTerms,
) -> Acquired {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match b.acquire(flight, tok, terms).await {
            Ok(a) => return a,
            Err(e) => {
                assert!(Instant::now() < deadline, "never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Issue 5 / invariant 8: an ambiguous acquire (timed out while Redis was
/// frozen, executed when it thawed) retried with the same token answers
/// OWNER with the same generation.
#[tokio::test]
async fn ambiguous_acquire_retry_is_owner_same_generation() {
    let mut redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let flight = flight_of("ambiguous", "k");
    let tok = OwnerToken::random();
    // A lease that outlives any stall of this test: the retry and the
    // other token's ACQUIRE must land while it lives.
    let terms = LeaseTerms {
        lease: Duration::from_secs(30),
        ..conformance::terms(true)
    };
    redis.pause().unwrap();
    let err = b.acquire(&flight, &tok, &terms).await.unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::OutcomeUnknown);
    redis.resume().unwrap();
    let retried = acquire_after_thaw(&b, &flight, &tok, &terms).await;
    let Acquired::Owner {
        generation,
        takeover: false,
        ..
    } = retried
    else {
        panic!("expected OWNER, got {retried:?}");
    };
    let other = OwnerToken::random();
    assert!(matches!(
        b.acquire(&flight, &other, &terms).await.unwrap(),
        Acquired::Follower { generation: g, .. } if g == generation
    ));
}

/// Issue 35: an ACQUIRE that reaches Redis after its caller gave it up
/// (queued on a frozen server past the command timeout, run when it
/// thaws) grants nothing, so no lease nobody works on blocks the flight:
/// the next caller is granted it at once, not told to follow a ghost.
#[tokio::test]
async fn a_late_acquire_grants_no_lease() {
    let mut redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let terms = LeaseTerms {
        lease: Duration::from_secs(30),
        ..conformance::terms(true)
    };
    // The node has heard from the server: ACQUIRE replies carry its clock.
    let warm = flight_of("late", "warm");
    let first = b.acquire(&warm, &OwnerToken::random(), &terms).await;
    assert!(matches!(first, Ok(Acquired::Owner { .. })), "{first:?}");
    let flight = flight_of("late", "k");
    redis.pause().unwrap();
    let err = b
        .acquire(&flight, &OwnerToken::random(), &terms)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::OutcomeUnknown);
    // Still frozen well past the call's deadline; the ACQUIRE waits in the
    // server's socket and runs when it thaws.
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.resume().unwrap();
    let answer = acquire_after_thaw(&b, &flight, &OwnerToken::random(), &terms).await;
    assert!(
        matches!(
            answer,
            Acquired::Owner {
                takeover: false,
                ..
            }
        ),
        "the late ACQUIRE left a lease nobody works on: {answer:?}"
    );
}

/// An ACQUIRE answered `LATE` while its caller still waits (the client's
/// estimate of the server's clock lagged: the last reply was read long
/// after the server sent it, as on a busy runtime) is asked once more,
/// with the clock the `LATE` answer carried, and granted.
#[tokio::test]
async fn a_late_answer_to_a_caller_still_waiting_is_asked_again() {
    let redis = RedisServer::start().unwrap();
    let b = RedisBackend::connect(
        RedisConfig::new(redis.url()).command_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("connects to the test redis");
    let terms = LeaseTerms {
        lease: Duration::from_secs(30),
        ..conformance::terms(true)
    };
    // The first reply is read 800 ms after the server sent it (this
    // thread busy meanwhile): the estimate of the server's clock lags so.
    let warm = {
        let b = b.clone();
        tokio::spawn(async move {
            b.acquire(
                &flight_of("late-wait", "warm"),
                &OwnerToken::random(),
                &terms,
            )
            .await
        })
    };
    // Polled until the command is written (the reply is read only once
    // the runtime polls its socket, every 61 tasks or when idle).
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    std::thread::sleep(Duration::from_millis(800));
    let first = warm.await.unwrap();
    assert!(matches!(first, Ok(Acquired::Owner { .. })), "{first:?}");
    // A caller that gives up in 300 ms: its deadline, by the lagging
    // estimate, has passed on the server when the ACQUIRE arrives.
    let ask = Ask {
        not_after: Some(tokio::time::Instant::now() + Duration::from_millis(300)),
        ..Ask::default()
    };
    let answer = b
        .acquire_with(
            &flight_of("late-wait", "k"),
            &OwnerToken::random(),
            ask,
            &terms,
        )
        .await;
    assert!(matches!(answer, Ok(Acquired::Owner { .. })), "{answer:?}");
}

/// Failure table, "before acquire": Redis killed or frozen -> a typed
/// coordination error within the call deadlines; nothing hangs.
#[tokio::test]
async fn killed_or_paused_redis_gives_typed_errors_quickly() {
    let mut redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(backend(&redis).await, "down", policy()).layer(work(
        calls.clone(),
        "v",
        Duration::ZERO,
    ));

    redis.pause().unwrap();
    let started = Instant::now();
    let err = svc.clone().oneshot("a".into()).await.unwrap_err();
    let paused_took = started.elapsed();
    assert_eq!(ErrorClass::of(&*err), ErrorClass::Unavailable, "{err}");
    redis.resume().unwrap();

    redis.kill();
    let started = Instant::now();
    let err = svc.clone().oneshot("b".into()).await.unwrap_err();
    let killed_took = started.elapsed();
    assert_eq!(ErrorClass::of(&*err), ErrorClass::Unavailable, "{err}");
    eprintln!("paused: error after {paused_took:?}; killed: error after {killed_took:?}");
    // Two acquire attempts of at most 300 ms each, plus slack.
    assert!(paused_took < Duration::from_secs(3));
    assert!(killed_took < Duration::from_secs(3));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// One subscriber connection per node, and on it one inbox for every
/// flight, subscribed from the first connection on and kept: followers
/// register on it (a subscribe per follower sends nothing once it is in
/// force), and leave nothing subscribed behind.
#[tokio::test]
async fn one_inbox_per_node_subscribed_once_and_kept() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let (f1, f2) = (flight_of("subs", "a"), flight_of("subs", "b"));
    let inbox = b.inbox(&f1);
    assert_eq!(inbox, b.inbox(&f2), "one inbox for every flight");
    let numsub = || match redis.cmd(&["PUBSUB", "NUMSUB", &inbox]).unwrap() {
        Resp::Array(Some(v)) => match v[1] {
            Resp::Int(n) => n,
            _ => -1,
        },
        _ => -1,
    };
    // `connect` waited for it.
    assert_eq!(numsub(), 1);
    assert_eq!(b.subscribed_channels(), 1);
    let s1 = b.subscribe(&f1).await.unwrap();
    let s2 = b.subscribe(&f1).await.unwrap();
    let s3 = b.subscribe(&f2).await.unwrap();
    assert_eq!(numsub(), 1);
    assert_eq!(b.subscribed_channels(), 1);
    assert_eq!(b.followed_flights(), 2);
    drop(s1);
    assert_eq!(b.followed_flights(), 2);
    drop((s2, s3));
    assert_eq!(b.followed_flights(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(numsub(), 1, "the inbox stays");
    let Resp::Array(Some(channels)) = redis.cmd(&["PUBSUB", "CHANNELS"]).unwrap() else {
        panic!("PUBSUB CHANNELS answers an array");
    };
    assert_eq!(channels.len(), 1, "the inbox alone: {channels:?}");
}

/// For scale (printed, not asserted): the owner path (acquire + commit) per
/// flight against a bare PING round trip to the same server.
#[tokio::test]
async fn measure_owner_path_against_a_round_trip() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let client =
        fred::prelude::Builder::from_config(fred::prelude::Config::from_url(&redis.url()).unwrap())
            .build()
            .unwrap();
    client.init().await.unwrap();
    let svc = layer(b, "measure", policy()).layer(service_fn(|req: String| async move {
        Ok::<_, Infallible>(req)
    }));
    const N: u32 = 300;
    let started = Instant::now();
    for _ in 0..N {
        let _: String = client.ping(None).await.unwrap();
    }
    let rtt = started.elapsed() / N;
    let started = Instant::now();
    for i in 0..N {
        svc.clone().oneshot(format!("k{i}")).await.unwrap();
    }
    let owner = started.elapsed() / N;
    let started = Instant::now();
    for i in 0..N {
        svc.clone().oneshot(format!("k{i}")).await.unwrap();
    }
    let hit = started.elapsed() / N;
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    eprintln!(
        "loopback, {N} sequential calls ({build} build): PING {rtt:?}; owner path {owner:?} ({:.1}x); hit {hit:?} ({:.1}x)",
        owner.as_secs_f64() / rtt.as_secs_f64(),
        hit.as_secs_f64() / rtt.as_secs_f64()
    );
}

/// A result this node committed, gone from the store before its TTL ran
/// out (`FLUSHALL`, as a failover to a replica that never got it would
/// leave it): the next request runs again and the loss is counted.
#[tokio::test]
async fn a_lost_result_is_counted() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let l2 = layer(backend(&redis).await, "lost", policy());
    let flights = l2.flights().clone();
    let svc = l2.layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "replayed while stored");
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, "lost"), 0);

    redis.cmd(&["FLUSHALL"]).unwrap();
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "ran again");
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, "lost"), 1);
}

/// An invalidation, by this node or by another, is not a lost result.
#[tokio::test]
async fn an_invalidated_result_is_not_lost() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = layer(backend(&redis).await, "invalidated", policy());
    let b = layer(backend(&redis).await, "invalidated", policy());
    let flights = a.flights().clone();
    let svc = a.layer(work(calls.clone(), "v", Duration::ZERO));
    let key = FlightKey::from_bytes(stage("invalidated"), "k");
    for invalidating in [&a, &b] {
        assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
        flights.idle().await;
        invalidating.invalidate(&key).await.unwrap();
    }
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "each invalidation ran it again"
    );
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, "invalidated"), 0);
}

/// A result that expired by its TTL is not a lost result.
#[tokio::test]
async fn an_expired_result_is_not_lost() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let l2 = layer(
        backend(&redis).await,
        "expired",
        policy().replay_ttl(Duration::from_millis(400)),
    );
    let flights = l2.flights().clone();
    let svc = l2.layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "ran again once expired");
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, "expired"), 0);
}

fn replicas_counted(stage_name: &str, result: &str) -> u64 {
    counter_where(
        metric::COMMIT_REPLICAS_TOTAL,
        stage_name,
        Some(("result", result)),
    )
}

/// `commit_replicas(1)`: with a replica attached the commit is
/// acknowledged; without one the wait ends at its timeout, short, and the
/// callers have their value all the same.
#[tokio::test]
async fn commits_wait_for_replicas() {
    let wait = Duration::from_millis(150);
    let replicated = policy().commit_replicas(1).commit_replicas_timeout(wait);

    let redis = RedisServer::start().unwrap();
    let _replica = RedisServer::start_replica_of(&redis).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let l2 = layer(backend(&redis).await, "acked", replicated.clone());
    let flights = l2.flights().clone();
    let svc = l2.layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(replicas_counted("acked", "acked"), 1);
    assert_eq!(replicas_counted("acked", "short"), 0);

    let alone = RedisServer::start().unwrap();
    let l2 = layer(backend(&alone).await, "short", replicated);
    let flights = l2.flights().clone();
    let svc = l2.layer(work(calls.clone(), "v", Duration::ZERO));
    let started = Instant::now();
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    let took = started.elapsed();
    assert_eq!(replicas_counted("short", "short"), 1);
    assert_eq!(replicas_counted("short", "acked"), 0);
    assert!(took >= wait, "WAIT lasted its timeout: {took:?}");
    assert!(took < Duration::from_secs(1), "and no longer: {took:?}");
    // The commit happened on the primary: the next request replays it.
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `min-replicas-to-write 1` without a replica: every ACQUIRE is refused
/// with `NOREPLICAS`, yet a stored result is still replayed (a read-only
/// lookup, no execution); a key without one stays unavailable.
#[tokio::test]
async fn refused_writes_still_replay_stored_results() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let b = backend(&redis).await;
    let l2 = layer(b.clone(), "noreplicas", policy());
    let flights = l2.flights().clone();
    let svc = l2.layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    redis
        .cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"])
        .unwrap();
    let replays =
        |result| counter_where(metric::READONLY_REPLAY_TOTAL, "", Some(("result", result)));
    let (hits, misses) = (replays("hit"), replays("miss"));

    assert_eq!(svc.clone().oneshot("k".into()).await.unwrap(), "v:k");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "replayed, not run");
    assert_eq!(replays("hit"), hits + 1);

    let err = svc.clone().oneshot("other".into()).await.unwrap_err();
    assert!(
        find::<flightdeck_core::error::CoordinationUnavailable>(&*err).is_some(),
        "{err}"
    );
    assert!(err.to_string().contains("NOREPLICAS") || format!("{err:?}").contains("NOREPLICAS"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(replays("miss"), misses + 1);

    // The backend's own answer for a key without a result.
    let refused = b
        .acquire(
            &flight_of("noreplicas", "none"),
            &OwnerToken::random(),
            &conformance::terms(true),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), BackendErrorKind::Unavailable);
}

/// An invalidation by another node stays known after the flight's record
/// expired (a grant after it, abandoned, keeps the record only two
/// leases): the missing result is still not counted lost.
#[tokio::test]
async fn an_invalidation_outlives_the_record() {
    let redis = RedisServer::start().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = layer(backend(&redis).await, "outlived", policy());
    let flights = a.flights().clone();
    let a = a.layer(work(calls.clone(), "v", Duration::ZERO));
    assert_eq!(a.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;

    let b = layer(backend(&redis).await, "outlived", policy());
    let b_flights = b.flights().clone();
    b.invalidate(&FlightKey::from_bytes(stage("outlived"), "k"))
        .await
        .unwrap();
    let failing = BoxCloneService::new(service_fn(|_req: String| async {
        Err::<String, BoxError>("no result this time".into())
    }));
    b.layer(failing).oneshot("k".into()).await.unwrap_err();
    b_flights.idle().await;
    // The abandoned grant's record lives two leases.
    tokio::time::sleep(LEASE * 2 + Duration::from_millis(300)).await;
    let Resp::Int(0) = redis
        .cmd(&[
            "EXISTS",
            &b.backend().record_key(&flight_of("outlived", "k")),
        ])
        .unwrap()
    else {
        panic!("the record expired");
    };

    assert_eq!(a.clone().oneshot("k".into()).await.unwrap(), "v:k");
    flights.idle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(counter(metric::RESULT_LOST_TOTAL, "outlived"), 0);
}
