"""The Lua scripts of :mod:`lousho_sync.stores.redis`, one per atomic operation.

Each is registered once per store (``redis.Redis.register_script``) and runs on the server
as one atomic step. The comments say what each takes (KEYS, ARGV) and returns.
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "APPEND",
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
    "TAKE_OVER",
]

# Lua helpers: RPUSH ARGV[from..] in chunks (unpack is limited by Lua's C stack).
_PUSH = """
local function push(key, from)
  for i = from, #ARGV, 1000 do
    redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
end
local function touch(ttl_ms)
  if tonumber(ttl_ms) > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
    redis.call('PEXPIRE', KEYS[2], ttl_ms)
  end
end
"""

# KEYS: list, meta, revision counter, sessions index.
# ARGV: now, ttl_ms, id, messages...
SAVE = (
    _PUSH
    + """
redis.call('DEL', KEYS[1], KEYS[2])
if #ARGV < 4 then
  redis.call('ZREM', KEYS[4], ARGV[3])
  return 0
end
push(KEYS[1], 4)
redis.call('HSET', KEYS[2], 'rev', redis.call('INCR', KEYS[3]))
touch(ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
return #ARGV - 3
"""
)

# KEYS: list, meta, revision counter, sessions index [, checkpoint, its two indexes, lease].
# ARGV: now, ttl_ms, id, expected_length, token, drop checkpoint ('1'/'0'), checkpoint key,
# lease owner to release ('' for none), messages...
# Returns {1, new length, revision} or {0, actual length} (a conflict).
APPEND = (
    _PUSH
    + """
local n = redis.call('LLEN', KEYS[1])
local expected = tonumber(ARGV[4])
local count = #ARGV - 8
if n ~= expected then
  if n == expected + count and redis.call('HGET', KEYS[2], 'op') == ARGV[5] then
    return {1, n, tonumber(redis.call('HGET', KEYS[2], 'rev'))}
  end
  return {0, n}
end
push(KEYS[1], 9)
local rev = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], 'rev', rev, 'op', ARGV[5])
touch(ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
if ARGV[6] == '1' then
  redis.call('DEL', KEYS[5])
  redis.call('ZREM', KEYS[6], ARGV[7])
  redis.call('ZREM', KEYS[7], ARGV[7])
end
if ARGV[8] ~= '' and redis.call('GET', KEYS[8]) == ARGV[8] then
  redis.call('DEL', KEYS[8])
end
return {1, n + count, rev}
"""
)

# KEYS: list, meta. Returns the revision, or false when the transcript is absent.
REVISION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('HGET', KEYS[2], 'rev')
"""

# KEYS: index, list of each id... ARGV: ids. Returns the ids whose list exists; drops the
# others (expired through ttl_s) from the index.
IDS = """
local out = {}
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 1 then
    out[#out + 1] = ARGV[i]
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return out
"""

# KEYS: lease. ARGV: owner, ttl_ms. Returns 1 when taken (or already ours), else the holder.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return holder or 0
"""

# KEYS: lease. ARGV: dead holder, new owner, ttl_ms. Compare-and-set.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
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

# KEYS: record, pending index, resolved index.
# ARGV: status, has_reason, reason, resolved_at, id, token.
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
return {1, cur[2]}
"""

# KEYS: index, then per id: list, meta, lease. ARGV: cutoff, ids...
PRUNE_SESSIONS = """
local removed = 0
for i = 2, #ARGV do
  local k = 2 + (i - 2) * 3
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < tonumber(ARGV[1])
      and redis.call('EXISTS', KEYS[k + 2]) == 0 then
    removed = removed + redis.call('DEL', KEYS[k])
    redis.call('DEL', KEYS[k + 1])
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

# KEYS: layout. ARGV: this release's layout. Returns the stored layout.
LAYOUT = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""
