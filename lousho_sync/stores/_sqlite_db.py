"""The SQLite connection of :mod:`lousho_sync.stores.sqlite`: opening (file checks, WAL,
schema migrations), running statements under one lock, and translating sqlite3 errors.

Schema versions (``PRAGMA user_version``): 1 the first; 2 adds ``leases.token``, the newest
fence token handed out for the session (a released lease keeps its row, with owner ``''``);
3 adds the session catalog: ``sessions.created_at`` (set to ``updated_at`` for the sessions
already stored), ``sessions.metadata`` (JSON text, NULL for none), the index
``sessions_by_update`` (``list``'s order) and the ``history`` table (the messages compaction
replaced, keyed like ``messages``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import (
    ConfigError,
    StoreCorruptError,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from ._common import encrypted_refusal, unstorable
from ._engine.backend import Backend, Translation
from ._sqlite_driver import (
    CHECKPOINT_WAL_BYTES,
    check_not_open_elsewhere,
    pin_driver,
    wal_reset_affected,
    warn_unguarded_connection,
    warn_wal_reset_once,
)
from ._sqlite_rows import quotes_stored_text

__all__ = ["BUSY_TIMEOUT_S", "SCHEMA_VERSION", "SPAN", "Conn", "Db"]

_log = logging.getLogger("lousho_sync.stores.sqlite")

SCHEMA_VERSION = 3
"""The schema this release writes (``PRAGMA user_version``)."""

BUSY_TIMEOUT_S = 5.0
_LOCK_TIMEOUT_S = 60.0
_HEADER = b"SQLite format 3\x00"
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
SPAN = 1 << 32
"""Message rowids of session key k are k * SPAN + position."""
_CHECK_WAL_EVERY = 32
"""Rows changed between two looks at the WAL's size (a turn changes about 4)."""
_BUSY_CODES = frozenset((5, 6))  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
_CORRUPT_CODES = frozenset((11, 26))  # SQLITE_CORRUPT, SQLITE_NOTADB
_TOOBIG_CODE = 18  # SQLITE_TOOBIG

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
    2: ("ALTER TABLE leases ADD COLUMN token INTEGER NOT NULL DEFAULT 0",),
    3: (
        "ALTER TABLE sessions ADD COLUMN created_at REAL NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN metadata TEXT",
        "UPDATE sessions SET created_at = updated_at",
        "CREATE INDEX sessions_by_update ON sessions (updated_at DESC, id)",
        "CREATE TABLE history (id INTEGER PRIMARY KEY, json TEXT NOT NULL)",
    ),
}
"""Statements that bring the schema from version ``n - 1`` to ``n``."""

ENCRYPTED_APPLICATION_ID = 0x6C6F7345
"""``PRAGMA application_id`` of a file written through EncryptedStore ("losE")."""

_open_files: dict[str, int] = {}
"""The files this process's stores hold open (real path: how many stores)."""
_open_files_lock = threading.Lock()

_T = TypeVar("_T")
Conn = sqlite3.Connection
"""A connection (what ``Db.run`` hands its function)."""


class Db(Backend):
    """The connection, its lock and the file's path. Thread-safe: ``lock`` guards ``conn``
    and ``closed``."""

    kind = "SQLite"
    store_class = "SqliteStore"
    path: str

    def __init__(self, path: str | os.PathLike[str], synchronous: str) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.memory = os.fspath(path) == ":memory:"
        where = ":memory:" if self.memory else str(Path(path).absolute())
        super().__init__(f"in the SQLite store at {where}", path=where)
        self.synchronous = _SYNCHRONOUS[synchronous]
        self.driver = pin_driver(self.path)
        self.errors: type[Exception] = self.driver.Error
        self.table = (
            Translation(quotes_stored_text, StoreCorruptError,
                        "a stored text value is not valid UTF-8 (the file is damaged; it was "
                        "left as it was; the value is not shown)", hide_detail=True),
            Translation(_is_corrupt, StoreCorruptError,
                        "the file is damaged or not a SQLite database; it was left as it was"),
            Translation(is_busy, StoreUnavailableError,
                        f"still locked by another connection after {BUSY_TIMEOUT_S:.0f} s"),
            Translation(self.driver.OperationalError, StoreUnavailableError),
        )
        # The WAL-reset guard (see _sqlite_driver): no automatic checkpoints; the store
        # checkpoints under the write lock itself.
        self.guard = not self.memory and wal_reset_affected(self.driver.sqlite_version_info)
        self.wal = self.path + "-wal"
        self.checkpointer: Conn | None = None  # the guard's second connection, lazily
        self.unchecked = 0  # rows changed since the guard last looked at the WAL's size
        self.wrapped = False  # used through EncryptedStore (mark_encrypted)
        self.mark_checked = False  # the encryption mark was checked (or written)
        self.real = None if self.memory else os.path.realpath(self.path)
        if self.real is not None:
            with _open_files_lock:
                if not _open_files.get(self.real):
                    check_not_open_elsewhere(self.driver, self.path)
                    if self.guard:
                        warn_unguarded_connection(self.driver, self.path)
                _open_files[self.real] = _open_files.get(self.real, 0) + 1
        try:
            self.conn = self._open()
        except BaseException:
            self._forget()
            raise
        if self.guard:
            warn_wal_reset_once(self.driver, self.path)
        self.level = self.synchronous  # the connection's current PRAGMA synchronous

    # --- opening ------------------------------------------------------------------------
    def _open(self) -> Conn:
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
                if not (is_busy(exc) and time.monotonic() < deadline):
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

    def _connect(self) -> Conn:
        try:
            conn: Conn = self.driver.connect(
                self.path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
            )
        except self.errors as exc:
            raise self.translate(exc, "open the database") from exc
        return conn

    def _setup(self, conn: Conn) -> None:
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

    def _version(self, conn: Conn) -> int:
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
        fn: Callable[[Conn], _T],
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
            if self.closed or self.pid != os.getpid():
                self.check_open(session_id)
            conn = self.conn
            level = self.synchronous if sync else "NORMAL"
            if level != self.level:
                conn.execute(f"PRAGMA synchronous = {level}")
                self.level = level
            changes = conn.total_changes
            try:
                if not self.mark_checked:
                    self._check_mark(conn)
                result = fn(conn)
            except BaseException as exc:
                writing = conn.in_transaction
                if writing:
                    try:
                        conn.rollback()
                    except self.errors:
                        _log.warning("could not roll back in %s", self.path, exc_info=True)
                if not writing and _is_too_big(exc):
                    # SQLite never stores a value past its size limit (the write is refused),
                    # so a read that meets one reads a damaged record
                    raise StoreCorruptError(
                        f"could not {what} in the SQLite store at {self.path}: a stored value "
                        "claims a size past SQLite's limit (the file is damaged; it was left "
                        "as it was; PRAGMA integrity_check tells)",
                        path=self.path,
                        session_id=session_id,
                    ) from None
                if isinstance(exc, MemoryError):  # SQLITE_NOMEM
                    raise StoreUnavailableError(
                        f"could not {what} in the SQLite store at {self.path}: SQLite ran out of"
                        " memory (the process is short of memory, or a damaged row claims a"
                        " huge size: PRAGMA integrity_check tells)",
                        path=self.path,
                        session_id=session_id,
                    ) from exc
                if isinstance(exc, UnicodeEncodeError):  # a surrogate in a bound str
                    raise unstorable(what, exc.object[exc.start], session_id) from None
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

    def mark_encrypted(self) -> None:
        """Mark the file as written through EncryptedStore (at the next statement) and
        accept this store's use."""
        with self.lock:
            self.wrapped = True
            self.mark_checked = False

    def _check_mark(self, conn: Conn) -> None:
        """Write the encryption mark (wrapped) or refuse a marked file (plain). Called
        holding ``lock``."""
        marked = conn.execute("PRAGMA application_id").fetchone()[0] == ENCRYPTED_APPLICATION_ID
        if self.wrapped and not marked:
            conn.execute(f"PRAGMA application_id = {ENCRYPTED_APPLICATION_ID}")
        elif marked and not self.wrapped:
            raise encrypted_refusal(f"at {self.path}", path=self.path)
        self.mark_checked = True

    def _checkpoint_if_due(self, conn: Conn) -> None:
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

    def reopen(self) -> None:
        """After a fork: a connection of this process's own."""
        self.conn = self._open()
        self.checkpointer = None
        self.level = self.synchronous

    def _forget(self) -> None:
        if self.real is None:
            return
        with _open_files_lock:
            left = _open_files.get(self.real, 0) - 1
            if left > 0:
                _open_files[self.real] = left
            else:
                _open_files.pop(self.real, None)

    def close(self) -> None:
        """Close the connection (idempotent; under the lock, so no call is using it)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._forget()
            if self.pid == os.getpid():
                if self.checkpointer is not None:
                    self.checkpointer.close()
                self.conn.close()


def _is_corrupt(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "not a database" in str(exc)
    return code & 0xFF in _CORRUPT_CODES


def _is_too_big(exc: BaseException) -> bool:
    """SQLITE_TOOBIG: a string or blob past SQLite's length limit."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == _TOOBIG_CODE)
    return type(exc).__name__ == "DataError" and "too big" in str(exc)  # (any driver)


def is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    return "locked" in str(exc) or "busy" in str(exc)

