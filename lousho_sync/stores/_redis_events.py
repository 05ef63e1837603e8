"""The Redis store's event-log primitives: a turn's rows are a Stream
(``<prefix>events:<turn>``) of one entry per write (by 1,000 rows at most), with the id
``0-<seq + 1>`` of its last row: a lone row is its field ``d``, several rows are fields
named by their seq (a write of 1,000 text deltas is one entry, not 1,000); its head a hash
(``<prefix>turn-head:<turn>``), a session's latest turn a string
(``<prefix>turn-latest:<session>``) and the ended turns a sorted set by end time
(``<prefix>turns-ended``). Readers wake with ``XREAD BLOCK``. A begin and a write are a
script each (one round trip); a write also says whether a reader watches the turn, and
then announces itself on the turn's live channel (:mod:`._redis_live`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._events import TurnHead, TurnStatus
from ._redis_conn import Conn, as_str
from ._redis_live import RedisLive

__all__ = ["RedisEventOps"]

BLOCK_MS_MAX = 1000

# KEYS: head, rows (the Stream), ended turns, readers' mark. ARGV: owner, status, ended_at
# ('' while running), turn id, the rows as one flat JSON array [seq, row, seq, row, ...],
# the turn's live channel. One atomic
# step, one round trip: 0, nothing written, when another owner re-opened the turn (a
# takeover's begin); else 1: the rows are added, up to 1,000 to a Stream entry (see the
# module), the rows whose seq the Stream holds already left out (the retry of a write that
# was made; rows come in seq order), and the head's owner, status, ended_at, last_seq and
# rows are set (a head that is gone is not made again); 2 instead of 1 when a reader
# watches the turn (then ``w`` is published on its live channel: the log has new rows).
_APPEND = """
local held = redis.call('HGET', KEYS[1], 'owner')
if held and held ~= ARGV[1] then return 0 end
local top = -1
local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if newest then top = tonumber(string.match(newest[1], '%-(%d+)$')) - 1 end
local f = cjson.decode(ARGV[5])
local n = #f
local first = 1
while first < n and f[first] <= top do first = first + 2 end
for i = first, n - 1, 2000 do
  local last = math.min(i + 1999, n)
  local id = '0-' .. string.format('%d', f[last - 1] + 1)
  if last - i == 1 then
    redis.call('XADD', KEYS[2], id, 'd', f[last])
  else
    redis.call('XADD', KEYS[2], id, unpack(f, i, last))
  end
end
if held then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'status', ARGV[2], 'ended_at', ARGV[3])
  if n > 0 then redis.call('HSET', KEYS[1], 'last_seq', string.format('%d', f[n - 1])) end
  redis.call('HINCRBY', KEYS[1], 'rows', (n - first + 1) / 2)
end
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4]) end
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('PUBLISH', ARGV[6], 'w')
  return 2
end
return 1
"""


# KEYS: head, the session's latest turn, ended turns. ARGV: session id, owner, started_at,
# last_seq, status, rows, turn id. The head made again (an old one's fields gone but the
# highest seq sent live), the session's latest turn set, the turn not ended: one atomic
# step, one round trip.
_BEGIN = """
local live = redis.call('HGET', KEYS[1], 'live_seq')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'session_id', ARGV[1], 'owner', ARGV[2], 'started_at', ARGV[3],
           'last_seq', ARGV[4], 'status', ARGV[5], 'ended_at', '', 'rows', ARGV[6])
if live then redis.call('HSET', KEYS[1], 'live_seq', live) end
redis.call('SET', KEYS[2], ARGV[7])
redis.call('ZREM', KEYS[3], ARGV[7])
return 1
"""


def _id(seq: int) -> str:
    return f"0-{seq + 1}"


def _seq(entry_id: object) -> int:
    return int(as_str(entry_id).split("-", 1)[1]) - 1


class RedisEventOps:
    """:class:`~lousho_sync.stores._events.EventOps` on a Redis store's client."""

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self._append = conn.client.register_script(_APPEND)
        self._begin = conn.client.register_script(_BEGIN)
        self.live = RedisLive(conn)
        """The live tail (:class:`~._events.LiveOps`)."""

    def _rows_key(self, turn_id: str) -> str:
        return self._c.key("events:", turn_id)

    def _head_key(self, turn_id: str) -> str:
        return self._c.key("turn-head:", turn_id)

    def begin(self, head: TurnHead) -> None:
        keys = [self._head_key(head.turn_id), self._c.key("turn-latest:", head.session_id),
                self._c.key("turns-ended")]
        args: list[str | int] = [head.session_id, head.owner, repr(head.started_at),
                                 head.last_seq, head.status, head.rows, head.turn_id]
        self._c.run("begin a turn's event log",
                    lambda r: self._begin(keys=keys, args=args, client=r), head.session_id)

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        live = self.live
        keys = [self._head_key(turn_id), self._rows_key(turn_id), self._c.key("turns-ended"),
                live.watch_key(turn_id)]
        args = [owner, status, "" if ended_at is None else repr(ended_at), turn_id,
                json.dumps([x for row in rows for x in row], ensure_ascii=False,
                           separators=(",", ":")), live.channel(turn_id)]
        out = int(self._c.run("write events",
                              lambda r: self._append(keys=keys, args=args, client=r)))
        if out:
            live.found(turn_id, out == 2, ended_at is not None)
        return bool(out)

    def head(self, turn_id: str) -> TurnHead | None:
        d = self._c.run("read a turn's event log",
                        lambda r: r.hgetall(self._head_key(turn_id)))
        if not d:
            return None
        f = {as_str(k): as_str(v) for k, v in d.items()}
        status: Any = f["status"]
        return TurnHead(turn_id=turn_id, session_id=f["session_id"], owner=f["owner"],
                        started_at=float(f["started_at"]), last_seq=int(f["last_seq"]),
                        status=status,
                        ended_at=float(f["ended_at"]) if f.get("ended_at") else None,
                        rows=int(f.get("rows", 0)))

    def latest(self, session_id: str) -> str | None:
        value = self._c.run("read a session's latest turn",
                            lambda r: r.get(self._c.key("turn-latest:", session_id)))
        return None if value is None else as_str(value)

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        entries: Any = self._c.run("read events", lambda r: r.xrange(
            self._rows_key(turn_id), min=_id(after + 1), max="+", count=limit))
        rows: list[tuple[int, str]] = []
        for entry_id, fields in entries:
            if len(fields) == 1 and (b"d" in fields or "d" in fields):
                rows.append((_seq(entry_id), as_str(next(iter(fields.values())))))
                continue
            batch = sorted((int(as_str(k)), as_str(v)) for k, v in fields.items())
            rows.extend(row for row in batch if row[0] > after)
        return rows[:limit]

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        block = max(1, min(BLOCK_MS_MAX, int(timeout * 1000)))
        self._c.run("wait for events", lambda r: r.xread(
            {self._rows_key(turn_id): _id(after)}, count=1, block=block))

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        later = self.read(turn_id, upto, 1 << 30)

        def fn(r: Any) -> None:
            pipe = r.pipeline(transaction=True)
            key = self._rows_key(turn_id)
            pipe.delete(key)
            for seq, text in [*rows, *later]:
                pipe.xadd(key, {"d": text}, id=_id(seq))
            pipe.hset(self._head_key(turn_id), "rows", len(rows) + len(later))
            pipe.execute()

        self._c.run("bound a turn's event log", fn)

    def drop(self, turn_id: str) -> None:
        head = self.head(turn_id)

        def fn(r: Any) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.delete(self._rows_key(turn_id), self._head_key(turn_id))
            pipe.zrem(self._c.key("turns-ended"), turn_id)
            pipe.execute()
            if head is not None:
                latest = self._c.key("turn-latest:", head.session_id)
                if as_str(r.get(latest) or b"") == turn_id:
                    r.delete(latest)

        self._c.run("remove a turn's event log", fn)

    def ended_before(self, when: float) -> list[str]:
        ids = self._c.run("list ended turns", lambda r: r.zrangebyscore(
            self._c.key("turns-ended"), "-inf", f"({when!r}"))
        return [as_str(i) for i in ids]
