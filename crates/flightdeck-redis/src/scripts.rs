//! The Lua scripts of the protocol, one per action.
//!
//! A script gets the flight's record as `KEYS[1]`; INVALIDATE and READ also
//! the invalidation key (below) as `KEYS[2]`. Both share one hash tag
//! (`{prefix}:{h}:…`), so a flight lives in one cluster slot; the `#!lua`
//! shebang makes Redis reject undeclared cross-slot access. Numbers are
//! sent as their decimal digits, but for ACQUIRE and COMMIT, which run
//! once or twice per flight: their short arguments go packed into one
//! (`ARGV[1]`), which the script reads with one `struct.unpack` (Redis's
//! Lua library): a number as a little-endian IEEE double (`d`: a Lua
//! number, exact below 2^53; `-1` for none), a flag as a byte (`B`, `1`
//! or `0`), a string as its length in four bytes and its bytes (`I4c0`).
//! Each argument more costs the client's RESP encoding and the server's
//! parsing a bulk string, and the script a `tonumber` of digits. Every
//! script is named by its source's SHA, so a node running another
//! revision of a script sends its own arguments to its own script: the
//! record's fields (below), which nodes share, are written alike.
//!
//! **One key per flight** (and one more after an invalidation, below),
//! the record `{prefix}:{h}:f5`, a hash:
//!
//! | field | what |
//! |---|---|
//! | `g` | generation of the last grant (or invalidation), decimal |
//! | `t` | the last grant's token (`''` after an invalidation) |
//! | `d` | the last grant's lease deadline, server time in ms; `0` once the grant ended (committed, abandoned, released, invalidated) |
//! | `s`, `b` | the stored result: status (`ok`) and body; only while a result is stored (a later grant leaves it, its commit replaces it) |
//! | `rg` | the generation that stored the result |
//! | `ct` | when the result was stored (server time, ms): its age is the server's `TIME` less this |
//! | `fu` | the result is fresh until then (server time, ms): an ACQUIRE replays it (the stage's replay TTL; a commit time means never); `fu - ct` is its TTL |
//! | `su` | a success is answered stale until then (server time, ms; `fu` plus the stage's longest stale window, `fu` when it has none), to an ACQUIRE that asks for stale results |
//! | `ku` | the result is kept until then (server time, ms): the record lives as long; for the followers already waiting, a re-check that names `rg` or an older generation replays it. The latest of `su` and the retention for waiters |
//! | `wt` | how long the result's work took (ms), for early refreshes |
//! | `ra` | a failed refresh's throttle (server time, ms; absent or `0`: none): until then an ACQUIRE that asks for stale results answers STALE and grants nothing |
//! | `eb`, `eg`, `ec`, `eu` | a failure cached by an abandon, beside the stored result (which it never replaces): its body, the generation that cached it, when (server time, ms), and until when it is replayed (`0`: none; a commit ends it) |
//! | `x` | tokens never to be granted the flight (space-separated, newest first, at most 8): released, or whose attempt ended here (committed, abandoned, released), so that a late duplicate of their ACQUIRE grants nothing |
//! | `w` | the inboxes of the nodes that follow the flight (space-separated): added by an ACQUIRE that answers FOLLOWER, told and emptied when the grant ends |
//!
//! and one expiry, the record's: [`LeaseTerms::record_ttl`] from a grant
//! or heartbeat (the lease plus one more lease, at most `state_ttl`), but
//! never before `ku` or `eu`; from a commit, the longest of the result's
//! freshness, its stale window after it and its retention for waiters
//! (`ku`); from an abandon that caches a failure, the longer of the
//! failure's TTL and `ku`. The lease's
//! own end is `d`, compared with the server's `TIME`, so the lease and the
//! record do not need two keys.
//!
//! **Stale results.** A success stays in the record past its freshness
//! for the stage's stale windows (`su`), through later grants: the grant
//! that refreshes it hands it to its owner, and every ACQUIRE that asks
//! for stale results while the refresh runs gets it beside FOLLOWER.
//! Only the refresh's COMMIT replaces it, and only while it is the last
//! grant, so a refresh that an invalidation fenced (INVALIDATE drops the
//! result, its windows and the throttle, and starts a newer generation)
//! never brings the purged result back. An ABANDON with a retry time
//! starts a throttle (`ra`) during which the kept result is the answer
//! and nothing is granted; the first ACQUIRE after it is granted (a grant
//! ends the throttle). A failure an ABANDON caches goes beside the kept
//! result (`e*`): an ACQUIRE that asks for nothing stale replays it, one
//! that asks gets the kept result. An ACQUIRE that asks for neither stale
//! results nor an early refresh gets exactly the answers of a stage
//! without windows.
//!
//! **An invalidation** also leaves `{prefix}:{h}:f5:i`, a string: the
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
//! Numbers never reach Redis as Lua numbers in a command's arguments (a
//! reply's server time does, as an integer reply): Lua 5.1 prints a
//! double like 1.7e15 as `1.7e+15` (`tostring`, `..`), and Redis 7.2+
//! turns a number argument into its shortest form, which may use an
//! exponent. A new generation is the two parts of `TIME` put side by side
//! (exact digits), every other number a script writes is an integer
//! formatted with `%d` (Lua 5.1 formats it as a C `long`: every digit, no
//! exponent, and half the cost of `%.0f`, which goes through C's
//! floating-point printer), and generations are compared as the strings
//! the client sent. Arithmetic stays exact: integers below 2^53
//! (microseconds since 1970 stay below that until the year 2255); times
//! are whole milliseconds (`math.floor` of `TIME`, waits rounded up with
//! `math.ceil`) before they are formatted.
//!
//! **A 64-bit Redis server is needed.** On a 32-bit build (`make 32bit`,
//! some armhf packages) a C `long` is 32 bits and a millisecond time does
//! not fit: a lease would be written in the past. ACQUIRE checks the
//! lease it formats (a time in milliseconds has at least three digits
//! more than `TIME`'s seconds) and, on such a server, grants nothing and
//! answers a protocol error (`FDPROTO`) instead: every flight fails
//! loudly, none is granted a lease written wrong.
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
//! **Messages** to an inbox: `<record>|<gen>|c<work_ms>,<age_ms>|<payload>`
//! (inline), `<record>|<gen>|c<work_ms>,<age_ms>`, or `<record>|<gen>|a`
//! (abandoned, released or invalidated: race again), where `<record>` is
//! the flight's record name, `<work_ms>` the work's time (the commit's
//! `work_ms`) and `<age_ms>` the result's age as the commit dates it
//! (its `ct`), in milliseconds.
//!
//! **Inner commands** per answer (the per-flight budget, checked by the
//! crate's tests through `INFO commandstats`); `+ n PUBLISH` is one per
//! node that follows the flight:
//!
//! | script and answer | `redis.call`s |
//! |---|---|
//! | ACQUIRE → HIT, STALE, LATE | 2: `HMGET`, `TIME` |
//! | ACQUIRE → FOLLOWER, EXPIRED, OWNER (retry) | 2: `HMGET`, `TIME` |
//! | ACQUIRE → FOLLOWER, this node's first | 3: `HMGET`, `TIME`, `HSET` |
//! | ACQUIRE → OWNER (grant) | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` |
//! | COMMIT → COMMITTED | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` (+ n `PUBLISH`; a retry: 1) |
//! | COMMIT → FENCED | 1: `HMGET` |
//! | HEARTBEAT → RENEWED | 4: `HMGET`, `TIME`, `HSET`, `PEXPIRE` |
//! | HEARTBEAT → LOST | 1 or 2: `HMGET` (, `TIME`) |
//! | ABANDON → RELEASED | 2: `HMGET`, `HSET` (+ `TIME` when it caches a failure or may throttle a kept success, + `PEXPIRE` when it caches a failure, + n `PUBLISH`) |
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

/// `ACQUIRE(packed, inbox)`, `packed` holding `tok, lease_ms, record_ms,
/// follows, not_after, takeover_ok, stale, early` in `struct`'s format
/// `<I4c0ddddBBB` (see the module docs)
/// → `{HIT, <result>, now}` | `{OWNER, gen, takeover[, <result>], now}` |
/// `{FOLLOWER, gen, remaining_ms[, <result>], now}` | `{STALE, <result>, now}` |
/// `{EXPIRED, gen, now}` | `{LATE, now}`, where `<result>` is a stored
/// result's six items `gen, status, body, age_ms, ttl_ms, work_ms` (its
/// age by the server's clock) and `now` the server's `TIME` in ms (an
/// integer reply: a Lua number, not formatted), from which the client
/// estimates the server's clock for its next ACQUIRE.
///
/// `not_after` (server time in ms; `-1`: none) is when the client gives
/// the call up: an ACQUIRE that runs later (queued on a frozen server,
/// resent after its caller walked away) answers `LATE` and changes
/// nothing, so it never grants a lease nobody works on. The client sends
/// its estimate of the server's clock plus its call timeout; the estimate
/// lags the server by the last reply's transit, so the deadline errs
/// early.
///
/// HIT when the stored result is fresh (`fu`), or when `follows` (a
/// follower's re-check: the generation it first followed; `-1` for an
/// acquire) is at most the result's generation and the result is still
/// kept for waiters (`ku`); otherwise HIT with the cached failure while
/// it lasts (`eu`), unless a result goes beside the answer. With `stale`
/// (`1`: the stage answers stale results), a success past its freshness
/// but before `su` goes beside the answer: OWNER (this caller refreshes
/// it), FOLLOWER (another does), or alone as STALE while a failed
/// refresh's throttle (`ra`) runs, granting nothing. With `early` (`1`:
/// an early refresh), a fresh success is not a HIT when nothing refreshes
/// it already (no other token's lease, no throttle, no cached failure):
/// the answer goes on as without a result, with the fresh result beside.
/// Without `stale` and `early` (`0` each), exactly the answers of a stage
/// without stale windows.
///
/// The token that holds the live lease is answered OWNER with its
/// generation, unless a result answers it as a HIT, whatever else the
/// record says by then (a kept result past its stale window, a cached
/// failure, a throttle, `not_after` gone by): an earlier
/// attempt of its ACQUIRE was applied (its reply lost, the command sent
/// again), and only this token ends that lease, so it must hear it holds
/// it.
///
/// A FOLLOWER answer adds `inbox` (unless empty) to the flight's waiting
/// nodes `w`, in the same script as the read: every later end of the
/// grant is published there. A grant ends a throttle, leaves the stored
/// result and the cached failure in place and never shortens their life.
pub const ACQUIRE: &str = r"#!lua
local tok, lease, record, follows, late, takeover_ok, stale, early = struct.unpack('<I4c0ddddBBB', ARGV[1])
local inbox = ARGV[2]
local r = redis.call('HMGET', KEYS[1], 'g', 't', 'd', 's', 'b', 'x', 'w', 'rg', 'fu', 'ku', 'ct', 'su', 'wt', 'ra', 'eb', 'eg', 'ec', 'eu')
local tm = redis.call('TIME')
local now = tm[1] * 1000 + tm[2] / 1000
local d, ra, eu = tonumber(r[3] or 0), tonumber(r[14] or 0), tonumber(r[18] or 0)
if not d or not ra or not eu then
  return redis.error_reply('FDPROTO unreadable flight record')
end
local stamp = math.floor(now)
local function with(a, res)
  if res then
    for i = 1, 6 do
      a[#a + 1] = res[i]
    end
  end
  a[#a + 1] = stamp
  return a
end
local live, mine, ku, beside = d > now, r[2] == tok, 0, nil
local held = live and mine
if late >= 0 and now > late and not held then
  return with({'LATE'}, nil)
end
if r[4] then
  local rg, fu, ct = tonumber(r[8] or ''), tonumber(r[9] or ''), tonumber(r[11] or '')
  local su, wt = tonumber(r[12] or ''), tonumber(r[13] or '')
  ku = tonumber(r[10] or '')
  if not rg or not fu or not ku or not ct or not su or not wt then
    return redis.error_reply('FDPROTO unreadable flight record')
  end
  local res = {r[8], r[4], r[5] or '', math.max(0, math.floor(now - ct)), fu - ct, wt}
  if now < fu or (follows >= 0 and follows <= rg and now < ku) then
    if early ~= 1 or follows >= 0 or now >= fu or r[4] ~= 'ok' or now < ra or now < eu or (live and not mine) then
      return with({'HIT'}, res)
    end
    beside = res
  elseif stale == 1 and r[4] == 'ok' and now < su then
    beside = res
  end
end
if now < eu and not beside and not held then
  local ec = tonumber(r[17] or '')
  if not ec or not r[16] then
    return redis.error_reply('FDPROTO unreadable flight record')
  end
  return with({'HIT'}, {r[16], 'err', r[15] or '', math.max(0, math.floor(now - ec)), eu - ec, 0})
end
if beside and now < ra and not held then
  return with({'STALE'}, beside)
end
local takeover = 0
if mine then
  if live then
    return with({'OWNER', r[1], 0}, beside)
  end
  if d == 0 then
    return with({'EXPIRED', r[1]}, nil)
  end
elseif live then
  local w = r[7] or ''
  if inbox ~= '' and not string.find(' ' .. w .. ' ', ' ' .. inbox .. ' ', 1, true) then
    if w ~= '' then
      w = w .. ' '
    end
    redis.call('HSET', KEYS[1], 'w', w .. inbox)
  end
  return with({'FOLLOWER', r[1], math.ceil(d - now)}, beside)
end
if d > 0 then
  if takeover_ok ~= 1 then
    return with({'EXPIRED', r[1]}, nil)
  end
  takeover = 1
end
if r[6] and string.find(' ' .. r[6] .. ' ', ' ' .. tok .. ' ', 1, true) then
  return with({'EXPIRED', r[1] or '0'}, nil)
end
local gen = tm[1] .. string.sub('00000' .. tm[2], -6)
if r[1] then
  local g = tonumber(r[1])
  if not g then
    return redis.error_reply('FDPROTO unreadable flight record')
  end
  if g >= tm[1] * 1000000 + tm[2] then
    gen = string.format('%d', g + 1)
  end
end
local deadline = string.format('%d', math.floor(now) + lease)
if #deadline < #tm[1] + 3 then
  return redis.error_reply('FDPROTO this server formats integers in 32 bits: a 64-bit Redis is needed')
end
if ra > 0 then
  redis.call('HSET', KEYS[1], 'g', gen, 't', tok, 'd', deadline, 'ra', '0')
else
  redis.call('HSET', KEYS[1], 'g', gen, 't', tok, 'd', deadline)
end
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(record, math.ceil(ku - now), math.ceil(eu - now))))
return with({'OWNER', gen, takeover}, beside)
";

/// `HEARTBEAT(tok, gen, lease_ms, record_ms)` → `RENEWED` | `LOST`.
/// Never re-creates or revives a lease, never shortens the life of a
/// kept result or cached failure.
pub const HEARTBEAT: &str = r"#!lua
local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 'ku', 'eu')
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
redis.call('HSET', KEYS[1], 'd', string.format('%d', math.floor(now) + ARGV[3]))
local ku, eu = tonumber(r[4] or 0) or 0, tonumber(r[5] or 0) or 0
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(tonumber(ARGV[4]), math.ceil(ku - now), math.ceil(eu - now))))
return 'RENEWED'
";

/// `COMMIT(packed, payload)`, `packed` holding `tok, gen, work_ms, ttl_ms,
/// retain_ms, stale_ms, sent_ms, inline` in `struct`'s format
/// `<I4c0I4c0I4c0ddddB` (see the module docs; `gen` and `work_ms` as
/// their decimal digits, which the script stores and compares as they
/// are) → `COMMITTED` | `FENCED`. Only the last grant commits (its
/// lease live or run out), so a refresh replaces the result it refreshes,
/// and a refresh an invalidation fenced (or a later grant superseded)
/// replaces nothing. Stores the result with its commit time (`ct`: when it
/// was sent, `sent_ms` in the server's time as the client estimates it,
/// when given (not `-1`) and earlier than now, else now) and work time (`wt`,
/// `work_ms`): fresh for `ttl_ms` from `ct` (`fu`; 0: never replayed to an
/// acquire), answered stale for `stale_ms` more (`su`), kept for the
/// waiters for `retain_ms`; the record (`ku`, and its expiry) lives for
/// the longest of these. Ends the lease and a cached failure (`eu`; a
/// throttle ended with the grant), and tells the waiting nodes in one
/// round trip (the payload inline when
/// `inline` is `1`): no message at all when no other node follows. A
/// retry of a done commit (the stored result is this generation's)
/// answers `COMMITTED`.
pub const COMMIT: &str = concat!(
    "#!lua\n",
    remember!(),
    r"local tok, gen, work, ttl, retain, stale_for, sent, inline = struct.unpack('<I4c0I4c0I4c0ddddB', ARGV[1])
local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 's', 'w', 'x', 'rg', 'eu')
if r[1] ~= tok or r[2] ~= gen then
  return 'FENCED'
end
if r[4] and r[7] == gen then
  if r[4] == 'ok' then
    return 'COMMITTED'
  end
  return 'FENCED'
end
if not r[3] or r[3] == '0' then
  return 'FENCED'
end
local w = r[5] or ''
local tm = redis.call('TIME')
local now = math.floor(tm[1] * 1000 + tm[2] / 1000)
local base = now
if sent >= 0 and sent < now then
  base = sent
end
local keep = math.max(base + ttl + stale_for - now, retain, 1)
local fu, su = string.format('%d', base + ttl), string.format('%d', base + ttl + stale_for)
local ku, ct, x = string.format('%d', now + keep), string.format('%d', base), remember(r[6], tok)
if w == '' and (not r[8] or r[8] == '0') then
  redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[2], 'rg', gen, 'fu', fu, 'su', su, 'ku', ku, 'ct', ct, 'wt', work, 'x', x)
else
  redis.call('HSET', KEYS[1], 'd', '0', 's', 'ok', 'b', ARGV[2], 'rg', gen, 'fu', fu, 'su', su, 'ku', ku, 'ct', ct, 'wt', work, 'x', x, 'w', '', 'eu', '0', 'eb', '')
end
redis.call('PEXPIRE', KEYS[1], string.format('%d', keep))
if w ~= '' then
  local m = KEYS[1] .. '|' .. gen .. '|c' .. work .. ',' .. string.format('%d', now - base)
  if inline == 1 then
    m = m .. '|' .. ARGV[2]
  end
  for inbox in string.gmatch(w, '%S+') do
    redis.call('PUBLISH', inbox, m)
  end
end
return 'COMMITTED'
"
);

/// `ABANDON(tok, gen, failure, failure_ttl_ms, retry_ms)` → `RELEASED` |
/// `NOT_OWNER`. Ends the last grant (its lease live or run out) and
/// wakes the waiting nodes at once. With `retry_ms` above 0 while a
/// success is kept (before its `su`, fresh or not), starts a throttle
/// until `retry_ms` from now (`ra`): an ACQUIRE that asks for stale
/// results answers STALE and grants nothing until then. Optionally
/// caches the failure for `failure_ttl_ms` (`eb`, `eg`, `ec`, `eu`),
/// beside the stored result, which an abandon never drops nor shortens.
pub const ABANDON: &str = concat!(
    "#!lua\n",
    remember!(),
    r"local r = redis.call('HMGET', KEYS[1], 't', 'g', 'd', 'w', 'x', 's', 'su', 'ku')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or not r[3] or r[3] == '0' then
  return 'NOT_OWNER'
end
local f = {'d', '0', 'w', '', 'x', remember(r[5], ARGV[1])}
local cache = ARGV[3] ~= '' and tonumber(ARGV[4]) > 0
local retry = tonumber(ARGV[5]) > 0 and r[6] == 'ok'
local now = 0
if cache or retry then
  local tm = redis.call('TIME')
  now = math.floor(tm[1] * 1000 + tm[2] / 1000)
end
if retry and now < (tonumber(r[7] or 0) or 0) then
  f[#f + 1], f[#f + 2] = 'ra', string.format('%d', now + ARGV[5])
end
if cache then
  local n = #f
  f[n + 1], f[n + 2], f[n + 3], f[n + 4] = 'eb', ARGV[3], 'eg', ARGV[2]
  f[n + 5], f[n + 6] = 'ec', string.format('%d', now)
  f[n + 7], f[n + 8] = 'eu', string.format('%d', now + ARGV[4])
end
redis.call('HSET', KEYS[1], unpack(f))
if cache then
  local ku = tonumber(r[8] or 0) or 0
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(tonumber(ARGV[4]), ku - now)))
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

/// `INVALIDATE(state_ttl_ms)` → the new generation. Drops the result
/// (fresh and stale), the cached failure, the throttle and the lease, starts a newer generation (fencing a running owner), keeps
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
  gen = string.format('%d', g + 1)
end
redis.call('HSET', KEYS[1], 'g', gen, 't', '', 'd', '0')
redis.call('HDEL', KEYS[1], 's', 'b', 'w', 'rg', 'fu', 'ku', 'ct', 'su', 'wt', 'ra', 'eb', 'eg', 'ec', 'eu')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], gen, 'PX', ARGV[1])
for inbox in string.gmatch(r[2] or '', '%S+') do
  redis.call('PUBLISH', inbox, KEYS[1] .. '|' .. gen .. '|a')
end
return gen
";

/// `READ(stale)` → `{gen, st, body, invalidated, age_ms, ttl_ms, work_ms}`:
/// what ACQUIRE would replay when it grants nothing: the stored result
/// (its generation `rg`, status `s`, body `b`, age, TTL and work time)
/// while it is fresh; with `stale` (`1`: the stage answers stale
/// results), else the success kept past its freshness while it may be
/// answered stale (`su`; its age then is at least its TTL); else the
/// cached failure (`eg`, `err`, `eb`, ...) while it lasts; else nothing
/// (all nil but `rg`); and the last invalidation's generation (`KEYS[2]`,
/// nil when absent). Writes nothing (`no-writes`), so a primary that
/// refuses writes (`NOREPLICAS`) or a replica (`READONLY`) still runs it;
/// an expired record reads as absent.
pub const READ: &str = r"#!lua flags=no-writes
local r = redis.call('HMGET', KEYS[1], 'rg', 's', 'b', 'fu', 'ct', 'wt', 'eg', 'eb', 'ec', 'eu', 'su')
local tm = redis.call('TIME')
local now = tm[1] * 1000 + tm[2] / 1000
local inv = redis.call('GET', KEYS[2])
local fu, ct, su = tonumber(r[4] or 0) or 0, tonumber(r[5] or ''), tonumber(r[11] or 0) or 0
if ct and (fu > now or (ARGV[1] == '1' and r[2] == 'ok' and su > now)) then
  return {r[1], r[2], r[3], inv, math.max(0, math.floor(now - ct)), fu - ct, r[6] or false}
end
local eu, ec = tonumber(r[10] or 0) or 0, tonumber(r[9] or '')
if eu > now and ec then
  return {r[7], 'err', r[8], inv, math.max(0, math.floor(now - ec)), eu - ec, 0}
end
return {r[1], false, false, inv, false, false, false}
";
