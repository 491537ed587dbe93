//! The Lua scripts of the protocol (ARCHITECTURE §4), one per action.
//!
//! Every script gets `KEYS = [lease, state, result, channel]`, all sharing
//! one hash tag (`{prefix}:{h}:…`), so a flight lives in one cluster slot.
//! The `#!lua` shebang makes Redis reject undeclared cross-slot access.
//! Only server-side time is used (`PEXPIRE`, `PTTL`).
//!
//! - lease `HASH {tok, gen}` with the lease TTL;
//! - state `HASH {gen, cgen}`: the last granted and the last committed or
//!   abandoned generation, kept longer than anything else of the flight;
//! - result `HASH {gen, tok, st, body}` with the result (or failure) TTL;
//! - channel: `<gen>|c|<payload>` (inline), `<gen>|c`, or `<gen>|a`.
//!
//! ```
//! // Every script is declared as a `#!lua` script with keys in KEYS.
//! for src in [flightdeck_redis::scripts::ACQUIRE, flightdeck_redis::scripts::COMMIT] {
//!     assert!(src.starts_with("#!lua"));
//!     assert!(!src.contains("redis.call('KEYS'"));
//! }
//! ```

/// `ACQUIRE(tok, lease_ms, takeover_ok, state_ttl_ms)` →
/// `{HIT, gen, st, body}` | `{OWNER, gen, takeover}` |
/// `{FOLLOWER, gen, pttl}` | `{EXPIRED, gen}`.
pub const ACQUIRE: &str = r"#!lua
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

/// `HEARTBEAT(tok, gen, lease_ms, state_ttl_ms)` → `RENEWED` | `LOST`.
/// Never re-creates a lease.
pub const HEARTBEAT: &str = r"#!lua
local l = redis.call('HMGET', KEYS[1], 'tok', 'gen')
if l[1] == ARGV[1] and l[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return 'RENEWED'
end
return 'LOST'
";

/// `COMMIT(tok, gen, payload, ttl_ms, inline_below, state_ttl_ms)` →
/// `COMMITTED` | `FENCED`. Writes the result, ends the lease and publishes
/// in one round trip; a retry of a done commit answers `COMMITTED`.
pub const COMMIT: &str = r"#!lua
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

/// `INVALIDATE(state_ttl_ms)` → the new generation. Drops the result and
/// the lease, starts a new generation (fencing a running owner) and wakes
/// followers.
pub const INVALIDATE: &str = r"#!lua
local gen = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('HSET', KEYS[2], 'cgen', gen)
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', KEYS[4], gen .. '|a')
return gen
";

/// `ABANDON(tok, gen, failure, failure_ttl_ms, state_ttl_ms)` →
/// `RELEASED` | `NOT_OWNER`. Releases the lease, optionally caches the
/// failure, and wakes followers at once.
pub const ABANDON: &str = r"#!lua
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
