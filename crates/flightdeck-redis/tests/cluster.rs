//! The Redis backend on a real 3-primary Redis Cluster (harness): hash-tagged
//! keys in one slot, sharded pub/sub (SSUBSCRIBE/SPUBLISH), scripts loaded on
//! every primary and reloaded after a cluster-wide SCRIPT FLUSH
//! (invariant 13).

mod short;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{BoxError, ErrorClass};
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::backend::{Backend, Shard};
use flightdeck_distributed::{
    BackendErrorKind, DistributedFlightLayer, DistributedPolicy, FlightId, OwnerToken,
    PostcardCodec,
};
use flightdeck_harness::RedisCluster;
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::conformance;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

async fn backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::connect(
        RedisConfig::new(cluster.url())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connects to the test cluster")
}

type Svc = BoxCloneService<String, String, BoxError>;

/// Executions per request string, with a signal on every start and end of
/// one, so a test can wait for "these flights are running" as an event.
#[derive(Default)]
struct Calls {
    started: Mutex<HashMap<String, usize>>,
    ended: AtomicUsize,
    changed: tokio::sync::watch::Sender<()>,
}

impl Calls {
    fn started(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.started.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn total(&self) -> usize {
        self.started().values().sum()
    }

    fn of(&self, req: &str) -> usize {
        self.started().get(req).copied().unwrap_or(0)
    }

    /// Waits (at most `limit`) until `done` holds; checked on every change.
    async fn wait_until(&self, what: &str, limit: Duration, done: impl Fn(&Self) -> bool) {
        let mut changes = self.changed.subscribe();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done(self) {
                changes.changed().await.expect("the sender lives in self");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"));
    }
}

fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(Duration::from_millis(900))
        .heartbeat(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(Duration::from_secs(5))
        .replay_ttl(Duration::from_secs(10))
        .call_timeout(Duration::from_millis(500))
}

fn node(b: RedisBackend, calls: &Arc<Calls>) -> Svc {
    node_with(b, calls, policy())
}

/// One node: L2 over `b`; the work takes 200 ms (1.2 s for requests
/// starting with `slow`) and answers `v:{req}`.
fn node_with(b: RedisBackend, calls: &Arc<Calls>, policy: DistributedPolicy) -> Svc {
    let calls = calls.clone();
    let layer = DistributedFlightLayer::new(
        b,
        policy,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        |req: &String| {
            Some(FlightKey::from_bytes(
                StageName::new("cluster").unwrap(),
                req,
            ))
        },
    )
    .unwrap();
    BoxCloneService::new(layer.layer(service_fn(move |req: String| {
        let calls = calls.clone();
        async move {
            *calls.started().entry(req.clone()).or_default() += 1;
            calls.changed.send_replace(());
            let ms = if req.starts_with("slow") { 1200 } else { 200 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            calls.ended.fetch_add(1, Ordering::SeqCst);
            calls.changed.send_replace(());
            Ok::<_, BoxError>(format!("v:{req}"))
        }
    })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_backend_conforms() {
    let cluster = RedisCluster::start(3).unwrap();
    conformance::run_all(Arc::new(backend(&cluster).await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_three_nodes_one_execution_with_sharded_pubsub() {
    let cluster = RedisCluster::start(3).unwrap();
    let calls = Arc::new(Calls::default());
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(node(backend(&cluster).await, &calls));
    }
    // Several keys, so flights land on different shards.
    for key in ["a", "b", "c", "d"] {
        let mut tasks = Vec::new();
        for node in &nodes {
            for _ in 0..20 {
                tasks.push(tokio::spawn(node.clone().oneshot(key.to_owned())));
            }
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), format!("v:{key}"));
        }
    }
    assert_eq!(calls.total(), 4, "one execution per key");
    assert_eq!(cluster.command_calls("publish").unwrap(), 0);
    assert!(cluster.command_calls("spublish").unwrap() >= 4);
    assert!(cluster.command_calls("ssubscribe").unwrap() >= 1);

    // A cluster-wide SCRIPT FLUSH is transparent (scripts are reloaded on
    // the node that answered NOSCRIPT).
    cluster.flush_scripts().unwrap();
    assert_eq!(nodes[0].clone().oneshot("e".into()).await.unwrap(), "v:e");
    assert_eq!(nodes[1].clone().oneshot("e".into()).await.unwrap(), "v:e");
    assert_eq!(calls.total(), 5);
}

/// Issue 7 / invariant 13: the server agrees that every name of a flight
/// (its record, its invalidation, and this node's inbox for it) lives in
/// one slot (`CLUSTER KEYSLOT`), for many flights, and that slot is the
/// one fred routes by.
#[tokio::test]
async fn flight_keys_share_one_slot_by_cluster_keyslot() {
    let cluster = RedisCluster::start(3).unwrap();
    let b = backend(&cluster).await;
    let stage = StageName::new("slots").unwrap();
    let mut slots_seen = std::collections::HashSet::new();
    for i in 0..50 {
        let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), format!("req-{i}")));
        let record = b.record_key(&flight);
        let names = [record.clone(), format!("{record}:i"), b.inbox(&flight)];
        let slot = cluster.keyslot(&record).unwrap();
        for n in &names {
            assert_eq!(cluster.keyslot(n).unwrap(), slot, "{n}");
            assert_eq!(fred::util::redis_keyslot(n.as_bytes()), slot, "{n}");
        }
        slots_seen.insert(slot);
    }
    assert!(slots_seen.len() > 40, "flights spread over slots");
}

/// Flight keys (request strings) of stage `stage` whose keys hash to `slot`.
fn requests_in_slot(b: &RedisBackend, stage: &StageName, slot: u16, n: usize) -> Vec<String> {
    named_requests_in_slot(b, stage, slot, "m", n)
}

/// Like [`requests_in_slot`], named `{prefix}{i}`.
fn named_requests_in_slot(
    b: &RedisBackend,
    stage: &StageName,
    slot: u16,
    prefix: &str,
    n: usize,
) -> Vec<String> {
    let mut found = Vec::new();
    for i in 0.. {
        let req = format!("{prefix}{i}");
        let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), &req));
        if fred::util::redis_keyslot(b.record_key(&flight).as_bytes()) == slot {
            found.push(req);
            if found.len() == n {
                break;
            }
        }
    }
    found
}

/// Issue 7: the slot holding several flights is migrated to another
/// primary (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) between bursts of
/// requests from two nodes whose clients still map the slot to the old
/// owner: fred follows the `MOVED` redirects, every flight goes on on the
/// new owner with its generation counter (moved with its keys), and each
/// new generation executes once. Requests during the migration:
/// `slot_migration_ask_is_handled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_moved_is_followed() {
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    // The stage of `node`.
    let stage = StageName::new("cluster").unwrap();
    let probe = backend(&cluster).await;
    let first = FlightId::of(&FlightKey::from_bytes(stage.clone(), "m-first"));
    let slot = cluster.keyslot(&probe.record_key(&first)).unwrap();
    let mut reqs = vec!["m-first".to_owned()];
    reqs.extend(requests_in_slot(&probe, &stage, slot, 4));
    let from = cluster.slot_owner(slot).unwrap();
    let to = (from + 1) % 3;

    let calls = Arc::new(Calls::default());
    let nodes = [
        node(backend(&cluster).await, &calls),
        node(backend(&cluster).await, &calls),
    ];
    let burst = |round: &'static str| {
        let mut tasks = Vec::new();
        for req in &reqs {
            for node in &nodes {
                for _ in 0..5 {
                    let req = req.clone();
                    let fut = node.clone().oneshot(req.clone());
                    tasks.push(tokio::spawn(async move {
                        let v = tokio::time::timeout(Duration::from_secs(10), fut)
                            .await
                            .unwrap_or_else(|_| panic!("{round}: {req} hung"))
                            .unwrap_or_else(|e| panic!("{round}: {req}: {e}"));
                        assert_eq!(v, format!("v:{req}"), "a value for another key");
                    }));
                }
            }
        }
        tasks
    };
    for t in burst("before") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(calls.total(), reqs.len());
    let keys_before = cluster.nodes()[from]
        .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
        .unwrap();

    let c = cluster.clone();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || c.migrate_slot(slot, to, Duration::ZERO)),
    )
    .await
    .expect("migration within 60 s")
    .unwrap()
    .unwrap();
    assert_eq!(cluster.slot_owner(slot).unwrap(), to);
    let keys_after = cluster.nodes()[to]
        .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
        .unwrap();
    assert_eq!(keys_after, keys_before, "every key moved");

    // Stored results are replayed from the new owner (no execution)...
    for t in burst("replay") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(calls.total(), reqs.len());
    // ... and new generations start there, after the old ones.
    for req in &reqs {
        let key = FlightKey::from_bytes(stage.clone(), req);
        let flight = FlightId::of(&key);
        let (stored, gen) = {
            use flightdeck_distributed::backend::{Acquired, Backend};
            let terms = conformance::terms(true);
            let tok = flightdeck_distributed::OwnerToken::random();
            let stored = match probe.acquire(&flight, &tok, &terms).await.unwrap() {
                Acquired::Hit(r) => r.generation,
                other => panic!("{req}: the result moved with its record: {other:?}"),
            };
            let gen = probe
                .invalidate(&flight, Duration::from_secs(60))
                .await
                .unwrap();
            (stored, gen)
        };
        assert!(gen > stored, "{req}: generation {gen} after {stored}");
    }
    let evalsha_before = cluster.nodes()[to].command_calls("evalsha").unwrap();
    for t in burst("after") {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        calls.total(),
        2 * reqs.len(),
        "one execution per new generation"
    );
    assert!(cluster.nodes()[to].command_calls("evalsha").unwrap() > evalsha_before);
    eprintln!(
        "slot {slot} moved from node {from} to {to} with {keys_before:?} keys; MOVED followed"
    );
}

/// How one request ended.
#[derive(Debug)]
enum End {
    Value(String),
    Error(ErrorClass, String),
    Hung,
}

/// `per_node` concurrent requests for each of `reqs` on each node; each
/// gets `deadline` to end.
fn spawn_requests(
    nodes: &[Svc],
    reqs: &[String],
    per_node: usize,
    deadline: Duration,
) -> Vec<tokio::task::JoinHandle<(String, End)>> {
    let mut tasks = Vec::new();
    for req in reqs {
        for node in nodes {
            for _ in 0..per_node {
                let (req, fut) = (req.clone(), node.clone().oneshot(req.clone()));
                tasks.push(tokio::spawn(async move {
                    let end = match tokio::time::timeout(deadline, fut).await {
                        Err(_) => End::Hung,
                        Ok(Ok(v)) => End::Value(v),
                        Ok(Err(e)) => End::Error(ErrorClass::of(&*e), e.to_string()),
                    };
                    (req, end)
                }));
            }
        }
    }
    tasks
}

/// Awaits `tasks` and checks each ended in time with the value of its own
/// key (or, unless `values_only`, a typed error). Returns (values, errors).
async fn check_ends(
    phase: &str,
    tasks: Vec<tokio::task::JoinHandle<(String, End)>>,
    values_only: bool,
) -> (usize, usize) {
    let (mut values, mut errors) = (0, 0);
    for t in tasks {
        let (req, end) = t.await.expect("request task");
        match end {
            End::Value(v) => {
                assert_eq!(v, format!("v:{req}"), "{phase}: a value for another key");
                values += 1;
            }
            End::Error(class, e) => {
                assert!(!values_only, "{phase}: {req}: {class:?}: {e}");
                assert_ne!(class, ErrorClass::Internal, "{phase}: {req}: untyped: {e}");
                errors += 1;
            }
            End::Hung => panic!("{phase}: {req} did not end by its deadline"),
        }
    }
    (values, errors)
}

/// Issue 7: requests in flight DURING a live slot migration. The slot of
/// nine flights is put in MIGRATING/IMPORTING state by hand while three
/// of them run (owners executing, followers on the other node waiting),
/// the keys of two flights are moved, and new requests arrive for all
/// nine; so the clients meet `ASK` (flights whose keys left the old owner
/// or never existed) and `TRYAGAIN`. Then the rest of the keys move and
/// the migration ends (`MOVED` from here).
///
/// Every request must end within its deadline with its own value or a
/// typed error; the running flights' owners commit once the slot is
/// stable (their waiters all get the value, nothing runs twice); and after
/// the migration every request gets its value, each flight having run
/// exactly once. fred 10.1's own `ASK` handling (`process_ask`) wedged or
/// desynchronised the clients here; the backend now turns a redirect into
/// a retry within the call deadline instead (see the crate docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_ask_is_handled() {
    let deadline = Duration::from_secs(12);
    let cluster = Arc::new(RedisCluster::start(3).unwrap());
    let stage = StageName::new("cluster").unwrap();
    let probe = backend(&cluster).await;
    let flight = |req: &str| FlightId::of(&FlightKey::from_bytes(stage.clone(), req));
    let slot = cluster
        .keyslot(&probe.record_key(&flight("slow-x")))
        .unwrap();
    let done = named_requests_in_slot(&probe, &stage, slot, "done", 3);
    let running = named_requests_in_slot(&probe, &stage, slot, "slow", 3);
    let fresh = named_requests_in_slot(&probe, &stage, slot, "fresh", 3);
    let all: Vec<String> = [&done[..], &running[..], &fresh[..]].concat();
    let from = cluster.slot_owner(slot).unwrap();
    let to = (from + 1) % 3;

    let calls = Arc::new(Calls::default());
    // A lease and commit retries that outlast the migration window, so a
    // flight running through it neither lapses nor loses its result.
    let long = || {
        policy()
            .lease(Duration::from_secs(4))
            .heartbeat(Duration::from_secs(1))
            .commit_attempts(12)
    };
    let nodes = [
        node_with(backend(&cluster).await, &calls, long()),
        node_with(backend(&cluster).await, &calls, long()),
    ];

    // Committed results on the old owner.
    check_ends("before", spawn_requests(&nodes, &done, 3, deadline), true).await;
    assert_eq!(calls.total(), done.len());

    // Three flights running (owner on one node, followers on both).
    let in_flight = spawn_requests(&nodes, &running, 3, deadline);
    calls
        .wait_until("the slow flights started", Duration::from_secs(10), |c| {
            running.iter().all(|r| c.of(r) == 1)
        })
        .await;

    let asks_before = cluster.error_replies(from, "ASK").unwrap();
    let started = tokio::time::Instant::now();
    let (c, moving) = (cluster.clone(), [done[0].clone(), running[0].clone()]);
    let keys: Vec<String> = moving
        .iter()
        .map(|r| probe.record_key(&flight(r)))
        .collect();
    let migration = tokio::task::spawn_blocking(move || {
        let m = c.begin_migration(slot, to)?.expect("the slot moves");
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        c.migrate_keys(&m, &keys).map(|n| (m, n))
    })
    .await
    .unwrap()
    .unwrap();
    let (migration, moved_early) = migration;
    assert_eq!(moved_early, 2, "the two flights' records moved");

    // New requests for every flight while the slot is split.
    let during = spawn_requests(&nodes, &all, 2, deadline);
    // The event to go on: the old owner has answered ASK (and the slow
    // flights are done executing, so their commits meet the migration).
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let waiting = std::time::Instant::now();
        while c.error_replies(from, "ASK").unwrap() == asks_before {
            assert!(
                waiting.elapsed() < Duration::from_secs(10),
                "no client met ASK within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    calls
        .wait_until(
            "the slow flights finished executing",
            Duration::from_secs(10),
            |c| c.ended.load(Ordering::SeqCst) >= done.len() + running.len(),
        )
        .await;

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        c.migrate_all_keys(&migration)?;
        c.finish_migration(&migration)
    })
    .await
    .unwrap()
    .unwrap();
    let window = started.elapsed();
    assert_eq!(cluster.slot_owner(slot).unwrap(), to);
    let asks = cluster.error_replies(from, "ASK").unwrap() - asks_before;
    let tryagains = cluster.error_replies(from, "TRYAGAIN").unwrap()
        + cluster.error_replies(to, "TRYAGAIN").unwrap();

    let (running_values, _) = check_ends("in flight", in_flight, true).await;
    let (during_values, during_errors) = check_ends("during", during, false).await;
    let (after_values, _) =
        check_ends("after", spawn_requests(&nodes, &all, 3, deadline), true).await;
    for req in &all {
        assert_eq!(calls.of(req), 1, "{req}: one execution");
    }
    eprintln!(
        "slot {slot}: node {from} -> {to}, window {window:?}; old owner answered ASK {asks}x, \
         TRYAGAIN {tryagains}x in all; in flight {running_values} values; during {during_values} \
         values, {during_errors} typed errors; after {after_values} values"
    );
}

/// One flight through two backends: `a` owns it and commits, `b` follows
/// (its subscription gets the commit's notice) and then hits the result.
async fn owner_follower_hit(a: &RedisBackend, b: &RedisBackend, key: &str) {
    use flightdeck_distributed::backend::{Acquired, Backend, CommitArgs, Committed, Notice};
    let within = |what: &'static str| move |_| format!("{key}: {what} not within 5 s");
    let (f, terms, me) = (short::flight(key), short::terms(), OwnerToken::random());
    let acquired = tokio::time::timeout(Duration::from_secs(5), a.acquire(&f, &me, &terms))
        .await
        .map_err(within("acquire"))
        .unwrap();
    let Ok(Acquired::Owner { generation, .. }) = acquired else {
        panic!("{key}: owner expected: {acquired:?}");
    };
    let mut sub = tokio::time::timeout(Duration::from_secs(5), b.subscribe(&f))
        .await
        .map_err(within("subscribe"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{key}: subscribe: {e}"));
    let follows = b.acquire(&f, &OwnerToken::random(), &terms).await;
    assert!(
        matches!(follows, Ok(Acquired::Follower { .. })),
        "{key}: {follows:?}"
    );
    let args = CommitArgs {
        payload: format!("v:{key}").into(),
        ttl: Duration::from_secs(10),
        retain: Duration::from_secs(10),
        inline_below: 1024,
        state_ttl: Duration::from_secs(20),
        stale_for: Duration::ZERO,
        work_time: Duration::ZERO,
        sent: None,
    };
    let committed = a.commit(&f, &me, generation, &args).await;
    assert_eq!(committed.ok(), Some(Committed::Committed), "{key}");
    // A `Resync` (the slot map changed, a connection came back: re-check)
    // may come first while a primary is down or back; the commit's notice
    // must follow it.
    let notice = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match sub.recv().await {
                Some(Notice::Resync) => continue,
                other => return other,
            }
        }
    })
    .await
    .map_err(within("notice"))
    .unwrap();
    assert!(
        matches!(notice, Some(Notice::Committed { generation: g, .. }) if g == generation),
        "{key}: {notice:?}"
    );
    match b.acquire(&f, &OwnerToken::random(), &terms).await {
        Ok(Acquired::Hit(r)) => assert_eq!(r.payload, args.payload, "{key}"),
        other => panic!("{key}: hit expected: {other:?}"),
    }
}

/// Waits until `b` refuses (`down`) or accepts (`!down`) the flight of
/// `key` before sending anything.
async fn wait_refused(b: &RedisBackend, key: &str, down: bool) {
    let started = tokio::time::Instant::now();
    while b.reject_early(&b.shard(&short::flight(key))).is_some() != down {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{key}: refused early should be {down} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A primary killed under two running backends: the flights of the two
/// live shards keep working end to end (owner, follower, notice, hit),
/// right after the loss and once the cluster has marked the primary
/// failed; the dead shard's flights are refused early and fail fast as
/// unavailable; after the primary's restart every shard works again,
/// through the same backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_primary_down_the_other_shards_keep_working() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let a = RedisBackend::connect(short::config(cluster.url()))
        .await
        .unwrap();
    let b = RedisBackend::connect(short::config(cluster.url()))
        .await
        .unwrap();
    let keys = short::keys_by_node(&cluster, &a, 4);
    let dead = Shard::new(format!("127.0.0.1:{}", cluster.nodes()[1].port()));
    for keys in &keys {
        owner_follower_hit(&a, &b, &keys[0]).await;
    }

    cluster.node_mut(1).unwrap().kill();
    wait_refused(&a, &keys[1][1], true).await;
    wait_refused(&b, &keys[1][1], true).await;
    let live = |round: usize| [keys[0][round].clone(), keys[2][round].clone()];
    for key in live(1) {
        owner_follower_hit(&a, &b, &key).await;
    }
    for key in &keys[1][1..3] {
        let f = short::flight(key);
        assert_eq!(a.shard(&f), dead);
        let refused = a.reject_early(&a.shard(&f)).expect("its primary is down");
        assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
        assert!(
            refused.to_string().contains(dead.name().unwrap()),
            "{refused}"
        );
        let started = tokio::time::Instant::now();
        let err = a
            .acquire(&f, &OwnerToken::random(), &short::terms())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
        let Err(err) = b.subscribe(&f).await else {
            panic!("{key}: subscribed on a dead primary");
        };
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(200),
            "{key}: failed in {took:?}"
        );
    }
    // Once the other primaries agree that it failed (cluster-node-timeout
    // 2 s), they still serve their slots.
    let failed = std::time::Instant::now();
    let marked_failed = || {
        let nodes = cluster.nodes()[0].cmd(&["CLUSTER", "NODES"]).unwrap();
        let text = nodes.as_str().unwrap_or_default().to_owned();
        text.lines().any(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|f| f.split(',').any(|f| f == "fail"))
        })
    };
    while !marked_failed() {
        assert!(
            failed.elapsed() < Duration::from_secs(20),
            "never marked failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for key in live(2) {
        owner_follower_hit(&a, &b, &key).await;
    }
    assert!(a.unreachable().is_none() && b.unreachable().is_none());

    cluster.node_mut(1).unwrap().restart().unwrap();
    wait_refused(&a, &keys[1][3], false).await;
    wait_refused(&b, &keys[1][3], false).await;
    for keys in &keys {
        retry_until_served(&a, &b, &keys[3]).await;
    }
}

/// [`owner_follower_hit`] once the shard answers (a restarted primary
/// answers `CLUSTERDOWN` until it has rejoined).
async fn retry_until_served(a: &RedisBackend, b: &RedisBackend, key: &str) {
    use flightdeck_distributed::backend::Backend;
    let started = tokio::time::Instant::now();
    let f = short::flight(key);
    while let Err(e) = a.invalidate(&f, Duration::from_secs(20)).await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{key}: not served within 20 s: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    owner_follower_hit(a, b, key).await;
}

/// `shard` names the primary that serves a flight: equal for flights on
/// one primary, different across primaries.
#[tokio::test]
async fn shards_are_the_primaries() {
    let cluster = RedisCluster::start(3).unwrap();
    let b = backend(&cluster).await;
    let keys = short::keys_by_node(&cluster, &b, 2);
    for (i, keys) in keys.iter().enumerate() {
        let want = Shard::new(format!("127.0.0.1:{}", cluster.nodes()[i].port()));
        for key in keys {
            assert_eq!(b.shard(&short::flight(key)), want, "{key}");
        }
    }
    let s = |i: usize| b.shard(&short::flight(&keys[i][0]));
    assert_ne!(s(0), s(1));
    assert_ne!(s(1), s(2));
    assert_ne!(s(0), s(2));
}
