"""The Redis store's event-log primitives: a turn's rows are a Stream
(``<prefix>events:<turn>``, entry id ``0-<seq + 1>``), its head a hash
(``<prefix>turn-head:<turn>``), a session's latest turn a string
(``<prefix>turn-latest:<session>``) and the ended turns a sorted set by end time
(``<prefix>turns-ended``). Readers wake with ``XREAD BLOCK``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from ._events import TurnHead, TurnStatus
from ._redis_conn import Conn, as_str

__all__ = ["RedisEventOps"]

BLOCK_MS_MAX = 1000


def _id(seq: int) -> str:
    return f"0-{seq + 1}"


def _seq(entry_id: object) -> int:
    return int(as_str(entry_id).split("-", 1)[1]) - 1


class RedisEventOps:
    """:class:`~lousho_sync.stores._events.EventOps` on a Redis store's client."""

    def __init__(self, conn: Conn) -> None:
        self._c = conn

    def _rows_key(self, turn_id: str) -> str:
        return self._c.key("events:", turn_id)

    def _head_key(self, turn_id: str) -> str:
        return self._c.key("turn-head:", turn_id)

    def begin(self, head: TurnHead) -> None:
        def fn(r: Any) -> None:
            pipe = r.pipeline(transaction=True)
            key = self._head_key(head.turn_id)
            pipe.delete(key)
            pipe.hset(key, mapping={
                "session_id": head.session_id, "owner": head.owner,
                "started_at": repr(head.started_at), "last_seq": head.last_seq,
                "status": head.status, "ended_at": "", "rows": head.rows,
            })
            pipe.set(self._c.key("turn-latest:", head.session_id), head.turn_id)
            pipe.zrem(self._c.key("turns-ended"), head.turn_id)
            pipe.execute()

        self._c.run("begin a turn's event log", fn, head.session_id)

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        def fn(r: Any) -> bool:
            head_key = self._head_key(turn_id)
            with r.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(head_key)  # a takeover's begin() in between: try again
                        held = pipe.hget(head_key, "owner")
                        if held is not None and as_str(held) != owner:
                            return False  # another owner re-opened the turn (a takeover)
                        pipe.multi()
                        key = self._rows_key(turn_id)
                        for seq, text in rows:
                            pipe.xadd(key, {"d": text}, id=_id(seq))
                        fields: dict[str, Any] = {
                            "owner": owner, "status": status,
                            "ended_at": "" if ended_at is None else repr(ended_at)}
                        if rows:
                            fields["last_seq"] = rows[-1][0]
                        pipe.hset(head_key, mapping=fields)
                        pipe.hincrby(head_key, "rows", len(rows))
                        if ended_at is not None:
                            pipe.zadd(self._c.key("turns-ended"), {turn_id: ended_at})
                        pipe.execute()
                        return True
                    except redis_errors.WatchError:
                        continue

        return self._c.run("write events", fn)

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
        return [(_seq(eid), as_str(fields[b"d"] if b"d" in fields else fields["d"]))
                for eid, fields in entries]

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
