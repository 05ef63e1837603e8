"""The Lua scripts of :mod:`lousho_sync.stores.redis`, one per atomic operation.

Each is registered once per store (``redis.Redis.register_script``) and runs on the server
as one atomic step. The comments say what each takes (KEYS, ARGV) and returns.
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "APPEND",
    "APPROVAL_CREATE",
    "CHECKPOINT_DELETE",
    "CHECKPOINT_SAVE",
    "COMPACT",
    "CREATE",
    "DELETE",
    "IDS",
    "LAYOUT",
    "PRUNE_APPROVALS",
    "PRUNE_CHECKPOINTS",
    "PRUNE_SESSIONS",
    "RELEASE",
    "RENEW",
    "RESOLVE",
    "REVISION",
    "SAVE",
    "SESSION_PAGE",
    "SET_METADATA",
    "TAKE_OVER",
]

# Lua helpers: RPUSH ARGV[from..to] in chunks (unpack is limited by Lua's C stack); the
# newest fence token when it is newer than a write's token ('0': an unfenced write); expiry
# of a session's keys; its created_at, set on its first write (a session of layout 2 has
# none: it takes the updated_at its transcript has so far).
_PUSH = """
local function push(key, from, to)
  to = to or #ARGV
  for i = from, to, 1000 do
    redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 999, to)))
  end
end
local function newer(fence_key, token)
  if token == '0' then return nil end
  local newest = tonumber(redis.call('GET', fence_key) or '0')
  if newest > tonumber(token) then return newest end
  return nil
end
local function touch(ttl_ms, ...)
  if tonumber(ttl_ms) > 0 then
    for _, key in ipairs({...}) do redis.call('PEXPIRE', key, ttl_ms) end
  end
end
local function created(info, list, index, id, now)
  if redis.call('HEXISTS', info, 'created') == 1 then return end
  local at = nil
  if redis.call('EXISTS', list) == 1 then at = redis.call('ZSCORE', index, id) end
  redis.call('HSET', info, 'created', at or now)
end
local function clear(list, meta, index, info, history, id, now, ttl_ms)
  redis.call('DEL', list, meta, history)
  if redis.call('HEXISTS', info, 'md') == 1 then
    redis.call('ZADD', index, now, id)
    touch(ttl_ms, info)
  else
    redis.call('DEL', info)
    redis.call('ZREM', index, id)
  end
end
"""

# KEYS: list, meta, revision counter, sessions index, fence, info, history.
# ARGV: now, ttl_ms, id, fence token, messages...
# Returns {1, length} or {-1, newest token} (refused: a newer lease token exists). No
# messages: the transcript and the history go; a session with metadata stays listed.
SAVE = (
    _PUSH
    + """
local newest = newer(KEYS[5], ARGV[4])
if newest then return {-1, newest} end
if #ARGV < 5 then
  clear(KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[7], ARGV[3], ARGV[1], ARGV[2])
  return {1, 0}
end
created(KEYS[6], KEYS[1], KEYS[4], ARGV[3], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[2])
push(KEYS[1], 5)
redis.call('HSET', KEYS[2], 'rev', redis.call('INCR', KEYS[3]))
touch(ARGV[2], KEYS[1], KEYS[2], KEYS[6], KEYS[7])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
return {1, #ARGV - 4}
"""
)

# KEYS: list, meta, revision counter, sessions index, fence, info, history.
# ARGV: now, ttl_ms, id, fence token, number of replaced messages r, the r replaced
# messages, then the new transcript's messages...
# Returns {1, length} or {-1, newest token} (refused). The replaced messages join the
# history; an empty transcript clears the session as SAVE does.
COMPACT = (
    _PUSH
    + """
local newest = newer(KEYS[5], ARGV[4])
if newest then return {-1, newest} end
local last = 5 + tonumber(ARGV[5])
if #ARGV <= last then
  clear(KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[7], ARGV[3], ARGV[1], ARGV[2])
  return {1, 0}
end
created(KEYS[6], KEYS[1], KEYS[4], ARGV[3], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[2])
push(KEYS[1], last + 1)
if last > 5 then push(KEYS[7], 6, last) end
redis.call('HSET', KEYS[2], 'rev', redis.call('INCR', KEYS[3]))
touch(ARGV[2], KEYS[1], KEYS[2], KEYS[6], KEYS[7])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
return {1, #ARGV - last}
"""
)

# KEYS: list, meta, revision counter, sessions index, info, history.
# ARGV: now, ttl_ms, id, metadata JSON ('' for none), number of history messages h, the h
# history messages, then the messages... Returns 1, or 0 (nothing written) when the id has
# messages or metadata.
CREATE = (
    _PUSH
    + """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HEXISTS', KEYS[5], 'md') == 1 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[5], KEYS[6])
local last = 5 + tonumber(ARGV[5])
local has_messages = #ARGV > last
if not has_messages and ARGV[4] == '' then
  redis.call('ZREM', KEYS[4], ARGV[3])
  return 1
end
redis.call('HSET', KEYS[5], 'created', ARGV[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[5], 'md', ARGV[4]) end
if has_messages then
  push(KEYS[1], last + 1)
  if last > 5 then push(KEYS[6], 6, last) end
  redis.call('HSET', KEYS[2], 'rev', redis.call('INCR', KEYS[3]))
end
touch(ARGV[2], KEYS[1], KEYS[2], KEYS[5], KEYS[6])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
return 1
"""
)

# KEYS: list, meta, sessions index, info, history. ARGV: now, ttl_ms, id, metadata JSON
# ('' removes it). The transcript and its revision stay; updated_at moves.
SET_METADATA = (
    _PUSH
    + """
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[4], 'md')
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[2], KEYS[4], KEYS[5])
    redis.call('ZREM', KEYS[3], ARGV[3])
    return 1
  end
end
created(KEYS[4], KEYS[1], KEYS[3], ARGV[3], ARGV[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], 'md', ARGV[4]) end
touch(ARGV[2], KEYS[1], KEYS[2], KEYS[4], KEYS[5])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[3])
return 1
"""
)

# KEYS: list, meta, sessions index, info, history. ARGV: id. Removes all of the session.
DELETE = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: list, meta, revision counter, sessions index, checkpoint, its two indexes, lease,
# fence, info, history.
# ARGV: now, ttl_ms, id, expected_length, op token, drop checkpoint ('1'/'0'), checkpoint
# key, release the lease held under the fence token ('1'/'0'), fence token, messages...
# Returns {1, new length, revision} (revision false: no transcript), {0, actual length} (a
# conflict) or {-1, newest token} (refused). A retry of an append that was done (same op
# token) returns its result.
APPEND = (
    _PUSH
    + """
local n = redis.call('LLEN', KEYS[1])
local expected = tonumber(ARGV[4])
local count = #ARGV - 9
if count > 0 and n == expected + count and redis.call('HGET', KEYS[2], 'op') == ARGV[5] then
  return {1, n, tonumber(redis.call('HGET', KEYS[2], 'rev'))}
end
local newest = newer(KEYS[9], ARGV[9])
if newest then return {-1, newest} end
if n ~= expected then return {0, n} end
if ARGV[6] == '1' then
  redis.call('DEL', KEYS[5])
  redis.call('ZREM', KEYS[6], ARGV[7])
  redis.call('ZREM', KEYS[7], ARGV[7])
end
if ARGV[8] == '1' and redis.call('GET', KEYS[9]) == ARGV[9] then
  redis.call('DEL', KEYS[8])
end
if count == 0 then
  if n == 0 then return {1, 0, false} end
  return {1, n, tonumber(redis.call('HGET', KEYS[2], 'rev'))}
end
created(KEYS[10], KEYS[1], KEYS[4], ARGV[3], ARGV[1])
push(KEYS[1], 10)
local rev = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], 'rev', rev, 'op', ARGV[5])
touch(ARGV[2], KEYS[1], KEYS[2], KEYS[10], KEYS[11])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
return {1, n + count, rev}
"""
)

# KEYS: list, meta. Returns the revision, or false when the transcript is absent.
REVISION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('HGET', KEYS[2], 'rev')
"""

# KEYS: index, then per id: list, info. ARGV: ids. Returns the ids with a transcript or
# metadata; drops the others (expired through ttl_s) from the index.
IDS = """
local out = {}
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[2 * i]) == 1
      or redis.call('HEXISTS', KEYS[2 * i + 1], 'md') == 1 then
    out[#out + 1] = ARGV[i]
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return out
"""

# KEYS: sessions index. ARGV: the highest score ('+inf', or the cursor's score), '1' when
# that is a cursor's score, how many rows are wanted, the id prefix, the chunk size.
# Returns {done, cursor band, rows, tail band}: done 1 when the index has no rows past
# ``rows``; the cursor band is every id (with the prefix) at the cursor's score; rows are
# the ids (with the prefix) below it, newest first, ``wanted`` or more unless done; the
# tail band (when not done) every id (with the prefix) at the lowest score of ``rows``.
# Each is a flat {id, score, ...}. Lua compares no ids (its string order is the server's
# locale): the client orders ties by id.
SESSION_PAGE = """
local index, top, want, prefix, chunk = KEYS[1], ARGV[1], tonumber(ARGV[3]), ARGV[4],
  tonumber(ARGV[5])
local plen = #prefix
local function band(score)
  local out = {}
  local got = redis.call('ZRANGEBYSCORE', index, score, score, 'WITHSCORES')
  for i = 1, #got, 2 do
    if string.sub(got[i], 1, plen) == prefix then
      out[#out + 1] = got[i]
      out[#out + 1] = got[i + 1]
    end
  end
  return out
end
local first = {}
if ARGV[2] == '1' then
  first = band(top)
  top = '(' .. top
end
local rows, n, offset, done, last = {}, 0, 0, 0, nil
while n < want do
  local got = redis.call('ZREVRANGEBYSCORE', index, top, '-inf', 'WITHSCORES', 'LIMIT',
    offset, chunk)
  for i = 1, #got, 2 do
    if string.sub(got[i], 1, plen) == prefix then
      rows[#rows + 1] = got[i]
      rows[#rows + 1] = got[i + 1]
      n = n + 1
    end
  end
  offset = offset + #got / 2
  if #got < 2 * chunk then
    done = 1
    break
  end
  last = got[#got]
end
local tail = {}
if done == 0 and last then tail = band(last) end
return {done, first, rows, tail}
"""

# KEYS: lease, fence. ARGV: owner, ttl_ms.
# Returns {1, new fence token} when taken (or already ours), else {0, holder or ''}.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, holder or ''}
"""

# KEYS: lease, fence. ARGV: dead holder, new owner, ttl_ms. Compare-and-set.
# Returns the new fence token, or 0 when the holder changed meanwhile.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return redis.call('INCR', KEYS[2])
end
return 0
"""

# KEYS: lease. ARGV: owner, ttl_ms.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease. ARGV: owner.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: checkpoint, its time index, its lex index, fence.
# ARGV: json, now, key, fence token. Returns {1} or {-1, newest token} (refused).
CHECKPOINT_SAVE = (
    _PUSH
    + """
local newest = newer(KEYS[4], ARGV[4])
if newest then return {-1, newest} end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[3])
return {1}
"""
)

# KEYS: checkpoint, its time index, its lex index, fence. ARGV: key, fence token.
# Returns {1} or {-1, newest token} (refused).
CHECKPOINT_DELETE = (
    _PUSH
    + """
local newest = newer(KEYS[4], ARGV[2])
if newest then return {-1, newest} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {1}
"""
)

# KEYS: record, pending index, resolved index, fence.
# ARGV: fence token, id, json, status, created_at, reason ('' with has_reason '0'),
# has_reason, resolved_at ('' for none). Returns {1} or {-1, newest token} (refused).
APPROVAL_CREATE = (
    _PUSH
    + """
local newest = newer(KEYS[4], ARGV[1])
if newest then return {-1, newest} end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'json', ARGV[3], 'status', ARGV[4])
if ARGV[7] == '1' then redis.call('HSET', KEYS[1], 'reason', ARGV[6]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'resolved_at', ARGV[8]) end
if ARGV[4] == 'pending' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
  local at = ARGV[8]
  if at == '' then at = '0' end
  redis.call('ZADD', KEYS[3], at, ARGV[2])
end
return {1}
"""
)

# KEYS: record, pending index, resolved index.
# ARGV: status, has_reason, reason, resolved_at, id, token, json with resolved_by ('' none).
# Returns {1, json} when this call resolved it, {0} when absent, {2, status} when resolved.
RESOLVE = """
local cur = redis.call('HMGET', KEYS[1], 'status', 'json', 'op')
if not cur[2] then return {0} end
if cur[1] ~= 'pending' then
  if cur[3] == ARGV[6] then return {1, cur[2]} end
  return {2, cur[1]}
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'resolved_at', ARGV[4], 'op', ARGV[6])
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'reason', ARGV[3])
else
  redis.call('HDEL', KEYS[1], 'reason')
end
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
if ARGV[7] and ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'json', ARGV[7])
  return {1, ARGV[7]}
end
return {1, cur[2]}
"""

# KEYS: index, then per id: list, meta, lease, info, history. ARGV: cutoff, ids...
# Returns how many sessions it removed.
PRUNE_SESSIONS = """
local removed = 0
for i = 2, #ARGV do
  local k = 2 + (i - 2) * 5
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < tonumber(ARGV[1])
      and redis.call('EXISTS', KEYS[k + 2]) == 0 then
    local live = redis.call('EXISTS', KEYS[k]) + redis.call('HEXISTS', KEYS[k + 3], 'md')
    if live > 0 then removed = removed + 1 end
    redis.call('DEL', KEYS[k], KEYS[k + 1], KEYS[k + 3], KEYS[k + 4])
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
"""

# KEYS: time index, lex index, then each checkpoint. ARGV: cutoff, keys...
PRUNE_CHECKPOINTS = """
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < tonumber(ARGV[1]) then
    removed = removed + redis.call('DEL', KEYS[i + 1])
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
  end
end
return removed
"""

# KEYS: resolved index, then each record. ARGV: cutoff, ids...
PRUNE_APPROVALS = """
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < tonumber(ARGV[1]) then
    local status = redis.call('HGET', KEYS[i], 'status')
    if status ~= 'pending' then
      removed = removed + redis.call('DEL', KEYS[i])
      redis.call('ZREM', KEYS[1], ARGV[i])
    end
  end
end
return removed
"""

# KEYS: layout. ARGV: this release's layout. Sets it when absent or an older number (an
# older layout is readable as this one). Returns the stored layout.
LAYOUT = """
local stored = redis.call('GET', KEYS[1])
if not stored or (tonumber(stored) and tonumber(stored) < tonumber(ARGV[1])) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return stored
"""
