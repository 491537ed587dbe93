//! The chaos suite: a seeded, reproducible schedule of faults
//! over a load of K keys across N nodes for T seconds, then the invariants
//! of the coordination protocol (no hung request, no stale commit, at most
//! one committed result per generation, generations per flight strictly
//! increasing, no lease left held once every node is idle, no follower
//! seeing a lease with no live owner for longer than the lease, ...),
//! checked and printed.
//!
//! Each node is one process-local stack, L1 (`LocalFlightLayer`) in front of
//! L2 (`DistributedFlightLayer`) over its own `RedisBackend` (its own fred
//! clients), connected through its own `FaultProxy`, so a fault can cut one
//! node off while the others go on. Redis runs with an fsync-always AOF, so
//! a kill and restart loses no acknowledged write: the generation history
//! is one, and "at most one committed result per (key, generation)" is
//! checked across restarts. The faults: Redis SIGKILL + restart, SIGSTOP /
//! SIGCONT, and per node a blackhole (partition), a blackhole ended by
//! resets, connection resets, latency and replies cut in the middle.
//!
//! Keys live in time windows (`k{i}.w{n}`): every node hammers the same K
//! keys for one window, then moves on, so each key is one burst of
//! coalescing, and any second execution of a key is a duplicate with a
//! cause (listed).
//!
//! A second run does the same over Sentinel (a primary, a replica, three
//! sentinels): forced failovers (`SENTINEL FAILOVER`) and a frozen primary
//! (long enough, the sentinels fail over on their own), with
//! `min-replicas-to-write 1` so the demoted primary refuses the writes it
//! would lose (see `chaos_sentinel`).
//!
//! A third run goes over a Redis Cluster of three primaries, whose faults
//! are live slot migrations of the keys under load (see `chaos_cluster`).
//!
//! A fourth runs the standalone faults with the stage's stale windows on
//! (grace, stale-if-error with phases where the work fails, its throttle,
//! a soft timeout) and checks every answer besides (see `chaos_stale`).
//!
//! Short form (CI): 60 s standalone, 30 s Sentinel, 30 s cluster, 30 s
//! stale. Long
//! form: `FLIGHTDECK_CHAOS_SECS=600 cargo test -p flightdeck-redis --test
//! chaos -- --nocapture --test-threads 1` (Sentinel, cluster and stale get
//! half);
//! `FLIGHTDECK_CHAOS_SEED` picks another schedule.
//!
//! The schedule, its faults, the load and the printed and checked summary
//! are `flightdeck_harness::chaos`, shared with the same run over
//! `flightdeck-node` processes (`flightdeck-harness/tests/chaos_nodes.rs`,
//! which also kills node processes mid-work). This file keeps what is
//! particular to in-process nodes: their stacks and the in-process checks.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::error::{BoxError, DeadlineExceeded, ErrorClass};
use flightdeck_core::{CloneShare, FlightKey, Shareable, StageName};
use flightdeck_distributed::{
    Backend, DistributedFlightLayer, DistributedFlights, DistributedPolicy, Execute, FencingToken,
    FlightId, PostcardCodec, Propagate, Role,
};
use flightdeck_harness::chaos::{
    self, blocking, lock, within, Answer, Answers, Attempt, Chaos, Exec, Executions, Memory,
    Settings, Summary, Topology,
};
use flightdeck_harness::{FaultProxy, Recorder, RedisCluster, RedisSentinel};
use flightdeck_local::{FlightPolicy, LocalFlightLayer};
use flightdeck_redis::{RedisBackend, RedisConfig, LAYOUT};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

const STAGE: &str = "chaos";

// ------------------------------------------------------------------ nodes

#[derive(Clone, Debug)]
struct Req {
    key: String,
    fence: Option<FencingToken>,
}

type Svc = BoxCloneService<Req, String, BoxError>;
type L1 = LocalFlightLayer<fn(&Req) -> Option<FlightKey>, CloneShare<String>>;
type BoxFut = std::pin::Pin<Box<dyn Future<Output = Result<String, BoxError>> + Send>>;

fn key_of(req: &Req) -> Option<FlightKey> {
    Some(FlightKey::from_bytes(
        StageName::new(STAGE).expect("valid stage"),
        &req.key,
    ))
}

fn flight_of(key: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(
        StageName::new(STAGE).expect("valid stage"),
        key,
    ))
}

type Flights = DistributedFlights<Recorder<RedisBackend>, PostcardCodec<String>>;

struct Node {
    svc: Svc,
    l1: L1,
    flights: Flights,
    backend: RedisBackend,
    proxy: Option<FaultProxy>,
}

/// The work: a duration fixed per key ([`chaos::work_duration`]), value
/// `key|generation|node`.
fn work(node: usize, executions: Executions) -> impl Fn(Req) -> BoxFut + Clone {
    move |req: Req| {
        let executions = executions.clone();
        Box::pin(async move {
            let fence = req.fence.ok_or("the owner ran without a fencing token")?;
            let idx = {
                let mut e = lock(&executions);
                e.push(Exec {
                    key: req.key.clone(),
                    generation: fence.generation,
                    node,
                    start: Instant::now(),
                    end: None,
                    killed: false,
                });
                e.len() - 1
            };
            tokio::time::sleep(chaos::work_duration(&req.key)).await;
            lock(&executions)[idx].end = Some(Instant::now());
            Ok(format!("{}|{}|{node}", req.key, fence.generation))
        })
    }
}

/// The work of a stale run, run through L2 alone (its answers say how
/// they were given): [`work`], failing as an execution timeout while
/// [`chaos::work_down`] since `began`.
#[derive(Clone)]
struct StaleWork {
    node: usize,
    executions: Executions,
    began: Instant,
}

impl Execute<Req> for StaleWork {
    type Shared = String;
    type Output = String;

    async fn execute(
        self,
        mut req: Req,
        role: Role,
    ) -> Result<Shareable<String, String>, BoxError> {
        if let Role::Owner(token) = role {
            req.fence = Some(token);
        }
        let value = work(self.node, self.executions)(req).await?;
        if chaos::work_down(self.began.elapsed()) {
            return Err(Box::new(DeadlineExceeded::new("execution")));
        }
        Ok(Shareable::Shared(value))
    }
}

async fn start_node(
    i: usize,
    url: String,
    proxy: Option<FaultProxy>,
    policy: DistributedPolicy,
    journal: &Recorder<()>,
    executions: &Executions,
) -> Node {
    let backend = within(
        15,
        "connect",
        RedisBackend::connect(
            RedisConfig::new(url)
                .command_timeout(chaos::CALL_TIMEOUT)
                .connect_timeout(Duration::from_secs(1))
                .reconnect_max_delay(Duration::from_millis(200)),
        ),
    )
    .await
    .unwrap();
    let l2 = DistributedFlightLayer::new(
        Recorder::sharing(backend.clone(), journal),
        policy,
        CloneShare::<String>::new(),
        PostcardCodec::<String>::new(),
        key_of,
    )
    .map(|l| l.fence(|req: &mut Req, token: FencingToken| req.fence = Some(token)))
    .unwrap();
    let l1: L1 = LocalFlightLayer::with_key(
        FlightPolicy::new().wait_timeout(Some(chaos::LOCAL_WAIT_TIMEOUT)),
        key_of as fn(&Req) -> Option<FlightKey>,
    );
    let flights = l2.flights().clone();
    let svc = Svc::new(
        l1.clone()
            .layer(l2.layer(service_fn(work(i, executions.clone())))),
    );
    Node {
        svc,
        l1,
        flights,
        backend,
        proxy,
    }
}

// -------------------------------------------------------------------- run

struct Run {
    name: &'static str,
    secs: u64,
    strict: bool,
    /// With the stale windows on ([`chaos::stale_policy`]): requests go
    /// to L2 alone, and every answer is checked.
    stale: bool,
}

async fn run(topology: Topology, urls: Vec<(String, Option<FaultProxy>)>, spec: Run) {
    let defaults = Settings::from_env(spec.secs);
    let settings = Settings {
        secs: spec.secs,
        nodes: urls.len(),
        window: if spec.stale {
            chaos::STALE_KEY_WINDOW
        } else {
            defaults.window
        },
        ..defaults
    };
    let (seed, n_nodes) = (settings.seed, settings.nodes);
    let policy = if spec.stale {
        chaos::stale_policy()
    } else {
        chaos::distributed_policy()
    };

    let journal = Recorder::new(());
    let executions = Executions::default();
    let mut nodes = Vec::new();
    for (i, (url, proxy)) in urls.into_iter().enumerate() {
        let policy = policy.clone();
        nodes.push(start_node(i, url, proxy, policy, &journal, &executions).await);
    }
    let total = settings.total();
    let plan = chaos::schedule(seed, total, |rng| match topology {
        Topology::Standalone(_) => Chaos::standalone(rng, n_nodes),
        Topology::Sentinel(_) => Chaos::sentinel(rng, n_nodes),
        Topology::Cluster(_) => Chaos::cluster(rng, n_nodes),
    });
    settings.announce(spec.name, plan.len());

    let load = settings.load();
    let backend = nodes[0].backend.clone();
    load.shard_by(move |key| {
        let req = Req {
            key: key.to_owned(),
            fence: None,
        };
        key_of(&req).map_or_else(
            || "no flight".to_owned(),
            |k| backend.shard(&FlightId::of(&k)).to_string(),
        )
    });
    // (start, end) of every failed request and of every slot migration.
    let failures = Spans::default();
    let migrations = Spans::default();
    let answers = Answers::default();
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for w in 0..settings.workers {
            let (svc, failures) = (node.svc.clone(), failures.clone());
            let stale = spec.stale.then(|| {
                let work = StaleWork {
                    node: n,
                    executions: executions.clone(),
                    began: load.started,
                };
                (node.flights.clone(), work, answers.clone())
            });
            tasks.push(tokio::spawn(chaos::worker(
                load.clone(),
                settings.worker_seed(n, w),
                move |key| {
                    let (svc, failures, stale) = (svc.clone(), failures.clone(), stale.clone());
                    async move {
                        let began = Instant::now();
                        let attempt = match stale {
                            Some((flights, work, answers)) => {
                                call_answered(&flights, work, key, &answers).await
                            }
                            None => call(svc, key).await,
                        };
                        if matches!(attempt, Attempt::Error(_)) {
                            lock(&failures).push((began, Instant::now()));
                        }
                        attempt
                    }
                },
            )));
        }
    }

    let started = load.started;
    let mut memory = Memory {
        label: "the test process".into(),
        ..Memory::default()
    };
    let proxies: Vec<&FaultProxy> = nodes.iter().filter_map(|n| n.proxy.as_ref()).collect();
    let applied = chaos::drive(
        &plan,
        started,
        total,
        |fault| {
            let (topology, proxies, load, backend, migrations) =
                (&topology, &proxies, &load, &nodes[0].backend, &migrations);
            async move {
                match (fault, topology) {
                    (Chaos::MigrateSlot { key, pause }, Topology::Cluster(cluster)) => {
                        // The slot of a key the workers are hammering now.
                        let record = backend.record_key(&flight_of(&load.live_key(key)));
                        let slot = fred::util::redis_keyslot(record.as_bytes());
                        let began = Instant::now();
                        chaos::migrate_slot(cluster, slot, pause).await;
                        lock(migrations).push((began, Instant::now()));
                    }
                    _ => chaos::apply(fault, topology, proxies).await,
                }
            }
        },
        || {
            if memory.warm == 0 && started.elapsed() >= total / 4 {
                memory.warm = chaos::rss_bytes();
            }
            memory.samples.push(chaos::rss_bytes());
        },
    )
    .await;
    load.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        within(30, "load workers stop", t).await.unwrap();
    }

    // Quiesce: every in-flight map and subscription returns to empty.
    let quiet = Instant::now();
    let busy = |nodes: &[Node]| {
        nodes
            .iter()
            .map(|n| {
                (
                    n.l1.running_flights(),
                    n.l1.map_entries(),
                    n.backend.followed_flights(),
                )
            })
            .collect::<Vec<_>>()
    };
    while busy(&nodes).iter().any(|b| *b != (0, 0, 0)) {
        assert!(
            quiet.elapsed() < Duration::from_secs(20),
            "in-flight maps not empty 20 s after the load stopped: {:?}",
            busy(&nodes)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = quiet.elapsed();
    memory.end = chaos::rss_bytes();
    // Then every node's background coordination (commits, abandons, the
    // release of leases it gave up on): after that no flight runs
    // anywhere, and a lease still held on Redis is an orphan.
    for n in &nodes {
        within(20, "L2 background work ends", n.flights.idle()).await;
    }
    let scanned = topology.clone();
    let leases = blocking("lease scan", move || chaos::scan_leases(&scanned, LAYOUT))
        .await
        .expect("the lease scan reads Redis");

    let j = journal.journal();
    let execs = lock(&executions).clone();
    let cluster = matches!(topology, Topology::Cluster(_));
    // A cluster run: the slot's flights are unavailable while it moves,
    // and only then. A request failing clear of every migration (and
    // MIGRATION_GRACE after it) means a client did not recover.
    let stray_failures = {
        let migrations = lock(&migrations);
        lock(&failures)
            .iter()
            .filter(|(began, ended)| {
                !migrations
                    .iter()
                    .any(|(from, to)| began <= &(*to + MIGRATION_GRACE) && ended >= from)
            })
            .count()
    };
    let mut extra: Vec<String> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            Some(format!(
                "proxy of node {i}: {:?}",
                n.proxy.as_ref()?.stats()
            ))
        })
        .collect();
    if cluster {
        extra.push(format!(
            "failed requests clear of every slot migration (+{MIGRATION_GRACE:?}): {stray_failures} of {}",
            lock(&failures).len()
        ));
    }
    let answered = spec.stale.then(|| {
        chaos::check_answers(
            &lock(&answers),
            &execs,
            policy.replay_ttl_duration(),
            &policy.stale(),
        )
    });
    extra.extend(answered.iter().flat_map(|a| a.lines()));
    Summary {
        name: spec.name,
        seed,
        secs: spec.secs,
        nodes: n_nodes,
        load: &load,
        applied: &applied,
        journal: &j,
        executions: &execs,
        fresh: policy.replay_ttl_duration(),
        drained,
        drained_what: "L1 running and entries, subscriptions",
        leases: &leases,
        memory: &[memory],
        extra,
    }
    .print_and_check(spec.strict, flight_of);
    if let Some(answered) = answered {
        answered.assert();
    }
    if cluster {
        assert_eq!(
            stray_failures, 0,
            "requests failed while no slot was moving: a client did not recover"
        );
    }
}

/// (start, end) spans, shared.
type Spans = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// How long after a slot migration a request may still fail because of it
/// (it joined a flight whose acquire met the migration).
const MIGRATION_GRACE: Duration = Duration::from_secs(2);

/// A request of a stale run, through L2 alone: its answer, recorded with
/// how it was given.
async fn call_answered(
    flights: &Flights,
    work: StaleWork,
    key: String,
    answers: &Answers,
) -> Attempt {
    let node = work.node;
    let req = Req {
        key: key.clone(),
        fence: None,
    };
    let flight = key_of(&req).expect("every request is keyed");
    let began = Instant::now();
    match flights
        .run_answered(&flight, req, work, &Propagate, None)
        .await
    {
        Ok((Shareable::Shared(value), how)) => {
            // `key|generation|node`
            let mut parts = value.split('|').skip(1).map(|p| p.parse::<u64>().ok());
            if let (Some(Some(generation)), Some(Some(from))) = (parts.next(), parts.next()) {
                lock(answers).push(Answer {
                    node,
                    key,
                    generation,
                    from: usize::try_from(from).unwrap_or(usize::MAX),
                    began,
                    received: Instant::now(),
                    how,
                });
            }
            Attempt::Value(value)
        }
        Ok((Shareable::Unshared(value, _), _)) => Attempt::Value(value),
        Err(e) => Attempt::Error(format!("{:?}", ErrorClass::of(&*e))),
    }
}

async fn call(svc: Svc, key: String) -> Attempt {
    let req = Req { key, fence: None };
    match svc.oneshot(req).await {
        Ok(v) => Attempt::Value(v),
        Err(e) => Attempt::Error(format!("{:?}", ErrorClass::of(&*e))),
    }
}

/// Issue 7: the chaos suite on one Redis (kill+restart, SIGSTOP, and per
/// node partitions, resets, latency and cut replies). 60 s by default;
/// `FLIGHTDECK_CHAOS_SECS` for the long form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_standalone() {
    let settings = Settings::from_env(60);
    let (topology, proxies) = chaos::start_standalone(settings.nodes).unwrap();
    let urls = proxies.into_iter().map(|p| (p.url(), Some(p))).collect();
    run(
        topology,
        urls,
        Run {
            name: "standalone",
            secs: settings.secs,
            strict: true,
            stale: false,
        },
    )
    .await;
}

/// Issue 7: the chaos suite over Sentinel (forced failovers, a frozen
/// primary), 30 s by default, half of `FLIGHTDECK_CHAOS_SECS` when set.
///
/// The data nodes run with `min-replicas-to-write 1`: after a failover fred
/// keeps writing to the old primary until the sentinels demote it (up to
/// 10 s), and without the guard those writes are lost, so a generation can
/// be granted and committed twice. With the guard the fencing invariants
/// are asserted; `FLIGHTDECK_CHAOS_UNGUARDED=1` runs without it and only
/// prints them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_sentinel() {
    let secs = half_run_secs();
    let n_nodes = Settings::from_env(secs).nodes;
    let guarded = std::env::var_os("FLIGHTDECK_CHAOS_UNGUARDED").is_none();
    let sentinel = blocking("sentinel start", move || {
        if guarded {
            RedisSentinel::start_guarded()
        } else {
            RedisSentinel::start()
        }
    })
    .await
    .unwrap();
    let urls = (0..n_nodes).map(|_| (sentinel.url(), None)).collect();
    run(
        Topology::Sentinel(Arc::new(sentinel)),
        urls,
        Run {
            name: if guarded {
                "sentinel, min-replicas-to-write 1"
            } else {
                "sentinel, unguarded"
            },
            secs,
            strict: guarded,
            stale: false,
        },
    )
    .await;
}

/// 30 s, or half of `FLIGHTDECK_CHAOS_SECS` (at least 30) when set.
fn half_run_secs() -> u64 {
    std::env::var("FLIGHTDECK_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(30, |s| (s / 2).max(30))
}

/// Issue 7: the chaos suite over a Redis Cluster of three primaries, with
/// live slot migrations under load: the slot of a key the workers are
/// hammering moves to the next primary, held half-moved 0.1 to 1.5 s
/// before and again after its keys move (`TRYAGAIN`, `ASK`), then `MOVED`.
/// 30 s by default, half of `FLIGHTDECK_CHAOS_SECS` when set. Strict:
/// `MIGRATE` keeps every key with its TTL, so no result or generation is
/// lost. Also checks that the clients did meet `ASK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_cluster() {
    let secs = half_run_secs();
    let n_nodes = Settings::from_env(secs).nodes;
    let cluster = blocking("cluster start", || RedisCluster::start(3))
        .await
        .map(Arc::new)
        .unwrap();
    let urls = (0..n_nodes).map(|_| (cluster.url(), None)).collect();
    run(
        Topology::Cluster(cluster.clone()),
        urls,
        Run {
            name: "cluster, live slot migrations",
            secs,
            strict: true,
            stale: false,
        },
    )
    .await;
    let replies = |code: &'static str| {
        let c = cluster.clone();
        blocking("errorstats", move || -> u64 {
            (0..c.nodes().len())
                .map(|i| c.error_replies(i, code).unwrap())
                .sum()
        })
    };
    let (ask, tryagain, moved) = (
        replies("ASK").await,
        replies("TRYAGAIN").await,
        replies("MOVED").await,
    );
    println!("cluster nodes answered ASK {ask}x, TRYAGAIN {tryagain}x, MOVED {moved}x");
    assert!(
        ask > 0,
        "no client met ASK: no live migration was exercised"
    );
}

/// Issue 34: the standalone chaos run (Redis killed and frozen, nodes cut
/// off, reset, slowed) with the stage's stale windows on: results fresh
/// for 1 s, kept for grace and stale-if-error, work failing 2 s of every
/// 5 s, its throttle, a soft timeout. Besides the invariants of every
/// run (a refresh of a result past its freshness is no duplicate), every
/// answer is checked: none older than its freshness plus the window of
/// its reason, none of a generation older than one its node had already
/// answered from the store (a superseded refresh never replaces a newer
/// result). 30 s by default, half of `FLIGHTDECK_CHAOS_SECS` when set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_stale() {
    let secs = half_run_secs();
    let (topology, proxies) = chaos::start_standalone(Settings::from_env(secs).nodes).unwrap();
    let urls = proxies.into_iter().map(|p| (p.url(), Some(p))).collect();
    run(
        topology,
        urls,
        Run {
            name: "standalone, stale windows on",
            secs,
            strict: true,
            stale: true,
        },
    )
    .await;
}

/// The end-of-run lease scan: a lease granted to a token nobody runs is
/// found (with its token and what is left of it), a flight whose result is
/// stored is a record without a held lease, and the lease is gone once its
/// token released it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_scan_finds_a_lease_left_held() {
    use flightdeck_distributed::backend::{Acquired, Backend, Committed, LeaseTerms, Released};
    use flightdeck_distributed::OwnerToken;
    use flightdeck_harness::RedisServer;
    use flightdeck_test::conformance;

    let redis = blocking("redis", RedisServer::start).await.unwrap();
    let backend = within(
        15,
        "connect",
        RedisBackend::connect(RedisConfig::new(redis.url())),
    )
    .await
    .unwrap();
    let topology = Topology::Standalone(Arc::new(Mutex::new(redis)));
    let scan = || {
        let t = topology.clone();
        blocking("scan", move || chaos::scan_leases(&t, LAYOUT))
    };
    let terms = LeaseTerms {
        lease: Duration::from_secs(30),
        state_ttl: Duration::from_secs(120),
        allow_takeover: true,
    };
    let (left, done) = (conformance::fresh_flight(), conformance::fresh_flight());
    let (orphan, owner) = (OwnerToken::random(), OwnerToken::random());
    let acquired = backend.acquire(&left, &orphan, &terms).await.unwrap();
    assert!(matches!(acquired, Acquired::Owner { .. }), "{acquired:?}");
    let Acquired::Owner { generation, .. } = backend.acquire(&done, &owner, &terms).await.unwrap()
    else {
        panic!("a fresh flight is owned");
    };
    let committed = backend
        .commit(
            &done,
            &owner,
            generation,
            &conformance::commit_args(b"v", 64),
        )
        .await
        .unwrap();
    assert_eq!(committed, Committed::Committed);

    let found = scan().await.unwrap();
    assert_eq!(found.records, 2, "{found:?}");
    assert_eq!(found.held.len(), 1, "{found:?}");
    assert_eq!(found.held[0].token, orphan.as_str());
    assert_eq!(found.held[0].key, backend.record_key(&left));
    assert!(found.held[0].remaining > Duration::from_secs(25));

    let released = backend
        .release(&left, &orphan, terms.state_ttl)
        .await
        .unwrap();
    assert_eq!(released, Released::Released);
    let found = scan().await.unwrap();
    assert_eq!((found.records, found.held.len()), (2, 0), "{found:?}");
}
