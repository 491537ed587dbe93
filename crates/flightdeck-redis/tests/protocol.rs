//! The Redis protocol itself, against real `redis-server` processes
//! started by the harness: the command budget of every script answer (as
//! Redis counts it, `INFO commandstats`, which counts the commands a
//! script runs), a rolling upgrade from the first key layout (its scripts
//! kept in `legacy`), and the server time of an owner flight, old layout
//! against new in one run.

mod legacy;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, CommitArgs, Committed, LeaseTerms, Notice, Released,
    Renewal,
};
use flightdeck_distributed::{
    DistributedFlightLayer, DistributedPolicy, FlightId, OwnerToken, PostcardCodec,
};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig, LAYOUT};
use flightdeck_test::conformance::{self, fresh_flight, Window, LEASE};
use fred::prelude::Value;
use legacy::f2::F2;
use legacy::f4::F4;
use legacy::Legacy;
use tower::{service_fn, Layer, ServiceExt};

/// A backend on `redis`. Its subscriber's liveness `PING` is an hour
/// apart: every count of commands below is the protocol's alone.
/// A plain fred client of `redis`, for the old layouts' scripts.
async fn plain_client(redis: &RedisServer) -> fred::prelude::Client {
    use fred::interfaces::ClientLike;
    let config = fred::prelude::Config::from_url(&redis.url()).unwrap();
    let client = fred::prelude::Builder::from_config(config).build().unwrap();
    client.init().await.unwrap();
    client
}

async fn backend(redis: &RedisServer) -> RedisBackend {
    let config = RedisConfig::new(redis.url())
        .command_timeout(Duration::from_secs(1))
        .subscriber_ping(Duration::from_secs(3600));
    RedisBackend::connect(config)
        .await
        .expect("connects to the test redis")
}

/// `INFO commandstats`: (calls, usec) per command, scripts' inner
/// commands included.
fn commandstats(redis: &RedisServer) -> BTreeMap<String, (u64, u64)> {
    let info = redis.cmd(&["INFO", "commandstats"]).unwrap();
    let text = info.as_str().expect("INFO answers text").to_owned();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_owned(), (field("calls="), field("usec=")));
    }
    out
}

/// The commands Redis ran since the last `CONFIG RESETSTAT`, without the
/// test's own `CONFIG` and `INFO`.
fn ran(redis: &RedisServer) -> BTreeMap<String, u64> {
    commandstats(redis)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("config") && !name.starts_with("info"))
        .map(|(name, (calls, _))| (name, calls))
        .collect()
}

fn reset(redis: &RedisServer) {
    redis.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
}

/// Runs `call` and checks that Redis ran exactly `want` for it (one
/// `EVALSHA` and the script's inner commands).
async fn costs<T>(
    redis: &RedisServer,
    what: &str,
    want: &[(&str, u64)],
    call: impl Future<Output = T>,
) -> T {
    reset(redis);
    let out = call.await;
    assert_ran(redis, what, want);
    out
}

/// Checks that Redis ran exactly one `EVALSHA` and `want` since the last
/// reset.
fn assert_ran(redis: &RedisServer, what: &str, want: &[(&str, u64)]) {
    let want: BTreeMap<String, u64> = [("evalsha", 1)]
        .iter()
        .chain(want)
        .map(|(name, n)| ((*name).to_owned(), *n))
        .collect();
    assert_eq!(ran(redis), want, "{what}: the commands Redis ran");
}

fn commit_args(payload: &'static [u8]) -> CommitArgs {
    conformance::commit_args(payload, 1024)
}

fn no_failure() -> AbandonArgs {
    AbandonArgs {
        failure: None,
        failure_ttl: Duration::ZERO,
        state_ttl: Duration::from_secs(30),
        retry_after: Duration::ZERO,
    }
}

fn owned(answer: Acquired) -> u64 {
    match answer {
        Acquired::Owner { generation, .. } => generation,
        other => panic!("expected OWNER, got {other:?}"),
    }
}

const HMGET: (&str, u64) = ("hmget", 1);
const TIME: (&str, u64) = ("time", 1);
const HSET: (&str, u64) = ("hset", 1);
const PEXPIRE: (&str, u64) = ("pexpire", 1);
const PUBLISH: (&str, u64) = ("publish", 1);

/// The per-flight command budget of `MEASUREMENTS.md`, answer by answer:
/// hit = 2 inner commands, follower = 2 (3 for its node's first: it adds
/// the node's inbox), owner = ACQUIRE 4 + COMMIT 4, and one `PUBLISH` per
/// node that follows; heartbeat, abandon, release, invalidate and the
/// refusals as listed. Any extra `redis.call` (or a missing one) fails
/// here.
#[tokio::test]
async fn every_script_answer_keeps_its_command_budget() {
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let t = conformance::terms(true);
    let tok = OwnerToken::random;
    let (a, c) = (tok(), tok());

    // Nobody follows: the owner's flight is 4 + 4, no message at all.
    let f = fresh_flight();
    let g = owned(
        costs(
            &redis,
            "ACQUIRE -> OWNER (grant)",
            &[HMGET, TIME, HSET, PEXPIRE],
            b.acquire(&f, &a, &t),
        )
        .await
        .unwrap(),
    );
    let args = commit_args(b"small result");
    let committed = costs(
        &redis,
        "COMMIT -> COMMITTED (nobody follows)",
        &[HMGET, TIME, HSET, PEXPIRE],
        b.commit(&f, &a, g, &args),
    );
    assert_eq!(committed.await.unwrap(), Committed::Committed);

    let f = fresh_flight();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap());
    let retry = costs(
        &redis,
        "ACQUIRE -> OWNER (retry)",
        &[HMGET, TIME],
        b.acquire(&f, &a, &t),
    );
    assert_eq!(owned(retry.await.unwrap()), g);
    let follower = costs(
        &redis,
        "ACQUIRE -> FOLLOWER (this node's first: adds its inbox)",
        &[HMGET, TIME, HSET],
        b.acquire(&f, &c, &t),
    );
    assert!(matches!(follower.await.unwrap(), Acquired::Follower { .. }));
    let e = tok();
    let again = costs(
        &redis,
        "ACQUIRE -> FOLLOWER (the node's inbox is there)",
        &[HMGET, TIME],
        b.acquire(&f, &e, &t),
    );
    assert!(matches!(again.await.unwrap(), Acquired::Follower { .. }));
    let renewed = costs(
        &redis,
        "HEARTBEAT -> RENEWED",
        &[HMGET, TIME, HSET, PEXPIRE],
        b.heartbeat(&f, &a, g, &t),
    );
    assert_eq!(renewed.await.unwrap(), Renewal::Renewed);
    let lost = costs(
        &redis,
        "HEARTBEAT -> LOST",
        &[HMGET],
        b.heartbeat(&f, &c, g, &t),
    );
    assert_eq!(lost.await.unwrap(), Renewal::Lost);
    let fenced = costs(
        &redis,
        "COMMIT -> FENCED",
        &[HMGET],
        b.commit(&f, &c, g, &args),
    );
    assert_eq!(fenced.await.unwrap(), Committed::Fenced);
    let committed = costs(
        &redis,
        "COMMIT -> COMMITTED (one node follows)",
        &[HMGET, TIME, HSET, PEXPIRE, PUBLISH],
        b.commit(&f, &a, g, &args),
    );
    assert_eq!(committed.await.unwrap(), Committed::Committed);
    let again = costs(
        &redis,
        "COMMIT -> COMMITTED (retry)",
        &[HMGET],
        b.commit(&f, &a, g, &args),
    );
    assert_eq!(again.await.unwrap(), Committed::Committed);
    let hit = costs(
        &redis,
        "ACQUIRE -> HIT",
        &[HMGET, TIME],
        b.acquire(&f, &c, &t),
    );
    assert!(matches!(hit.await.unwrap(), Acquired::Hit(_)));
    let kept = costs(
        &redis,
        "RELEASE -> NOT_OWNER (record kept)",
        &[HMGET, HSET],
        b.release(&f, &c, Duration::from_secs(30)),
    );
    assert_eq!(kept.await.unwrap(), Released::NotOwner);

    let f = fresh_flight();
    let none = costs(
        &redis,
        "RELEASE -> NOT_OWNER (no record)",
        &[HMGET, HSET, PEXPIRE],
        b.release(&f, &c, Duration::from_secs(30)),
    );
    assert_eq!(none.await.unwrap(), Released::NotOwner);
    let g = owned(b.acquire(&f, &a, &t).await.unwrap());
    let no_failure = no_failure();
    let not_owner = costs(
        &redis,
        "ABANDON -> NOT_OWNER",
        &[HMGET],
        b.abandon(&f, &c, g, &no_failure),
    );
    assert_eq!(not_owner.await.unwrap(), Released::NotOwner);
    let abandoned = costs(
        &redis,
        "ABANDON -> RELEASED (nobody follows)",
        &[HMGET, HSET],
        b.abandon(&f, &a, g, &no_failure),
    );
    assert_eq!(abandoned.await.unwrap(), Released::Released);
    // (`c` was released on this flight: it is never granted it.)
    let d = tok();
    let g = owned(b.acquire(&f, &d, &t).await.unwrap());
    let failure = AbandonArgs {
        failure: Some(Bytes::from_static(b"boom")),
        failure_ttl: Duration::from_secs(5),
        ..no_failure.clone()
    };
    assert!(matches!(
        b.acquire(&f, &tok(), &t).await.unwrap(),
        Acquired::Follower { .. }
    ));
    let cached = costs(
        &redis,
        "ABANDON -> RELEASED (failure cached, one node follows)",
        &[HMGET, TIME, HSET, PEXPIRE, PUBLISH],
        b.abandon(&f, &d, g, &failure),
    );
    assert_eq!(cached.await.unwrap(), Released::Released);

    let f = fresh_flight();
    owned(b.acquire(&f, &a, &t).await.unwrap());
    let released = costs(
        &redis,
        "RELEASE -> RELEASED (nobody follows)",
        &[HMGET, HSET],
        b.release(&f, &a, Duration::from_secs(30)),
    );
    assert_eq!(released.await.unwrap(), Released::Released);
    let ended = costs(
        &redis,
        "ACQUIRE -> EXPIRED (a released token)",
        &[HMGET, TIME],
        b.acquire(&f, &a, &t),
    );
    assert!(matches!(ended.await.unwrap(), Acquired::Expired { .. }));
    let invalidated = costs(
        &redis,
        "INVALIDATE (nobody follows)",
        &[HMGET, TIME, HSET, ("hdel", 1), PEXPIRE, ("set", 1)],
        b.invalidate(&f, Duration::from_secs(30)),
    );
    let generation = invalidated.await.unwrap();
    let read = costs(
        &redis,
        "READ",
        &[HMGET, TIME, ("get", 1)],
        b.invalidated_since(&f, generation - 1),
    );
    assert_eq!(read.await.unwrap(), Some(true));

    // A stage with stale windows pays nothing more: a grant with the kept
    // result beside, a follower with it, the abandon that throttles the
    // next refresh (it reads the server's clock) and STALE in the
    // throttle.
    let stale = Ask {
        stale: true,
        ..Ask::default()
    };
    let f = fresh_flight();
    let g = owned(b.acquire(&f, &a, &t).await.unwrap());
    let args = CommitArgs {
        ttl: Duration::from_millis(1),
        stale_for: Duration::from_secs(30),
        ..commit_args(b"kept")
    };
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let r = tok();
    let refresh = costs(
        &redis,
        "ACQUIRE -> OWNER (grant, the kept result beside)",
        &[HMGET, TIME, HSET, PEXPIRE],
        b.acquire_with(&f, &r, stale, &t),
    );
    let g = match refresh.await.unwrap() {
        Acquired::Owner {
            generation,
            stale: Some(_),
            ..
        } => generation,
        other => panic!("expected OWNER with the kept result, got {other:?}"),
    };
    let (e, h) = (tok(), tok());
    let beside = costs(
        &redis,
        "ACQUIRE -> FOLLOWER (this node's first, the kept result beside)",
        &[HMGET, TIME, HSET],
        b.acquire_with(&f, &e, stale, &t),
    );
    assert!(matches!(
        beside.await.unwrap(),
        Acquired::Follower { stale: Some(_), .. }
    ));
    let retry = AbandonArgs {
        retry_after: Duration::from_secs(30),
        ..no_failure.clone()
    };
    let throttled = costs(
        &redis,
        "ABANDON -> RELEASED (throttles the next refresh, one node follows)",
        &[HMGET, TIME, HSET, PUBLISH],
        b.abandon(&f, &r, g, &retry),
    );
    assert_eq!(throttled.await.unwrap(), Released::Released);
    let answered = costs(
        &redis,
        "ACQUIRE -> STALE",
        &[HMGET, TIME],
        b.acquire_with(&f, &h, stale, &t),
    );
    assert!(matches!(answered.await.unwrap(), Acquired::Stale(_)));

    let no_takeover = LeaseTerms {
        allow_takeover: false,
        ..t
    };
    // These answers need the dead owner's record alive when the calls
    // land: an attempt whose answers came back past it (a stalled
    // machine) shows nothing and goes again on a fresh flight.
    let (redis, b, a, c) = (&redis, &b, &a, &c);
    conformance::conclusive("ACQUIRE -> EXPIRED, HEARTBEAT -> LOST", || async move {
        let f = fresh_flight();
        let record = Window::record(&no_takeover);
        let g = owned(b.acquire(&f, a, &no_takeover).await.unwrap());
        tokio::time::sleep(LEASE + LEASE / 4).await;
        reset(redis);
        let expired = b.acquire(&f, c, &no_takeover).await.unwrap();
        record.kept()?;
        assert_ran(redis, "ACQUIRE -> EXPIRED (dead owner)", &[HMGET, TIME]);
        assert_eq!(expired, Acquired::Expired { generation: g });
        reset(redis);
        let lost = b.heartbeat(&f, a, g, &t).await.unwrap();
        record.kept()?;
        assert_ran(redis, "HEARTBEAT -> LOST (lease ran out)", &[HMGET, TIME]);
        assert_eq!(lost, Renewal::Lost);
        Ok(())
    })
    .await;
}

/// The same budget through the L2 layer (whatever its flow does around
/// the scripts): an owner flight costs 8 inner commands, a hit 2, and a
/// follower whose node's inbox is in force one ACQUIRE (3 inner commands:
/// it adds the inbox) and nothing else before it waits: no SUBSCRIBE, no
/// PING, no re-check; the owner's COMMIT then tells it (4 + 1 `PUBLISH`).
#[tokio::test]
async fn owner_hit_and_follower_flights_keep_the_budget() {
    let redis = RedisServer::start().unwrap();
    let stage = StageName::new("budget").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let node = |b: RedisBackend| {
        let stage = stage.clone();
        let calls = calls.clone();
        // Heartbeats far apart: the counts show the protocol itself.
        let policy = DistributedPolicy::new()
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_secs(1))
            .call_timeout(Duration::from_millis(500))
            .replay_ttl(Duration::from_secs(60));
        let layer = DistributedFlightLayer::new(
            b,
            policy,
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
            move |req: &String| Some(FlightKey::from_bytes(stage.clone(), req)),
        )
        .unwrap();
        let flights = layer.flights().clone();
        let svc = layer.layer(service_fn(move |req: String| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(format!("v:{req}"))
            }
        }));
        (svc, flights)
    };
    // The owner's commit runs in the background after its callers have
    // their answer: every count waits for the flights to be idle.
    let ((a, a_flights), (b, b_flights)) =
        (node(backend(&redis).await), node(backend(&redis).await));
    let inner = |ran: &BTreeMap<String, u64>| -> u64 {
        ran.iter()
            .filter(|(name, _)| !matches!(name.as_str(), "evalsha" | "subscribe" | "ping"))
            .map(|(_, n)| n)
            .sum()
    };

    reset(&redis);
    assert_eq!(a.clone().oneshot("x".into()).await.unwrap(), "v:x");
    a_flights.idle().await;
    let owner = ran(&redis);
    assert_eq!(
        owner.get("evalsha"),
        Some(&2),
        "ACQUIRE + COMMIT: {owner:?}"
    );
    assert_eq!(inner(&owner), 8, "owner flight: {owner:?}");

    reset(&redis);
    assert_eq!(b.clone().oneshot("x".into()).await.unwrap(), "v:x");
    b_flights.idle().await;
    let hit = ran(&redis);
    assert_eq!(hit.get("evalsha"), Some(&1), "{hit:?}");
    assert_eq!(inner(&hit), 2, "hit: {hit:?}");

    let owner_call = tokio::spawn(a.clone().oneshot("y".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    reset(&redis);
    assert_eq!(b.clone().oneshot("y".into()).await.unwrap(), "v:y");
    owner_call.await.unwrap().unwrap();
    a_flights.idle().await;
    b_flights.idle().await;
    let window = ran(&redis);
    // The follower's one ACQUIRE and the owner's COMMIT.
    assert_eq!(window.get("evalsha"), Some(&2), "{window:?}");
    assert_eq!(window.get("subscribe"), None, "{window:?}");
    assert_eq!(window.get("ping"), None, "{window:?}");
    assert_eq!(window.get("publish"), Some(&1), "{window:?}");
    assert_eq!(inner(&window), 3 + 5, "follower window: {window:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    eprintln!(
        "inner commands: owner {} ({owner:?}), hit {}, follower window {} ({window:?})",
        inner(&owner),
        inner(&hit),
        inner(&window)
    );
}

/// Waits (5 s at most) until the commands Redis ran since the last reset
/// satisfy `done`, then 100 ms more, and returns them.
async fn ran_until(
    redis: &RedisServer,
    done: impl Fn(&BTreeMap<String, u64>) -> bool,
) -> BTreeMap<String, u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = ran(redis);
        if done(&now) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return ran(redis);
        }
        assert!(tokio::time::Instant::now() < deadline, "still {now:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A node's followers, its first included, send one ACQUIRE each and
/// nothing else before they wait, while the node's inbox is in force (it
/// was subscribed once, before their ACQUIREs were sent, and the ACQUIRE
/// that answers FOLLOWER adds it to the flight). When the subscriber's
/// connection is cut (messages may have been lost) every follower
/// re-checks, the inbox is subscribed again and confirmed, every follower
/// re-checks once more, and later followers send one ACQUIRE again. With a
/// channel per flight, a node's first follower sent ACQUIRE, SUBSCRIBE,
/// PING and a second ACQUIRE.
#[tokio::test]
async fn a_follower_sends_one_acquire_while_its_inbox_is_in_force() {
    let redis = RedisServer::start().unwrap();
    let stage = StageName::new("share").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    // Polls and heartbeats far apart: every count below is the protocol.
    let policy = DistributedPolicy::new()
        .lease(Duration::from_secs(30))
        .heartbeat(Duration::from_secs(10))
        .poll_interval(Duration::from_secs(20))
        .wait_timeout(Duration::from_secs(30))
        .call_timeout(Duration::from_secs(1));
    let node = |b: RedisBackend| {
        let (stage, calls, release) = (stage.clone(), calls.clone(), release.clone());
        let layer = DistributedFlightLayer::new(
            b,
            policy.clone(),
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
            move |req: &String| Some(FlightKey::from_bytes(stage.clone(), req)),
        )
        .unwrap();
        layer.layer(service_fn(move |req: String| {
            calls.fetch_add(1, Ordering::SeqCst);
            let release = release.clone();
            async move {
                release.notified().await;
                Ok::<_, Infallible>(format!("v:{req}"))
            }
        }))
    };
    let (a, b) = (node(backend(&redis).await), node(backend(&redis).await));
    let owner = tokio::spawn(a.clone().oneshot("x".to_owned()));
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let follower = || tokio::spawn(b.clone().oneshot("x".to_owned()));
    let scripts = |r: &BTreeMap<String, u64>| r.get("evalsha").copied().unwrap_or(0);

    reset(&redis);
    let mut followers = vec![follower()];
    let first = ran_until(&redis, |r| scripts(r) >= 1).await;
    assert_eq!(scripts(&first), 1, "one ACQUIRE: {first:?}");
    assert_eq!(first.get("subscribe"), None, "{first:?}");
    assert_eq!(first.get("ping"), None, "{first:?}");

    reset(&redis);
    followers.extend((0..10).map(|_| follower()));
    let more = ran_until(&redis, |r| scripts(r) >= 10).await;
    assert_eq!(scripts(&more), 10, "one ACQUIRE per follower: {more:?}");
    assert_eq!(more.get("subscribe"), None, "{more:?}");
    assert_eq!(more.get("ping"), None, "{more:?}");

    // The subscribers' connections are cut: each node subscribes its
    // inbox again, and the 11 followers re-check at the reconnect and
    // again once the inbox is confirmed.
    reset(&redis);
    redis.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    let healed = ran_until(&redis, |r| scripts(r) >= 22).await;
    assert_eq!(scripts(&healed), 22, "two re-checks each: {healed:?}");
    assert_eq!(healed.get("subscribe"), Some(&2), "{healed:?}");
    reset(&redis);
    followers.extend((0..5).map(|_| follower()));
    let after = ran_until(&redis, |r| scripts(r) >= 5).await;
    assert_eq!(scripts(&after), 5, "one ACQUIRE each again: {after:?}");
    assert_eq!(after.get("subscribe"), None, "{after:?}");

    release.notify_one();
    assert_eq!(owner.await.unwrap().unwrap(), "v:x");
    for (i, f) in followers.into_iter().enumerate() {
        assert_eq!(f.await.unwrap().unwrap(), "v:x", "follower {i}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A rolling upgrade: nodes of the first layout (its scripts, run by
/// hand) and of this one share one Redis and one prefix. Neither reads
/// the other's keys: each replays only the results its own layout stored,
/// so no node ever hands out the other layout's result or reads its
/// format; a flight asked of both at once runs once per layout (the
/// documented cost of a mixed deployment); and notices do not cross.
#[tokio::test]
async fn old_and_new_layouts_never_read_each_other() {
    let redis = RedisServer::start().unwrap();
    let new = backend(&redis).await;
    let old = Legacy::load(&plain_client(&redis).await, "fd").await;
    let t = conformance::terms(true);
    let word = |v: &Value| v.as_str().map(|s| s.into_owned()).unwrap_or_default();

    // The old layout commits a result; the new one does not see it.
    let f = fresh_flight();
    let answer = old.acquire(&f, "old-node").await;
    assert_eq!(word(&answer[0]), "OWNER");
    let old_gen = answer[1].as_i64().unwrap();
    let committed = old
        .commit(&f, "old-node", old_gen, Bytes::from_static(b"old result"))
        .await;
    assert_eq!(committed, "COMMITTED");
    let tok = OwnerToken::random();
    let g = match new.acquire(&f, &tok, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => generation,
        other => panic!("the new layout must not read the old one's result: {other:?}"),
    };
    // Another new node follows: its inbox hears the new commit.
    let other = backend(&redis).await;
    let mut sub = other.join_subscription(&f).expect("its inbox is in force");
    assert!(matches!(
        other.acquire(&f, &OwnerToken::random(), &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g
    ));
    assert_eq!(
        new.commit(&f, &tok, g, &commit_args(b"new result"))
            .await
            .unwrap(),
        Committed::Committed
    );
    // Each replays its own.
    match new.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => assert_eq!(&r.payload[..], b"new result"),
        other => panic!("expected the new layout's HIT, got {other:?}"),
    }
    let answer = old.acquire(&f, "another-old-node").await;
    assert_eq!(word(&answer[0]), "HIT");
    assert_eq!(answer[3].as_bytes(), Some(&b"old result"[..]));
    // The new follower heard the new commit, not the old one.
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), sub.recv())
            .await
            .unwrap(),
        Some(Notice::Committed {
            generation: g,
            inline: Some(Bytes::from_static(b"new result")),
            work_time: Some(Duration::ZERO),
            age: Duration::ZERO,
        })
    );

    // A new node holds the lease; an old node owns the same flight in its
    // own layout (it runs there too), and neither's commit touches the
    // other's result.
    let f = fresh_flight();
    let tok = OwnerToken::random();
    let g = owned(new.acquire(&f, &tok, &t).await.unwrap());
    let answer = old.acquire(&f, "old-node").await;
    assert_eq!(word(&answer[0]), "OWNER", "the layouts do not coordinate");
    let old_gen = answer[1].as_i64().unwrap();
    let committed = old
        .commit(&f, "old-node", old_gen, Bytes::from_static(b"old"))
        .await;
    assert_eq!(committed, "COMMITTED");
    assert!(matches!(
        new.acquire(&f, &OwnerToken::random(), &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g
    ));
    new.commit(&f, &tok, g, &commit_args(b"new")).await.unwrap();
    match new.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => assert_eq!(&r.payload[..], b"new"),
        other => panic!("expected HIT, got {other:?}"),
    }

    // No name is shared: three old keys and the old channel, one new key
    // and the new inboxes.
    let old_names = old.keys(&f);
    for name in [new.record_key(&f), new.inbox(&f), other.inbox(&f)] {
        assert!(!old_names.contains(&name), "{name}");
    }
    let Ok(flightdeck_harness::Resp::Array(Some(stored))) =
        redis.cmd(&["KEYS", &format!("fd:{{{}}}:*", f.to_hex())])
    else {
        panic!("KEYS answers an array");
    };
    assert_eq!(
        stored.len(),
        3,
        "old state + result, new record: {stored:?}"
    );
}

/// A rolling upgrade from the previous layout (`f2`, a channel per
/// flight): nodes of `f2` (its scripts, run by hand) and of this layout
/// share one Redis and one prefix. As with the first layout, neither reads
/// the other's record (the names differ): a flight asked of both at once
/// runs once per layout, each replays only its own result, and no node
/// hands out the other's or reads its format. Their messages do not
/// cross either: an `f2` commit publishes to its flight's channel, which
/// no inbox of this layout is, and this layout publishes only to inboxes.
#[tokio::test]
async fn f2_and_f3_layouts_never_read_each_other() {
    use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
    let redis = RedisServer::start().unwrap();
    let (new, other) = (backend(&redis).await, backend(&redis).await);
    let old = F2::load(&plain_client(&redis).await, "fd").await;
    let t = conformance::terms(true);
    let word = |v: &Value| v.as_str().map(|s| s.into_owned()).unwrap_or_default();
    let f = fresh_flight();
    // An `f2` follower's subscription to the flight's channel.
    let [_, f2_channel] = old.keys(&f);
    let f2_follower =
        fred::prelude::Builder::from_config(fred::prelude::Config::from_url(&redis.url()).unwrap())
            .build_subscriber_client()
            .unwrap();
    f2_follower.init().await.unwrap();
    let mut f2_heard = f2_follower.message_rx();
    f2_follower.subscribe(f2_channel.as_str()).await.unwrap();
    let _: Value = f2_follower.ping(None).await.unwrap();

    // Both layouts grant the flight: they do not coordinate.
    let answer = old.acquire(&f, "old-node").await;
    assert_eq!(word(&answer[0]), "OWNER");
    let old_gen = word(&answer[1]);
    let tok = OwnerToken::random();
    let g = match new.acquire(&f, &tok, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            ..
        } => generation,
        other => panic!("the new layout must not read the old one's lease: {other:?}"),
    };
    // A node of this layout follows this layout's grant.
    let mut sub = other.join_subscription(&f).expect("its inbox is in force");
    assert!(matches!(
        other.acquire(&f, &OwnerToken::random(), &t).await.unwrap(),
        Acquired::Follower { generation, .. } if generation == g
    ));

    // The `f2` commit reaches the `f2` channel only.
    let done = old
        .commit(&f, "old-node", &old_gen, Bytes::from_static(b"old"))
        .await;
    assert_eq!(done, "COMMITTED");
    let heard = tokio::time::timeout(Duration::from_secs(2), f2_heard.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        heard.value.as_bytes(),
        Some(format!("{old_gen}|c|old").as_bytes())
    );
    // This layout's commit reaches the follower's inbox, and is the first
    // thing it hears; nothing reaches the `f2` channel.
    new.commit(&f, &tok, g, &commit_args(b"new")).await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), sub.recv())
            .await
            .unwrap(),
        Some(Notice::Committed {
            generation: g,
            inline: Some(Bytes::from_static(b"new")),
            work_time: Some(Duration::ZERO),
            age: Duration::ZERO,
        })
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), f2_heard.recv())
            .await
            .is_err(),
        "a message of this layout reached the f2 channel"
    );

    // Each replays its own.
    match new.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => assert_eq!(&r.payload[..], b"new"),
        other => panic!("expected this layout's HIT, got {other:?}"),
    }
    let answer = old.acquire(&f, "another-old-node").await;
    assert_eq!(word(&answer[0]), "HIT");
    assert_eq!(answer[3].as_bytes(), Some(&b"old"[..]));
    let Ok(flightdeck_harness::Resp::Array(Some(stored))) =
        redis.cmd(&["KEYS", &format!("fd:{{{}}}:*", f.to_hex())])
    else {
        panic!("KEYS answers an array");
    };
    assert_eq!(stored.len(), 2, "one record per layout: {stored:?}");
    for name in [new.record_key(&f), new.inbox(&f), other.inbox(&f)] {
        assert!(!old.keys(&f).contains(&name), "{name}");
    }
    f2_follower.quit().await.unwrap();
}

/// A rolling upgrade from the previous layout (`f4`, no stale results):
/// an `f4` node (its scripts, run by hand) and a node of this layout
/// share one Redis and one prefix. Neither reads the other's record (the
/// names differ): each replays only its own result, so an `f4` node never
/// meets a record with fields it does not keep up (a throttle, a kept
/// result past its freshness), and this layout never reads a result
/// without its commit time.
#[tokio::test]
async fn f4_and_f5_layouts_never_read_each_other() {
    let redis = RedisServer::start().unwrap();
    let new = backend(&redis).await;
    let old = F4::load(&plain_client(&redis).await, "fd").await;
    let t = conformance::terms(true);
    let word = |v: &Value| v.as_str().map(|s| s.into_owned()).unwrap_or_default();
    let f = fresh_flight();
    let inbox = new.inbox(&f).replace(&format!(":{LAYOUT}:"), ":f4:");
    let answer = old.acquire(&f, "old-node", &inbox).await;
    assert_eq!(word(&answer[0]), "OWNER");
    let done = old
        .commit(
            &f,
            "old-node",
            &word(&answer[1]),
            Bytes::from_static(b"old"),
        )
        .await;
    assert_eq!(done, "COMMITTED");
    let tok = OwnerToken::random();
    let stale = Ask {
        stale: true,
        early: true,
        ..Ask::default()
    };
    let g = match new.acquire_with(&f, &tok, stale, &t).await.unwrap() {
        Acquired::Owner {
            generation,
            takeover: false,
            stale: None,
        } => generation,
        other => panic!("this layout must not read the f4 record: {other:?}"),
    };
    new.commit(&f, &tok, g, &commit_args(b"new")).await.unwrap();
    match new.acquire(&f, &OwnerToken::random(), &t).await.unwrap() {
        Acquired::Hit(r) => assert_eq!(&r.payload[..], b"new"),
        other => panic!("expected this layout's HIT, got {other:?}"),
    }
    let answer = old.acquire(&f, "another-old-node", &inbox).await;
    assert_eq!(word(&answer[0]), "HIT");
    assert_eq!(answer[3].as_bytes(), Some(&b"old"[..]));
    assert_ne!(old.record(&f), new.record_key(&f));
    let Ok(flightdeck_harness::Resp::Array(Some(stored))) =
        redis.cmd(&["KEYS", &format!("fd:{{{}}}:*", f.to_hex())])
    else {
        panic!("KEYS answers an array");
    };
    assert_eq!(stored.len(), 2, "one record per layout: {stored:?}");
}

/// What Redis ran for one phase of the measurement: `EVALSHA` calls,
/// their server time, and the inner commands of those scripts.
#[derive(Clone, Copy, Default)]
struct Phase {
    scripts: u64,
    usec: u64,
    inner: u64,
}

impl Phase {
    fn read(redis: &RedisServer) -> Self {
        let stats = commandstats(redis);
        let (scripts, usec) = stats.get("evalsha").copied().unwrap_or((0, 0));
        let all: u64 = ran(redis).values().sum();
        Self {
            scripts,
            usec,
            inner: all - scripts,
        }
    }
}

/// One layout's owner flights: ACQUIRE of `FLIGHTS` fresh flights, then
/// their COMMITs, each phase counted apart.
async fn owner_flights(
    redis: &RedisServer,
    new: &RedisBackend,
    old: &F4,
    legacy: bool,
    args: &CommitArgs,
) -> (Phase, Phase) {
    if !legacy {
        return owner_flights_at_once(redis, new, args, 1).await;
    }
    let flights: Vec<FlightId> = (0..FLIGHTS).map(|_| fresh_flight()).collect();
    let tok = OwnerToken::random();
    // The inbox an `f4` node names (as long as this layout's).
    let inbox = new
        .inbox(&flights[0])
        .replace(&format!(":{LAYOUT}:"), ":f4:");
    reset(redis);
    let mut gens = Vec::new();
    for f in &flights {
        let answer = old.acquire(f, tok.as_str(), &inbox).await;
        gens.push(answer[1].as_str().expect("a generation").into_owned());
    }
    let acquire = Phase::read(redis);
    reset(redis);
    for (f, g) in flights.iter().zip(&gens) {
        let done = old.commit(f, tok.as_str(), g, args.payload.clone()).await;
        assert_eq!(done, "COMMITTED");
    }
    let commit = Phase::read(redis);
    assert_eq!((acquire.scripts, commit.scripts), (FLIGHTS, FLIGHTS));
    (acquire, commit)
}

/// The median of measurements (an even count: the mean of the middle two).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
}

/// Flights per phase (fewer in debug builds, where this is only a check
/// that the measurement runs; measure with `--release`).
const FLIGHTS: u64 = if cfg!(debug_assertions) { 200 } else { 2000 };

/// For the record (printed, not asserted: a measurement, not a timed
/// test): Redis server time per owner flight (ACQUIRE + COMMIT, the
/// `usec` of `EVALSHA` in `INFO commandstats`) of the previous layout's
/// scripts (`f4`, kept in `legacy::f4`) and of this one's, alternating in
/// one run on one server (which goes first alternates too), with a small
/// (64 B) and a larger (4 KiB) result; then the median of the rounds. The
/// inner command counts are checked on the way (8 per owner flight in
/// both).
#[tokio::test]
async fn measure_server_time_per_owner_flight_old_and_new() {
    const ROUNDS: usize = 6;
    let redis = RedisServer::start().unwrap();
    let new = backend(&redis).await;
    let old = F4::load(&plain_client(&redis).await, "fd").await;
    let per = |us: u64| us as f64 / FLIGHTS as f64;
    for size in [64usize, 4096] {
        let args = CommitArgs {
            payload: Bytes::from(vec![b'r'; size]),
            ..commit_args(b"")
        };
        let mut rows = Vec::new();
        let (mut olds, mut news) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut run = [(true, None), (false, None)];
            if round % 2 == 1 {
                run.reverse();
            }
            for (legacy, out) in &mut run {
                *out = Some(owner_flights(&redis, &new, &old, *legacy, &args).await);
            }
            let get = |legacy: bool| {
                run.iter()
                    .find(|(l, _)| *l == legacy)
                    .and_then(|(_, out)| *out)
                    .unwrap()
            };
            let ((oa, oc), (na, nc)) = (get(true), get(false));
            assert_eq!(oa.inner + oc.inner, 8 * FLIGHTS, "f4: 8 inner calls");
            assert_eq!(na.inner + nc.inner, 8 * FLIGHTS, "8 inner calls");
            olds.push(per(oa.usec + oc.usec));
            news.push(per(na.usec + nc.usec));
            rows.push(format!(
                "  round {round}: old {:.1} us (ACQUIRE {:.1} + COMMIT {:.1}; {} inner calls) | \
                 new {:.1} us (ACQUIRE {:.1} + COMMIT {:.1}; {} inner calls)",
                per(oa.usec + oc.usec),
                per(oa.usec),
                per(oc.usec),
                (oa.inner + oc.inner) / FLIGHTS,
                per(na.usec + nc.usec),
                per(na.usec),
                per(nc.usec),
                (na.inner + nc.inner) / FLIGHTS,
            ));
        }
        let (o, n) = (median(&mut olds), median(&mut news));
        eprintln!(
            "Redis server time per owner flight (ACQUIRE + COMMIT), {size} B result, {FLIGHTS} \
             fresh flights per phase:\n{}\n  median of {ROUNDS} rounds: old {o:.1} us, new {n:.1} us \
             ({:.2}x)",
            rows.join("\n"),
            n / o
        );
    }
}

/// The owner flights of this layout on `tasks` tasks at once, each taking
/// its share of `FLIGHTS` fresh flights one after the other: ACQUIRE of
/// all, then COMMIT of all, each phase counted apart.
async fn owner_flights_at_once(
    redis: &RedisServer,
    b: &RedisBackend,
    args: &CommitArgs,
    tasks: usize,
) -> (Phase, Phase) {
    // As the first layout's runner: 30 s leases (the phases take a while).
    let t = LeaseTerms {
        lease: Duration::from_secs(30),
        state_ttl: Duration::from_secs(120),
        allow_takeover: true,
    };
    let tok = OwnerToken::random();
    let flights: Vec<FlightId> = (0..FLIGHTS).map(|_| fresh_flight()).collect();
    let shares: Vec<Vec<FlightId>> = flights
        .chunks(flights.len().div_ceil(tasks))
        .map(<[FlightId]>::to_vec)
        .collect();
    reset(redis);
    let mut granted = tokio::task::JoinSet::new();
    for share in shares {
        let (b, tok) = (b.clone(), tok.clone());
        granted.spawn(async move {
            let mut out = Vec::with_capacity(share.len());
            for f in share {
                let g = owned(b.acquire(&f, &tok, &t).await.unwrap());
                out.push((f, g));
            }
            out
        });
    }
    let granted: Vec<Vec<(FlightId, u64)>> = granted.join_all().await;
    let acquire = Phase::read(redis);
    reset(redis);
    let mut committed = tokio::task::JoinSet::new();
    for share in granted {
        let (b, tok, args) = (b.clone(), tok.clone(), args.clone());
        committed.spawn(async move {
            for (f, g) in share {
                let done = b.commit(&f, &tok, g, &args).await.unwrap();
                assert_eq!(done, Committed::Committed);
            }
        });
    }
    committed.join_all().await;
    let commit = Phase::read(redis);
    assert_eq!((acquire.scripts, commit.scripts), (FLIGHTS, FLIGHTS));
    assert_eq!(
        acquire.inner + commit.inner,
        8 * FLIGHTS,
        "8 inner calls per owner flight"
    );
    (acquire, commit)
}

/// For the record (printed, not asserted): Redis server time per owner
/// flight (ACQUIRE + COMMIT, the `usec` of `EVALSHA`) when the server
/// idles between calls (one flight at a time) and when it is kept busy
/// (64 tasks on one client), alternating in one run, which goes first
/// alternating too; then the median of the rounds. A server that idles
/// between calls runs each one from cold caches; the busy figure is the
/// one that bounds a node's flights per second.
#[tokio::test]
async fn measure_server_time_per_owner_flight_idle_and_busy() {
    const ROUNDS: usize = 6;
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let per = |us: u64| us as f64 / FLIGHTS as f64;
    for size in [64usize, 4096] {
        let args = CommitArgs {
            payload: Bytes::from(vec![b'r'; size]),
            ..commit_args(b"")
        };
        let (mut idle, mut busy, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut order = [1, 64];
            if round % 2 == 1 {
                order.reverse();
            }
            for tasks in order {
                let (a, c) = owner_flights_at_once(&redis, &b, &args, tasks).await;
                let total = per(a.usec + c.usec);
                rows.push(format!(
                    "  round {round}, {tasks:>2} task(s): {total:.1} us (ACQUIRE {:.1} + COMMIT {:.1})",
                    per(a.usec),
                    per(c.usec)
                ));
                if tasks == 1 { &mut idle } else { &mut busy }.push(total);
            }
        }
        let (i, k) = (median(&mut idle), median(&mut busy));
        eprintln!(
            "Redis server time per owner flight, {size} B result, {FLIGHTS} fresh flights per \
             phase:\n{}\n  median of {ROUNDS} rounds: idle server {i:.1} us, busy server {k:.1} us",
            rows.join("\n")
        );
    }
}

/// Every number the scripts write is a whole number in plain digits: a
/// generation past the clock (`g + 1`, 16 digits, beyond Lua's 14
/// significant digits of `tostring`), the lease's deadline, the stored
/// result's times and the record's life, after a grant and a commit.
#[tokio::test]
async fn the_scripts_write_whole_numbers_in_plain_digits() {
    use fred::interfaces::{HashesInterface, KeysInterface};
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let plain = plain_client(&redis).await;
    let f = fresh_flight();
    let record = b.record_key(&f);
    // A record whose last generation is ahead of the server's clock (in
    // the year 2033), its grant ended: the next grant takes `g + 1`.
    let ahead: u64 = 1_999_999_999_999_999;
    let _: () = plain
        .hset(
            record.as_str(),
            [("g", ahead.to_string()), ("d", "0".to_owned())],
        )
        .await
        .unwrap();
    let _: () = plain.pexpire(record.as_str(), 60_000, None).await.unwrap();

    let a = OwnerToken::random();
    let g = owned(b.acquire(&f, &a, &conformance::terms(true)).await.unwrap());
    assert_eq!(g, ahead + 1);
    let digits = |v: &Option<String>| {
        v.as_deref()
            .is_some_and(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
    };
    let fields: Vec<Option<String>> = plain.hmget(record.as_str(), vec!["g", "d"]).await.unwrap();
    assert_eq!(fields[0].as_deref(), Some("2000000000000000"));
    assert!(digits(&fields[1]), "lease deadline {:?}", fields[1]);

    let args = commit_args(b"a result");
    assert_eq!(
        b.commit(&f, &a, g, &args).await.unwrap(),
        Committed::Committed
    );
    let fields: Vec<Option<String>> = plain
        .hmget(record.as_str(), vec!["rg", "fu", "su", "ku", "ct"])
        .await
        .unwrap();
    assert_eq!(fields[0].as_deref(), Some("2000000000000000"));
    for (name, v) in ["fu", "su", "ku", "ct"].iter().zip(&fields[1..]) {
        assert!(digits(v), "{name} = {v:?}");
    }
    let ttl: i64 = plain.pttl(record.as_str()).await.unwrap();
    assert!(ttl > 0, "the record has a life: {ttl}");
}

/// On a 32-bit Redis build a C `long` cannot hold a millisecond time, and
/// Lua's `%d` writes a clipped number: ACQUIRE refuses to grant a lease it
/// would write wrong, with a protocol error, and writes nothing. CI's
/// servers are 64-bit, so the script runs here with `string.format`'s
/// `%d` clipped as a 32-bit build clips it.
#[tokio::test]
async fn a_32_bit_server_grants_nothing_and_says_why() {
    use fred::interfaces::{KeysInterface, LuaInterface};
    let redis = RedisServer::start().unwrap();
    let b = backend(&redis).await;
    let plain = plain_client(&redis).await;
    let source = flightdeck_redis::scripts::ACQUIRE;
    let (shebang, body) = source.split_once('\n').unwrap();
    let clipped = format!(
        "{shebang}\n\
         local format64 = string.format\n\
         local string = setmetatable({{format = function(f, x, ...)\n\
           if f == '%d' and x >= 2^31 then return '2147483647' end\n\
           return format64(f, x, ...)\n\
         end}}, {{__index = string}})\n\
         {body}"
    );
    // ACQUIRE(packed, inbox), `packed` holding tok, lease_ms, record_ms,
    // follows, not_after, takeover_ok, stale, early in `struct`'s format
    // `<I4c0ddddBBB`.
    let packed = [
        &6u32.to_le_bytes()[..],
        b"tok-32",
        &2200f64.to_le_bytes(),
        &2200f64.to_le_bytes(),
        &(-1f64).to_le_bytes(),
        &(-1f64).to_le_bytes(),
        &[1, 0, 0],
    ]
    .concat();
    let args = || vec![Bytes::from(packed.clone()), Bytes::new()];
    let f = fresh_flight();
    let record = b.record_key(&f);
    let refused: Result<Value, _> = plain
        .eval(clipped.as_str(), vec![record.as_str()], args())
        .await;
    let e = refused.expect_err("a clipped lease is not granted");
    assert!(
        e.details()
            .starts_with("FDPROTO this server formats integers in 32 bits"),
        "{e}"
    );
    let written: i64 = plain.exists(record.as_str()).await.unwrap();
    assert_eq!(written, 0, "nothing written");
    // The same script on the same server, `%d` as this build has it: a grant.
    let granted: Value = plain
        .eval(source, vec![record.as_str()], args())
        .await
        .unwrap();
    let Value::Array(items) = granted else {
        panic!("{granted:?}")
    };
    assert_eq!(items[0].as_str().as_deref(), Some("OWNER"));
}
