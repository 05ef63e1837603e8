"""The PostgreSQL connection of :mod:`lousho_sync.stores.postgres`: the conninfo (its
address, never the password), the connection pool, the versioned schema (created on first
use, migrated forward under an advisory lock, a newer one refused), running statements with
retries where they are safe, and translating psycopg errors.

Schema versions (``<schema>.schema_version``): 1 the first; 2 the session catalog
(``sessions.created_at`` and ``metadata``, the index on ``(updated_at DESC, id)``, the
``history`` table of the messages compaction replaced).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import (
    ConfigError,
    StoreCorruptError,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from ._common import encrypted_refusal, unstorable
from ._engine.backend import Backend, Translation

__all__ = ["SCHEMA_VERSION", "Conn", "Db"]

_log = logging.getLogger("lousho_sync.stores.postgres")

SCHEMA_VERSION = 2
"""The schema this release writes (the row of ``<schema>.schema_version``)."""

Conn = psycopg.Connection[Any]
"""A connection (what ``Db.run`` hands its function), in autocommit mode."""

_T = TypeVar("_T")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
IDLE_IN_TRANSACTION_S = 10.0
"""The server ends a session of this store's that sits this long inside a transaction
(``idle_in_transaction_session_timeout``, unless the conninfo's ``options`` set it): a
transaction of the store never waits for anything but its own statements, so one that
does belongs to a client stopped (SIGSTOP) or hung in it, and its row locks would keep a
takeover of its turn waiting. The call of a client that goes on is made again (see
:meth:`Db.run`)."""
_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Pauses between attempts of a call whose connection was lost (then 1 s each), within the
call's ``pool_timeout_s``."""


_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE {s}.sessions (key bigserial PRIMARY KEY, id text COLLATE \"C\" NOT NULL"
        " UNIQUE, length integer NOT NULL, revision bigint NOT NULL, op text,"
        " updated_at double precision NOT NULL)",
        "CREATE TABLE {s}.messages (session_key bigint NOT NULL, seq integer NOT NULL,"
        " json text NOT NULL, PRIMARY KEY (session_key, seq))",
        "CREATE TABLE {s}.checkpoints (key text COLLATE \"C\" PRIMARY KEY, session_id text,"
        " json text NOT NULL, updated_at double precision NOT NULL)",
        "CREATE TABLE {s}.approvals (id text PRIMARY KEY, session_id text, status text NOT"
        " NULL, reason text, json text NOT NULL, created_at double precision NOT NULL,"
        " resolved_at double precision, op text)",
        "CREATE INDEX ON {s}.approvals (status, created_at)",
        "CREATE TABLE {s}.leases (session_id text PRIMARY KEY, owner text NOT NULL,"
        " expires_at double precision NOT NULL, token bigint NOT NULL)",
    ),
    2: (
        "ALTER TABLE {s}.sessions ADD COLUMN created_at double precision,"
        " ADD COLUMN metadata text",
        "UPDATE {s}.sessions SET created_at = updated_at",
        "ALTER TABLE {s}.sessions ALTER COLUMN created_at SET NOT NULL",
        "CREATE INDEX sessions_by_update ON {s}.sessions (updated_at DESC, id)",
        "CREATE TABLE {s}.history (session_key bigint NOT NULL, seq integer NOT NULL,"
        " json text NOT NULL, PRIMARY KEY (session_key, seq))",
    ),
}
"""Statements that bring the schema from version ``n - 1`` to ``n``."""


def _address(params: dict[str, Any]) -> str:
    """``postgresql://[user@]host:port/dbname`` of a parsed conninfo (never the password)."""
    host = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST")
               or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = params.get("user")
    db = params.get("dbname") or user or ""
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{db}"


_TABLE = (
    Translation((psycopg.OperationalError, psycopg.InterfaceError), StoreUnavailableError,
                "is the server running and reachable?"),
    Translation(psycopg.DataError, StoreCorruptError,
                "a stored value cannot be read (it was left as it was; the value is not "
                "shown)", hide_detail=True),
    Translation((psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn),
                StoreCorruptError, "the schema's tables were changed or dropped by hand"),
)


class Db(Backend):
    """The pool, the schema name, the address and the setup state. Thread-safe: ``lock``
    guards ``pool``, ``closed`` and ``ready``."""

    kind = "PostgreSQL"
    store_class = "PostgresStore"
    table = _TABLE
    address: str

    def __init__(
        self,
        conninfo: str,
        schema: str,
        min_size: int,
        max_size: int,
        connect_timeout_s: float,
        pool_timeout_s: float = 5.0,
    ) -> None:
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(
                f"schema must be a lower-case SQL identifier (letters, digits, '_', at most 63,"
                f" not starting with a digit), got {schema!r}"
            )
        if not isinstance(conninfo, str):
            raise ConfigError(
                f"PostgresStore needs a conninfo string, got {type(conninfo).__name__}"
            )
        if not (1 <= min_size <= max_size):
            raise ConfigError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        if not connect_timeout_s > 0:
            raise ConfigError(f"connect_timeout_s must be > 0, got {connect_timeout_s!r}")
        if not pool_timeout_s > 0:
            raise ConfigError(f"pool_timeout_s must be > 0, got {pool_timeout_s!r}")
        params = _parse(conninfo)
        password = params.get("password")
        params.setdefault("connect_timeout", str(max(1, round(connect_timeout_s))))
        params.setdefault("application_name", "lousho")
        options = str(params.get("options") or "")
        if "idle_in_transaction_session_timeout" not in options:
            params["options"] = (f"{options} -c idle_in_transaction_session_timeout="
                                 f"{int(IDLE_IN_TRANSACTION_S * 1000)}").strip()
        self._conninfo = make_conninfo(**params)
        address = _address(params)
        super().__init__(f"in the PostgreSQL store at {address} (schema {schema!r})",
                         address=address, secret=str(password) if password else None)
        self.schema = schema
        self.closed_detail = f" (schema {schema!r})"
        self.min_size, self.max_size = min_size, max_size
        self.timeout = connect_timeout_s
        self.pool_timeout = pool_timeout_s
        self._ident = sql.Identifier(schema)
        self._queries: dict[str, sql.Composed] = {}
        self.ready = False
        self.wrapped = False  # used through EncryptedStore (mark_encrypted)
        self.mark_checked = False  # the encryption mark was checked (or written)
        self.pool: ConnectionPool[Any] | None = None

    def connect(self) -> Conn:
        """A new connection of its own, outside the pool, in autocommit mode (a listener's:
        the caller closes it)."""
        return psycopg.connect(self._conninfo, autocommit=True)

    def q(self, text: str) -> sql.Composed:
        """``text`` with ``{s}`` replaced by the quoted schema name (cached)."""
        query = self._queries.get(text)
        if query is None:
            query = sql.SQL(text).format(s=self._ident)
            self._queries[text] = query
        return query

    # --- setup --------------------------------------------------------------------------
    def _setup(self, conn: Conn) -> None:
        """Create or migrate the schema (once per store); refuse a newer one."""
        if self._version(conn) == SCHEMA_VERSION:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         (f"lousho schema {self.schema}",))
            conn.execute(self.q("CREATE SCHEMA IF NOT EXISTS {s}"))
            conn.execute(self.q(
                "CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer NOT NULL)"))
            version = self._version(conn)  # another process may have migrated meanwhile
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    conn.execute(self.q(statement))
                _log.info("migrated the PostgreSQL store at %s (schema %s) to version %d",
                          self.address, self.schema, target)
            if version < SCHEMA_VERSION:
                conn.execute(self.q("DELETE FROM {s}.schema_version"))
                conn.execute(self.q("INSERT INTO {s}.schema_version VALUES (%s)"),
                             (SCHEMA_VERSION,))

    def mark_encrypted(self) -> None:
        """Write the encryption mark at the next call and accept this store's use."""
        with self.lock:
            self.wrapped = True
            self.mark_checked = False

    def _check_mark(self, conn: Conn) -> None:
        """Create ``<schema>.encrypted`` (wrapped) or refuse a schema that has it (plain).
        Called holding ``lock``."""
        if self.wrapped:
            conn.execute(self.q("CREATE TABLE IF NOT EXISTS {s}.encrypted (since float8)"))
            return
        row = conn.execute("SELECT to_regclass(%s)", (f'"{self.schema}".encrypted',)
                           ).fetchone()
        if row is not None and row[0] is not None:
            raise encrypted_refusal(f"at {self.address} (schema {self.schema!r})",
                                    address=self.address)

    def _version(self, conn: Conn) -> int:
        row = conn.execute("SELECT to_regclass(%s)", (f'"{self.schema}".schema_version',)
                           ).fetchone()
        if row is None or row[0] is None:
            return 0
        found = conn.execute(self.q("SELECT max(version) FROM {s}.schema_version")).fetchone()
        version = 0 if found is None or found[0] is None else int(found[0])
        if version > SCHEMA_VERSION:
            raise StoreTooNewError(
                f"the PostgreSQL store at {self.address} (schema {self.schema!r}) has schema "
                f"version {version}, written by a newer lousho; this release reads up to "
                f"version {SCHEMA_VERSION}: upgrade lousho",
                address=self.address,
            )
        return version

    def _pool(self, session_id: str | None) -> ConnectionPool[Any]:
        with self.lock:
            self.check_open(session_id)
            if not (self.ready and self.mark_checked):
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    if not self.ready:
                        self._setup(conn)
                        self.ready = True
                    self._check_mark(conn)
                    self.mark_checked = True
            if self.pool is None:
                self.pool = ConnectionPool(
                    self._conninfo,
                    min_size=self.min_size,
                    max_size=self.max_size,
                    kwargs={"autocommit": True},
                    timeout=self.pool_timeout,
                    # give up a reconnection after as long (its backoff grows to 16 s and
                    # more during an outage); the next call that waits starts a new one
                    reconnect_timeout=self.pool_timeout,
                    open=False,
                    name=f"lousho-{self.schema}",
                )
                self.pool.open(wait=False)
                _unclosed[self.pool] = os.getpid()
                # a store dropped without close() closes its pool (see _close_dropped)
                weakref.finalize(self, _close_dropped, self.pool, os.getpid()).atexit = False
            return self.pool

    # --- running ------------------------------------------------------------------------
    def run(self, what: str, fn: Callable[[Conn], _T], session_id: str | None = None) -> _T:
        """Call ``fn(conn)`` on a pooled connection; translate psycopg errors.

        A call whose connection was lost (the server restarted, a network cut) is made
        again on a new connection, for a few seconds: every ``fn`` the store passes is safe
        to repeat (reads, idempotent writes, and writes keyed on a one-off token or the
        expected length). Nothing of the psycopg error is chained (its ``pgconn`` holds the
        conninfo, password included)."""
        error: StoreError | None = None
        bad: str | None = None  # a NUL or surrogate of a str given: nothing was written
        deadline = time.monotonic() + self.pool_timeout
        for attempt in itertools.count():
            lost = False
            try:
                pool = self._pool(session_id)
                wait = max(0.05, deadline - time.monotonic())
                with pool.connection(timeout=wait) as conn:
                    try:
                        return fn(conn)
                    except psycopg.Error as exc:
                        lost = conn.broken or conn.closed or _lost(exc)
                        raise
            except PoolTimeout:
                lost = True
                error = StoreUnavailableError(
                    f"could not {what} {self.where}: no connection within "
                    f"{self.pool_timeout:g} s (is the server running and reachable?)",
                    address=self.address,
                    session_id=session_id,
                )
            except UnicodeEncodeError as exc:
                bad = exc.object[exc.start]
                break
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.DataError) and "NUL (0x00)" in str(exc):
                    bad = "\x00"
                    break
                lost = lost or _lost(exc)
                error = self.translate(exc, what, session_id)
            if error is not None and not lost:
                break
            delay = _RETRY_DELAYS[attempt] if attempt < len(_RETRY_DELAYS) else 1.0
            if time.monotonic() + delay >= deadline:
                break
            if pool_is_set := self.pool:
                try:
                    pool_is_set.check()  # drop the dead idle connections
                except Exception:  # pragma: no cover - the retry reports what matters
                    pass
            time.sleep(delay)
        if bad is not None:
            raise unstorable(what, bad, session_id)
        assert error is not None
        raise error  # outside the except blocks: nothing chained holds the psycopg error

    def reopen(self) -> None:
        """After a fork: a pool of this process's own (made on first use)."""
        self.pool = None

    def detail(self, exc: BaseException | str) -> str:
        """The driver's text on one line, with the password scrubbed."""
        return super().detail(" ".join(str(exc).split()) or type(exc).__name__)

    def corrupt(self, problem: str, session_id: str | None = None) -> StoreCorruptError:
        """A StoreCorruptError naming the address, for ``problem`` (no stored content)."""
        return StoreCorruptError(
            f"{problem} {self.where} (it was left as it was; stored content is not shown)",
            address=self.address,
            session_id=session_id,
        )

    def shut(self) -> None:
        """Close the pool."""
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None and self.pid == os.getpid():
            pool.close()


def _close_dropped(pool: ConnectionPool[Any], pid: int) -> None:
    """Close the pool of a store that was garbage-collected unclosed, in a thread of its own:
    the collection may run in one of the pool's own worker threads, which cannot join
    themselves (psycopg_pool's finaliser would raise "cannot join current thread" there).
    A pool inherited across a fork is left alone."""
    if pool.closed or pid != os.getpid():
        return
    with contextlib.suppress(RuntimeError):  # interpreter shutdown: the atexit hook closes it
        threading.Thread(target=_close_quietly, args=(pool,), daemon=True,
                         name="lousho-pool-close").start()


def _close_quietly(pool: ConnectionPool[Any]) -> None:
    with contextlib.suppress(Exception):
        pool.close(timeout=1.0)


_unclosed: weakref.WeakKeyDictionary[ConnectionPool[Any], int] = weakref.WeakKeyDictionary()
"""Every pool a store opened, with the process that opened it."""


@atexit.register
def _close_unclosed_pools() -> None:
    """At exit, close the pools of stores nobody closed, while their threads still run:
    psycopg_pool's finaliser would otherwise wait 5 s per worker thread during interpreter
    shutdown. Pools of another process (inherited across a fork) are left alone."""
    for pool, pid in list(_unclosed.items()):
        if pid == os.getpid() and not pool.closed:
            with contextlib.suppress(Exception):
                pool.close(timeout=1.0)


def _parse(conninfo: str) -> dict[str, Any]:
    """The conninfo's parameters; ConfigError (quoting none of it) when it is not one."""
    problem = ""
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.Error:
        problem = "not a PostgreSQL conninfo"
    raise ConfigError(
        f"{problem} (use postgresql://user[:password]@host:port/dbname or "
        "'host=... dbname=...'; the text given is not shown, it may hold a password)"
    )


def _lost(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection was lost or the server is not ready yet."""
    return isinstance(
        exc,
        psycopg.errors.AdminShutdown
        | psycopg.errors.CannotConnectNow
        | psycopg.errors.CrashShutdown
        | psycopg.errors.ConnectionException,
    ) or (isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None)
