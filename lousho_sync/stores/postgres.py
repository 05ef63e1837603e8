"""PostgresStore: sessions, checkpoints, approvals and leases in PostgreSQL, shared by many
processes and machines.

Tables, all in the schema ``schema`` (default ``"lousho"``; several stores live side by side
in one database under different schemas)::

    schema_version (version)                    the schema this release wrote (2)
    sessions    (key bigserial, id UNIQUE, length, revision, op, created_at, updated_at,
                 metadata)                      the catalog; INDEX (updated_at DESC, id)
    messages    (session_key, seq, json)        one row a message, PRIMARY KEY (key, seq)
    history     (session_key, seq, json)        the messages compaction replaced, in order
    checkpoints (key PRIMARY KEY, session_id, json, updated_at)
    approvals   (id PRIMARY KEY, session_id, status, reason, json, created_at, resolved_at, op)
    leases      (session_id PRIMARY KEY, owner, expires_at, token)

The schema is created on first use, in one transaction under ``pg_advisory_xact_lock`` (so
processes opening at once do not race), and migrated forward; a schema written by a newer
release is refused (StoreTooNewError). ``revision(id)`` is ``(key, counter)``: a session
deleted and written again gets a new key, so a revision never repeats.

The catalog lives in the ``sessions`` row (``length`` is the message count, ``metadata``
the compact JSON text, NULL when none), so every write updates it in its own transaction
with no extra statement, and ``list`` is one scan of the ``(updated_at DESC, id)`` index
that reads no message row. A session with metadata only is a row with ``length = 0``
(``load`` and ``revision`` return None for it). ``create`` is ``INSERT ... ON CONFLICT DO
NOTHING``: of two creates of one id, exactly one wins.

Writes: ``append`` and ``commit_turn`` are one transaction (conditional ``UPDATE ... WHERE
length = expected_length``, the rows, the checkpoint delete, the lease release). Fencing:
every acquisition of a lease adds one to ``leases.token`` (a released lease keeps its row,
so tokens only grow); a write given ``fence=`` locks the session's lease row
(``SELECT ... FOR UPDATE``) in its own transaction and raises LeaseLostError, writing
nothing, when a newer token exists. ``resolve`` is one ``UPDATE ... WHERE status =
'pending' RETURNING``, so exactly one caller wins.

Lost connections: a call whose connection drops (a server restart) is made again on a new
connection for a few seconds. That is safe for every call: reads, idempotent writes, and
``append``/``commit_turn``/``resolve``, which carry a one-off token (``op``), so a retry of a
write that did land sees its own token and succeeds instead of reporting a conflict. When the
server stays away, StoreUnavailableError (the turn stays pending, as with any store error).

Times (``updated_at``, lease expiry) come from the client's clock, as in SqliteStore.
Errors name ``postgresql://user@host:port/dbname`` and the schema, never the password, and
chain no psycopg error (whose ``pgconn`` holds the conninfo). A bad row raises
StoreCorruptError naming the session and the message, never the stored content.

Thread safety: a psycopg_pool connection pool (``min_size`` to ``max_size`` connections);
a store used in a forked child opens its own pool there.
"""

from __future__ import annotations

import builtins
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg-pool: pip install 'lousho[postgres]'"
    ) from exc

from ..catalog import (
    SessionInfo,
    SessionPage,
    check_list_args,
    check_metadata,
    page_from,
)
from ..codec import dumps_message, loads_message_texts
from ..errors import SessionExistsError, StoreCorruptError
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
from ._engine.leases import LeaseRules, check_newest, fence_token_of
from ._events import prune_events
from ._expiry import expire_due
from ._key_expiry import DEFAULT_KEY_TTL_S, check_key_ttl, tidy
from ._postgres_db import SCHEMA_VERSION, Conn, Db
from ._postgres_events import PostgresEventOps
from ._postgres_mail import PostgresMailOps
from ._postgres_ops import (
    INSERT_MESSAGES,
    PostgresApprovals,
    PostgresCheckpoints,
    PostgresCommits,
    PostgresLeases,
    locked_token,
)
from ._postgres_rows import (
    HISTORY,
    INFO_COLUMNS,
    LOAD,
    LOAD_LEAN,
    decode_history,
    decode_info,
    decode_transcript,
)
from .base import StoreCapabilities

__all__ = [
    "SCHEMA_VERSION",
    "PostgresApprovalStore",
    "PostgresCheckpointStore",
    "PostgresSessionStore",
    "PostgresStore",
]

_log = logging.getLogger(__name__)

_INSERT_HISTORY = (
    "INSERT INTO {s}.history (session_key, seq, json) SELECT %s, (SELECT coalesce(max(seq)"
    " + 1, 0) FROM {s}.history WHERE session_key = %s) + t.o - 1, t.j"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS t(j, o)"
)
_REPLACE = (
    "INSERT INTO {s}.sessions AS x (id, length, revision, op, created_at, updated_at)"
    " VALUES (%s, %s, 1, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET length = excluded.length,"
    " revision = x.revision + 1, op = excluded.op, updated_at = excluded.updated_at"
    " WHERE excluded.op IS NULL OR x.op IS DISTINCT FROM excluded.op RETURNING key"
)


def _fence(db: Db, c: Conn, id: str, token: int) -> None:
    """Inside the caller's transaction: lock ``id``'s lease row; LeaseLostError when a
    token newer than ``token`` (0: no fence, no lock) was handed out."""
    if token:
        check_newest(db, id, locked_token(db, c, id), token)


def _replace(db: Db, c: Conn, id: str, texts: list[str], op: str | None) -> int | None:
    """Inside the caller's transaction: replace the transcript with ``texts`` (not empty);
    the session's key, or None when the row already carries ``op`` (a retry that landed)."""
    now = time.time()
    row = c.execute(db.q(_REPLACE), (id, len(texts), op, now, now)).fetchone()
    if row is None:
        return None
    c.execute(db.q("DELETE FROM {s}.messages WHERE session_key = %s"), (row[0],))
    c.execute(db.q(INSERT_MESSAGES), (row[0], 0, texts))
    return int(row[0])


def _clear(db: Db, c: Conn, id: str, *, keep_metadata: bool) -> None:
    """Inside the caller's transaction: remove the transcript and the history of ``id``,
    and the row too unless ``keep_metadata`` and it has metadata."""
    row = c.execute(db.q(
        "SELECT key, metadata IS NOT NULL FROM {s}.sessions WHERE id = %s FOR UPDATE"), (id,)
    ).fetchone()
    if row is None:
        return
    c.execute(db.q("DELETE FROM {s}.messages WHERE session_key = %s"), (row[0],))
    c.execute(db.q("DELETE FROM {s}.history WHERE session_key = %s"), (row[0],))
    if keep_metadata and row[1]:
        c.execute(db.q("UPDATE {s}.sessions SET length = 0, revision = revision + 1, op = NULL,"
                       " updated_at = %s WHERE key = %s"), (time.time(), row[0]))
    else:
        c.execute(db.q("DELETE FROM {s}.sessions WHERE key = %s"), (row[0],))


class PostgresSessionStore(LeaseRules, AppendRules):
    """Transcripts, one row per message; ``append`` is one transaction of the turn's rows.

    Also the per-session lease with fence tokens (SPEC §5), ``revision`` and ``ids``. Writes
    take ``fence=`` (``fenced``). ``combined`` is the PostgresStore this belongs to. Thread-
    and process-safe.
    """

    fenced = True

    @property
    def capabilities(self) -> StoreCapabilities:
        """All but ``prune`` (the store's): lease, fencing, append, revision,
        ``commit_turn`` through ``combined``, the catalog, the event log, the mailbox."""
        return SHARED_SESSIONS

    def __init__(self, db: Db, combined: PostgresStore) -> None:
        self._db = db
        self.combined = combined
        self._leases = PostgresLeases(db)
        self._commits = PostgresCommits(db)
        self._mail = PostgresMailOps(db)
        self._events = PostgresEventOps(db)

    def mail_ops(self) -> PostgresMailOps:
        """The session mailbox's primitives (turn policies across processes)."""
        return self._mail

    def event_ops(self) -> PostgresEventOps:
        """The event log's primitives (``start()``/``attach()``)."""
        return self._events

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript (one query), or None when the id has none."""
        validate_session_id(id)
        db = self._db
        rows = db.run("load a session", lambda c: c.execute(
            db.q(LOAD_LEAN), (id,), binary=True).fetchall(), id)
        if not rows:
            return None
        length = rows[0][0]
        if length is not None and len(rows) == length and rows[-1][1] == length - 1:
            # seq is unique per session (the primary key) and the rows come sorted by it:
            # ``length`` rows from 0 to length - 1 are every position, each once
            try:
                return loads_message_texts(map(itemgetter(2), rows))
            except StoreCorruptError:
                pass  # which one: below
        elif length == 0 and len(rows) == 1 and rows[0][1] is None:
            return None  # metadata only
        rows = db.run("load a session", lambda c: c.execute(db.q(LOAD), (id,)).fetchall(), id)
        return decode_transcript(db, id, rows)

    def save(self, id: str, messages: Sequence[Message], *, fence: Fence | None = None) -> None:
        """Replace the transcript; an empty sequence removes the transcript and the history
        (the metadata stays). With ``fence``, LeaseLostError (nothing written) when a newer
        lease token exists."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        texts = [dumps_message(m) for m in messages]
        db = self._db

        def write(c: Conn) -> None:
            with c.transaction():
                _fence(db, c, id, token)
                if texts:
                    _replace(db, c, id, texts, None)
                else:
                    _clear(db, c, id, keep_metadata=True)

        db.run("save a session", write, id)

    def delete(self, id: str) -> None:
        """Forget the id: transcript, history and metadata (no error when absent)."""
        validate_session_id(id)
        db = self._db

        def write(c: Conn) -> None:
            with c.transaction():
                _clear(db, c, id, keep_metadata=False)

        db.run("delete a session", write, id)

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript; None when absent."""
        validate_session_id(id)
        db = self._db
        row = db.run(
            "read a session's revision",
            lambda c: c.execute(db.q(
                "SELECT key, revision, length FROM {s}.sessions WHERE id = %s"), (id,)
            ).fetchone(),
            id,
        )
        return None if row is None or not row[2] else (int(row[0]), int(row[1]))

    def ids(self) -> builtins.list[str]:
        """Stored session ids (with a transcript or metadata), sorted."""
        db = self._db
        rows = db.run("list sessions", lambda c: c.execute(
            db.q("SELECT id FROM {s}.sessions ORDER BY id")).fetchall())
        return [r[0] for r in rows]

    # --- the catalog (Catalogued) -------------------------------------------------------
    def info(self, id: str) -> SessionInfo | None:
        """The catalog entry of ``id`` (one row; no message is read), or None."""
        validate_session_id(id)
        db = self._db
        row = db.run("read a session's catalog entry", lambda c: c.execute(db.q(
            f"SELECT {INFO_COLUMNS} FROM {{s}}.sessions WHERE id = %s"), (id,)).fetchone(), id)
        return None if row is None else decode_info(db, row)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` in one statement ({} removes it), creating the
        catalog entry when absent; bumps ``updated_at``, not the revision; takes no fence."""
        validate_session_id(id)
        text = check_metadata(metadata, id)
        db = self._db

        def write(c: Conn) -> None:
            now = time.time()
            if text != "{}":
                c.execute(db.q(
                    "INSERT INTO {s}.sessions AS x (id, length, revision, created_at,"
                    " updated_at, metadata) VALUES (%s, 0, 0, %s, %s, %s) ON CONFLICT (id)"
                    " DO UPDATE SET metadata = excluded.metadata,"
                    " updated_at = excluded.updated_at"), (id, now, now, text))
                return
            with c.transaction():
                gone = c.execute(db.q(
                    "DELETE FROM {s}.sessions WHERE id = %s AND length = 0 RETURNING key"),
                    (id,)).fetchone()
                if gone is not None:
                    c.execute(db.q("DELETE FROM {s}.history WHERE session_key = %s"), (gone[0],))
                else:
                    c.execute(db.q("UPDATE {s}.sessions SET metadata = NULL, updated_at = %s"
                                   " WHERE id = %s"), (now, id))

        db.run("set a session's metadata", write, id)

    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced in ``id``, oldest first ([] when none)."""
        validate_session_id(id)
        db = self._db
        rows = db.run("read a session's history",
                      lambda c: c.execute(db.q(HISTORY), (id,)).fetchall(), id)
        return decode_history(db, id, rows)

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """In one transaction: add ``replaced`` to the history of ``id`` and replace its
        transcript with ``messages`` (an empty one removes the history too, as ``save``).
        With ``fence``, LeaseLostError (nothing written) when a newer lease token exists."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        texts = [dumps_message(m) for m in messages]
        old = [dumps_message(m) for m in replaced]
        op = uuid.uuid4().hex  # a retry after a lost reply sees its own compaction
        db = self._db

        def write(c: Conn) -> None:
            with c.transaction():
                _fence(db, c, id, token)
                if not texts:
                    _clear(db, c, id, keep_metadata=True)
                    return
                key = _replace(db, c, id, texts, op)
                if key is not None and old:
                    c.execute(db.q(_INSERT_HISTORY), (key, key, old))

        db.run("compact a session", write, id)

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create ``id`` with a transcript, metadata and history in one transaction;
        SessionExistsError (nothing written) when it has messages or metadata already. Of
        two creates at once, exactly one wins."""
        validate_session_id(id)
        text = check_metadata(metadata or {}, id)
        md = None if text == "{}" else text
        texts = [dumps_message(m) for m in messages]
        old = [dumps_message(m) for m in history] if texts else []
        op = uuid.uuid4().hex  # a retry after a lost reply sees its own row
        db = self._db

        def write(c: Conn) -> None:
            with c.transaction():
                if texts or md is not None:
                    now = time.time()
                    row = c.execute(db.q(
                        "INSERT INTO {s}.sessions (id, length, revision, op, created_at,"
                        " updated_at, metadata) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (id) DO NOTHING RETURNING key"),
                        (id, len(texts), 1 if texts else 0, op, now, now, md)).fetchone()
                    if row is not None:
                        if texts:
                            c.execute(db.q(INSERT_MESSAGES), (row[0], 0, texts))
                        if old:
                            c.execute(db.q(_INSERT_HISTORY), (row[0], row[0], old))
                        return
                found = c.execute(db.q("SELECT op FROM {s}.sessions WHERE id = %s"), (id,)
                                  ).fetchone()
                if found is None or found[0] == op:
                    return  # nothing to create, or this call's retry: it landed
                raise SessionExistsError(f"session {id!r} exists already {db.where}",
                                         address=db.address, session_id=id)

        db.run("create a session", write, id)

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of the catalog, newest ``updated_at`` first, then by id: one scan of
        the ``(updated_at DESC, id)`` index, reading no message (see
        :class:`~lousho_sync.stores.base.Catalogued`)."""
        start, limit, cursor = check_list_args(prefix, limit, after)
        where: builtins.list[str] = []
        params: builtins.list[object] = []
        if start:
            where.append("starts_with(id, %s)")
            params.append(start)
        if cursor is not None:
            where.append("updated_at <= %s AND (updated_at < %s OR id > %s)")
            params += [cursor[0], cursor[0], cursor[1]]
        text = f"SELECT {INFO_COLUMNS} FROM {{s}}.sessions"
        if where:
            text += " WHERE " + " AND ".join(where)
        text += " ORDER BY updated_at DESC, id LIMIT %s"
        params.append(limit + 1)
        db = self._db
        rows = db.run("list sessions", lambda c: c.execute(db.q(text), params).fetchall())
        return page_from([decode_info(db, r) for r in rows], limit)


class PostgresCheckpointStore(CheckpointRules):
    """The ``checkpoints`` table of a PostgresStore (the rules: the engine's)."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, db: Db) -> None:
        self._ops = PostgresCheckpoints(db)


class PostgresApprovalStore(ApprovalRules):
    """The ``approvals`` table of a PostgresStore; ``resolve`` is one ``UPDATE ... WHERE
    status = 'pending'`` carrying an op token."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, db: Db) -> None:
        self._ops = PostgresApprovals(db)


class PostgresStore(CommitRules, LeaseForwarding, Closing):
    """Sessions, checkpoints, approvals and leases in a PostgreSQL database shared by many
    processes and machines; usable directly as an agent's ``store``.

    ``conninfo`` is a libpq URL (``postgresql://user:password@host:port/dbname``) or
    ``key=value`` string; ``schema`` is the PostgreSQL schema holding the tables (created on
    first use: a lower-case identifier); ``min_size``/``max_size`` bound the connection
    pool; ``connect_timeout_s`` bounds one connection attempt (libpq's, whole seconds, at
    least 1) and ``pool_timeout_s`` how long a call waits for a connection across its
    retries (a server that is down or restarting): then StoreUnavailableError. After an
    outage the next call connects as soon as the server is back. Nothing connects before
    the first call. ``commit_turn`` commits a finished
    turn in one transaction; the lease methods forward to ``sessions``. Thread-safe;
    ``close()`` is idempotent and any use after it raises StoreClosedError; a context
    manager.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """Everything: lease, fencing, append, revision, ``commit_turn``, the catalog,
        ``prune``, the event log, the mailbox."""
        return SHARED_STORE

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "lousho",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 5.0,
        pool_timeout_s: float = 5.0,
    ) -> None:
        self._db = Db(conninfo, schema, min_size, max_size, connect_timeout_s, pool_timeout_s)
        self.sessions = PostgresSessionStore(self._db, self)
        self.checkpoints = PostgresCheckpointStore(self._db)
        self.approvals = PostgresApprovalStore(self._db)
        self._commits = self.sessions._commits

    @property
    def address(self) -> str:
        """``postgresql://user@host:port/dbname`` (never the password)."""
        return self._db.address

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the store's tables."""
        return self._db.schema

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
        db = self._db

        def delete_old(c: Conn) -> PruneResult:
            now = time.time()
            cutoff = now - older_than_s
            with c.transaction():
                row = c.execute(db.q(
                    "WITH gone AS (DELETE FROM {s}.sessions WHERE updated_at < %s AND id NOT IN"
                    " (SELECT session_id FROM {s}.leases WHERE expires_at > %s) AND id NOT IN"
                    " (SELECT session_id FROM {s}.approvals WHERE status = 'pending' AND"
                    " session_id IS NOT NULL) RETURNING key),"
                    " m AS (DELETE FROM {s}.messages WHERE session_key IN"
                    " (SELECT key FROM gone)), h AS (DELETE FROM {s}.history WHERE"
                    " session_key IN (SELECT key FROM gone)) SELECT count(*) FROM gone"),
                    (cutoff, now)
                ).fetchone()
                # a pending approval keeps the checkpoint of the turn it paused
                checkpoints = c.execute(db.q(
                    "DELETE FROM {s}.checkpoints WHERE updated_at < %s AND key NOT IN (SELECT"
                    " json::json->>'checkpoint_key' FROM {s}.approvals WHERE status = 'pending'"
                    " AND json::json->>'checkpoint_key' IS NOT NULL)"), (cutoff,)).rowcount
                approvals = c.execute(db.q(
                    "DELETE FROM {s}.approvals WHERE status != 'pending' AND resolved_at < %s"),
                    (cutoff,)).rowcount
            return PruneResult(0 if row is None else int(row[0]), checkpoints, approvals)

        result: PruneResult = db.run("prune", delete_old)
        return tidy(result, self.sessions, idempotency_ttl_s)

    def mark_encrypted(self) -> None:
        """Called by EncryptedStore: mark the schema (its ``encrypted`` table, at the next
        call) as written through it, and accept this object's use."""
        self._db.mark_encrypted()

    def close(self) -> None:
        """Close the connection pool (idempotent)."""
        self._db.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self._db.address!r}, schema={self._db.schema!r})"
