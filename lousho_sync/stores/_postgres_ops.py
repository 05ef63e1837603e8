"""PostgresStore's primitives for the store engine (leases, checkpoints, approvals, the
commit), each one statement or one transaction, and the statements its writes share. See
:mod:`lousho_sync.stores.postgres` for the schema, the retries and the op tokens."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..codec import approval_json_resolved_by
from ..records import ApprovalRecord, Checkpoint
from ._engine.commits import CommitOp, Conflict, Stale
from ._postgres_db import Conn, Db

__all__ = [
    "INSERT_MESSAGES",
    "append_rows",
    "PostgresApprovals",
    "PostgresCheckpoints",
    "PostgresCommits",
    "PostgresLeases",
    "locked_token",
]

INSERT_MESSAGES = (
    "INSERT INTO {s}.messages (session_key, seq, json) SELECT %s, %s + t.o - 1, t.j"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS t(j, o)"
)
# commit_turn's common case in one statement (one round trip, atomic in autocommit):
# when the fence holds (the lease row locked, its token not newer) and the session holds
# ``expected`` messages, append, drop the checkpoint, release the lease. No row back means
# nothing was written; the transactional path then says why (or creates the session).
_COMMIT_TURN = (
    "WITH f AS (SELECT token FROM {s}.leases WHERE session_id = %(id)s AND %(token)s > 0"
    " FOR UPDATE), u AS (UPDATE {s}.sessions SET length = length + %(n)s,"
    " revision = revision + 1, op = %(op)s, updated_at = %(now)s WHERE id = %(id)s"
    " AND length = %(expected)s AND coalesce((SELECT max(token) FROM f), 0) <= %(token)s"
    " RETURNING key, revision), i AS (INSERT INTO {s}.messages (session_key, seq, json)"
    " SELECT u.key, %(expected)s + t.o - 1, t.j FROM u,"
    " unnest(%(texts)s::text[]) WITH ORDINALITY AS t(j, o)), d AS (DELETE FROM"
    " {s}.checkpoints WHERE key = %(checkpoint)s AND EXISTS (SELECT FROM u)), r AS"
    " (UPDATE {s}.leases SET owner = '', expires_at = 0 WHERE %(release)s"
    " AND session_id = %(id)s AND token = %(token)s AND EXISTS (SELECT FROM u))"
    " SELECT key, revision FROM u"
)


def locked_token(db: Db, c: Conn, id: str) -> int:
    """Inside the caller's transaction: lock ``id``'s lease row; its newest token (0:
    none)."""
    row = c.execute(
        db.q("SELECT token FROM {s}.leases WHERE session_id = %s FOR UPDATE"), (id,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def _fenced(db: Db, c: Conn, fenced_id: str | None, token: int, write: Any,
            params: Sequence[Any]) -> int:
    """``write`` alone (unfenced), or in a transaction after the fence holds: 0 written,
    else the newer token that refused it."""
    if not fenced_id:
        c.execute(write, params)
        return 0
    with c.transaction():
        newest = locked_token(db, c, fenced_id)
        if newest > token:
            return newest
        c.execute(write, params)
    return 0


class PostgresLeases:
    """The lease primitives: a ``leases`` row per session whose ``token`` only grows (a
    released lease keeps its row, owner ``''``)."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        db = self.backend

        def attempt(c: Conn) -> int | str:
            now = time.time()
            row = c.execute(db.q(
                "INSERT INTO {s}.leases AS l (session_id, owner, expires_at, token)"
                " VALUES (%s, %s, %s, 1) ON CONFLICT (session_id) DO UPDATE SET"
                " owner = excluded.owner, expires_at = excluded.expires_at, token = l.token + 1"
                " WHERE l.owner = excluded.owner OR l.expires_at <= %s RETURNING token"),
                (id, owner, now + ttl_s, now)).fetchone()
            if row is not None:
                return int(row[0])
            row = c.execute(db.q("SELECT owner FROM {s}.leases WHERE session_id = %s"),
                            (id,)).fetchone()
            return "" if row is None else str(row[0])

        return db.run("acquire a lease", attempt, id)

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        db = self.backend

        def take(c: Conn) -> int:
            row = c.execute(db.q(
                "UPDATE {s}.leases SET owner = %s, expires_at = %s, token = token + 1"
                " WHERE session_id = %s AND owner = %s RETURNING token"),
                (owner, time.time() + ttl_s, id, holder)).fetchone()
            return 0 if row is None else int(row[0])

        return db.run("take over a lease", take, id)

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        db = self.backend
        count = db.run("renew a lease", lambda c: c.execute(db.q(
            "UPDATE {s}.leases SET expires_at = %s WHERE session_id = %s AND owner = %s"),
            (time.time() + ttl_s, id, owner)).rowcount, id)
        return count == 1

    def release(self, id: str, owner: str) -> None:
        db = self.backend
        db.run("release a lease", lambda c: c.execute(db.q(
            "UPDATE {s}.leases SET owner = '', expires_at = 0"
            " WHERE session_id = %s AND owner = %s"), (id, owner)), id)

    def newest(self, id: str) -> int:
        db = self.backend
        row = db.run("read a fence token", lambda c: c.execute(
            db.q("SELECT token FROM {s}.leases WHERE session_id = %s"), (id,)).fetchone(), id)
        return 0 if row is None else int(row[0])

    def holder(self, id: str) -> str:
        db = self.backend
        row = db.run("read a lease", lambda c: c.execute(db.q(
            "SELECT owner FROM {s}.leases WHERE session_id = %s AND expires_at > %s"),
            (id, time.time())).fetchone(), id)
        return "" if row is None else str(row[0])


class PostgresCheckpoints:
    """The checkpoint primitives: one statement each, or a transaction that locks the
    session's lease row first when fenced."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def get(self, key: str) -> str | None:
        db = self.backend
        row = db.run("load a checkpoint", lambda c: c.execute(
            db.q("SELECT json FROM {s}.checkpoints WHERE key = %s"), (key,)).fetchone())
        return None if row is None else str(row[0])

    def put(self, key: str, session_id: str | None, text: str, fenced_id: str | None,
            token: int, checkpoint: Checkpoint) -> int:
        db = self.backend
        upsert = db.q(
            "INSERT INTO {s}.checkpoints (key, session_id, json, updated_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET"
            " session_id = excluded.session_id, json = excluded.json,"
            " updated_at = excluded.updated_at")
        params = (key, session_id, text, time.time())
        return db.run("save a checkpoint",
                      lambda c: _fenced(db, c, fenced_id, token, upsert, params), session_id)

    def drop(self, key: str, fenced_id: str | None, token: int) -> int:
        db = self.backend
        remove = db.q("DELETE FROM {s}.checkpoints WHERE key = %s")
        return db.run("delete a checkpoint",
                      lambda c: _fenced(db, c, fenced_id, token, remove, (key,)), fenced_id)

    def keys(self, prefix: str) -> list[str]:
        db = self.backend
        rows = db.run("list checkpoints", lambda c: c.execute(db.q(
            "SELECT key FROM {s}.checkpoints WHERE key >= %s ORDER BY key"), (prefix,)
        ).fetchall())
        out = []
        for (key,) in rows:
            if not key.startswith(prefix):
                break
            out.append(key)
        return out


_APPROVAL_COLUMNS = "json, status, reason, resolved_at"


class PostgresApprovals:
    """The approval primitives: ``json`` is the record as created; ``status``, ``reason``
    and ``resolved_at`` are the truth; ``resolve`` is one conditional UPDATE carrying an op
    token, so a retry after a lost reply sees its own win."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def put(self, record: ApprovalRecord, text: str, resolved: float | None,
            fenced_id: str | None, token: int) -> int:
        db = self.backend
        upsert = db.q(
            "INSERT INTO {s}.approvals (id, session_id, status, reason, json, created_at,"
            " resolved_at, op) VALUES (%s, %s, %s, %s, %s, %s, %s, NULL) ON CONFLICT (id)"
            " DO UPDATE SET session_id = excluded.session_id, status = excluded.status,"
            " reason = excluded.reason, json = excluded.json,"
            " created_at = excluded.created_at, resolved_at = excluded.resolved_at, op = NULL")
        params = (record.id, record.session_id, record.status, record.reason, text,
                  record.created_at, resolved)
        return db.run("create an approval",
                      lambda c: _fenced(db, c, fenced_id, token, upsert, params),
                      record.session_id)

    def row(self, id: str) -> Sequence[Any] | None:
        db = self.backend
        return db.run("read an approval", lambda c: c.execute(db.q(
            f"SELECT {_APPROVAL_COLUMNS} FROM {{s}}.approvals WHERE id = %s"), (id,)).fetchone())

    def resolve(self, id: str, status: str, reason: str | None, at: float, by: str | None
                ) -> Sequence[Any] | str | None:
        op = uuid.uuid4().hex  # a retry after a lost reply sees its own win
        db = self.backend

        def update(c: Conn) -> Sequence[Any] | str | None:
            params: tuple[Any, ...]
            sets, params = "", (status, reason, at, op)
            if by is not None:
                old = c.execute(db.q("SELECT json FROM {s}.approvals WHERE id = %s"),
                                (id,)).fetchone()
                if old is not None:
                    sets, params = ", json = %s", (*params, approval_json_resolved_by(old[0], by))
            row = c.execute(db.q(
                "UPDATE {s}.approvals SET status = %s, reason = %s, resolved_at = %s, op = %s"
                f"{sets} WHERE id = %s AND status = 'pending' RETURNING {_APPROVAL_COLUMNS}"),
                (*params, id)).fetchone()
            if row is not None:
                return tuple(row)
            found = c.execute(db.q(
                f"SELECT {_APPROVAL_COLUMNS}, op FROM {{s}}.approvals WHERE id = %s"), (id,)
            ).fetchone()
            if found is None:
                return None
            if found[4] == op:
                return tuple(found[:4])
            return str(found[1])

        return db.run("resolve an approval", update)

    def pending(self, session_id: str | None) -> list[tuple[str, Sequence[Any]]]:
        text = f"SELECT id, {_APPROVAL_COLUMNS} FROM {{s}}.approvals WHERE status = 'pending'"
        params: tuple[str, ...] = ()
        if session_id is not None:
            text += " AND session_id = %s"
            params = (session_id,)
        db = self.backend
        rows = db.run("list approvals", lambda c: c.execute(
            db.q(text + " ORDER BY created_at, id"), params).fetchall())
        return [(r[0], r[1:]) for r in rows]


class PostgresCommits:
    """The commit primitive: one statement in the common case (one round trip), else one
    transaction that finds out why it wrote nothing; an op token makes a retry after a lost
    reply see its own append."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def commit(self, op: CommitOp) -> object:
        db, id, texts, expected = self.backend, op.id, op.texts, op.expected_length
        token = op.token
        params = {"id": id, "n": len(texts), "expected": expected, "texts": texts,
                  "op": uuid.uuid4().hex, "token": token, "checkpoint": op.checkpoint_key,
                  "release": op.release}

        def write(c: Conn) -> object:
            if texts:
                params["now"] = time.time()
                row = c.execute(db.q(_COMMIT_TURN), params).fetchone()
                if row is not None:
                    return (int(row[0]), int(row[1]))
                # nothing written: a conflict, a lost lease, a new session or this call's
                # retry; the transaction below finds out which
            with c.transaction():
                if texts:  # this call's retry after a lost reply: it landed, whoever
                    landed = c.execute(db.q(  # holds the lease now (a commit may release it)
                        "SELECT key, revision FROM {s}.sessions WHERE id = %s AND op = %s"
                        " AND length = %s"), (id, params["op"], expected + len(texts))
                    ).fetchone()
                    if landed is not None:
                        return (int(landed[0]), int(landed[1]))
                if token:
                    newest = locked_token(db, c, id)
                    if newest > token:
                        return Stale(newest)
                if texts:
                    done = append_rows(db, c, id, texts, expected, str(params["op"]))
                else:
                    row = c.execute(db.q(
                        "SELECT key, revision, length FROM {s}.sessions WHERE id = %s"),
                        (id,)).fetchone()
                    actual = 0 if row is None else row[2]
                    if actual != expected:
                        return Conflict(actual)
                    done = None if row is None or not row[2] else (int(row[0]), int(row[1]))
                if isinstance(done, Conflict):
                    return done
                if op.checkpoint_key is not None:
                    c.execute(db.q("DELETE FROM {s}.checkpoints WHERE key = %s"),
                              (op.checkpoint_key,))
                if op.release:
                    c.execute(db.q(
                        "UPDATE {s}.leases SET owner = '', expires_at = 0"
                        " WHERE session_id = %s AND token = %s"), (id, token))
            return done

        return db.run("commit a turn", write, id)


def append_rows(db: Db, c: Conn, id: str, texts: list[str], expected: int, op: str
                 ) -> object:
    """Append rows inside the caller's transaction: the new revision, or a Conflict
    (nothing written)."""
    n = len(texts)
    row = c.execute(db.q(
        "UPDATE {s}.sessions SET length = length + %s, revision = revision + 1, op = %s,"
        " updated_at = %s WHERE id = %s AND length = %s RETURNING key, revision"),
        (n, op, time.time(), id, expected)).fetchone()
    if row is None:
        found = c.execute(db.q(
            "SELECT key, revision, length, op FROM {s}.sessions WHERE id = %s"), (id,)
        ).fetchone()
        if found is not None and found[3] == op and found[2] == expected + n:
            return (int(found[0]), int(found[1]))  # this call's retry: it landed
        if found is None and expected == 0:
            now = time.time()  # a row created meanwhile with metadata only is appended to
            row = c.execute(db.q(
                "INSERT INTO {s}.sessions AS x (id, length, revision, op, created_at,"
                " updated_at) VALUES (%s, %s, 1, %s, %s, %s) ON CONFLICT (id) DO UPDATE"
                " SET length = excluded.length, revision = x.revision + 1, op = excluded.op,"
                " updated_at = excluded.updated_at WHERE x.length = 0"
                " RETURNING key, revision"), (id, n, op, now, now)).fetchone()
            if row is None:  # created meanwhile by another writer
                found = c.execute(db.q("SELECT 0, 0, length FROM {s}.sessions WHERE id = %s"),
                                  (id,)).fetchone()
        if row is None:
            return Conflict(0 if found is None else int(found[2]))
    c.execute(db.q(INSERT_MESSAGES), (row[0], expected, texts))
    return (int(row[0]), int(row[1]))
