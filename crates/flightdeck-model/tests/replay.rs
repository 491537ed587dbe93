//! The model and the Lua scripts stay in step: runs of the model are
//! replayed against the real scripts, through `RedisBackend`, on a real
//! Redis, and every answer and every notice must be the model's.
//!
//! The server's time is the model's: a lease of one tick is a lease of
//! `MS_PER_TICK` ms, far longer than a replay takes, and a tick of the
//! model moves every time the record holds (the lease deadline `d`, the
//! result's commit time, freshness, stale window and retention, a
//! throttle's end, a cached failure's time and end) and every key's
//! expiry of the flight one tick closer,
//! in one script; a record due at that tick is deleted, as the model's
//! is. A failover copies the replica's keys over the
//! flight's (the replica is a copy the model's replication step made),
//! then moves the clock a tick on, less the ticks the new primary's clock
//! is behind. Generations are the server's own (`TIME` in µs): they must
//! be ordered as the model's are, one real generation for each of the
//! model's.

use std::time::Duration;

use bytes::Bytes;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Ask, Backend, BackendErrorKind, CommitArgs, Committed, LeaseTerms,
    Released, Renewal, ResultStatus, StoredResult,
};
use flightdeck_distributed::{FlightId, OwnerToken};
use flightdeck_harness::RedisServer;
use flightdeck_model::model::{server_steps, Action, Config, ProtocolModel, ServerStep};
use flightdeck_model::server::{Answer, Body, Call, Gen, Notice, Res, Status, Tick, Tok};
use flightdeck_redis::{RedisBackend, RedisConfig};
use fred::clients::SubscriberClient;
use fred::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stateright::Model;

/// One tick of the model on the real server.
const MS_PER_TICK: u64 = 100_000;

/// Moves the flight's deadlines, times and expiries `ARGV[1]` ms closer
/// (a negative shift moves them away); deletes what falls due. A field
/// that is absent, or `0` where `0` means "none" (`d`, `ra`, `eu`),
/// stays.
const SHIFT: &str = r"
local by = tonumber(ARGV[1])
for i = 1, #KEYS do
  local k = KEYS[i]
  local pttl = redis.call('PTTL', k)
  if pttl ~= -2 then
    if pttl >= 0 and pttl - by <= 0 then
      redis.call('DEL', k)
    else
      if pttl >= 0 then
        redis.call('PEXPIRE', k, pttl - by)
      end
      if redis.call('TYPE', k).ok == 'hash' then
        for _, f in ipairs({'d', 'ra', 'eu', 'ct', 'fu', 'su', 'ku', 'ec'}) do
          local v = redis.call('HGET', k, f)
          if v and not ((f == 'd' or f == 'ra' or f == 'eu') and v == '0') then
            redis.call('HSET', k, f, string.format('%.0f', tonumber(v) - by))
          end
        end
      end
    end
  end
end
return 1
";

/// Copies `KEYS[1]` over `KEYS[2]`, TTL and all (deletes `KEYS[2]` when
/// `KEYS[1]` is absent).
const COPY: &str = r"
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('COPY', KEYS[1], KEYS[2])
end
return 1
";

/// The model's not-after `tick`, at the model's `now`, as an instant:
/// the end of that tick's first half (the server's clock now is `now`'s
/// start), so a not-after of this tick is not reached and one of an
/// earlier tick is past.
fn not_after(tick: Tick, now: Tick) -> tokio::time::Instant {
    let half = MS_PER_TICK / 2;
    let at = tokio::time::Instant::now();
    if tick >= now {
        at + Duration::from_millis((u64::from(tick - now)) * MS_PER_TICK + half)
    } else {
        let back = Duration::from_millis(u64::from(now - tick) * MS_PER_TICK - half);
        at.checked_sub(back).unwrap_or(at)
    }
}

fn ms(ticks: Tick) -> Duration {
    Duration::from_millis(u64::from(ticks) * MS_PER_TICK)
}

fn token(tok: Tok) -> OwnerToken {
    OwnerToken::from_string(format!("model-token-{tok}"))
}

fn body_bytes(body: Body) -> Bytes {
    Bytes::from(match body {
        Body::Value(t) => format!("value-{t}"),
        Body::Failure(t) => format!("failure-{t}"),
    })
}

fn body_of(bytes: &[u8]) -> Body {
    let text = std::str::from_utf8(bytes).expect("a body the replay wrote");
    let (kind, tok) = text.split_once('-').expect("a body the replay wrote");
    let tok = tok.parse().expect("a body the replay wrote");
    match kind {
        "value" => Body::Value(tok),
        _ => Body::Failure(tok),
    }
}

/// The model's generations and the server's, one for one, ordered alike.
#[derive(Default)]
struct Gens(Vec<(Gen, u64)>);

impl Gens {
    fn real(&self, gen: Gen) -> u64 {
        if gen == 0 {
            return 0;
        }
        self.0
            .iter()
            .find(|&&(m, _)| m == gen)
            .map(|&(_, r)| r)
            .unwrap_or_else(|| panic!("generation {gen} was never answered"))
    }

    /// The real generation `real` stands for the model's `model`.
    fn pair(&mut self, model: Gen, real: u64) -> Result<(), String> {
        if model == 0 || real == 0 {
            return if u64::from(model) == real {
                Ok(())
            } else {
                Err(format!("generation {real} where the model has {model}"))
            };
        }
        for &(m, r) in &self.0 {
            if (m == model) != (r == real) || (m < model) != (r < real) {
                return Err(format!(
                    "generation {real} for the model's {model}, but {r} for its {m}"
                ));
            }
        }
        if !self.0.contains(&(model, real)) {
            self.0.push((model, real));
        }
        Ok(())
    }
}

struct Replay {
    server: RedisServer,
    backends: Vec<RedisBackend>,
    inboxes: Vec<String>,
    subscriber: SubscriberClient,
    messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    config: Config,
}

impl Replay {
    async fn start(config: Config) -> Self {
        let server = RedisServer::start().expect("redis-server starts");
        let mut backends = Vec::new();
        for _ in 0..config.nodes {
            let b = RedisBackend::connect(RedisConfig::new(server.url()).prefix("model"))
                .await
                .expect("connects");
            backends.push(b);
        }
        let probe = FlightId::of(&FlightKey::from_bytes(
            StageName::new("model").unwrap(),
            "any",
        ));
        // Each backend hears the server's clock once (an ACQUIRE's answer
        // carries it), so its ACQUIREs carry their not-after from the
        // first the replay sends.
        for b in &backends {
            let terms = LeaseTerms {
                lease: Duration::from_millis(1),
                state_ttl: Duration::from_millis(1),
                allow_takeover: true,
            };
            b.acquire(&probe, &OwnerToken::random(), &terms)
                .await
                .expect("the first ACQUIRE is answered");
        }
        let inboxes: Vec<String> = backends.iter().map(|b| b.inbox(&probe)).collect();
        let subscriber =
            Builder::from_config(fred::types::config::Config::from_url(&server.url()).unwrap())
                .build_subscriber_client()
                .unwrap();
        subscriber.init().await.expect("the subscriber connects");
        let messages = subscriber.message_rx();
        subscriber
            .subscribe(inboxes.clone())
            .await
            .expect("subscribes");
        Self {
            server,
            backends,
            inboxes,
            subscriber,
            messages,
            config,
        }
    }

    fn terms(&self) -> LeaseTerms {
        let t = &self.config.terms;
        LeaseTerms {
            lease: ms(t.lease),
            state_ttl: ms(t.state_ttl),
            allow_takeover: t.takeover,
        }
    }

    fn eval(&self, script: &str, keys: &[&str], args: &[&str]) {
        let n = keys.len().to_string();
        let mut cmd = vec!["EVAL", script, &n];
        cmd.extend_from_slice(keys);
        cmd.extend_from_slice(args);
        let reply = self.server.cmd(&cmd).expect("the server answers");
        assert_eq!(reply, flightdeck_harness::Resp::Int(1), "{cmd:?}");
    }

    /// Runs `steps` on a flight of its own; the first difference from the
    /// model, with the steps up to it.
    async fn run(&mut self, flight: &FlightId, steps: &[ServerStep]) -> Result<(), String> {
        let record = self.backends[0].record_key(flight);
        let keys = [
            record.clone(),
            format!("{record}:i"),
            format!("{record}:replica"),
            format!("{record}:i:replica"),
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut gens = Gens::default();
        // The model's clock (its first state's is 1).
        let mut now: Tick = 1;
        for (i, step) in steps.iter().enumerate() {
            let at = || {
                steps[..=i]
                    .iter()
                    .map(|s| format!("  {s}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            match step {
                ServerStep::Run {
                    node,
                    call,
                    answer,
                    notices,
                } => {
                    let real = self.call(flight, *node, *call, now, &gens).await;
                    let real = match real {
                        Ok(r) => r,
                        Err(e) => return Err(format!("{e}\nafter:\n{}", at())),
                    };
                    self.same(&mut gens, *answer, real)
                        .map_err(|e| format!("{e}\nafter:\n{}", at()))?;
                    let heard = self.notices(&record, notices.len()).await;
                    let heard = heard.map_err(|e| format!("{e}\nafter:\n{}", at()))?;
                    let mut want = notices.clone();
                    want.sort();
                    let mut got = Vec::new();
                    for (node, real_gen, body) in heard {
                        let gen = want
                            .iter()
                            .find(|m| gens.real(m.gen) == real_gen)
                            .map_or(Gen::MAX, |m| m.gen);
                        got.push(Notice { node, gen, body });
                    }
                    got.sort();
                    if got != want {
                        return Err(format!(
                            "notices {got:?}, the model's {want:?}\nafter:\n{}",
                            at()
                        ));
                    }
                }
                ServerStep::Tick => {
                    now += 1;
                    self.eval(SHIFT, &keys, &[&MS_PER_TICK.to_string()]);
                }
                ServerStep::Replicate => {
                    self.eval(COPY, &[keys[0], keys[2]], &[]);
                    self.eval(COPY, &[keys[1], keys[3]], &[]);
                }
                ServerStep::Failover { behind } => {
                    self.eval(COPY, &[keys[2], keys[0]], &[]);
                    self.eval(COPY, &[keys[3], keys[1]], &[]);
                    now = now + 1 - *behind;
                    let by = (1 - i64::from(*behind)) * MS_PER_TICK as i64;
                    self.eval(SHIFT, &keys, &[&by.to_string()]);
                }
            }
        }
        Ok(())
    }

    /// Runs `call` as `node`'s backend does; the answer in the model's
    /// terms, its generations still the server's.
    async fn call(
        &self,
        flight: &FlightId,
        node: u8,
        call: Call,
        now: Tick,
        gens: &Gens,
    ) -> Result<Real, String> {
        let b = &self.backends[usize::from(node)];
        let t = &self.config.terms;
        let terms = self.terms();
        let fail = |e: flightdeck_distributed::backend::BackendError| format!("{call:?}: {e}");
        Ok(match call {
            Call::Acquire(tok, ask) => {
                let ask = Ask {
                    follows: ask.follows.map(|f| gens.real(f)),
                    recheck: ask.follows.is_some(),
                    stale: ask.stale,
                    early: ask.early,
                    not_after: ask.not_after.map(|t| not_after(t, now)),
                };
                match b.acquire_with(flight, &token(tok), ask, &terms).await {
                    Ok(a) => Real::Acquired(a),
                    Err(e) if e.kind() == BackendErrorKind::Unavailable => Real::Late,
                    Err(e) => return Err(fail(e)),
                }
            }
            Call::Heartbeat(tok, gen) => Real::Renewal(
                b.heartbeat(flight, &token(tok), gens.real(gen), &terms)
                    .await
                    .map_err(fail)?,
            ),
            Call::Commit(tok, gen) => {
                let args = CommitArgs {
                    payload: body_bytes(Body::Value(tok)),
                    ttl: ms(t.result_ttl),
                    retain: ms(t.retain),
                    inline_below: 1024,
                    state_ttl: ms(t.state_ttl),
                    stale_for: ms(t.stale_for),
                    work_time: ms(t.work_time),
                    sent: None,
                };
                Real::Committed(
                    b.commit(flight, &token(tok), gens.real(gen), &args)
                        .await
                        .map_err(fail)?,
                )
            }
            Call::Abandon(tok, gen, failed) => {
                let args = AbandonArgs {
                    failure: failed.then(|| body_bytes(Body::Failure(tok))),
                    failure_ttl: if failed {
                        ms(t.failure_ttl)
                    } else {
                        Duration::ZERO
                    },
                    retry_after: if failed {
                        ms(t.retry_after)
                    } else {
                        Duration::ZERO
                    },
                    state_ttl: ms(t.state_ttl),
                };
                Real::Released(
                    b.abandon(flight, &token(tok), gens.real(gen), &args)
                        .await
                        .map_err(fail)?,
                )
            }
            Call::Release(tok) => Real::Released(
                b.release(flight, &token(tok), ms(t.state_ttl))
                    .await
                    .map_err(fail)?,
            ),
            Call::Invalidate => {
                Real::Invalidated(b.invalidate(flight, ms(t.state_ttl)).await.map_err(fail)?)
            }
        })
    }

    fn same(&self, gens: &mut Gens, model: Answer, real: Real) -> Result<(), String> {
        let differ = || format!("answer {real:?}, the model's {model:?}");
        let ok = match (model, &real) {
            (Answer::Hit(res), Real::Acquired(Acquired::Hit(r)))
            | (Answer::Stale(res), Real::Acquired(Acquired::Stale(r))) => {
                same_result(gens, res, r)?
            }
            (
                Answer::Owner(g, takeover, res),
                Real::Acquired(Acquired::Owner {
                    generation,
                    takeover: t,
                    stale,
                }),
            ) => {
                gens.pair(g, *generation)?;
                takeover == *t && same_beside(gens, res, stale.as_ref())?
            }
            (
                Answer::Follower(g, left, res),
                Real::Acquired(Acquired::Follower {
                    generation,
                    lease_remaining,
                    stale,
                }),
            ) => {
                gens.pair(g, *generation)?;
                let ticks = lease_remaining
                    .as_millis()
                    .div_ceil(u128::from(MS_PER_TICK));
                ticks == u128::from(left) && same_beside(gens, res, stale.as_ref())?
            }
            (Answer::Expired(g), Real::Acquired(Acquired::Expired { generation })) => {
                gens.pair(g, *generation)?;
                true
            }
            (Answer::Late, Real::Late) => true,
            (Answer::Renewed, Real::Renewal(Renewal::Renewed))
            | (Answer::Lost, Real::Renewal(Renewal::Lost))
            | (Answer::Committed, Real::Committed(Committed::Committed))
            | (Answer::Fenced, Real::Committed(Committed::Fenced))
            | (Answer::Released, Real::Released(Released::Released))
            | (Answer::NotOwner, Real::Released(Released::NotOwner)) => true,
            (Answer::Invalidated(g), Real::Invalidated(generation)) => {
                gens.pair(g, *generation)?;
                true
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(differ())
        }
    }

    /// The notices published since the last call: (node, generation,
    /// body). Waits until `want` came, then a PING on the subscriber's
    /// connection makes sure nothing more is on its way.
    async fn notices(
        &mut self,
        record: &str,
        want: usize,
    ) -> Result<Vec<(u8, u64, Option<Body>)>, String> {
        let mut got = Vec::new();
        for _ in 0..200 {
            let _: Value = self
                .subscriber
                .ping(None)
                .await
                .map_err(|e| e.to_string())?;
            while let Ok(msg) = self.messages.try_recv() {
                let node = self
                    .inboxes
                    .iter()
                    .position(|i| i.as_str() == &*msg.channel)
                    .ok_or_else(|| format!("a message on {}", msg.channel))?;
                let text = msg
                    .value
                    .as_bytes()
                    .ok_or("a message without bytes")?
                    .to_vec();
                let text = String::from_utf8(text).map_err(|e| e.to_string())?;
                let mut parts = text.splitn(4, '|');
                let (rec, gen, kind, payload) =
                    (parts.next(), parts.next(), parts.next(), parts.next());
                if rec != Some(record) {
                    return Err(format!("a notice of another record: {text}"));
                }
                let gen: u64 = gen
                    .and_then(|g| g.parse().ok())
                    .ok_or(format!("notice {text}"))?;
                // `c<work_ms>,<age_ms>`: the work's time and the result's
                // age ride along (not modelled).
                let committed = kind.and_then(|k| k.strip_prefix('c')).is_some_and(|ms| {
                    ms.split(',').count() == 2 && ms.split(',').all(|n| n.parse::<u64>().is_ok())
                });
                let body = match (kind, payload) {
                    (Some(_), Some(p)) if committed => Some(body_of(p.as_bytes())),
                    (Some("a"), None) => None,
                    _ => return Err(format!("notice {text}")),
                };
                got.push((node as u8, gen, body));
            }
            if got.len() >= want {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(got)
    }
}

/// Whether the real result is the model's: generation, status, body, and
/// its age (whole ticks: the replay takes far less than one), TTL and
/// work time by the server's clock.
fn same_result(gens: &mut Gens, model: Res, real: &StoredResult) -> Result<bool, String> {
    gens.pair(model.gen, real.generation)?;
    let status = match real.status {
        ResultStatus::Ok => Status::Ok,
        ResultStatus::Failed => Status::Err,
    };
    let age = real.age.as_millis() / u128::from(MS_PER_TICK);
    Ok(status == model.status
        && body_of(&real.payload) == model.body
        && age == u128::from(model.age)
        && real.ttl == ms(model.ttl)
        && real.work_time == ms(model.work))
}

/// Whether the result beside an OWNER or FOLLOWER answer is the model's.
fn same_beside(
    gens: &mut Gens,
    model: Option<Res>,
    real: Option<&StoredResult>,
) -> Result<bool, String> {
    match (model, real) {
        (None, None) => Ok(true),
        (Some(m), Some(r)) => same_result(gens, m, r),
        _ => Ok(false),
    }
}

#[derive(Debug)]
enum Real {
    Acquired(Acquired),
    /// An ACQUIRE refused as run past its not-after (`LATE`).
    Late,
    Renewal(Renewal),
    Committed(Committed),
    Released(Released),
    Invalidated(u64),
}

/// A random run of the model: `len` steps at most, the server's steps
/// drawn more often than the clients' (they are what the replay checks).
fn walk(model: &ProtocolModel, rng: &mut StdRng, len: usize) -> Vec<Action> {
    let mut state = model.init_states().remove(0);
    let mut path = Vec::new();
    let mut actions = Vec::new();
    while path.len() < len && model.within_boundary(&state) {
        actions.clear();
        model.actions(&state, &mut actions);
        if !rng.random_bool(0.02) {
            actions.retain(|a| *a != Action::Settle);
        }
        if actions.is_empty() {
            break;
        }
        let runs: Vec<Action> = actions
            .iter()
            .copied()
            .filter(|a| matches!(a, Action::Run(_)))
            .collect();
        let action = if !runs.is_empty() && rng.random_bool(0.4) {
            runs[rng.random_range(0..runs.len())]
        } else {
            actions[rng.random_range(0..actions.len())]
        };
        model.step(&mut state, action);
        path.push(action);
    }
    path
}

async fn replay_walks(config: Config, seed: u64, walks: usize) {
    let model = ProtocolModel::new(config);
    let mut replay = Replay::start(config).await;
    let stage = StageName::new("model").unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps_run = 0;
    // Answers with a result beside a grant or FOLLOWER, or STALE.
    let mut kept = 0;
    for i in 0..walks {
        let actions = walk(&model, &mut rng, 80);
        let steps = server_steps(&model, &actions);
        steps_run += steps.len();
        kept += steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    ServerStep::Run {
                        answer: Answer::Owner(_, _, Some(_))
                            | Answer::Follower(_, _, Some(_))
                            | Answer::Stale(_),
                        ..
                    }
                )
            })
            .count();
        let flight = FlightId::of(&FlightKey::from_bytes(stage.clone(), format!("{seed}-{i}")));
        if let Err(e) = replay.run(&flight, &steps).await {
            panic!("walk {i} of seed {seed} differs from the model: {e}\nactions: {actions:?}");
        }
    }
    println!("{walks} walks, {steps_run} server steps replayed, {kept} answers with a kept result");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_runs_give_the_scripts_answers() {
    replay_walks(Config::small(), 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_runs_without_takeover_give_the_scripts_answers() {
    let mut config = Config::small();
    config.terms.takeover = false;
    config.terms.lease = 2;
    config.terms.state_ttl = 4;
    replay_walks(config, 2, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_runs_kept_for_waiters_give_the_scripts_answers() {
    let mut config = Config::small();
    config.terms.result_ttl = 0;
    config.terms.retain = 3;
    replay_walks(config, 3, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_runs_with_stale_windows_give_the_scripts_answers() {
    let mut config = Config {
        stale_windows: true,
        early: 2,
        ..Config::small()
    };
    config.terms.retain = 1;
    config.terms.stale_for = 2;
    config.terms.retry_after = 1;
    replay_walks(config, 4, 4000).await;
}
