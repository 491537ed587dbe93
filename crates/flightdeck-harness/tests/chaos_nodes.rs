//! The chaos suite over real node processes: N `flightdeck-node`
//! processes (L1 + L2 over one Redis, each its own OS process, fred clients
//! and [`FaultProxy`], so a partition cuts off one node), driven over HTTP
//! with K keys per window for T seconds, under the seeded schedule of
//! `flightdeck-redis/tests/chaos.rs` (Redis SIGKILL + restart, SIGSTOP /
//! SIGCONT, per node blackhole, blackhole ended by resets, resets, latency,
//! replies cut mid-way) plus, every fourth fault, a node process killed
//! (SIGKILL) while it runs a flight and restarted: the takeover story.
//!
//! Every process appends its grants, commits, lost heartbeats and the start
//! and end of each execution to its own file (`--journal`, JSON lines
//! flushed one by one, so a killed process's record survives it). After the
//! run the test merges them and prints and checks the invariants of
//! [`flightdeck_harness::chaos`]: hung requests, wrong-key results, stale
//! commits, committed results per (key, generation), duplicate executions
//! by cause, leases left held on Redis once every node is idle (`/idle`),
//! followers waiting on a lease whose owner's grant never reached it or
//! whose process was killed; the in-flight maps come from each node's
//! `/stats`, memory from each node's `VmRSS`.
//!
//! A second run, after the first, turns the stage's stale windows on
//! (`flightdeck-node --stale`: grace, stale-if-error with phases where the
//! work fails, its throttle, a soft timeout; each request answered by L2
//! alone, which says how) under the same kind of schedule, and checks
//! every answer besides, as `chaos_stale` does in one process
//! ([`chaos::check_answers`]): no stale answer older than its freshness
//! plus its reason's window, no node answering a generation older than
//! one it had answered from the store.
//!
//! Short form (CI): 25 s, then 20 s with the windows on. Long form:
//! `FLIGHTDECK_CHAOS_SECS=300 cargo test -p flightdeck-harness --all-features
//! --test chaos_nodes -- --nocapture` (the stale run takes half of it);
//! `FLIGHTDECK_CHAOS_SEED` picks another schedule,
//! `FLIGHTDECK_CHAOS_VERBOSE=1` prints each fault.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::FlightId;
use flightdeck_harness::chaos::{
    self, blocking, lock, within, Answer, Answers, Attempt, Chaos, Memory, NodeLog, Settings,
    Summary,
};
use flightdeck_harness::node::{get_async, NodeProcess, NodeStats};
use flightdeck_harness::recorder::{wall_us, WallClock};
use flightdeck_harness::{FaultProxy, Journal};
use flightdeck_redis::LAYOUT;
use tokio::time::{timeout, Instant};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flightdeck-node"))
}

/// The flight of a request key (the node's stage is `node`).
fn flight_of(key: &str) -> FlightId {
    FlightId::of(&FlightKey::from_bytes(
        StageName::new("node").expect("valid stage"),
        key,
    ))
}

/// One process of a node, alive or dead.
struct Life {
    log: PathBuf,
    pid: u32,
    born: Instant,
    killed_at: Option<Instant>,
    memory: Memory,
}

#[derive(Default)]
struct Slot {
    process: Option<NodeProcess>,
    lives: Vec<Life>,
}

/// The node processes: their slots (the process and its past lives), the
/// address the load sends to (`None` while a node is down), and counters.
struct Nodes {
    dir: PathBuf,
    redis_urls: Vec<String>,
    slots: Mutex<Vec<Slot>>,
    addrs: Vec<Mutex<Option<SocketAddr>>>,
    kills: AtomicU64,
    kills_mid_work: AtomicU64,
    /// A stale run: the wall-clock microseconds its work's failing phases
    /// count from (`--stale`).
    stale: Option<u64>,
}

impl Nodes {
    /// Starts (or restarts) node `i`'s process (blocking: run it off the
    /// runtime).
    fn start(&self, i: usize) {
        let n = lock(&self.slots)[i].lives.len();
        let log = self.dir.join(format!("node{i}.{n}.jsonl"));
        let journal = log.to_str().expect("utf-8 temp path").to_owned();
        let epoch = self.stale.map(|us| us.to_string());
        let mut args = vec!["--chaos", "1", "--journal", &journal];
        if let Some(epoch) = &epoch {
            args.extend(["--stale", epoch]);
        }
        let process = NodeProcess::start(binary(), &self.redis_urls[i], &args)
            .unwrap_or_else(|e| panic!("node {i} starts: {e}"));
        let addr = process.addr();
        let mut slots = lock(&self.slots);
        slots[i].lives.push(Life {
            log,
            pid: process.pid(),
            born: Instant::now(),
            killed_at: None,
            memory: Memory {
                label: format!("node {i} (pid {})", process.pid()),
                ..Memory::default()
            },
        });
        slots[i].process = Some(process);
        *lock(&self.addrs[i]) = Some(addr);
    }

    fn addr(&self, i: usize) -> Option<SocketAddr> {
        *lock(&self.addrs[i])
    }

    /// The node whose process (alive or dead) had `pid`.
    fn node_of(&self, pid: u32) -> Option<usize> {
        lock(&self.slots)
            .iter()
            .position(|slot| slot.lives.iter().any(|l| l.pid == pid))
    }

    /// Node `i`'s stats, `None` if it is down or does not answer in 2 s.
    async fn stats(&self, i: usize) -> Option<NodeStats> {
        let addr = self.addr(i)?;
        match timeout(Duration::from_secs(2), get_async(addr, "/stats")).await {
            Ok(Ok((200, body))) => NodeStats::parse(&body).ok(),
            _ => None,
        }
    }

    /// SIGKILLs node `i` once it runs a flight (waiting up to 5 s for one),
    /// keeps it down for `down`, restarts it.
    async fn kill_and_restart(self: &Arc<Self>, i: usize, down: Duration) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut mid_work = false;
        while Instant::now() < deadline {
            if self.stats(i).await.is_some_and(|s| s.working > 0) {
                mid_work = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *lock(&self.addrs[i]) = None;
        let process = lock(&self.slots)[i].process.take();
        if let Some(mut process) = process {
            blocking("kill a node", move || process.kill()).await;
        }
        let killed_at = Instant::now();
        if let Some(life) = lock(&self.slots)[i].lives.last_mut() {
            life.killed_at = Some(killed_at);
        }
        self.kills.fetch_add(1, Ordering::SeqCst);
        if mid_work {
            self.kills_mid_work.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(down).await;
        let nodes = self.clone();
        blocking("restart a node", move || nodes.start(i)).await;
    }

    /// A memory sample of every live process; `warm` once the run is a
    /// quarter through and the process is 5 s old.
    fn sample_memory(&self, started: Instant, total: Duration) {
        let mut slots = lock(&self.slots);
        for slot in slots.iter_mut() {
            let Some(life) = slot.lives.last_mut().filter(|l| l.killed_at.is_none()) else {
                continue;
            };
            let rss = chaos::rss_of(life.pid);
            if life.memory.warm == 0
                && started.elapsed() >= total / 4
                && life.born.elapsed() >= Duration::from_secs(5)
            {
                life.memory.warm = rss;
            }
            life.memory.samples.push(rss);
        }
    }
}

/// One request over HTTP to node `i`: skipped while it is down; a lost
/// connection is put down to a kill when the node's address changed
/// meanwhile. In a stale run, its answer (`key|generation|pid|how`) is
/// recorded in `answers`.
async fn call(nodes: Arc<Nodes>, i: usize, key: String, answers: Option<Answers>) -> Attempt {
    let Some(addr) = nodes.addr(i) else {
        return Attempt::Skipped;
    };
    let began = Instant::now();
    match get_async(addr, &format!("/flight/{key}")).await {
        Ok((200, body)) => {
            if let Some(answers) = answers {
                let received = Instant::now();
                let answer = parse_answer(&nodes, i, &key, &body, began, received);
                lock(&answers).push(answer.unwrap_or_else(|| {
                    panic!("node {i} answered {body:?} for {key}: not key|generation|pid|how")
                }));
            }
            Attempt::Value(body)
        }
        Ok((status, body)) => Attempt::Error(format!(
            "{status} {}",
            body.split_whitespace().next().unwrap_or("(empty)")
        )),
        Err(_) if nodes.addr(i) != Some(addr) => {
            Attempt::Error("connection lost: node process killed".into())
        }
        Err(_) => Attempt::Error("connection lost: node alive".into()),
    }
}

/// A stale run's answer, `key|generation|pid|how`, of a request to node
/// `i` (`None`: not of that form).
fn parse_answer(
    nodes: &Nodes,
    i: usize,
    key: &str,
    body: &str,
    began: Instant,
    received: Instant,
) -> Option<Answer> {
    let mut parts = body.split('|').skip(1);
    let generation = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    let how = chaos::answered_from_text(parts.next()?)?;
    Some(Answer {
        node: i,
        key: key.to_owned(),
        generation,
        from: nodes.node_of(pid).unwrap_or(usize::MAX),
        began,
        received,
        how,
    })
}

/// Issue 7: the chaos suite over `flightdeck-node` processes, with node
/// processes killed mid-work and restarted; then issue 34's stale windows
/// over them (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_node_processes() {
    let (plain, stale) = match std::env::var("FLIGHTDECK_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(secs) => (secs, (secs / 2).max(20)),
        None => (25, 20),
    };
    run_nodes("node processes", Settings::from_env(plain), false).await;
    let settings = Settings {
        secs: stale,
        window: chaos::STALE_KEY_WINDOW,
        ..Settings::from_env(stale)
    };
    run_nodes("node processes, stale windows on", settings, true).await;
}

/// One run over node processes (`stale`: with the stage's stale windows
/// on, every answer checked).
async fn run_nodes(name: &'static str, settings: Settings, stale: bool) {
    let total = settings.total();
    let (topology, proxies) = blocking("redis and proxies", move || {
        chaos::start_standalone(settings.nodes)
    })
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "flightdeck-chaos-nodes-{}-{}",
        std::process::id(),
        wall_us()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = Arc::new(Nodes {
        dir: dir.clone(),
        redis_urls: proxies.iter().map(FaultProxy::url).collect(),
        slots: Mutex::new((0..settings.nodes).map(|_| Slot::default()).collect()),
        addrs: (0..settings.nodes).map(|_| Mutex::new(None)).collect(),
        kills: AtomicU64::new(0),
        kills_mid_work: AtomicU64::new(0),
        stale: stale.then(wall_us),
    });
    for i in 0..settings.nodes {
        let n = nodes.clone();
        blocking("start a node", move || n.start(i)).await;
    }

    // Every fourth fault kills a node process; the rest as in chaos.rs.
    let mut picked = 0;
    let plan = chaos::schedule(settings.seed, total, |rng| {
        picked += 1;
        if picked % 4 == 2 {
            Chaos::kill_node(rng, settings.nodes)
        } else {
            Chaos::standalone(rng, settings.nodes)
        }
    });
    settings.announce(name, plan.len());

    let load = settings.load();
    let answers = stale.then(Answers::default);
    let mut tasks = Vec::new();
    for i in 0..settings.nodes {
        for w in 0..settings.workers {
            let (nodes, answers) = (nodes.clone(), answers.clone());
            tasks.push(tokio::spawn(chaos::worker(
                load.clone(),
                settings.worker_seed(i, w),
                move |key| call(nodes.clone(), i, key, answers.clone()),
            )));
        }
    }
    let started = load.started;
    let proxy_refs: Vec<&FaultProxy> = proxies.iter().collect();
    let (topology_ref, proxy_refs) = (&topology, &proxy_refs[..]);
    let applied = chaos::drive(
        &plan,
        started,
        total,
        |fault| {
            let nodes = nodes.clone();
            async move {
                match fault {
                    Chaos::KillNode { node, down } => nodes.kill_and_restart(node, down).await,
                    other => chaos::apply(other, topology_ref, proxy_refs).await,
                }
            }
        },
        || nodes.sample_memory(started, total),
    )
    .await;
    load.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        within(30, "load workers stop", t).await.unwrap();
    }

    // Quiesce: every node's in-flight maps and subscriptions empty.
    let quiet = Instant::now();
    loop {
        let mut busy = Vec::new();
        for i in 0..settings.nodes {
            match nodes.stats(i).await {
                Some(s) if s.idle() => {}
                other => busy.push((i, other)),
            }
        }
        if busy.is_empty() {
            break;
        }
        assert!(
            quiet.elapsed() < Duration::from_secs(20),
            "in-flight maps not empty 20 s after the load stopped: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = quiet.elapsed();
    // Then every node's background coordination: after that no flight
    // runs anywhere, and a lease still held on Redis is an orphan.
    for i in 0..settings.nodes {
        let addr = nodes.addr(i).expect("every node is up after the run");
        let idle = within(
            15,
            "a node's L2 background work ends",
            get_async(addr, "/idle"),
        )
        .await;
        assert!(
            matches!(&idle, Ok((200, _))),
            "node {i} still busy 10 s after the load stopped: {idle:?}"
        );
    }
    let scanned = topology.clone();
    let leases = blocking("lease scan", move || chaos::scan_leases(&scanned, LAYOUT))
        .await
        .expect("the lease scan reads Redis");

    // Merge what every process (dead or alive) wrote.
    let clock = WallClock::now();
    let mut journal = Journal::default();
    let mut executions = Vec::new();
    let mut malformed = 0;
    let mut memory = Vec::new();
    let mut lives = Vec::new();
    {
        let mut slots = lock(&nodes.slots);
        for (i, slot) in slots.iter_mut().enumerate() {
            lives.push(format!(
                "node {i}: pids {:?}",
                slot.lives.iter().map(|l| l.pid).collect::<Vec<_>>()
            ));
            for life in &mut slot.lives {
                let text = std::fs::read_to_string(&life.log).unwrap_or_default();
                let log = NodeLog::read(&text, i, &clock, life.killed_at);
                journal.merge(log.journal);
                executions.extend(log.executions);
                malformed += log.malformed;
                if life.killed_at.is_none() {
                    life.memory.end = chaos::rss_of(life.pid);
                    if life.memory.warm == 0 {
                        // Restarted late in the run: no warm sample.
                        life.memory.warm = life.memory.end;
                    }
                    memory.push(life.memory.clone());
                }
            }
        }
    }
    let kills = nodes.kills.load(Ordering::SeqCst);
    let kills_mid_work = nodes.kills_mid_work.load(Ordering::SeqCst);
    let mut extra: Vec<String> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| format!("proxy of node {i}: {:?}", p.stats()))
        .collect();
    extra.push(format!(
        "node processes killed: {kills} ({kills_mid_work} while running a flight); journal lines unreadable: {malformed}"
    ));
    extra.extend(lives);
    let policy = if stale {
        chaos::stale_policy()
    } else {
        chaos::distributed_policy()
    };
    let answered = answers.map(|answers| {
        chaos::check_answers(
            &lock(&answers),
            &executions,
            policy.replay_ttl_duration(),
            &policy.stale(),
        )
    });
    extra.extend(answered.iter().flat_map(|a| a.lines()));
    Summary {
        name,
        seed: settings.seed,
        secs: settings.secs,
        nodes: settings.nodes,
        load: &load,
        applied: &applied,
        journal: &journal,
        executions: &executions,
        fresh: policy.replay_ttl_duration(),
        drained,
        drained_what: "every node's /stats: L1 running and entries, subscriptions",
        leases: &leases,
        memory: &memory,
        extra,
    }
    .print_and_check(true, flight_of);
    if let Some(answered) = answered {
        answered.assert();
    }

    let scheduled_kills = applied.get(Chaos::KILL_NODE).copied().unwrap_or(0);
    assert_eq!(kills, scheduled_kills);
    assert!(
        scheduled_kills == 0 || kills_mid_work > 0,
        "no node was killed while running a flight"
    );
    assert!(
        malformed as u64 <= kills,
        "only a killed process may leave a torn line: {malformed} torn, {kills} kills"
    );
    assert!(
        !executions.is_empty() && !journal.grants.is_empty(),
        "the nodes journaled their work"
    );
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
