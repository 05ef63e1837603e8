"""RedisStore's primitives for the store engine (leases, checkpoints, approvals, the
commit), each one script or one read, and the key lists its scripts take. See
:mod:`lousho_sync.stores.redis` for the key layout."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from ..codec import approval_json_resolved_by
from ..records import ApprovalRecord, Checkpoint
from ._engine.commits import CommitOp, Conflict, Stale
from ._redis_conn import Conn, as_str, ms, op_token

__all__ = [
    "RedisApprovals",
    "RedisCheckpoints",
    "RedisCommits",
    "RedisLeases",
    "catalog_keys",
    "session_keys",
]


def session_keys(c: Conn, id: str) -> list[str]:
    """The transcript's keys: list, meta, the revision counter, the sessions index."""
    return [c.key("session:", id), c.key("session-meta:", id), c.key("revision"),
            c.key("sessions")]


def catalog_keys(c: Conn, id: str) -> list[str]:
    """The catalog's keys of ``id``: info, history."""
    return [c.key("session-info:", id), c.key("session-history:", id)]


def _fence_key(c: Conn, fenced_id: str | None) -> str:
    return c.key("fence:", fenced_id or "")


class RedisLeases:
    """The lease primitives: ``lease:<id>`` (the owner, with Redis's own PX expiry) and
    ``fence:<id>`` (INCR per acquisition, never deleted)."""

    def __init__(self, conn: Conn) -> None:
        self.backend = conn

    def _keys(self, id: str) -> list[str]:
        return [self.backend.key("lease:", id), self.backend.key("fence:", id)]

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        c, keys = self.backend, self._keys(id)
        out = c.run("acquire a lease", lambda r: c.acquire_script(keys, [owner, ms(ttl_s)], r),
                    id)
        return int(out[1]) if out[0] == 1 else as_str(out[1])

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        c, keys = self.backend, self._keys(id)
        return int(c.run(
            "take over a lease",
            lambda r: c.take_over_script(keys, [holder, owner, ms(ttl_s)], r),
            id,
        ))

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        c, key = self.backend, [self.backend.key("lease:", id)]
        done = c.run("renew a lease", lambda r: c.renew_script(key, [owner, ms(ttl_s)], r), id)
        return bool(done == 1)

    def release(self, id: str, owner: str) -> None:
        c, key = self.backend, [self.backend.key("lease:", id)]
        c.run("release a lease", lambda r: c.release_script(key, [owner], r), id)

    def newest(self, id: str) -> int:
        key = self.backend.key("fence:", id)
        value = self.backend.run("read a fence token", lambda r: r.get(key), id)
        return 0 if value is None else int(value)

    def holder(self, id: str) -> str:
        key = self.backend.key("lease:", id)
        value = self.backend.run("read a lease", lambda r: r.get(key), id)
        return "" if value is None else as_str(value)


class RedisCheckpoints:
    """The checkpoint primitives: a string per key with two index entries, one script a
    write."""

    def __init__(self, conn: Conn) -> None:
        self.backend = conn

    def _keys(self, key: str, fenced_id: str | None) -> list[str]:
        c = self.backend
        return [c.key("checkpoint:", key), c.key("checkpoints"), c.key("checkpoint-keys"),
                _fence_key(c, fenced_id)]

    def get(self, key: str) -> str | bytes | None:
        rkey = self.backend.key("checkpoint:", key)
        value: str | bytes | None = self.backend.run("load a checkpoint", lambda r: r.get(rkey))
        return value

    def put(self, key: str, session_id: str | None, text: str, fenced_id: str | None,
            token: int, checkpoint: Checkpoint) -> int:
        c, keys = self.backend, self._keys(key, fenced_id)
        args: list[Any] = [text, repr(time.time()), key, token]
        return c.refused(c.run("save a checkpoint",
                               lambda r: c.checkpoint_save_script(keys, args, r), session_id))

    def drop(self, key: str, fenced_id: str | None, token: int) -> int:
        c, keys = self.backend, self._keys(key, fenced_id)
        return c.refused(c.run("delete a checkpoint",
                               lambda r: c.checkpoint_delete_script(keys, [key, token], r),
                               fenced_id))

    def keys(self, prefix: str) -> list[str]:
        if prefix:
            raw = prefix.encode("utf-8", "surrogatepass")
            low, high = b"[" + raw, b"(" + raw + b"\xff"  # 0xff never occurs in UTF-8
        else:
            low, high = b"-", b"+"
        index = self.backend.key("checkpoint-keys")
        found = self.backend.run("list checkpoints", lambda r: r.zrangebylex(index, low, high))
        return [as_str(k) for k in found]


_FIELDS = ["json", "status", "reason", "resolved_at"]


class RedisApprovals:
    """The approval primitives: a hash per record (``json`` as created, ``status``,
    ``reason``, ``resolved_at``: the truth), a pending and a resolved index."""

    def __init__(self, conn: Conn) -> None:
        self.backend = conn

    def _keys(self, id: str) -> list[str]:
        c = self.backend
        return [c.key("approval:", id), c.key("approvals-pending"), c.key("approvals-resolved")]

    def put(self, record: ApprovalRecord, text: str, resolved: float | None,
            fenced_id: str | None, token: int) -> int:
        c = self.backend
        keys = [*self._keys(record.id), _fence_key(c, fenced_id)]
        args: list[Any] = [
            token,
            record.id,
            text,
            record.status,
            repr(record.created_at),
            record.reason or "",
            "0" if record.reason is None else "1",
            "" if resolved is None else repr(resolved),
        ]
        return c.refused(c.run("create an approval",
                               lambda r: c.approval_create_script(keys, args, r),
                               record.session_id))

    def row(self, id: str) -> Sequence[Any] | None:
        rkey = self.backend.key("approval:", id)
        row = self.backend.run("read an approval", lambda r: r.hmget(rkey, _FIELDS))
        return None if row[0] is None else row

    def resolve(self, id: str, status: str, reason: str | None, at: float, by: str | None
                ) -> Sequence[Any] | str | None:
        c, keys = self.backend, self._keys(id)
        stamped = ""
        if by is not None:  # the created record's JSON never changes: read it first
            old = c.run("read an approval", lambda r: r.hget(keys[0], "json"))
            if old is not None:
                stamped = approval_json_resolved_by(old, by)
        args: list[Any] = [status, "0" if reason is None else "1", reason or "", repr(at), id,
                           op_token(), stamped]
        out = c.run("resolve an approval", lambda r: c.resolve_script(keys, args, r))
        if out[0] == 0:
            return None
        if out[0] == 2:
            return as_str(out[1])
        return (out[1], status, reason, at)

    def pending(self, session_id: str | None) -> list[tuple[str, Sequence[Any]]]:
        c = self.backend
        index = c.key("approvals-pending")

        def read(r: redis.Redis) -> tuple[list[Any], list[Any]]:
            ids = r.zrange(index, 0, -1)
            with r.pipeline(transaction=False) as p:
                for m in ids:
                    p.hmget(c.key("approval:", as_str(m)), _FIELDS)
                return ids, p.execute()

        ids, rows = c.run("list approvals", read)
        out: list[tuple[str, Sequence[Any]]] = []
        for m, row in zip(ids, rows, strict=True):
            if row[0] is None or as_str(row[1]) != "pending":
                continue  # resolved or deleted between the two reads
            out.append((as_str(m), row))
        return out  # the engine keeps those of ``session_id``


class RedisCommits:
    """The commit primitive: the APPEND script (one round trip) checks the fence and the
    length, pushes, drops the checkpoint and releases the lease; its op token makes a
    retried call see its own write."""

    def __init__(self, conn: Conn, ttl_ms: int) -> None:
        self.backend = conn
        self.ttl_ms = ttl_ms

    def commit(self, op: CommitOp) -> object:
        c, id = self.backend, op.id
        cp = "" if op.checkpoint_key is None else op.checkpoint_key
        keys = [
            *session_keys(c, id),
            c.key("checkpoint:", cp),
            c.key("checkpoints"),
            c.key("checkpoint-keys"),
            c.key("lease:", id),
            _fence_key(c, id if op.token else None),
            *catalog_keys(c, id),
        ]
        args: list[Any] = [
            repr(time.time()),
            self.ttl_ms,
            id,
            op.expected_length,
            op_token(),
            "0" if op.checkpoint_key is None else "1",
            cp,
            "1" if op.release else "0",
            op.token,
            *op.texts,
        ]
        out = c.run("append to a session", lambda r: c.append_script(keys, args, r), id)
        if out[0] == -1:
            return Stale(int(out[1]))
        if out[0] == 0:
            return Conflict(int(out[1]))
        return None if out[2] is None else int(out[2])
