"""SqliteStore: sessions, checkpoints, approvals and leases in one SQLite file.

Several processes share the file (WAL mode, 5 s busy timeout, every write a
``BEGIN IMMEDIATE`` transaction or a single statement, so a busy database waits instead of
failing). Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    sessions    (key INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, length, revision,
                 updated_at)
    messages    (id INTEGER PRIMARY KEY = session key << 32 | seq, json)   one row a message
    checkpoints (key TEXT PRIMARY KEY, session_id, json, updated_at)
    approvals   (id TEXT PRIMARY KEY, session_id, status, reason, json, created_at,
                 resolved_at)
    leases      (session_id TEXT PRIMARY KEY, owner, expires_at)

A message's rowid is its session's integer key (never reused, thanks to AUTOINCREMENT)
shifted left 32 bits plus its position, so the table needs no index of its own and a
session is one range of the table; ``revision(id)`` is ``(key, counter)``, so it never
repeats even when a session is deleted and written again. An approval's ``json`` is the
record as created; the ``status``, ``reason`` and ``resolved_at`` columns are the truth
and are laid over it on read, so ``resolve`` is one conditional ``UPDATE``.

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

The WAL-reset bug of SQLite 3.7.0 to 3.51.2 (see :mod:`._sqlite_driver`): with the
``sqlite`` extra a fixed SQLite (pysqlite3) is used automatically; otherwise, when the linked
SQLite is affected, the store warns once (StoreDurabilityWarning), turns SQLite's automatic
checkpoints off and checkpoints itself from a second connection holding the write lock, so
no commit can restart the WAL during a checkpoint. ``LOUSHO_SQLITE_DRIVER`` (``auto``,
``sqlite3``, ``pysqlite3``) overrides the choice.

Thread safety: one connection per store, guarded by one lock; every call holds it for its
statements only (JSON encoding and decoding happen outside). One connection measured as
fast as a connection per thread for a single thread, and threads of one process queue on
the lock instead of on SQLite's millisecond busy sleeps. A store used in a forked child
opens its own connection there.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import attrs

from ..codec import (
    dumps_approval,
    dumps_checkpoint,
    dumps_message,
    loads_approval,
    loads_checkpoint,
)
from ..errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidSessionIdError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from ..messages import Message
from ..results import PruneResult
from ._lease import owner_is_dead, poll_until
from ._sqlite_driver import (
    CHECKPOINT_WAL_BYTES,
    choose_driver,
    wal_reset_affected,
    warn_wal_reset_once,
)
from ._sqlite_rows import decode_transcript, load_rows, quotes_stored_text
from .base import ApprovalRecord, Checkpoint

__all__ = [
    "SCHEMA_VERSION",
    "SqliteApprovalStore",
    "SqliteCheckpointStore",
    "SqliteSessionStore",
    "SqliteStore",
]

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""The schema this release writes (``PRAGMA user_version``)."""

BUSY_TIMEOUT_S = 5.0
_LOCK_TIMEOUT_S = 60.0
_HEADER = b"SQLite format 3\x00"
_ID_RULE = "^[A-Za-z0-9_-]{1,128}$"
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
_SPAN = 1 << 32
"""Message rowids of session key k are k * _SPAN + position."""
_CHECK_WAL_EVERY = 32
"""Rows changed between two looks at the WAL's size (a turn changes about 4)."""
_BUSY_CODES = frozenset((5, 6))  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
_CORRUPT_CODES = frozenset((11, 26))  # SQLITE_CORRUPT, SQLITE_NOTADB

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE sessions (key INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
        " length INTEGER NOT NULL, revision INTEGER NOT NULL, updated_at REAL NOT NULL)",
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, json TEXT NOT NULL)",
        "CREATE TABLE checkpoints (key TEXT PRIMARY KEY, session_id TEXT, json TEXT NOT NULL,"
        " updated_at REAL NOT NULL) WITHOUT ROWID",
        "CREATE TABLE approvals (id TEXT PRIMARY KEY, session_id TEXT, status TEXT NOT NULL,"
        " reason TEXT, json TEXT NOT NULL, created_at REAL NOT NULL, resolved_at REAL)"
        " WITHOUT ROWID",
        "CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL,"
        " expires_at REAL NOT NULL) WITHOUT ROWID",
    ),
}
"""Statements that bring the schema from version ``n - 1`` to ``n``."""

_T = TypeVar("_T")
_Conn = sqlite3.Connection


def _check_id(id: str) -> None:
    if type(id) is not str or _ID_RE.fullmatch(id) is None:
        raise InvalidSessionIdError(
            f"invalid session id {id!r}: it must match {_ID_RULE}", session_id=id
        )


class _Db:
    """The connection, its lock and the file's path. Thread-safe: ``lock`` guards ``conn``
    and ``closed``."""

    def __init__(self, path: str | os.PathLike[str], synchronous: str) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.memory = os.fspath(path) == ":memory:"
        self.path = ":memory:" if self.memory else str(Path(path).absolute())
        self.synchronous = _SYNCHRONOUS[synchronous]
        self.driver = choose_driver()
        self.errors: type[Exception] = self.driver.Error
        # The WAL-reset guard (see _sqlite_driver): no automatic checkpoints; the store
        # checkpoints under the write lock itself.
        self.guard = not self.memory and wal_reset_affected(self.driver.sqlite_version_info)
        self.wal = self.path + "-wal"
        self.checkpointer: _Conn | None = None  # the guard's second connection, lazily
        self.unchecked = 0  # rows changed since the guard last looked at the WAL's size
        self.lock = threading.Lock()
        self.closed = False
        self.conn = self._open()
        if self.guard:
            warn_wal_reset_once(self.driver, self.path)
        self.level = self.synchronous  # the connection's current PRAGMA synchronous
        self.pid = os.getpid()

    # --- opening ------------------------------------------------------------------------
    def _open(self) -> _Conn:
        if not self.memory:
            self._check_file()
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            conn = self._connect()
            try:
                self._setup(conn)
                return conn
            except StoreTooNewError:
                conn.close()
                raise
            except self.errors as exc:
                conn.close()
                if not (_is_busy(exc) and time.monotonic() < deadline):
                    raise self.translate(exc, "open the database") from exc
                time.sleep(0.005)

    def _check_file(self) -> None:
        path = Path(self.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as f:
                head = f.read(len(_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot open the SQLite store at {self.path}: {exc}", path=self.path
            ) from exc
        if head and head != _HEADER:
            raise StoreCorruptError(
                f"{self.path} is not a SQLite database (it was left as it was): "
                "point SqliteStore at a new or SQLite file",
                path=self.path,
            )

    def _connect(self) -> _Conn:
        try:
            conn: _Conn = self.driver.connect(
                self.path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
            )
        except self.errors as exc:
            raise self.translate(exc, "open the database") from exc
        return conn

    def _setup(self, conn: _Conn) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        current = self._version(conn)  # first, so a newer file is refused before any write
        if not self.memory:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA journal_size_limit = 1048576")  # WAL back to <= 1 MiB
            if self.guard:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        if current == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._version(conn)  # another process may have migrated meanwhile
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    conn.execute(statement)
                _log.info("migrated the SQLite store at %s to schema %d", self.path, target)
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise

    def _version(self, conn: _Conn) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreTooNewError(
                f"the SQLite store at {self.path} has schema version {version}, written by a "
                f"newer lousho; this release reads up to version {SCHEMA_VERSION}: upgrade "
                "lousho",
                path=self.path,
            )
        return version

    # --- running ------------------------------------------------------------------------
    def run(
        self,
        what: str,
        fn: Callable[[_Conn], _T],
        session_id: str | None = None,
        *,
        sync: bool = True,
    ) -> _T:
        """Call ``fn(conn)`` holding the lock; roll back and translate sqlite3 errors.

        ``sync=False`` writes without a sync of its own under ``synchronous="full"`` (see
        the module's durability notes)."""
        if not self.lock.acquire(timeout=_LOCK_TIMEOUT_S):
            raise StoreUnavailableError(
                f"timed out after {_LOCK_TIMEOUT_S:.0f} s waiting for the SQLite store at "
                f"{self.path} (another thread holds it)",
                path=self.path,
                session_id=session_id,
            )
        try:
            if self.closed:
                raise StoreClosedError(
                    f"the SQLite store at {self.path} is closed: open a new SqliteStore",
                    path=self.path,
                    session_id=session_id,
                )
            if self.pid != os.getpid():  # forked: never share a connection with the parent
                self.conn = self._open()
                self.checkpointer = None
                self.level = self.synchronous
                self.pid = os.getpid()
            conn = self.conn
            level = self.synchronous if sync else "NORMAL"
            if level != self.level:
                conn.execute(f"PRAGMA synchronous = {level}")
                self.level = level
            changes = conn.total_changes
            try:
                result = fn(conn)
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.rollback()
                    except self.errors:
                        _log.warning("could not roll back in %s", self.path, exc_info=True)
                if isinstance(exc, MemoryError):  # SQLITE_NOMEM
                    raise StoreUnavailableError(
                        f"could not {what} in the SQLite store at {self.path}: SQLite ran out of"
                        " memory (the process is short of memory, or a damaged row claims a"
                        " huge size: PRAGMA integrity_check tells)",
                        path=self.path,
                        session_id=session_id,
                    ) from exc
                if not isinstance(exc, self.errors):
                    raise
                error = self.translate(exc, what, session_id)
                if not quotes_stored_text(exc):
                    raise error from exc
            else:
                if self.guard:
                    self.unchecked += conn.total_changes - changes
                    if self.unchecked >= _CHECK_WAL_EVERY:
                        self.unchecked = 0
                        self._checkpoint_if_due(conn)
                return result
            # Raised outside the except block, so neither __cause__ nor __context__ holds
            # the driver's error, whose text quotes the stored value.
            raise error
        finally:
            self.lock.release()

    def _checkpoint_if_due(self, conn: _Conn) -> None:
        """The WAL-reset guard: once the WAL passes CHECKPOINT_WAL_BYTES, checkpoint while
        a second connection holds the write lock, so no commit can restart the WAL
        meanwhile. Called holding ``lock``."""
        try:
            if os.stat(self.wal).st_size < CHECKPOINT_WAL_BYTES:
                return
        except OSError:
            return
        try:
            if self.checkpointer is None:
                self.checkpointer = self._connect()
                self.checkpointer.execute("PRAGMA wal_autocheckpoint = 0")
            holder = self.checkpointer
            holder.execute("BEGIN IMMEDIATE")
            try:
                busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                holder.execute("ROLLBACK")
        except (self.errors, StoreError):  # the write is committed; the next one retries
            _log.warning("could not checkpoint %s", self.path, exc_info=True)
            return
        _log.debug("checkpointed %s: %s of %s WAL frames (busy=%s)", self.path, done, frames,
                   busy)

    def translate(self, exc: Exception, what: str, session_id: str | None = None) -> StoreError:
        """The lousho error for a sqlite3 error (the caller chains it, unless the driver's
        text quotes a stored value: see :func:`._sqlite_rows.quotes_stored_text`)."""
        if quotes_stored_text(exc):
            return StoreCorruptError(
                f"could not {what} in the SQLite store at {self.path}: a stored text value "
                "is not valid UTF-8 (the file is damaged; it was left as it was; the value is "
                "not shown)",
                path=self.path,
                session_id=session_id,
            )
        code = getattr(exc, "sqlite_errorcode", None)
        primary = None if code is None else code & 0xFF
        text = f"could not {what} in the SQLite store at {self.path}: {exc}"
        if primary in _CORRUPT_CODES or (primary is None and "not a database" in str(exc)):
            return StoreCorruptError(
                f"{text} (the file is damaged or not a SQLite database; it was left as it was)",
                path=self.path,
                session_id=session_id,
            )
        if _is_busy(exc):
            return StoreUnavailableError(
                f"{text} (still locked by another connection after {BUSY_TIMEOUT_S:.0f} s)",
                path=self.path,
                session_id=session_id,
            )
        if isinstance(exc, self.driver.OperationalError):
            return StoreUnavailableError(text, path=self.path, session_id=session_id)
        return StoreError(text, path=self.path, session_id=session_id)

    def corrupt(
        self, exc: Exception, what: str, session_id: str | None = None
    ) -> StoreCorruptError:
        """A StoreCorruptError naming the path, for a codec error about ``what`` (raise it
        unchained: the codec error's cause holds the stored text)."""
        return StoreCorruptError(
            f"{what} in the SQLite store at {self.path} cannot be read: {exc}",
            path=self.path,
            session_id=session_id,
        )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.pid == os.getpid():
                if self.checkpointer is not None:
                    self.checkpointer.close()
                self.conn.close()


def _is_busy(exc: Exception) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    return "locked" in str(exc) or "busy" in str(exc)


class SqliteSessionStore:
    """Transcripts, one row per message; ``append`` is one transaction of the turn's rows.

    Also the per-session lease (SPEC §5) and ``revision``. Thread- and process-safe.
    """

    def __init__(self, db: _Db) -> None:
        self._db = db

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript (one query), or None when the id has none."""
        _check_id(id)
        rows = self._db.run("load a session", lambda c: load_rows(c, id, _SPAN), id)
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

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript; an empty sequence deletes the session."""
        _check_id(id)
        texts = [dumps_message(m) for m in messages]

        def write(c: _Conn) -> None:
            c.execute("BEGIN IMMEDIATE")
            row = c.execute("SELECT key FROM sessions WHERE id = ?", (id,)).fetchone()
            if row is not None:
                c.execute("DELETE FROM messages WHERE id >= ? AND id < ?",
                          (row[0] * _SPAN, (row[0] + 1) * _SPAN))
            if not texts:
                c.execute("DELETE FROM sessions WHERE id = ?", (id,))
            else:
                if row is None:
                    key = _insert_session(c, id, len(texts))
                else:
                    key = row[0]
                    c.execute(
                        "UPDATE sessions SET length = ?, revision = revision + 1,"
                        " updated_at = ? WHERE key = ?",
                        (len(texts), time.time(), key),
                    )
                _insert_messages(c, key, 0, texts)
            c.execute("COMMIT")

        self._db.run("save a session", write, id)

    def delete(self, id: str) -> None:
        """Forget the id and its messages (no error when absent)."""
        self.save(id, ())

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add a turn's messages in one transaction.

        Raises StoreConflictError when the stored transcript does not hold exactly
        ``expected_length`` messages (another writer appended first).
        """
        _check_id(id)
        texts = [dumps_message(m) for m in messages]

        def write(c: _Conn) -> None:
            if not texts:
                row = c.execute("SELECT length FROM sessions WHERE id = ?", (id,)).fetchone()
                self._check_length(id, expected_length, 0 if row is None else row[0])
                return
            c.execute("BEGIN IMMEDIATE")
            self._append_rows(c, id, texts, expected_length)
            c.execute("COMMIT")

        self._db.run("append to a session", write, id)

    def _append_rows(
        self, c: _Conn, id: str, texts: list[str], expected_length: int
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
            self._check_length(id, expected_length, 0 if row is None else row[0])
            key, revision = _insert_session(c, id, n), 1  # absent and expected_length == 0
        _insert_messages(c, key, expected_length, texts)
        return key, revision

    def commit_turn(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        checkpoints: object,
        checkpoint_key: str | None,
        release_owner: str | None,
    ) -> object:
        """Append a finished turn, delete its checkpoint and release the session's lease in
        ONE transaction (one commit instead of three); returns the new ``revision(id)``.

        Returns None, doing nothing, when ``checkpoints`` is not this database's checkpoint
        store or there is nothing to append. Raises StoreConflictError like ``append``.
        """
        if checkpoint_key is not None and getattr(checkpoints, "_db", None) is not self._db:
            return None
        if not messages:
            return None
        _check_id(id)
        texts = [dumps_message(m) for m in messages]

        def write(c: _Conn) -> tuple[int, int]:
            c.execute("BEGIN IMMEDIATE")
            revision = self._append_rows(c, id, texts, expected_length)
            if checkpoint_key is not None:
                c.execute("DELETE FROM checkpoints WHERE key = ?", (checkpoint_key,))
            if release_owner is not None:
                c.execute("DELETE FROM leases WHERE session_id = ? AND owner = ?",
                          (id, release_owner))
            c.execute("COMMIT")
            return revision

        return self._db.run("commit a turn", write, id)

    def _check_length(self, id: str, expected: int, actual: int) -> None:
        if actual != expected:
            raise StoreConflictError(
                f"session {id!r} in the SQLite store at {self._db.path} holds {actual} "
                f"messages, expected {expected}: another writer appended first; reload and "
                "append again",
                expected_length=expected,
                actual_length=actual,
                path=self._db.path,
                session_id=id,
            )

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript; None when absent."""
        _check_id(id)
        row = self._db.run(
            "read a session's revision",
            lambda c: c.execute(
                "SELECT key, revision FROM sessions WHERE id = ?", (id,)
            ).fetchone(),
            id,
        )
        return None if row is None else (row[0], row[1])

    def ids(self) -> list[str]:
        """Stored session ids, sorted."""
        rows = self._db.run(
            "list sessions", lambda c: c.execute("SELECT id FROM sessions ORDER BY id").fetchall()
        )
        return [r[0] for r in rows]

    # --- lease --------------------------------------------------------------------------
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> bool:
        """Take the session's lease for ``ttl_s`` seconds; True when taken.

        Taken when free, expired, already ``owner``'s, or held by a dead process on this
        host; otherwise polled until ``wait_s`` seconds pass.
        """
        _check_id(id)
        _check_ttl(ttl_s)
        return poll_until(lambda: self._try_acquire(id, owner, ttl_s), wait_s)

    def _try_acquire(self, id: str, owner: str, ttl_s: float) -> bool:
        def attempt(c: _Conn) -> tuple[bool, str | None]:
            now = time.time()
            cur = c.execute(
                "INSERT INTO leases (session_id, owner, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
                " expires_at = excluded.expires_at"
                " WHERE leases.owner = excluded.owner OR leases.expires_at <= ?",
                (id, owner, now + ttl_s, now),
            )
            if cur.rowcount == 1:
                return True, None
            row = c.execute("SELECT owner FROM leases WHERE session_id = ?", (id,)).fetchone()
            return False, None if row is None else row[0]

        taken, holder = self._db.run("acquire a lease", attempt, id, sync=False)
        if taken or holder is None or not owner_is_dead(holder):
            return taken

        def take_over(c: _Conn) -> bool:
            cur = c.execute(
                "UPDATE leases SET owner = ?, expires_at = ? WHERE session_id = ? AND owner = ?",
                (owner, time.time() + ttl_s, id, holder),
            )
            return cur.rowcount == 1

        taken = self._db.run("take over a lease", take_over, id, sync=False)
        if taken:
            _log.info("session %s: took over the lease of dead owner %s", id, holder)
        return taken

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        _check_id(id)
        _check_ttl(ttl_s)
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
        """Release the lease if ``owner`` holds it (otherwise do nothing)."""
        _check_id(id)
        self._db.run(
            "release a lease",
            lambda c: c.execute(
                "DELETE FROM leases WHERE session_id = ? AND owner = ?", (id, owner)
            ),
            id,
            sync=False,
        )


def _check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ConfigError(f"a lease's ttl_s must be > 0 seconds, got {ttl_s!r}")


def _insert_session(c: _Conn, id: str, length: int) -> int:
    cur = c.execute(
        "INSERT INTO sessions (id, length, revision, updated_at) VALUES (?, ?, 1, ?)",
        (id, length, time.time()),
    )
    key = cur.lastrowid
    assert key is not None
    return key


def _insert_messages(c: _Conn, key: int, start: int, texts: list[str]) -> None:
    c.executemany(
        "INSERT INTO messages (id, json) VALUES (?, ?)",
        [(key * _SPAN + start + i, text) for i, text in enumerate(texts)],
    )


def _must_sync(checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint write needs its own sync: it records a paused or interrupted
    turn, or a tool about to start (see the module's durability notes)."""
    return checkpoint.status != "running" or bool(checkpoint.started_call_ids)


class SqliteCheckpointStore:
    """Checkpoints as opaque JSON by key (unknown fields round-trip). Thread-safe."""

    def __init__(self, db: _Db) -> None:
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

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write (replace) the checkpoint."""
        text = dumps_checkpoint(checkpoint)
        self._db.run(
            "save a checkpoint",
            lambda c: c.execute(
                "INSERT INTO checkpoints (key, session_id, json, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET session_id = excluded.session_id,"
                " json = excluded.json, updated_at = excluded.updated_at",
                (key, checkpoint.session_id, text, time.time()),
            ),
            checkpoint.session_id,
            sync=_must_sync(checkpoint),
        )

    def delete(self, key: str) -> None:
        """Delete the checkpoint (no error when absent)."""
        self._db.run(
            "delete a checkpoint",
            lambda c: c.execute("DELETE FROM checkpoints WHERE key = ?", (key,)),
        )

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted (an index range scan)."""

        def scan(c: _Conn) -> list[str]:
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
    threads and processes wins. Thread-safe."""

    def __init__(self, db: _Db) -> None:
        self._db = db

    def create(self, record: ApprovalRecord) -> None:
        """Store a record (replacing one with the same id)."""
        text = dumps_approval(record)
        resolved_at = record.resolved_at
        if record.status != "pending" and resolved_at is None:
            resolved_at = time.time()
        self._db.run(
            "create an approval",
            lambda c: c.execute(
                "INSERT OR REPLACE INTO approvals (id, session_id, status, reason, json,"
                " created_at, resolved_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.session_id,
                    record.status,
                    record.reason,
                    text,
                    record.created_at,
                    resolved_at,
                ),
            ),
            record.session_id,
        )

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        row = self._db.run(
            "read an approval",
            lambda c: c.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (id,)
            ).fetchone(),
        )
        return None if row is None else self._record(id, row)

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once: one caller wins; the others get ApprovalAlreadyResolvedError;
        an unknown id raises ApprovalNotFoundError."""
        status = "approved" if approved else "denied"

        def update(c: _Conn) -> tuple[Any, ...] | None:
            row = c.execute(
                "UPDATE approvals SET status = ?, reason = ?, resolved_at = ?"
                f" WHERE id = ? AND status = 'pending' RETURNING {_APPROVAL_COLUMNS}",
                (status, reason, time.time(), id),
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
        text, status, reason, resolved_at = row
        try:
            record = loads_approval(text)
        except StoreCorruptError as exc:
            error = self._db.corrupt(exc, f"approval {id!r}")
            record = None
        if record is None:
            raise error  # unchained: the codec's cause holds the stored text
        if (record.status, record.reason, record.resolved_at) != (status, reason, resolved_at):
            record = attrs.evolve(record, status=status, reason=reason, resolved_at=resolved_at)
        return record


class SqliteStore:
    """Sessions, checkpoints, approvals and leases in one SQLite file shared by several
    processes; usable directly as an agent's ``store``.

    ``path`` is a file (its directory is created) or ``":memory:"``. ``synchronous`` is
    ``"full"`` (default: a commit survives a power loss) or ``"normal"`` (survives a process
    crash; a power loss may lose the last commits). Thread-safe; ``close()`` is idempotent
    and any use after it raises StoreClosedError; a context manager.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["full", "normal"] = "full",
    ) -> None:
        self._db = _Db(path, synchronous)
        self.sessions = SqliteSessionStore(self._db)
        self.checkpoints = SqliteCheckpointStore(self._db)
        self.approvals = SqliteApprovalStore(self._db)

    @property
    def path(self) -> str:
        """The database file's absolute path, or ``":memory:"``."""
        return self._db.path

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> bool:
        """Same as ``sessions.acquire_lease``."""
        return self.sessions.acquire_lease(id, owner=owner, ttl_s=ttl_s, wait_s=wait_s)

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Same as ``sessions.renew_lease``."""
        return self.sessions.renew_lease(id, owner=owner, ttl_s=ttl_s)

    def release_lease(self, id: str, *, owner: str) -> None:
        """Same as ``sessions.release_lease``."""
        self.sessions.release_lease(id, owner=owner)

    def prune(self, older_than_s: float) -> PruneResult:
        """Delete sessions and checkpoints not updated for ``older_than_s`` seconds and
        approvals resolved that long ago; pending approvals and sessions under a live lease
        are kept. Returns the counts."""
        if not older_than_s >= 0:
            raise ConfigError(f"older_than_s must be >= 0, got {older_than_s!r}")

        def delete_old(c: _Conn) -> PruneResult:
            now = time.time()
            cutoff = now - older_than_s
            stale = (
                "SELECT key FROM sessions WHERE updated_at < ?1 AND id NOT IN"
                " (SELECT session_id FROM leases WHERE expires_at > ?2)"
            )
            c.execute("BEGIN IMMEDIATE")
            c.execute(f"DELETE FROM messages WHERE id / {_SPAN} IN ({stale})", (cutoff, now))
            sessions = c.execute(f"DELETE FROM sessions WHERE key IN ({stale})", (cutoff, now))
            checkpoints = c.execute("DELETE FROM checkpoints WHERE updated_at < ?", (cutoff,))
            approvals = c.execute(
                "DELETE FROM approvals WHERE status != 'pending' AND resolved_at < ?", (cutoff,)
            )
            c.execute("DELETE FROM leases WHERE expires_at < ?", (now,))
            result = PruneResult(sessions.rowcount, checkpoints.rowcount, approvals.rowcount)
            c.execute("COMMIT")
            return result

        return self._db.run("prune", delete_old)

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self._db.path!r})"
