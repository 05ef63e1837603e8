"""SqliteStore's primitives for the store engine (leases, checkpoints, approvals, the
commit), each one statement or one transaction, and the row helpers its writes share.
See :mod:`lousho_sync.stores.sqlite` for the schema and the durability rules."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..codec import approval_json_resolved_by
from ..records import ApprovalRecord, Checkpoint
from ._engine.commits import CommitOp, Conflict, Stale
from ._sqlite_db import SPAN, Conn, Db

__all__ = [
    "SqliteApprovals",
    "SqliteCheckpoints",
    "SqliteCommits",
    "SqliteLeases",
    "drop_rows",
    "insert_rows",
    "insert_session",
    "replace",
    "revision",
    "token_of",
]

NO_NEWER_TOKEN = "NOT EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token > ?)"
"""The guard of a single-statement fenced write (params: session id, fence token)."""


def token_of(c: Conn, id: str) -> int:
    """The newest fence token of ``id`` (0: none)."""
    row = c.execute("SELECT token FROM leases WHERE session_id = ?", (id,)).fetchone()
    return 0 if row is None else int(row[0])


def _refused(c: Conn, fenced_id: str | None, token: int, rowcount: int) -> int:
    """After a guarded statement: the newest token when the guard refused it (0: written)."""
    if rowcount or fenced_id is None:
        return 0
    return token_of(c, fenced_id)


def revision(c: Conn, id: str) -> object:
    """The revision of ``id``: (key, counter), None when it has no transcript."""
    row = c.execute(
        "SELECT key, revision FROM sessions WHERE id = ? AND length != 0", (id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def insert_session(c: Conn, id: str, length: int, metadata: str | None = None) -> int:
    """A new ``sessions`` row; its key."""
    now = time.time()
    cur = c.execute(
        "INSERT INTO sessions (id, length, revision, created_at, updated_at, metadata)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (id, length, 1 if length else 0, now, now, metadata),
    )
    key = cur.lastrowid
    assert key is not None
    return key


def insert_rows(c: Conn, table: str, key: int, start: int, texts: list[str]) -> None:
    """Rows of ``table`` (``messages`` or ``history``) for session ``key`` from ``start``."""
    c.executemany(
        f"INSERT INTO {table} (id, json) VALUES (?, ?)",
        [(key * SPAN + start + i, text) for i, text in enumerate(texts)],
    )


def drop_rows(c: Conn, key: int, *, history: bool) -> None:
    """Delete session ``key``'s message rows (and its history rows)."""
    for table in ("messages", "history") if history else ("messages",):
        c.execute(f"DELETE FROM {table} WHERE id >= ? AND id < ?", (key * SPAN, (key + 1) * SPAN))


def replace(c: Conn, id: str, texts: list[str]) -> int | None:
    """Inside the caller's transaction: replace the transcript of ``id`` with ``texts``
    (none: drop it and the history, and the entry unless it has metadata). Returns the
    session key, or None when the session has no transcript now."""
    row = c.execute(
        "SELECT key, metadata IS NOT NULL FROM sessions WHERE id = ?", (id,)
    ).fetchone()
    if row is None:
        if not texts:
            return None
        key = insert_session(c, id, len(texts))
    else:
        key = row[0]
        drop_rows(c, key, history=not texts)
        if not texts and not row[1]:
            c.execute("DELETE FROM sessions WHERE key = ?", (key,))
            return None
        c.execute(
            "UPDATE sessions SET length = ?, revision = revision + 1, updated_at = ?"
            " WHERE key = ?",
            (len(texts), time.time(), key),
        )
    insert_rows(c, "messages", key, 0, texts)
    return key if texts else None


_TAKE = (
    "INSERT INTO leases (session_id, owner, expires_at, token) VALUES (?, ?, ?, 1)"
    " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
    " expires_at = excluded.expires_at, token = leases.token + 1"
    " WHERE leases.owner = excluded.owner OR leases.expires_at <= ?"
    " RETURNING token"
)
"""Take a lease that is free, expired or the owner's already (params: id, owner, expiry,
now): the new token, or no row."""


class SqliteLeases:
    """The lease primitives: a ``leases`` row per session whose ``token`` only grows (a
    released lease keeps its row, owner ``''``). Written without a sync of their own."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        def attempt(c: Conn) -> int | str:
            now = time.time()
            row = c.execute(_TAKE, (id, owner, now + ttl_s, now)).fetchone()
            if row is not None:
                return int(row[0])
            row = c.execute("SELECT owner FROM leases WHERE session_id = ?", (id,)).fetchone()
            return "" if row is None else str(row[0])

        return self.backend.run("acquire a lease", attempt, id, sync=False)

    def take_saving(self, id: str, owner: str, ttl_s: float, key: str, text: str,
                    expected: object) -> tuple[int, bool] | str:
        def attempt(c: Conn) -> tuple[int, bool] | str:
            now = time.time()
            c.execute("BEGIN IMMEDIATE")
            row = c.execute(_TAKE, (id, owner, now + ttl_s, now)).fetchone()
            if row is None:
                row = c.execute("SELECT owner FROM leases WHERE session_id = ?", (id,)).fetchone()
                c.execute("ROLLBACK")
                return "" if row is None else str(row[0])
            saved = revision(c, id) == expected and c.execute(
                "INSERT INTO checkpoints (key, session_id, json, updated_at) SELECT ?, ?, ?, ?"
                " WHERE NOT EXISTS (SELECT 1 FROM checkpoints WHERE key = ?)",
                (key, id, text, now, key),
            ).rowcount == 1
            c.execute("COMMIT")
            return int(row[0]), saved

        return self.backend.run("acquire a lease", attempt, id, sync=False)

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        def take(c: Conn) -> int:
            row = c.execute(
                "UPDATE leases SET owner = ?, expires_at = ?, token = token + 1"
                " WHERE session_id = ? AND owner = ? RETURNING token",
                (owner, time.time() + ttl_s, id, holder),
            ).fetchone()
            return 0 if row is None else int(row[0])

        return self.backend.run("take over a lease", take, id, sync=False)

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        cur = self.backend.run(
            "renew a lease",
            lambda c: c.execute(
                "UPDATE leases SET expires_at = ? WHERE session_id = ? AND owner = ?",
                (time.time() + ttl_s, id, owner),
            ),
            id,
            sync=False,
        )
        return bool(cur.rowcount == 1)

    def release(self, id: str, owner: str) -> None:
        self.backend.run(
            "release a lease",
            lambda c: c.execute(
                "UPDATE leases SET owner = '', expires_at = 0 WHERE session_id = ? AND owner = ?",
                (id, owner),
            ),
            id,
            sync=False,
        )

    def newest(self, id: str) -> int:
        return self.backend.run("read a fence token", lambda c: token_of(c, id), id)

    def holder(self, id: str) -> str:
        row = self.backend.run("read a lease", lambda c: c.execute(
            "SELECT owner FROM leases WHERE session_id = ? AND expires_at > ?",
            (id, time.time())).fetchone(), id)
        return "" if row is None else str(row[0])


def _must_sync(checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint write needs its own sync: it records a paused or interrupted
    turn, or a tool about to start (see the durability notes of the store)."""
    return checkpoint.status != "running" or bool(checkpoint.started_call_ids)


class SqliteCheckpoints:
    """The checkpoint primitives: one statement each (a fenced one guarded by
    ``NO_NEWER_TOKEN``)."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def get(self, key: str) -> str | None:
        row = self.backend.run(
            "load a checkpoint",
            lambda c: c.execute("SELECT json FROM checkpoints WHERE key = ?", (key,)).fetchone(),
        )
        return None if row is None else str(row[0])

    def put(self, key: str, session_id: str | None, text: str, fenced_id: str | None, token: int,
            checkpoint: Checkpoint) -> int:
        sql = (
            "INSERT INTO checkpoints (key, session_id, json, updated_at) SELECT ?, ?, ?, ?"
            + (f" WHERE {NO_NEWER_TOKEN}" if fenced_id else " WHERE true")
            + " ON CONFLICT (key) DO UPDATE SET session_id = excluded.session_id,"
            " json = excluded.json, updated_at = excluded.updated_at"
        )
        params: tuple[Any, ...] = (key, session_id, text, time.time())
        if fenced_id:
            params += (fenced_id, token)
        return self.backend.run(
            "save a checkpoint",
            lambda c: _refused(c, fenced_id, token, c.execute(sql, params).rowcount),
            session_id,
            sync=_must_sync(checkpoint),
        )

    def drop(self, key: str, fenced_id: str | None, token: int) -> int:
        def remove(c: Conn) -> int:
            if not fenced_id:
                c.execute("DELETE FROM checkpoints WHERE key = ?", (key,))
                return 0
            cur = c.execute(f"DELETE FROM checkpoints WHERE key = ? AND {NO_NEWER_TOKEN}",
                            (key, fenced_id, token))
            return _refused(c, fenced_id, token, cur.rowcount)

        return self.backend.run("delete a checkpoint", remove, fenced_id)

    def keys(self, prefix: str) -> list[str]:
        def scan(c: Conn) -> list[str]:
            out = []
            for (key,) in c.execute(
                "SELECT key FROM checkpoints WHERE key >= ? ORDER BY key", (prefix,)
            ):
                if not key.startswith(prefix):
                    break
                out.append(key)
            return out

        return self.backend.run("list checkpoints", scan)


_APPROVAL_COLUMNS = "json, status, reason, resolved_at"


class SqliteApprovals:
    """The approval primitives: ``json`` is the record as created; ``status``, ``reason``
    and ``resolved_at`` are the truth, so ``resolve`` is one conditional UPDATE."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def put(self, record: ApprovalRecord, text: str, resolved: float | None,
            fenced_id: str | None, token: int) -> int:
        sql = (
            "INSERT OR REPLACE INTO approvals (id, session_id, status, reason, json,"
            " created_at, resolved_at) SELECT ?, ?, ?, ?, ?, ?, ?"
            + (f" WHERE {NO_NEWER_TOKEN}" if fenced_id else "")
        )
        params: tuple[Any, ...] = (record.id, record.session_id, record.status, record.reason,
                                   text, record.created_at, resolved)
        if fenced_id:
            params += (fenced_id, token)
        return self.backend.run(
            "create an approval",
            lambda c: _refused(c, fenced_id, token, c.execute(sql, params).rowcount),
            record.session_id,
        )

    def row(self, id: str) -> Sequence[Any] | None:
        return self.backend.run(  # type: ignore[no-any-return]
            "read an approval",
            lambda c: c.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (id,)
            ).fetchone(),
        )

    def resolve(self, id: str, status: str, reason: str | None, at: float, by: str | None
                ) -> Sequence[Any] | str | None:
        def update(c: Conn) -> Sequence[Any] | str | None:
            params: tuple[Any, ...]
            sets, params = "", (status, reason, at)
            if by is not None:
                old = c.execute("SELECT json FROM approvals WHERE id = ?", (id,)).fetchone()
                if old is not None:
                    sets, params = ", json = ?", (*params, approval_json_resolved_by(old[0], by))
            row = c.execute(
                f"UPDATE approvals SET status = ?, reason = ?, resolved_at = ?{sets}"
                f" WHERE id = ? AND status = 'pending' RETURNING {_APPROVAL_COLUMNS}",
                (*params, id),
            ).fetchone()
            if row is not None:
                return tuple(row)
            found = c.execute("SELECT status FROM approvals WHERE id = ?", (id,)).fetchone()
            return None if found is None else str(found[0])

        return self.backend.run("resolve an approval", update)

    def pending(self, session_id: str | None) -> list[tuple[str, Sequence[Any]]]:
        sql = f"SELECT id, {_APPROVAL_COLUMNS} FROM approvals WHERE status = 'pending'"
        params: tuple[str, ...] = ()
        if session_id is not None:
            sql += " AND session_id = ?"
            params = (session_id,)
        rows = self.backend.run(
            "list approvals", lambda c: c.execute(sql + " ORDER BY created_at", params).fetchall()
        )
        return [(r[0], r[1:]) for r in rows]


class SqliteCommits:
    """The commit primitive: ONE transaction (one sync) of the fence check, the length
    check, the rows, the checkpoint delete and the lease release."""

    def __init__(self, db: Db) -> None:
        self.backend = db

    def commit(self, op: CommitOp) -> object:
        id, texts, expected = op.id, op.texts, op.expected_length

        def write(c: Conn) -> object:
            if not texts and not op.token and op.checkpoint_key is None:
                row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
                actual = 0 if row is None else row[0]
                return Conflict(actual) if actual != expected else revision(c, id)
            c.execute("BEGIN IMMEDIATE")
            if op.token:
                newest = token_of(c, id)
                if newest > op.token:
                    c.execute("ROLLBACK")
                    return Stale(newest)
            if texts:
                done: object = _append_rows(c, id, texts, expected)
            else:
                row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
                actual = 0 if row is None else row[0]
                done = Conflict(actual) if actual != expected else revision(c, id)
            if isinstance(done, Conflict):
                c.execute("ROLLBACK")
                return done
            if op.checkpoint_key is not None:
                c.execute("DELETE FROM checkpoints WHERE key = ?", (op.checkpoint_key,))
            if op.release:
                c.execute(
                    "UPDATE leases SET owner = '', expires_at = 0"
                    " WHERE session_id = ? AND token = ?",
                    (id, op.token),
                )
            c.execute("COMMIT")
            return done

        return self.backend.run("commit a turn", write, id)


def _append_rows(c: Conn, id: str, texts: list[str], expected: int) -> object:
    """Append rows inside the caller's transaction: the new revision, or a Conflict."""
    n = len(texts)
    row = c.execute(
        "UPDATE sessions SET length = length + ?, revision = revision + 1,"
        " updated_at = ? WHERE id = ? AND length = ? RETURNING key, revision",
        (n, time.time(), id, expected),
    ).fetchone()
    if row is not None:
        key, rev = row[0], row[1]
    else:
        row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
        actual = 0 if row is None else row[0]
        if actual != expected:
            return Conflict(actual)
        key, rev = insert_session(c, id, n), 1  # absent and expected == 0
    insert_rows(c, "messages", key, expected, texts)
    return (key, rev)
