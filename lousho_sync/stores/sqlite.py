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

from ..catalog import SessionInfo, SessionPage, check_list_args, check_metadata, page_from
from ..codec import dumps_message
from ..errors import SessionExistsError, StoreCorruptError
from ..ids import is_session_id
from ..messages import Message
from ..records import Fence
from ..results import PruneResult
from ._common import (
    FENCED_PART,
    SHARED_SESSIONS,
    SHARED_STORE,
    Closing,
    LeaseForwarding,
    check_older_than,
    validate_session_id,
)
from ._engine.approvals import ApprovalRules
from ._engine.checkpoints import CheckpointRules
from ._engine.commits import AppendRules, CommitRules
from ._engine.leases import LeaseSavingRules, check_newest, fence_token_of
from ._events import prune_events
from ._expiry import expire_due
from ._key_expiry import DEFAULT_KEY_TTL_S, check_key_ttl, tidy
from ._sqlite_db import SCHEMA_VERSION, SPAN, Conn, Db
from ._sqlite_events import SqliteEventOps
from ._sqlite_mail import SqliteMailOps
from ._sqlite_ops import (
    SqliteApprovals,
    SqliteCheckpoints,
    SqliteCommits,
    SqliteLeases,
    drop_rows,
    insert_rows,
    insert_session,
    replace,
    revision,
    token_of,
)
from ._sqlite_rows import INFO_COLUMNS, decode_history, decode_info, decode_transcript, load_rows
from .base import StoreCapabilities

__all__ = [
    "SCHEMA_VERSION",
    "SqliteApprovalStore",
    "SqliteCheckpointStore",
    "SqliteSessionStore",
    "SqliteStore",
]

_log = logging.getLogger(__name__)


def _check_fence(db: Db, c: Conn, id: str, token: int) -> None:
    """Inside the caller's transaction: LeaseLostError when a token newer than ``token``
    (0: no fence) was handed out for ``id``."""
    if token:
        check_newest(db, id, token_of(c, id), token)


class SqliteSessionStore(LeaseSavingRules, AppendRules):
    """Transcripts, one row per message; ``append`` is one transaction of the turn's rows.

    Also the per-session lease with fence tokens (SPEC §5) and ``revision``. Writes take
    ``fence=`` (``fenced``). ``combined`` is the SqliteStore this belongs to. Thread- and
    process-safe.
    """

    fenced = True

    @property
    def capabilities(self) -> StoreCapabilities:
        """All but ``prune`` (the store's): lease, fencing, append, revision,
        ``commit_turn`` through ``combined``, the catalog, the event log, the mailbox."""
        return SHARED_SESSIONS

    def __init__(self, db: Db, combined: SqliteStore) -> None:
        self._db = db
        self.combined = combined
        self._leases = SqliteLeases(db)
        self._commits = SqliteCommits(db)
        self._events = SqliteEventOps(db)
        self._mail = SqliteMailOps(db)

    def event_ops(self) -> SqliteEventOps:
        """The event log's primitives (``start()``/``attach()``): rows in this file."""
        return self._events

    def mail_ops(self) -> SqliteMailOps:
        """The session mailbox's primitives (turn policies across processes)."""
        return self._mail

    @property
    def first_checkpoints(self) -> SqliteCheckpointStore:
        """The checkpoint store ``take_lease_saving`` writes to (the same file's)."""
        return self.combined.checkpoints

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
            replace(c, id, texts)
            c.execute("COMMIT")

        self._db.run("save a session", write, id)

    def delete(self, id: str) -> None:
        """Forget the id: its messages, history and metadata (no error when absent)."""
        validate_session_id(id)

        def forget(c: Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            row = c.execute("SELECT key FROM sessions WHERE id = ?", (id,)).fetchone()
            if row is not None:
                drop_rows(c, row[0], history=True)
                c.execute("DELETE FROM sessions WHERE key = ?", (row[0],))
            c.execute("COMMIT")

        self._db.run("delete a session", forget, id)

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript; None when it has
        none (absent, or metadata only)."""
        validate_session_id(id)
        return self._db.run("read a session's revision", lambda c: revision(c, id), id)

    def ids(self) -> list[str]:
        """Stored session ids (with a transcript or metadata), sorted."""
        rows = self._db.run(
            "list sessions", lambda c: c.execute("SELECT id FROM sessions ORDER BY id").fetchall()
        )
        return [r[0] for r in rows]

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
            key = replace(c, id, texts)
            if key is not None and old:
                last = c.execute(
                    "SELECT max(id) FROM history WHERE id >= ? AND id < ?",
                    (key * SPAN, (key + 1) * SPAN),
                ).fetchone()[0]
                insert_rows(c, "history", key, 0 if last is None else last % SPAN + 1, old)
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
                drop_rows(c, row[0], history=True)
                c.execute("DELETE FROM sessions WHERE key = ?", (row[0],))
            if texts or stored is not None:
                key = insert_session(c, id, len(texts), stored)
                insert_rows(c, "messages", key, 0, texts)
                if texts:
                    insert_rows(c, "history", key, 0, old)
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


class SqliteCheckpointStore(CheckpointRules):
    """Checkpoints of a SqliteStore, one ``WITHOUT ROWID`` row each; progress checkpoints
    of a running turn ride on the next sync."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, db: Db) -> None:
        self._ops = SqliteCheckpoints(db)


class SqliteApprovalStore(ApprovalRules):
    """Approval rows of a SqliteStore; ``resolve`` is one conditional UPDATE."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, db: Db) -> None:
        self._ops = SqliteApprovals(db)


class SqliteStore(CommitRules, LeaseForwarding, Closing):
    """Sessions, checkpoints, approvals and leases in one SQLite file shared by several
    processes; usable directly as an agent's ``store``.

    ``path`` is a file (its directory is created) or ``":memory:"``. ``synchronous`` is
    ``"full"`` (default: a commit survives a power loss) or ``"normal"`` (survives a process
    crash; a power loss may lose the last commits). ``commit_turn`` commits a finished turn
    in one transaction; the lease methods forward to ``sessions``. Thread-safe; ``close()``
    is idempotent and any use after it raises StoreClosedError; a context manager.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """Everything: lease, fencing, append, revision, ``commit_turn``, the catalog,
        ``prune``, the event log, the mailbox."""
        return SHARED_STORE

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
        self._commits = self.sessions._commits

    @property
    def path(self) -> str:
        """The database file's absolute path, or ``":memory:"``."""
        return self._db.path

    def prune(self, older_than_s: float, *,
              idempotency_ttl_s: float = DEFAULT_KEY_TTL_S) -> PruneResult:
        """Delete sessions and checkpoints not updated for ``older_than_s`` seconds and
        approvals resolved that long ago; pending approvals (with their session and the
        checkpoint of the turn they paused) and sessions under a live lease
        are kept (and every session's fence token). Returns the counts.
        Then drops mail older than ``MAIL_TTL_S`` (600 s) from the session mailbox and the
        idempotency keys older than ``idempotency_ttl_s`` (default 24 h; pass the largest
        ``idempotency_ttl_s`` your sessions use) from the transcripts (``mails``,
        ``keys``: the transcripts rewritten, which counts as their update)."""
        check_older_than(older_than_s)
        check_key_ttl(idempotency_ttl_s)
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

        result: PruneResult = self._db.run("prune", delete_old)
        return tidy(result, self.sessions, idempotency_ttl_s)

    def mark_encrypted(self) -> None:
        """Called by EncryptedStore: mark the file (``PRAGMA application_id``, at the next
        statement) as written through it, and accept this object's use."""
        self._db.mark_encrypted()

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self._db.path!r})"
