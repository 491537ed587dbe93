//! The first key layout's scripts, verbatim from the release before the
//! one-key layout, and a minimal client for them: what a node of that
//! version does to Redis, for the mixed-layout tests and the old/new
//! server-time comparison. Test-only: the backend never runs these.

#![allow(dead_code)]

pub(crate) mod f2;
pub(crate) mod f4;

use bytes::Bytes;
use flightdeck_distributed::FlightId;
use fred::prelude::*;

/// A node of the first layout: its keys `{prefix}:{h}:lease|state|result`
/// and channel `{prefix}:{h}:done`.
pub(crate) struct Legacy {
    client: Client,
    prefix: String,
    acquire: String,
    commit: String,
}

impl Legacy {
    /// Loads the first layout's ACQUIRE and COMMIT on `client`'s server.
    pub(crate) async fn load(client: &Client, prefix: &str) -> Self {
        Self {
            client: client.clone(),
            prefix: prefix.to_owned(),
            acquire: client.script_load(ACQUIRE).await.expect("SCRIPT LOAD"),
            commit: client.script_load(COMMIT).await.expect("SCRIPT LOAD"),
        }
    }

    /// The first layout's key names of a flight.
    pub(crate) fn keys(&self, flight: &FlightId) -> Vec<String> {
        let (p, h) = (&self.prefix, flight.to_hex());
        ["lease", "state", "result", "done"]
            .iter()
            .map(|k| format!("{p}:{{{h}}}:{k}"))
            .collect()
    }

    /// ACQUIRE with a 30 s lease and state: the script's raw answer.
    pub(crate) async fn acquire(&self, flight: &FlightId, token: &str) -> Vec<Value> {
        let args: Vec<Value> = vec![token.into(), 30_000.into(), "1".into(), 120_000.into()];
        self.client
            .evalsha(&self.acquire, self.keys(flight), args)
            .await
            .expect("old ACQUIRE")
    }

    /// COMMIT with a 30 s result TTL, inline below 1 KiB.
    pub(crate) async fn commit(
        &self,
        flight: &FlightId,
        token: &str,
        generation: i64,
        payload: Bytes,
    ) -> String {
        let args: Vec<Value> = vec![
            token.into(),
            generation.to_string().into(),
            Value::Bytes(payload),
            30_000.into(),
            1024.into(),
            120_000.into(),
        ];
        self.client
            .evalsha(&self.commit, self.keys(flight), args)
            .await
            .expect("old COMMIT")
    }
}

pub(crate) const ACQUIRE: &str = r"#!lua
local r = redis.call('HMGET', KEYS[3], 'gen', 'st', 'body')
if r[1] then
  return {'HIT', tonumber(r[1]), r[2] or 'ok', r[3] or ''}
end
local l = redis.call('HMGET', KEYS[1], 'tok', 'gen')
if l[1] then
  if l[1] == ARGV[1] then
    return {'OWNER', tonumber(l[2]), 0}
  end
  return {'FOLLOWER', tonumber(l[2]), redis.call('PTTL', KEYS[1])}
end
local s = redis.call('HMGET', KEYS[2], 'gen', 'cgen')
local gen = tonumber(s[1] or '0')
local cgen = tonumber(s[2] or '0')
local takeover = 0
if gen > cgen then
  if ARGV[3] ~= '1' then
    return {'EXPIRED', gen}
  end
  takeover = 1
end
gen = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('HSET', KEYS[1], 'tok', ARGV[1], 'gen', gen)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {'OWNER', gen, takeover}
";

pub(crate) const HEARTBEAT: &str = r"#!lua
local l = redis.call('HMGET', KEYS[1], 'tok', 'gen')
if l[1] == ARGV[1] and l[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return 'RENEWED'
end
return 'LOST'
";

pub(crate) const COMMIT: &str = r"#!lua
local gen = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[3], 'gen', 'tok')
if r[1] then
  if tonumber(r[1]) == gen and r[2] == ARGV[1] then
    return 'COMMITTED'
  end
  if tonumber(r[1]) >= gen then
    return 'FENCED'
  end
end
local l = redis.call('HMGET', KEYS[1], 'tok', 'gen')
local ok
if l[1] then
  ok = (l[1] == ARGV[1] and tonumber(l[2]) == gen)
else
  local s = redis.call('HMGET', KEYS[2], 'gen', 'cgen')
  ok = (tonumber(s[1] or '0') == gen and tonumber(s[2] or '0') < gen)
end
if not ok then
  return 'FENCED'
end
redis.call('HSET', KEYS[2], 'cgen', gen)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'gen', gen, 'tok', ARGV[1], 'st', 'ok', 'body', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('DEL', KEYS[1])
local msg = ARGV[2] .. '|c'
if string.len(ARGV[3]) <= tonumber(ARGV[5]) then
  msg = msg .. '|' .. ARGV[3]
end
redis.call('PUBLISH', KEYS[4], msg)
return 'COMMITTED'
";

pub(crate) const INVALIDATE: &str = r"#!lua
local gen = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('HSET', KEYS[2], 'cgen', gen)
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', KEYS[4], gen .. '|a')
return gen
";

pub(crate) const ABANDON: &str = r"#!lua
local gen = tonumber(ARGV[2])
local l = redis.call('HMGET', KEYS[1], 'tok', 'gen')
if l[1] ~= ARGV[1] or tonumber(l[2]) ~= gen then
  return 'NOT_OWNER'
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'cgen', gen)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if ARGV[3] ~= '' and tonumber(ARGV[4]) > 0 then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'gen', gen, 'tok', ARGV[1], 'st', 'err', 'body', ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
redis.call('PUBLISH', KEYS[4], ARGV[2] .. '|a')
return 'RELEASED'
";
