"""SqliteStore: sessions, checkpoints, approvals and leases in one SQLite file.

Several processes share the file (WAL mode, 5 s busy timeout, every write a
``BEGIN IMMEDIATE`` transaction or a single statement, so a busy database waits instead of
failing). Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    sessions    (key INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, length, revision,
                 updated_at, created_at, metadata)   index (updated_at DESC, id)
    messages    (id INTEGER PRIMARY KEY = session key << 32 | seq, json)   one row a message
    history     (id INTEGER PRIMARY KEY = session key << 32 | seq, json)   what compaction
                                                                          replaced
    checkpoints (key TEXT PRIMARY KEY, session_id, json, updated_at)
    approvals   (id TEXT PRIMARY KEY, session_id, status, reason, json, created_at,
                 resolved_at)
    leases      (session_id TEXT PRIMARY KEY, owner, expires_at, token)

The ``sessions`` row is also the session's catalog entry: ``length`` is the message count
``info`` and ``list`` report (neither reads a message row), ``list`` is one range of the
``(updated_at DESC, id)`` index, and a session with metadata only is a row with length 0
(revision None). ``append`` and ``commit_turn`` keep it current with the one ``UPDATE`` they
always made.

A message's rowid is its session's integer key (never reused, thanks to AUTOINCREMENT)
shifted left 32 bits plus its position, so the table needs no index of its own and a
session is one range of the table; ``revision(id)`` is ``(key, counter)``, so it never
repeats even when a session is deleted and written again. An approval's ``json`` is the
record as created; the ``status``, ``reason`` and ``resolved_at`` columns are the truth
and are laid over it on read, so ``resolve`` is one conditional ``UPDATE``.

Fencing: every acquisition of a session's lease adds one to ``leases.token`` and returns it;
a released lease keeps its row (owner ``''``), so tokens only grow. A write given
``fence=`` checks the session's token inside the write's own transaction (one ``SELECT``, or
a ``NOT EXISTS`` guard on a single-statement write) and raises LeaseLostError, writing
nothing, when a newer token exists. Files of schema versions 1 and 2 are migrated on open.

Durability (``synchronous``): ``"full"`` (default) syncs the WAL when a turn is committed
and whenever something is promised to a caller or another process: transcripts, approvals,
checkpoints of a paused or interrupted turn, and the checkpoint written just before a tool
starts (so a tool that may have run is never forgotten). A committed turn survives a
process crash and a power loss. Leases and the in-between progress checkpoints of a running
turn are written without a sync of their own (they ride on the next synced commit): they
survive a process crash, which is what resuming in another process needs; a power loss
can lose only the progress of the turn in flight (it then resumes from its last synced
checkpoint, or is lost if it had none: it was never acknowledged). A plain turn costs one
sync. ``"normal"`` syncs only at WAL checkpoints: everything survives a process crash, but
a power loss or OS crash may lose the last commits (the database stays consistent).

Damage (see :mod:`._sqlite_rows`): a transcript shorter than the session's recorded length,
a row that is not a message and a damaged session-id index raise StoreCorruptError naming the
path, the session and the message, never the stored content (nor does any exception chained
to it). SQLite keeps no checksums: a changed byte inside a text that stays valid JSON goes
unseen; ``PRAGMA integrity_check`` finds structural damage.

The WAL-reset bug of SQLite 3.7.0 to 3.51.2 (see :mod:`._sqlite_driver`): when the linked
SQLite is affected, the store turns SQLite's automatic checkpoints off and checkpoints itself
from a second connection holding the write lock, so no commit can restart the WAL during a
checkpoint; being guarded, it says so once at INFO, and warns (StoreDurabilityWarning) only
when the process already holds the file open through a connection lousho did not make.
``LOUSHO_SQLITE_DRIVER=pysqlite3`` uses the ``sqlite`` extra's fixed SQLite instead (the
default, ``auto`` or ``sqlite3``, is the standard module). One process uses one library for
all its stores: two SQLite libraries on one file in one process break each other's locks and
lose commits, so a store on ``pysqlite3`` refuses a file the process holds open through
another library (ConfigError).

Thread safety: one connection per store, guarded by one lock; every call holds it for its
statements only (JSON encoding and decoding happen outside). One connection measured as
fast as a connection per thread for a single thread, and threads of one process queue on
the lock instead of on SQLite's millisecond busy sleeps. A store used in a forked child
opens its own connection there.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..approvals import expire_due
from ..catalog import SessionInfo, SessionPage, check_list_args, check_metadata, page_from
from ..codec import (
    approval_json_resolved_by,
    dumps_approval,
    dumps_checkpoint,
    dumps_message,
    loads_approval,
    loads_checkpoint,
)
from ..errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    SessionExistsError,
    StoreCorruptError,
)
from ..ids import is_session_id
from ..messages import Message
from ..records import Fence
from ..results import PruneResult
from ._common import (
    Closing,
    LeaseForwarding,
    check_fence,
    check_length,
    check_older_than,
    check_owner,
    check_ttl,
    commit_token,
    fence_token_of,
    overlay,
    resolved_at,
    validate_session_id,
)
from ._events import prune_events
from ._lease import owner_is_dead, poll_until
from ._sqlite_db import SCHEMA_VERSION, SPAN, Conn, Db
from ._sqlite_events import SqliteEventOps
from ._sqlite_mail import SqliteMailOps
from ._sqlite_rows import INFO_COLUMNS, decode_history, decode_info, decode_transcript, load_rows
from .base import ApprovalRecord, Checkpoint

__all__ = [
    "SCHEMA_VERSION",
    "SqliteApprovalStore",
    "SqliteCheckpointStore",
    "SqliteSessionStore",
    "SqliteStore",
]

_log = logging.getLogger(__name__)

_NO_NEWER_TOKEN = "NOT EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token > ?)"
"""The guard of a single-statement fenced write (params: session id, fence token)."""


def _where(db: Db) -> str:
    return f"in the SQLite store at {db.path}"


def _token_of(c: Conn, id: str) -> int:
    row = c.execute("SELECT token FROM leases WHERE session_id = ?", (id,)).fetchone()
    return 0 if row is None else int(row[0])


def _check_fence(db: Db, c: Conn, id: str, token: int) -> None:
    """Inside the caller's transaction: LeaseLostError when a token newer than ``token``
    (0: no fence) was handed out for ``id``."""
    if token:
        check_fence(id, _token_of(c, id), token, _where(db), path=db.path)


def _refused(db: Db, c: Conn, id: str, token: int) -> None:
    """After a guarded statement changed no row: LeaseLostError if the guard refused it."""
    check_fence(id, _token_of(c, id), token, _where(db), path=db.path)


class SqliteSessionStore:
    """Transcripts, one row per message; ``append`` is one transaction of the turn's rows.

    Also the per-session lease with fence tokens (SPEC §5) and ``revision``. Writes take
    ``fence=`` (``fenced``). ``combined`` is the SqliteStore this belongs to. Thread- and
    process-safe.
    """

    fenced = True

    def __init__(self, db: Db, combined: SqliteStore) -> None:
        self._db = db
        self.combined = combined
        self._events = SqliteEventOps(db)
        self._mail = SqliteMailOps(db)

    def event_ops(self) -> SqliteEventOps:
        """The event log's primitives (``start()``/``attach()``): rows in this file."""
        return self._events

    def mail_ops(self) -> SqliteMailOps:
        """The session mailbox's primitives (turn policies across processes)."""
        return self._mail

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript (one query), or None when the id has none."""
        validate_session_id(id)
        rows = self._db.run("load a session", lambda c: load_rows(c, id, SPAN), id)
        messages: list[Message] = []
        problem: str | None = "the index of session ids is damaged"
        if rows is None:
            pass
        elif not rows or (rows[0][0] == 0 and rows[0][1] is None):
            return None
        else:
            messages, problem = decode_transcript(rows)
            del rows
        if problem is not None:
            raise StoreCorruptError(
                f"session {id!r} in the SQLite store at {self._db.path} cannot be read: "
                f"{problem} (the file is damaged; it was left as it was; stored content is "
                "not shown)",
                path=self._db.path,
                session_id=id,
            )
        return messages

    def save(self, id: str, messages: Sequence[Message], *, fence: Fence | None = None) -> None:
        """Replace the transcript; an empty sequence forgets the transcript and the history
        (a session with metadata stays in the catalog). With ``fence``, LeaseLostError
        (nothing written) when a newer lease token exists."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        texts = [dumps_message(m) for m in messages]

        def write(c: Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            _check_fence(self._db, c, id, token)
            _replace(c, id, texts)
            c.execute("COMMIT")

        self._db.run("save a session", write, id)

    def delete(self, id: str) -> None:
        """Forget the id: its messages, history and metadata (no error when absent)."""
        validate_session_id(id)

        def forget(c: Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            row = c.execute("SELECT key FROM sessions WHERE id = ?", (id,)).fetchone()
            if row is not None:
                _drop_rows(c, row[0], history=True)
                c.execute("DELETE FROM sessions WHERE key = ?", (row[0],))
            c.execute("COMMIT")

        self._db.run("delete a session", forget, id)

    def append(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        fence: Fence | None = None,
    ) -> None:
        """Add a turn's messages in one transaction.

        Raises StoreConflictError when the stored transcript does not hold exactly
        ``expected_length`` messages (another writer appended first), and with ``fence``
        LeaseLostError when a newer lease token exists; nothing is written then.
        """
        self.combined.commit_turn(
            id, messages, expected_length=expected_length, checkpoint_key=None, fence=fence
        )

    def check_length(self, id: str, expected: int, actual: int) -> None:
        """StoreConflictError when ``actual`` is not ``expected`` (naming this store)."""
        check_length(id, expected, actual, _where(self._db), path=self._db.path)

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript; None when it has
        none (absent, or metadata only)."""
        validate_session_id(id)
        return self._db.run("read a session's revision", lambda c: _revision(c, id), id)

    def ids(self) -> list[str]:
        """Stored session ids (with a transcript or metadata), sorted."""
        rows = self._db.run(
            "list sessions", lambda c: c.execute("SELECT id FROM sessions ORDER BY id").fetchall()
        )
        return [r[0] for r in rows]

    # --- lease --------------------------------------------------------------------------
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Take the session's lease for ``ttl_s`` seconds: the new fence token (greater than
        every token handed out before for ``id``, also when ``owner`` held it), or None
        when not taken within ``wait_s`` seconds.

        Taken when free, expired, already ``owner``'s, or held by a dead process on this
        host; otherwise polled until ``wait_s`` seconds pass.
        """
        validate_session_id(id)
        check_owner(owner)
        check_ttl(ttl_s)
        got: list[int] = []

        def attempt() -> bool:
            token = self._try_acquire(id, owner, ttl_s)
            if token:
                got.append(token)
            return bool(token)

        return got[0] if poll_until(attempt, wait_s) else None

    def _try_acquire(self, id: str, owner: str, ttl_s: float) -> int:
        def attempt(c: Conn) -> tuple[int, str | None]:
            now = time.time()
            row = c.execute(
                "INSERT INTO leases (session_id, owner, expires_at, token) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
                " expires_at = excluded.expires_at, token = leases.token + 1"
                " WHERE leases.owner = excluded.owner OR leases.expires_at <= ?"
                " RETURNING token",
                (id, owner, now + ttl_s, now),
            ).fetchone()
            if row is not None:
                return int(row[0]), None
            row = c.execute("SELECT owner FROM leases WHERE session_id = ?", (id,)).fetchone()
            return 0, None if row is None else row[0]

        token, holder = self._db.run("acquire a lease", attempt, id, sync=False)
        if token or holder is None or not owner_is_dead(holder):
            return token

        def take_over(c: Conn) -> int:
            row = c.execute(
                "UPDATE leases SET owner = ?, expires_at = ?, token = token + 1"
                " WHERE session_id = ? AND owner = ? RETURNING token",
                (owner, time.time() + ttl_s, id, holder),
            ).fetchone()
            return 0 if row is None else int(row[0])

        token = self._db.run("take over a lease", take_over, id, sync=False)
        if token:
            _log.info("session %s: took over the lease of dead owner %s", id, holder)
        return token

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        validate_session_id(id)
        check_owner(owner)
        check_ttl(ttl_s)
        cur = self._db.run(
            "renew a lease",
            lambda c: c.execute(
                "UPDATE leases SET expires_at = ? WHERE session_id = ? AND owner = ?",
                (time.time() + ttl_s, id, owner),
            ),
            id,
            sync=False,
        )
        return bool(cur.rowcount == 1)

    def release_lease(self, id: str, *, owner: str) -> None:
        """Release the lease if ``owner`` holds it (otherwise do nothing); the fence token
        stays."""
        validate_session_id(id)
        check_owner(owner)
        self._db.run(
            "release a lease",
            lambda c: c.execute(
                "UPDATE leases SET owner = '', expires_at = 0 WHERE session_id = ? AND owner = ?",
                (id, owner),
            ),
            id,
            sync=False,
        )

    def fence_token(self, id: str) -> int:
        """The newest fence token handed out for ``id`` (0 when none)."""
        validate_session_id(id)
        return self._db.run("read a fence token", lambda c: _token_of(c, id), id)

    # --- the catalog (Catalogued) ---------------------------------------------------------
    def info(self, id: str) -> SessionInfo | None:
        """The catalog entry of ``id`` (one row; the transcript is not read), or None."""
        validate_session_id(id)
        row = self._db.run(
            "read a session's catalog entry",
            lambda c: c.execute(
                f"SELECT {INFO_COLUMNS} FROM sessions WHERE id = ?", (id,)
            ).fetchone(),
            id,
        )
        return None if row is None else decode_info(row, self._db.path)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` (``{}`` removes it), creating the catalog entry
        when absent; the transcript and its revision stay."""
        validate_session_id(id)
        text = check_metadata(metadata, id)

        def write(c: Conn) -> None:
            now = time.time()
            if text != "{}":
                c.execute(
                    "INSERT INTO sessions (id, length, revision, created_at, updated_at,"
                    " metadata) VALUES (?1, 0, 0, ?2, ?2, ?3) ON CONFLICT (id) DO UPDATE SET"
                    " metadata = excluded.metadata, updated_at = excluded.updated_at",
                    (id, now, text),
                )
                return
            c.execute("BEGIN IMMEDIATE")
            c.execute("UPDATE sessions SET metadata = NULL, updated_at = ? WHERE id = ?",
                      (now, id))
            c.execute("DELETE FROM sessions WHERE id = ? AND length = 0", (id,))
            c.execute("COMMIT")

        self._db.run("set a session's metadata", write, id)

    def history(self, id: str) -> list[Message]:
        """The messages compaction replaced in ``id``, oldest first ([] when none)."""
        validate_session_id(id)
        rows = self._db.run(
            "read a session's history",
            lambda c: c.execute(
                "SELECT h.id & 4294967295, CAST(h.json AS BLOB) FROM sessions s JOIN history h"
                " ON h.id >= s.key * ?2 AND h.id < (s.key + 1) * ?2 WHERE s.id = ?1"
                " ORDER BY h.id",
                (id, SPAN),
            ).fetchall(),
            id,
        )
        messages, problem = decode_history(rows)
        del rows
        if problem is not None:
            raise StoreCorruptError(
                f"session {id!r} in the SQLite store at {self._db.path} cannot be read: "
                f"{problem} (the file is damaged; it was left as it was; stored content is "
                "not shown)",
                path=self._db.path,
                session_id=id,
            )
        return messages

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """In one transaction: add ``replaced`` to the history and replace the transcript
        with ``messages`` (as ``save``, also with ``fence``)."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        texts = [dumps_message(m) for m in messages]
        old = [dumps_message(m) for m in replaced]

        def write(c: Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            _check_fence(self._db, c, id, token)
            key = _replace(c, id, texts)
            if key is not None and old:
                last = c.execute(
                    "SELECT max(id) FROM history WHERE id >= ? AND id < ?",
                    (key * SPAN, (key + 1) * SPAN),
                ).fetchone()[0]
                _insert_rows(c, "history", key, 0 if last is None else last % SPAN + 1, old)
            c.execute("COMMIT")

        self._db.run("compact a session", write, id)

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create ``id`` with a transcript, metadata and history in one transaction;
        SessionExistsError (nothing written) when it has messages or metadata."""
        validate_session_id(id)
        text = check_metadata(metadata or {}, id)
        stored = None if text == "{}" else text
        texts = [dumps_message(m) for m in messages]
        old = [dumps_message(m) for m in history]

        def write(c: Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            row = c.execute(
                "SELECT key, length != 0 OR metadata IS NOT NULL FROM sessions WHERE id = ?",
                (id,),
            ).fetchone()
            if row is not None and row[1]:
                raise SessionExistsError(
                    f"session {id!r} exists already in the SQLite store at {self._db.path}",
                    path=self._db.path,
                    session_id=id,
                )
            if row is not None:  # an entry with neither: start afresh
                _drop_rows(c, row[0], history=True)
                c.execute("DELETE FROM sessions WHERE key = ?", (row[0],))
            if texts or stored is not None:
                key = _insert_session(c, id, len(texts), stored)
                _insert_rows(c, "messages", key, 0, texts)
                if texts:
                    _insert_rows(c, "history", key, 0, old)
            c.execute("COMMIT")

        self._db.run("create a session", write, id)

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of the catalog, newest ``updated_at`` first, then by id: one indexed
        query of the ``sessions`` table (no message row is read)."""
        prefix, limit, cursor = check_list_args(prefix, limit, after)
        if prefix and not is_session_id(prefix):
            return SessionPage(())  # no id can start with it
        where: builtins.list[str] = []
        params: builtins.list[object] = []
        if prefix:  # ids are ASCII letters, digits, '_' and '-': all below '\x7f'
            where.append("id >= ? AND id < ?")
            params += [prefix, prefix + "\x7f"]
        if cursor is not None:
            where.append("updated_at <= ? AND (updated_at < ? OR id > ?)")
            params += [cursor[0], cursor[0], cursor[1]]
        sql = (
            f"SELECT {INFO_COLUMNS} FROM sessions"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY updated_at DESC, id LIMIT ?"
        )
        params.append(limit + 1)
        rows = self._db.run("list sessions", lambda c: c.execute(sql, params).fetchall())
        return page_from([decode_info(r, self._db.path) for r in rows], limit)


def _insert_session(c: Conn, id: str, length: int, metadata: str | None = None) -> int:
    now = time.time()
    cur = c.execute(
        "INSERT INTO sessions (id, length, revision, created_at, updated_at, metadata)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (id, length, 1 if length else 0, now, now, metadata),
    )
    key = cur.lastrowid
    assert key is not None
    return key


def _insert_rows(c: Conn, table: str, key: int, start: int, texts: list[str]) -> None:
    """Rows of ``table`` (``messages`` or ``history``) for session ``key`` from ``start``."""
    c.executemany(
        f"INSERT INTO {table} (id, json) VALUES (?, ?)",
        [(key * SPAN + start + i, text) for i, text in enumerate(texts)],
    )


def _drop_rows(c: Conn, key: int, *, history: bool) -> None:
    """Delete session ``key``'s message rows (and its history rows)."""
    for table in ("messages", "history") if history else ("messages",):
        c.execute(f"DELETE FROM {table} WHERE id >= ? AND id < ?", (key * SPAN, (key + 1) * SPAN))


def _replace(c: Conn, id: str, texts: list[str]) -> int | None:
    """Inside the caller's transaction: replace the transcript of ``id`` with ``texts``
    (none: drop it and the history, and the entry unless it has metadata). Returns the
    session key, or None when the session has no transcript now."""
    row = c.execute(
        "SELECT key, metadata IS NOT NULL FROM sessions WHERE id = ?", (id,)
    ).fetchone()
    if row is None:
        if not texts:
            return None
        key = _insert_session(c, id, len(texts))
    else:
        key = row[0]
        _drop_rows(c, key, history=not texts)
        if not texts and not row[1]:
            c.execute("DELETE FROM sessions WHERE key = ?", (key,))
            return None
        c.execute(
            "UPDATE sessions SET length = ?, revision = revision + 1, updated_at = ?"
            " WHERE key = ?",
            (len(texts), time.time(), key),
        )
    _insert_rows(c, "messages", key, 0, texts)
    return key if texts else None


def _must_sync(checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint write needs its own sync: it records a paused or interrupted
    turn, or a tool about to start (see the module's durability notes)."""
    return checkpoint.status != "running" or bool(checkpoint.started_call_ids)


class SqliteCheckpointStore:
    """Checkpoints as opaque JSON by key (unknown fields round-trip); writes take
    ``fence=`` (``fenced``). Thread-safe."""

    fenced = True

    def __init__(self, db: Db) -> None:
        self._db = db

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        row = self._db.run(
            "load a checkpoint",
            lambda c: c.execute("SELECT json FROM checkpoints WHERE key = ?", (key,)).fetchone(),
        )
        if row is None:
            return None
        try:
            return loads_checkpoint(row[0])
        except StoreCorruptError as exc:
            error = self._db.corrupt(exc, f"checkpoint {key!r}")
        raise error  # unchained: the codec's cause holds the stored text

    def save(self, key: str, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        """Write (replace) the checkpoint. With ``fence``, LeaseLostError (nothing written)
        when a newer lease token exists for the fence's session."""
        token = fence_token_of(fence, checkpoint.session_id)
        text = dumps_checkpoint(checkpoint)
        sql = (
            "INSERT INTO checkpoints (key, session_id, json, updated_at) SELECT ?, ?, ?, ?"
            + (f" WHERE {_NO_NEWER_TOKEN}" if fence else " WHERE true")
            + " ON CONFLICT (key) DO UPDATE SET session_id = excluded.session_id,"
            " json = excluded.json, updated_at = excluded.updated_at"
        )
        params: tuple[Any, ...] = (key, checkpoint.session_id, text, time.time())
        if fence:
            params += (fence.session_id, token)

        def write(c: Conn) -> None:
            if c.execute(sql, params).rowcount == 0 and fence:
                _refused(self._db, c, fence.session_id, token)

        self._db.run(
            "save a checkpoint", write, checkpoint.session_id, sync=_must_sync(checkpoint)
        )

    def delete(self, key: str, *, fence: Fence | None = None) -> None:
        """Delete the checkpoint (no error when absent). With ``fence``, LeaseLostError
        (nothing deleted) when a newer lease token exists for the fence's session."""
        token = fence_token_of(fence, None)

        def remove(c: Conn) -> None:
            if not fence:
                c.execute("DELETE FROM checkpoints WHERE key = ?", (key,))
            elif c.execute(
                f"DELETE FROM checkpoints WHERE key = ? AND {_NO_NEWER_TOKEN}",
                (key, fence.session_id, token),
            ).rowcount == 0:
                _refused(self._db, c, fence.session_id, token)

        self._db.run("delete a checkpoint", remove, fence.session_id if fence else None)

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted (an index range scan)."""

        def scan(c: Conn) -> list[str]:
            out = []
            for (key,) in c.execute(
                "SELECT key FROM checkpoints WHERE key >= ? ORDER BY key", (prefix,)
            ):
                if not key.startswith(prefix):
                    break
                out.append(key)
            return out

        return self._db.run("list checkpoints", scan)


_APPROVAL_COLUMNS = "json, status, reason, resolved_at"


class SqliteApprovalStore:
    """Approval records; ``resolve`` is one conditional UPDATE, so exactly one caller across
    threads and processes wins; ``create`` takes ``fence=`` (``fenced``). Thread-safe."""

    fenced = True

    def __init__(self, db: Db) -> None:
        self._db = db

    def create(self, record: ApprovalRecord, *, fence: Fence | None = None) -> None:
        """Store a record (replacing one with the same id). With ``fence``, LeaseLostError
        (nothing written) when a newer lease token exists for the fence's session."""
        token = fence_token_of(fence, record.session_id)
        text = dumps_approval(record)
        sql = (
            "INSERT OR REPLACE INTO approvals (id, session_id, status, reason, json,"
            " created_at, resolved_at) SELECT ?, ?, ?, ?, ?, ?, ?"
            + (f" WHERE {_NO_NEWER_TOKEN}" if fence else "")
        )
        params: tuple[Any, ...] = (
            record.id,
            record.session_id,
            record.status,
            record.reason,
            text,
            record.created_at,
            resolved_at(record),
        )
        if fence:
            params += (fence.session_id, token)

        def write(c: Conn) -> None:
            if c.execute(sql, params).rowcount == 0 and fence:
                _refused(self._db, c, fence.session_id, token)

        self._db.run("create an approval", write, record.session_id)

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        row = self._db.run(
            "read an approval",
            lambda c: c.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (id,)
            ).fetchone(),
        )
        return None if row is None else self._record(id, row)

    def resolve(
        self, id: str, *, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ApprovalRecord:
        """Resolve once (by ``by``, written into the record's JSON in the same UPDATE): one
        caller wins; the others get ApprovalAlreadyResolvedError; an unknown id raises
        ApprovalNotFoundError."""
        status = "approved" if approved else "denied"

        def update(c: Conn) -> tuple[Any, ...] | None:
            params: tuple[Any, ...]
            sets, params = "", (status, reason, time.time())
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
            if found is None:
                raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
            raise ApprovalAlreadyResolvedError(
                f"approval {id!r} was already {found[0]}", approval_id=id
            )

        row = self._db.run("resolve an approval", update)
        assert row is not None
        return self._record(id, row)

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        sql = f"SELECT id, {_APPROVAL_COLUMNS} FROM approvals WHERE status = 'pending'"
        params: tuple[str, ...] = ()
        if session_id is not None:
            sql += " AND session_id = ?"
            params = (session_id,)
        rows = self._db.run(
            "list approvals", lambda c: c.execute(sql + " ORDER BY created_at", params).fetchall()
        )
        return [self._record(r[0], r[1:]) for r in rows]

    def _record(self, id: str, row: Sequence[Any]) -> ApprovalRecord:
        text, status, reason, resolved = row
        try:
            record = loads_approval(text)
        except StoreCorruptError as exc:
            error = self._db.corrupt(exc, f"approval {id!r}")
            record = None
        if record is None:
            raise error  # unchained: the codec's cause holds the stored text
        return overlay(record, status, reason, resolved)


class SqliteStore(LeaseForwarding, Closing):
    """Sessions, checkpoints, approvals and leases in one SQLite file shared by several
    processes; usable directly as an agent's ``store``.

    ``path`` is a file (its directory is created) or ``":memory:"``. ``synchronous`` is
    ``"full"`` (default: a commit survives a power loss) or ``"normal"`` (survives a process
    crash; a power loss may lose the last commits). ``commit_turn`` commits a finished turn
    in one transaction; the lease methods forward to ``sessions``. Thread-safe; ``close()``
    is idempotent and any use after it raises StoreClosedError; a context manager.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["full", "normal"] = "full",
    ) -> None:
        self._db = Db(path, synchronous)
        self.sessions = SqliteSessionStore(self._db, self)
        self.checkpoints = SqliteCheckpointStore(self._db)
        self.approvals = SqliteApprovalStore(self._db)

    @property
    def path(self) -> str:
        """The database file's absolute path, or ``":memory:"``."""
        return self._db.path

    def commit_turn(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        checkpoint_key: str | None,
        fence: Fence | None = None,
        release: bool = False,
    ) -> object:
        """:meth:`~lousho_sync.stores.base.TurnCommitter.commit_turn` in ONE transaction
        (one sync): fence check, length check, append, checkpoint delete, lease release.
        Nothing is written when it raises. Returns the new ``sessions.revision(id)``."""
        token = commit_token(id, fence, release)
        texts = [dumps_message(m) for m in messages]
        sessions = self.sessions

        def write(c: Conn) -> object:
            if not texts and not token and checkpoint_key is None:
                row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
                sessions.check_length(id, expected_length, 0 if row is None else row[0])
                return _revision(c, id)
            c.execute("BEGIN IMMEDIATE")
            _check_fence(self._db, c, id, token)
            if texts:
                revision: object = self._append_rows(c, id, texts, expected_length)
            else:
                row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
                sessions.check_length(id, expected_length, 0 if row is None else row[0])
                revision = _revision(c, id)
            if checkpoint_key is not None:
                c.execute("DELETE FROM checkpoints WHERE key = ?", (checkpoint_key,))
            if release:
                c.execute(
                    "UPDATE leases SET owner = '', expires_at = 0"
                    " WHERE session_id = ? AND token = ?",
                    (id, token),
                )
            c.execute("COMMIT")
            return revision

        return self._db.run("commit a turn", write, id)

    def _append_rows(
        self, c: Conn, id: str, texts: list[str], expected_length: int
    ) -> tuple[int, int]:
        """Append rows inside the caller's transaction; returns the new revision token."""
        n = len(texts)
        row = c.execute(
            "UPDATE sessions SET length = length + ?, revision = revision + 1,"
            " updated_at = ? WHERE id = ? AND length = ? RETURNING key, revision",
            (n, time.time(), id, expected_length),
        ).fetchone()
        if row is not None:
            key, revision = row[0], row[1]
        else:
            row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
            self.sessions.check_length(id, expected_length, 0 if row is None else row[0])
            key, revision = _insert_session(c, id, n), 1  # absent and expected_length == 0
        _insert_rows(c, "messages", key, expected_length, texts)
        return key, revision

    def prune(self, older_than_s: float) -> PruneResult:
        """Delete sessions and checkpoints not updated for ``older_than_s`` seconds and
        approvals resolved that long ago; pending approvals (with their session and the
        checkpoint of the turn they paused) and sessions under a live lease
        are kept (and every session's fence token). Returns the counts."""
        check_older_than(older_than_s)
        prune_events(self.sessions.event_ops())  # finished turns past event_ttl_s
        expire_due(self.approvals)

        def delete_old(c: Conn) -> PruneResult:
            now = time.time()
            cutoff = now - older_than_s
            # a pending approval keeps its session and the checkpoint of the turn it paused
            stale = (
                "SELECT key FROM sessions WHERE updated_at < ?1 AND id NOT IN"
                " (SELECT session_id FROM leases WHERE expires_at > ?2) AND id NOT IN"
                " (SELECT session_id FROM approvals WHERE status = 'pending'"
                " AND session_id IS NOT NULL)"
            )
            c.execute("BEGIN IMMEDIATE")
            for table in ("messages", "history"):
                c.execute(f"DELETE FROM {table} WHERE id / {SPAN} IN ({stale})", (cutoff, now))
            sessions = c.execute(f"DELETE FROM sessions WHERE key IN ({stale})", (cutoff, now))
            checkpoints = c.execute(
                "DELETE FROM checkpoints WHERE updated_at < ? AND key NOT IN (SELECT"
                " json_extract(json, '$.checkpoint_key') FROM approvals WHERE status = 'pending'"
                " AND json_extract(json, '$.checkpoint_key') IS NOT NULL)",
                (cutoff,),
            )
            approvals = c.execute(
                "DELETE FROM approvals WHERE status != 'pending' AND resolved_at < ?", (cutoff,)
            )
            result = PruneResult(sessions.rowcount, checkpoints.rowcount, approvals.rowcount)
            c.execute("COMMIT")
            return result

        return self._db.run("prune", delete_old)

    def mark_encrypted(self) -> None:
        """Called by EncryptedStore: mark the file (``PRAGMA application_id``, at the next
        statement) as written through it, and accept this object's use."""
        self._db.mark_encrypted()

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self._db.path!r})"


def _revision(c: Conn, id: str) -> object:
    row = c.execute(
        "SELECT key, revision FROM sessions WHERE id = ? AND length != 0", (id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])

