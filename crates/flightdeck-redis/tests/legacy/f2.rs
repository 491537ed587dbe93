//! The second key layout's (`f2`) ACQUIRE and COMMIT, verbatim from the
//! release before the inboxes, and a minimal client for them: what a node
//! of that version does to Redis (a record `{prefix}:{h}:f2`, and a
//! channel per flight `{prefix}:{h}:f2:done` that every COMMIT publishes
//! to), for the mixed-layout test and the old/new server-time comparison.
//! Test-only: the backend never runs these.

#![allow(dead_code)]

use bytes::Bytes;
use flightdeck_distributed::FlightId;
use fred::prelude::*;

/// A node of the `f2` layout.
pub(crate) struct F2 {
    client: Client,
    prefix: String,
    acquire: String,
    commit: String,
}

impl F2 {
    /// Loads the `f2` ACQUIRE and COMMIT on `client`'s server.
    pub(crate) async fn load(client: &Client, prefix: &str) -> Self {
        Self {
            client: client.clone(),
            prefix: prefix.to_owned(),
            acquire: client.script_load(ACQUIRE).await.expect("SCRIPT LOAD"),
            commit: client.script_load(COMMIT).await.expect("SCRIPT LOAD"),
        }
    }

    /// The `f2` names of a flight: its record and its channel.
    pub(crate) fn keys(&self, flight: &FlightId) -> [String; 2] {
        let (p, h) = (&self.prefix, flight.to_hex());
        [format!("{p}:{{{h}}}:f2"), format!("{p}:{{{h}}}:f2:done")]
    }

    /// ACQUIRE with a 30 s lease and a 60 s record: the script's raw answer.
    pub(crate) async fn acquire(&self, flight: &FlightId, token: &str) -> Vec<Value> {
        let [record, _] = self.keys(flight);
        let args: Vec<Value> = vec![token.into(), "30000".into(), "1".into(), "60000".into()];
        self.client
            .evalsha(&self.acquire, vec![record], args)
            .await
            .expect("f2 ACQUIRE")
    }

    /// COMMIT with a 30 s result TTL, the payload inline.
    pub(crate) async fn commit(
        &self,
        flight: &FlightId,
        token: &str,
        generation: &str,
        payload: Bytes,
    ) -> String {
        let args: Vec<Value> = vec![
            token.into(),
            generation.into(),
            Value::Bytes(payload),
            "30000".into(),
            "1".into(),
        ];
        self.client
            .evalsha(&self.commit, self.keys(flight).to_vec(), args)
            .await
            .expect("f2 COMMIT")
    }
}

pub(crate) const ACQUIRE: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 'g', 't', 'd', 's', 'b', 'x')
if r[4] then
  return {'HIT', r[1], r[4], r[5] or ''}
end
local d = tonumber(r[3] or 0)
if not d then
  return redis.error_reply('FDPROTO unreadable flight record')
end
local tm = redis.call('TIME')
local now = tm[1] * 1000 + tm[2] / 1000
local takeover = 0
if r[2] == ARGV[1] then
  if d > now then
    return {'OWNER', r[1], 0}
  end
  if d == 0 then
    return {'EXPIRED', r[1]}
  end
elseif d > now then
  return {'FOLLOWER', r[1], math.ceil(d - now)}
end
if d > 0 then
  if ARGV[3] ~= '1' then
    return {'EXPIRED', r[1]}
  end
  takeover = 1
end
if r[6] and string.find(' ' .. r[6] .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then
  return {'EXPIRED', r[1] or '0'}
end
local gen = tm[1] .. string.sub('00000' .. tm[2], -6)
if r[1] then
  local g = tonumber(r[1])
  if not g then
    return redis.error_reply('FDPROTO unreadable flight record')
  end
  if g >= tm[1] * 1000000 + tm[2] then
    gen = string.format('%.0f', g + 1)
  end
end
redis.call('HSET', KEYS[1], 'g', gen, 't', ARGV[1], 'd', tostring(math.floor(now) + ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'OWNER', gen, takeover}
";

pub(crate) const COMMIT: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 's')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 'FENCED'
end
if r[4] then
  if r[4] == 'ok' then
    return 'COMMITTED'
  end
  return 'FENCED'
end
if not r[3] or r[3] == '0' then
  return 'FENCED'
end
redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[5] == '1' then
  redis.call('PUBLISH', KEYS[2], ARGV[2] .. '|c|' .. ARGV[3])
else
  redis.call('PUBLISH', KEYS[2], ARGV[2] .. '|c')
end
return 'COMMITTED'
";
