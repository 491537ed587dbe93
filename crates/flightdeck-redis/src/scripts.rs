//! The Lua scripts of the protocol, one per action.
//!
//! A script gets the flight's record as `KEYS[1]`; INVALIDATE and READ also
//! the invalidation key (below) as `KEYS[2]`. Both share one hash tag
//! (`{prefix}:{h}:…`), so a flight lives in one cluster slot; the `#!lua`
//! shebang makes Redis reject undeclared cross-slot access. Numbers are
//! sent as their decimal digits.
//!
//! **One key per flight** (and one more after an invalidation, below),
//! the record `{prefix}:{h}:f4`, a hash:
//!
//! | field | what |
//! |---|---|
//! | `g` | generation of the last grant (or invalidation), decimal |
//! | `t` | the last grant's token (`''` after an invalidation) |
//! | `d` | the last grant's lease deadline, server time in ms; `0` once the grant ended (committed, abandoned, released, invalidated) |
//! | `s`, `b` | the stored result: status `ok`/`err` and body; only while a result is stored (a later grant leaves it, its commit or cached failure replaces it) |
//! | `rg` | the generation that stored the result |
//! | `fu` | the result is fresh until then (server time, ms): an ACQUIRE replays it (the stage's replay TTL; a commit time means never) |
//! | `ku` | the result is kept for the followers already waiting until then (server time, ms): a re-check that names `rg` or an older generation replays it |
//! | `x` | tokens never to be granted the flight (space-separated, newest first, at most 8): released, or whose attempt ended here (committed, abandoned, released), so that a late duplicate of their ACQUIRE grants nothing |
//! | `w` | the inboxes of the nodes that follow the flight (space-separated): added by an ACQUIRE that answers FOLLOWER, told and emptied when the grant ends |
//!
//! and one expiry, the record's: [`LeaseTerms::record_ttl`] from a grant
//! or heartbeat (the lease plus one more lease, at most `state_ttl`), but
//! never before `ku`; from a commit, the longer of the result's freshness
//! and its retention for waiters (`ku`); the failure's TTL from an abandon
//! that caches one. The lease's own end is `d`, compared with the server's `TIME`, so
//! the lease and the record do not need two keys.
//!
//! **An invalidation** also leaves `{prefix}:{h}:f4:i`, a string: the
//! invalidation's generation, kept for `state_ttl` whatever happens to the
//! record (a later grant may give the record a shorter life). Only
//! INVALIDATE writes it and only READ reads it: it tells a result that was
//! invalidated from one the store lost.
//!
//! **Generations**: a grant (or an invalidation) takes `max(g + 1, now)`
//! with `now` the server's `TIME` in microseconds. While the record lives,
//! `g + 1` makes every generation larger than the last. Once it expired,
//! `now` is larger than every generation it held: a generation gets ahead
//! of the clock only if the flight is granted more than once a
//! microsecond (each grant needs a script, and another to end the grant
//! before it, and a script takes microseconds), and a record expires at
//! least a millisecond after its last write. **Clock caveat**: this relies
//! on the server's wall clock not stepping back by more than the time
//! since the flight's record expired (an NTP step on the server, or a
//! failover to a replica whose clock is behind); within a record's life
//! the clock does not matter.
//!
//! Numbers never reach Redis as Lua numbers: Lua 5.1 prints a double like
//! 1.7e15 as `1.7e+15` (`tostring`, `..`), and Redis 7.2+ turns a number
//! argument into its shortest form, which may use an exponent. A new
//! generation is the two parts of `TIME` put side by side (exact digits),
//! `g + 1` is formatted with `%.0f`, deadlines are milliseconds (13 digits,
//! exact under Lua's 14 significant digits), and generations are compared
//! as the strings the client sent. Arithmetic stays exact: integers below
//! 2^53 (microseconds since 1970 stay below that until the year 2255).
//!
//! **Inboxes, not channels per flight.** Each node (each
//! [`RedisBackend`](crate::RedisBackend)) keeps a subscription open to an
//! inbox of its own (in a cluster, one per hash slot it follows flights
//! in, named with a hash tag of that slot, so that `SPUBLISH` from a
//! flight's script stays on the flight's shard), and names it in every
//! ACQUIRE. An ACQUIRE that answers FOLLOWER adds it to `w` in the same
//! script as the read, so a grant that ends after that read is told to it:
//! a follower whose inbox was subscribed before its ACQUIRE was sent needs
//! neither a SUBSCRIBE nor a second ACQUIRE. A grant that ends with nobody
//! following publishes nothing.
//!
//! **Messages** to an inbox: `<record>|<gen>|c|<payload>` (inline),
//! `<record>|<gen>|c`, or `<record>|<gen>|a` (abandoned, released or
//! invalidated: race again), where `<record>` is the flight's record name.
//!
//! **Inner commands** per answer (the per-flight budget, checked by the
//! crate's tests through `INFO commandstats`); `+ n PUBLISH` is one per
//! node that follows the flight:
//!
//! | script and answer | `redis.call`s |
//! |---|---|
//! | ACQUIRE → HIT | 2: `HMGET`, `TIME` |
//! | ACQUIRE → FOLLOWER, EXPIRED, OWNER (retry) | 2: `HMGET`, `TIME` |
//! | ACQUIRE → FOLLOWER, this node's first | 3: `HMGET`, `TIME`, `HSET` |
//! | ACQUIRE → OWNER (grant) | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` |
//! | COMMIT → COMMITTED | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` (+ n `PUBLISH`; a retry: 1) |
//! | COMMIT → FENCED | 1: `HMGET` |
//! | HEARTBEAT → RENEWED | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` |
//! | HEARTBEAT → LOST | 1 or 2: `HMGET` (, `TIME`) |
//! | ABANDON → RELEASED | 2: `HMGET`, `HSET` (+ `TIME` and `PEXPIRE` when it caches a failure, + n `PUBLISH`) |
//! | ABANDON → NOT_OWNER | 1: `HMGET` |
//! | RELEASE → RELEASED | 2: `HMGET`, `HSET` (+ n `PUBLISH`) |
//! | RELEASE → NOT_OWNER | 2: `HMGET`, `HSET` (+ `PEXPIRE` when the flight had no record) |
//! | INVALIDATE | 6: `HMGET`, `TIME`, `HSET`, `HDEL`, `PEXPIRE`, `SET` (+ n `PUBLISH`) |
//! | READ | 3: `HMGET`, `TIME`, `GET` |
//!
//! A value the scripts did not write is a protocol error, never a result:
//! another type at the record's name makes Redis answer `WRONGTYPE`, a
//! field that does not parse makes the script answer an error starting
//! `FDPROTO`, and the client refuses a status other than `ok`/`err` or a
//! result without a generation. Other layouts use other key names (see
//! the crate docs on rolling upgrades).
//!
//! [`LeaseTerms::record_ttl`]: flightdeck_distributed::backend::LeaseTerms::record_ttl
//!
//! ```
//! // Every script is declared as a `#!lua` script with keys in KEYS.
//! for src in [flightdeck_redis::scripts::ACQUIRE, flightdeck_redis::scripts::COMMIT] {
//!     assert!(src.starts_with("#!lua"));
//!     assert!(!src.contains("redis.call('KEYS'"));
//! }
//! ```

/// The Lua of `remember(x, tok)`: the list `x` with `tok` first, newest
/// first, at most 8 tokens (the field `x` of the record). Put before the
/// scripts that add to it.
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

/// `ACQUIRE(tok, lease_ms, takeover_ok, record_ms, inbox, follows)` →
/// `{HIT, gen, st, body}` | `{OWNER, gen, takeover}` |
/// `{FOLLOWER, gen, remaining_ms}` | `{EXPIRED, gen}`. HIT when the
/// stored result is fresh (`fu`), or when `follows` (a follower's
/// re-check: the generation it first followed; `''` for an acquire) is
/// at most the result's generation and the result is still kept for
/// waiters (`ku`). A FOLLOWER answer adds `inbox` (unless empty) to the
/// flight's waiting nodes `w`, in the same script as the read: every
/// later end of the grant is published there. A grant leaves a stored
/// result in place and never shortens its life.
pub const ACQUIRE: &str = r"#!lua
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

/// `HEARTBEAT(tok, gen, lease_ms, record_ms)` → `RENEWED` | `LOST`.
/// Never re-creates or revives a lease, never shortens the life of a
/// result kept for waiters.
pub const HEARTBEAT: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 'ku')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 'LOST'
end
local d = tonumber(r[3] or 0) or 0
if d == 0 then
  return 'LOST'
end
local tm = redis.call('TIME')
local now = tm[1] * 1000 + tm[2] / 1000
if d <= now then
  return 'LOST'
end
redis.call('HSET', KEYS[1], 'd', tostring(math.floor(now) + ARGV[3]))
local ku = tonumber(r[4] or 0) or 0
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.max(tonumber(ARGV[4]), math.ceil(ku - now))))
return 'RENEWED'
";

/// `COMMIT(tok, gen, payload, ttl_ms, inline, retain_ms)` → `COMMITTED` |
/// `FENCED`. Only the last grant commits (its lease live or run out);
/// stores the result, fresh for `ttl_ms` (`fu`; 0: never replayed to an
/// acquire) and kept for the waiters for the longer of the two (`ku`, the
/// record's expiry), ends the lease and tells the waiting nodes in one
/// round trip (the payload inline when `inline` is `1`): no message at
/// all when no other node follows. A retry of a done commit (the stored
/// result is this generation's) answers `COMMITTED`.
pub const COMMIT: &str = concat!(
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

/// `ABANDON(tok, gen, failure, failure_ttl_ms)` → `RELEASED` |
/// `NOT_OWNER`. Ends the last grant (its lease live or run out),
/// optionally caches the failure (in place of a stored result, fresh and
/// kept for `failure_ttl_ms`), and wakes the waiting nodes at once.
pub const ABANDON: &str = concat!(
    "#!lua\n",
    remember!(),
    r"local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 'w', 'x')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or not r[3] or r[3] == '0' then
  return 'NOT_OWNER'
end
local x = remember(r[5], ARGV[1])
if ARGV[3] ~= '' and tonumber(ARGV[4]) > 0 then
  local tm = redis.call('TIME')
  local until_ms = string.format('%.0f', math.floor(tm[1] * 1000 + tm[2] / 1000) + ARGV[4])
  redis.call('HSET', KEYS[1], 'd', '0', 's', 'err', 'b', ARGV[3], 'rg', ARGV[2], 'fu', until_ms, 'ku', until_ms, 'w', '', 'x', x)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  redis.call('HSET', KEYS[1], 'd', '0', 'w', '', 'x', x)
end
for inbox in string.gmatch(r[4] or '', '%S+') do
  redis.call('PUBLISH', inbox, KEYS[1] .. '|' .. ARGV[2] .. '|a')
end
return 'RELEASED'
"
);

/// `RELEASE(tok, state_ttl_ms)` → `RELEASED` | `NOT_OWNER`. Ends the
/// lease held by `tok` whatever its generation and wakes the waiting
/// nodes; otherwise remembers `tok` so that a late ACQUIRE of it grants
/// nothing.
pub const RELEASE: &str = concat!(
    "#!lua\n",
    remember!(),
    r"local r = redis.call('HMGET', KEYS[1], 't', 'd', 'g', 'x', 'w')
local x = remember(r[4], ARGV[1])
if r[1] == ARGV[1] and r[2] and r[2] ~= '0' then
  redis.call('HSET', KEYS[1], 'd', '0', 'w', '', 'x', x)
  for inbox in string.gmatch(r[5] or '', '%S+') do
    redis.call('PUBLISH', inbox, KEYS[1] .. '|' .. r[3] .. '|a')
  end
  return 'RELEASED'
end
redis.call('HSET', KEYS[1], 'x', x)
if not r[1] and not r[3] and not r[4] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 'NOT_OWNER'
"
);

/// `INVALIDATE(state_ttl_ms)` → the new generation. Drops the result and
/// the lease, starts a newer generation (fencing a running owner), keeps
/// it in `KEYS[2]` for `state_ttl` and wakes the waiting nodes.
pub const INVALIDATE: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 'g', 'w')
local g = tonumber(r[1] or 0)
if not g then
  return redis.error_reply('FDPROTO unreadable flight record')
end
local tm = redis.call('TIME')
local gen = tm[1] .. string.sub('00000' .. tm[2], -6)
if g >= tm[1] * 1000000 + tm[2] then
  gen = string.format('%.0f', g + 1)
end
redis.call('HSET', KEYS[1], 'g', gen, 't', '', 'd', '0')
redis.call('HDEL', KEYS[1], 's', 'b', 'w', 'rg', 'fu', 'ku')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], gen, 'PX', ARGV[1])
for inbox in string.gmatch(r[2] or '', '%S+') do
  redis.call('PUBLISH', inbox, KEYS[1] .. '|' .. gen .. '|a')
end
return gen
";

/// `READ()` → `{gen, st, body, invalidated}`: the stored result's
/// generation `rg`, status `s` and body `b` while it is fresh (`fu`; nil
/// otherwise), and the last invalidation's generation (`KEYS[2]`, nil
/// when absent). Writes nothing (`no-writes`), so a primary that refuses
/// writes (`NOREPLICAS`) or a replica (`READONLY`) still runs it; an
/// expired record reads as absent.
pub const READ: &str = r"#!lua flags=no-writes
local r = redis.call('HMGET', KEYS[1], 'rg', 's', 'b', 'fu')
local tm = redis.call('TIME')
local fu = tonumber(r[4] or 0) or 0
if fu <= tm[1] * 1000 + tm[2] / 1000 then
  r[2], r[3] = false, false
end
return {r[1], r[2], r[3], redis.call('GET', KEYS[2])}
";
