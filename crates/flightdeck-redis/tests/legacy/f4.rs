//! The fourth key layout's (`f4`) ACQUIRE and COMMIT, verbatim from the
//! release before stale results, and a minimal client for them: what a
//! node of that version does to Redis (the record `{prefix}:{h}:f4`), for
//! the old/new server-time comparison of an owner flight. Test-only: the
//! backend never runs these.

#![allow(dead_code)]

use bytes::Bytes;
use flightdeck_distributed::FlightId;
use fred::prelude::*;

/// A node of the `f4` layout.
pub(crate) struct F4 {
    client: Client,
    prefix: String,
    acquire: String,
    commit: String,
}

impl F4 {
    /// Loads the `f4` ACQUIRE and COMMIT on `client`'s server.
    pub(crate) async fn load(client: &Client, prefix: &str) -> Self {
        Self {
            client: client.clone(),
            prefix: prefix.to_owned(),
            acquire: client.script_load(ACQUIRE).await.expect("SCRIPT LOAD"),
            commit: client.script_load(COMMIT).await.expect("SCRIPT LOAD"),
        }
    }

    /// The `f4` record of a flight.
    pub(crate) fn record(&self, flight: &FlightId) -> String {
        format!("{}:{{{}}}:f4", self.prefix, flight.to_hex())
    }

    /// ACQUIRE as an `f4` node sends it for a flight's first call: a 30 s
    /// lease, takeover allowed, a 60 s record, naming `inbox`; the
    /// script's raw answer.
    pub(crate) async fn acquire(&self, flight: &FlightId, token: &str, inbox: &str) -> Vec<Value> {
        let args: Vec<Value> = vec![
            token.into(),
            "30000".into(),
            "1".into(),
            "60000".into(),
            inbox.into(),
            "".into(),
        ];
        self.client
            .evalsha(&self.acquire, vec![self.record(flight)], args)
            .await
            .expect("f4 ACQUIRE")
    }

    /// COMMIT with a 30 s result TTL and retention, the payload inline.
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
            "30000".into(),
        ];
        self.client
            .evalsha(&self.commit, vec![self.record(flight)], args)
            .await
            .expect("f4 COMMIT")
    }
}

macro_rules! remember {
    () => {
        r"local function remember(x, tok)
  local out, n = tok, 1
  for t in string.gmatch(x or '', '%S+') do
    if n >= 8 then
      break
    end
    if t ~= tok then
      out = out .. ' ' .. t
      n = n + 1
    end
  end
  return out
end
"
    };
}

pub(crate) const ACQUIRE: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 'g', 't', 'd', 's', 'b', 'x', 'w', 'rg', 'fu', 'ku')
local tm = redis.call('TIME')
local now = tm[1] * 1000 + tm[2] / 1000
local ku = 0
if r[4] then
  local rg, fu = tonumber(r[8] or ''), tonumber(r[9] or '')
  ku = tonumber(r[10] or '')
  if not rg or not fu or not ku then
    return redis.error_reply('FDPROTO unreadable flight record')
  end
  if now < fu or (ARGV[6] ~= '' and tonumber(ARGV[6]) <= rg and now < ku) then
    return {'HIT', r[8], r[4], r[5] or ''}
  end
end
local d = tonumber(r[3] or 0)
if not d then
  return redis.error_reply('FDPROTO unreadable flight record')
end
local takeover = 0
if r[2] == ARGV[1] then
  if d > now then
    return {'OWNER', r[1], 0}
  end
  if d == 0 then
    return {'EXPIRED', r[1]}
  end
elseif d > now then
  local w = r[7] or ''
  if ARGV[5] ~= '' and not string.find(' ' .. w .. ' ', ' ' .. ARGV[5] .. ' ', 1, true) then
    if w ~= '' then
      w = w .. ' '
    end
    redis.call('HSET', KEYS[1], 'w', w .. ARGV[5])
  end
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
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.max(tonumber(ARGV[4]), math.ceil(ku - now))))
return {'OWNER', gen, takeover}
";

pub(crate) const COMMIT: &str = concat!(
    "#!lua\n",
    remember!(),
    r"local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 's', 'w', 'x', 'rg')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 'FENCED'
end
if r[4] and r[7] == ARGV[2] then
  if r[4] == 'ok' then
    return 'COMMITTED'
  end
  return 'FENCED'
end
if not r[3] or r[3] == '0' then
  return 'FENCED'
end
local w = r[5] or ''
local x = remember(r[6], ARGV[1])
local tm = redis.call('TIME')
local now = math.floor(tm[1] * 1000 + tm[2] / 1000)
local keep = math.max(tonumber(ARGV[4]), tonumber(ARGV[6]), 1)
local fu = string.format('%.0f', now + ARGV[4])
local ku = string.format('%.0f', now + keep)
if w == '' then
  redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[3], 'rg', ARGV[2], 'fu', fu, 'ku', ku, 'x', x)
else
  redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[3], 'rg', ARGV[2], 'fu', fu, 'ku', ku, 'w', '', 'x', x)
end
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', keep))
if w ~= '' then
  local m = KEYS[1] .. '|' .. ARGV[2] .. '|c'
  if ARGV[5] == '1' then
    m = m .. '|' .. ARGV[3]
  end
  for inbox in string.gmatch(w, '%S+') do
    redis.call('PUBLISH', inbox, m)
  end
end
return 'COMMITTED'
"
);
