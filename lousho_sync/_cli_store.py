"""The ``lousho`` command's stores: which kind a ``--store`` value names, opening it without
surprises, the sessions it holds (including those that hold only a pending turn), and
copying sessions from one store to another (``lousho sessions copy``)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from .catalog import LIST_LIMIT_MAX
from .errors import SessionExistsError, StoreConflictError
from .records import session_key, session_of, session_prefix
from .stores.base import capabilities_of, supports_append, supports_catalog

__all__ = [
    "CopyReport",
    "StoreProblem",
    "copy_sessions",
    "listed_sessions",
    "open_store",
    "probe_writable",
    "sessions_table",
    "shown",
    "stored_session_ids",
]

URL_SCHEMES = ("redis://", "rediss://", "unix://")
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
_SQLITE_HEADER = b"SQLite format 3\x00"


class StoreProblem(Exception):
    """A store that cannot be used; the message is one line that says what to do."""


def shown(path: str) -> str:
    """``path`` as the command prints it: a URL's password replaced by ``***`` (any scheme;
    the password may hold ``@``: everything up to the last ``@`` of the authority)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/]*@", r"\1:***@", path)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _kind(path: str, *, create: bool) -> str:
    """``"redis"``, ``"postgres"``, ``"sqlite"`` or ``"files"`` for ``path``, or
    StoreProblem."""
    if path.startswith(POSTGRES_SCHEMES):
        return "postgres"
    if path.startswith(URL_SCHEMES):
        return "redis"
    if "://" in path:
        raise StoreProblem(f"{shown(path)!r}: unknown store URL; lousho stores are redis://, "
                           "rediss://, unix:// or postgresql:// URLs, .db files and directories")
    p = Path(path)
    if p.is_dir():
        if create or (p / "sessions").is_dir() or (p / "state").is_dir():
            return "files"
        raise StoreProblem(f"{path!r} is a directory but not a lousho file store (it has no "
                           "sessions/ or state/ inside); nothing was created")
    if p.exists():
        if not p.is_file():
            raise StoreProblem(f"{path!r} is neither a file nor a directory")
        try:
            with p.open("rb") as f:
                head = f.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise StoreProblem(f"cannot read the store {path!r}: {_one_line(exc)}") from exc
        if head == _SQLITE_HEADER or (not head and p.suffix.lower() in SQLITE_SUFFIXES):
            return "sqlite"
        raise StoreProblem(f"{path!r} is not a lousho store (neither a SQLite database nor a "
                           "directory); it was left as it was. Give a .db file, a directory "
                           "or a redis:// URL")
    if not create:
        raise StoreProblem(f"no store at {path!r} (nothing was created; `lousho chat --store "
                           f"{path}` makes one)")
    if p.suffix.lower() in SQLITE_SUFFIXES:
        return "sqlite"
    if path.endswith(("/", os.sep)):
        return "files"
    raise StoreProblem(
        f"no store at {path!r}, and its name does not say which kind to create: name a new "
        f"SQLite file with .db ({p.with_suffix('.db')}), a new directory of files with a "
        f"trailing slash ({path}/), or use a redis:// URL")


def open_store(path: str, *, create: bool = True) -> Any:
    """The built-in store that ``path`` names: a ``redis://`` (``rediss://``, ``unix://``)
    URL → RedisStore; a directory → FileStore; a SQLite file, or a new ``.db``/``.sqlite``
    name → SqliteStore. With ``create=False`` nothing that does not exist yet is made.
    Anything else raises StoreProblem with a hint."""
    kind = _kind(path, create=create)
    if kind == "postgres":
        return _open_postgres(path, create=create)
    try:
        if kind == "redis":
            try:
                from .redis import RedisStore
            except ImportError as exc:
                raise StoreProblem(f"the store {shown(path)!r} needs the redis package: "
                                   "pip install 'lousho[redis]'") from exc
            if not create:
                _check_redis_store(path)
            store = _maybe_encrypted(RedisStore(path))
            store.sessions.ids()  # connects now, so a bad URL is reported before anything
            return store
        if kind == "files":
            from .stores.files import FileStore

            return _maybe_encrypted(FileStore(Path(path)))
        from .sqlite import SqliteStore

        if not create:
            _check_sqlite_store(path)
        return _maybe_encrypted(SqliteStore(Path(path)))
    except StoreProblem:
        raise
    except Exception as exc:  # every store failure becomes one line, no traceback
        raise StoreProblem(f"cannot open the store {shown(path)!r}: {_one_line(exc)}") from exc


DEFAULT_PREFIX = "lousho:"
"""The key prefix of the command's Redis stores (RedisStore's default)."""
_REDIS_KEYS = ("layout", "sessions", "checkpoint-keys", "approvals-pending",
               "approvals-resolved", "encrypted")
"""Keys of which a lousho Redis store has at least one (under its prefix)."""


def _check_redis_store(url: str) -> None:
    """StoreProblem when the Redis database holds no lousho store (under the default
    prefix): nothing is written. A server that cannot be reached is left to the store to
    report."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
        try:
            found = client.exists(*(DEFAULT_PREFIX + k for k in _REDIS_KEYS))
        finally:
            client.close()
    except Exception:  # unreachable or a bad URL: RedisStore says so
        return
    if not found:
        raise StoreProblem(f"no store at {shown(url)!r} (no lousho keys under the prefix "
                           f"{DEFAULT_PREFIX!r}; nothing was created)")


def _check_sqlite_store(path: str) -> None:
    """StoreProblem when the SQLite file is not a lousho store (an empty file, or another
    program's database): it is read, never changed. What cannot be read is left to the
    store to report."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sessions'"
            ).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return
    if not version or not tables:
        raise StoreProblem(f"no store at {path!r}: it is a SQLite database but not a lousho "
                           "store (it was left as it was; nothing was created)")


KEYS_ENV = "LOUSHO_ENCRYPTION_KEYS"
"""The environment variable holding the command's EncryptedStore keys (comma-separated
urlsafe base64, the encrypting one first)."""


def _maybe_encrypted(store: Any) -> Any:
    """``store`` inside an EncryptedStore when ``LOUSHO_ENCRYPTION_KEYS`` holds keys."""
    keys = [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",") if k.strip()]
    if not keys:
        return store
    from .stores.encrypted import EncryptedStore

    return EncryptedStore(store, keys=keys)


def postgres_schema(url: str) -> tuple[str, str]:
    """``url`` without its ``schema=`` query parameter (lousho's, not libpq's), and that
    schema (default ``"lousho"``): ``postgresql://host/db?schema=app_chat``."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, "lousho"
    schema, kept = "lousho", []
    for item in query.split("&"):
        if item.startswith("schema="):
            schema = item[len("schema="):]
        elif item:
            kept.append(item)
    return (f"{base}?{'&'.join(kept)}" if kept else base), schema


def _postgres_schema_exists(conninfo: str, schema: str) -> bool | None:
    """Whether ``schema`` holds a lousho store (its ``schema_version`` table); None when
    the server cannot tell (unreachable: the store reports it)."""
    import psycopg

    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".schema_version',)
                               ).fetchone()
    except Exception:  # nothing of it is shown: its text may hold the conninfo
        return None
    return row is not None and row[0] is not None


def _open_postgres(url: str, *, create: bool = True) -> Any:
    """A PostgresStore on ``url`` (its tables in the schema of a ``schema=`` query
    parameter, default ``lousho``), connected now; StoreProblem naming the address only
    (the URL may hold a password). With ``create=False`` a schema without a lousho store is
    "no store" (nothing is created)."""
    try:
        from .postgres import PostgresStore
    except ImportError:
        raise StoreProblem("a postgresql:// store needs psycopg: "
                           "pip install 'lousho[postgres]'") from None
    problem = ""
    if not create:
        conninfo, schema = postgres_schema(url)
        if _postgres_schema_exists(conninfo, schema) is False:
            raise StoreProblem(f"no store at {shown(url)!r}: the schema {schema!r} holds no "
                               "lousho store (nothing was created; is ?schema= right?)")
    try:
        conninfo, schema = postgres_schema(url)
        store = _maybe_encrypted(PostgresStore(conninfo, schema=schema))
    except Exception as exc:
        store, problem = None, _one_line(exc)
    if store is not None:
        try:
            store.sessions.ids()  # connects now, so a down server is reported before anything
            return store
        except Exception as exc:
            problem = _one_line(exc)
            store.close()
    # raised outside the except blocks: nothing chained holds the URL
    raise StoreProblem(f"cannot open the PostgreSQL store: {problem}")


def probe_writable(store: Any, path: str, session_id: str) -> None:
    """Take and give back ``session_id``'s lease (a real write), so a read-only store is
    reported now rather than at every turn. StoreProblem when it fails."""
    sessions = store.sessions
    try:
        sessions.load(session_id)
        if not capabilities_of(sessions).lease:
            return
        owner = f"lousho-cli-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        taken = sessions.acquire_lease(session_id, owner=owner, ttl_s=5.0, wait_s=0)
        # a fence token (older stores: True) when taken; None (False) when a running turn
        # elsewhere holds it: the store answered, so it is writable
        if taken is not None and taken is not False:
            sessions.release_lease(session_id, owner=owner)
    except Exception as exc:
        raise StoreProblem(
            f"the store {shown(path)!r} cannot be written: {_one_line(exc)}"
        ) from exc


def stored_session_ids(store: Any) -> list[str]:
    """Ids of the sessions with a transcript or a pending turn, sorted."""
    ids = set(store.sessions.ids())
    checkpoints = getattr(store, "checkpoints", None)
    if checkpoints is not None:
        for key in checkpoints.keys(""):
            sid = session_of(key)
            if sid is not None:
                ids.add(sid)
    return sorted(ids)



def listed_sessions(store: Any, agent: Any, prefix: str | None) -> list[dict[str, Any]]:
    """The rows of ``lousho sessions list``, newest first, read from the store's catalog
    (no transcript is loaded except of a session with a pending turn), then the sessions
    that hold only a pending turn."""
    keys = set(store.checkpoints.keys("")) if getattr(store, "checkpoints", None) else set()
    rows: list[dict[str, Any]] = []
    if supports_catalog(store.sessions):
        after = None
        while True:
            page = store.sessions.list(prefix=prefix, limit=LIST_LIMIT_MAX, after=after)
            for info in page:
                rows.append({"id": info.id, "messages": info.messages,
                             "created_at": info.created_at, "updated_at": info.updated_at,
                             "title": info.title, "metadata": dict(info.metadata),
                             "pending": None})
            if page.next is None:
                break
            after = page.next
    else:
        for sid in store.sessions.ids():
            if prefix is None or sid.startswith(prefix):
                rows.append({"id": sid, "messages": len(store.sessions.load(sid) or ()),
                             "created_at": None, "updated_at": None, "title": None,
                             "metadata": {}, "pending": None})
    seen = {row["id"] for row in rows}
    for key in sorted(keys):
        sid = session_of(key)
        if sid is not None and sid not in seen and (prefix is None or sid.startswith(prefix)):
            seen.add(sid)
            rows.append({"id": sid, "messages": 0, "created_at": None, "updated_at": None,
                         "title": None, "metadata": {}, "pending": None})
    for row in rows:
        if session_key(row["id"], row["messages"]) in keys:
            pending = agent.session(id=row["id"]).pending()
            row["pending"] = None if pending is None else pending.status
    return rows


def sessions_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` as the text table of ``lousho sessions list`` ('' when there are none)."""
    if not rows:
        return ""

    def when(t: float | None) -> str:
        return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    table = [("ID", "MESSAGES", "UPDATED", "TITLE")] + [
        (r["id"], str(r["messages"]), when(r["updated_at"]),
         (r["title"] or "-") + (f"  (pending turn: {r['pending']})" if r["pending"] else ""))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    return "".join(
        f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() + "\n"
        for a, b, c, d in table
    )


# --- lousho sessions copy ---------------------------------------------------------------------


@attrs.define
class CopyReport:
    """What :func:`copy_sessions` did: the ids copied (with their message counts), those
    refused (id, reason), those whose pending turn stayed behind in the source, and those
    whose metadata or compaction history the destination could not keep."""

    copied: list[tuple[str, int]] = attrs.field(factory=list)
    refused: list[tuple[str, str]] = attrs.field(factory=list)
    pending_left: list[str] = attrs.field(factory=list)
    catalog_dropped: list[str] = attrs.field(factory=list)


def _exists_in(store: Any, id: str) -> bool:
    """Whether ``id`` has a transcript, catalog metadata or a pending turn in ``store``."""
    sessions = store.sessions
    if sessions.load(id) is not None:
        return True
    if supports_catalog(sessions) and sessions.info(id) is not None:
        return True
    checkpoints = getattr(store, "checkpoints", None)
    return checkpoints is not None and bool(checkpoints.keys(session_prefix(id)))


def _has_pending(store: Any, id: str) -> bool:
    checkpoints = getattr(store, "checkpoints", None)
    return checkpoints is not None and bool(checkpoints.keys(session_prefix(id)))


def copy_sessions(src: Any, dst: Any, ids: Sequence[str]) -> CopyReport:
    """Copy the transcripts of ``ids`` from the store ``src`` to the store ``dst``.

    When both session stores have the catalog (:class:`~lousho_sync.stores.base.
    Catalogued`), a session's metadata and compaction history go with it, in one ``create``;
    else the transcript alone, with ``append(id, messages, expected_length=0)`` where
    ``dst`` has it (atomic: refused when another writer created the session meanwhile), else
    ``save``. A session that exists in ``dst`` (a transcript, metadata or a pending turn) is
    never overwritten: it is refused and the others are still copied. Pending turns
    (checkpoints) and approvals are never copied; a session that holds only a pending turn
    in ``src`` is refused (nothing to copy)."""
    report = CopyReport()
    src_sessions, dst_sessions = src.sessions, dst.sessions
    catalog = supports_catalog(src_sessions) and supports_catalog(dst_sessions)
    for id in ids:
        messages = src_sessions.load(id) or []
        metadata: dict[str, Any] = {}
        history: list[Any] = []
        if supports_catalog(src_sessions):
            info = src_sessions.info(id)
            metadata = dict(info.metadata) if info is not None else {}
            history = src_sessions.history(id)
        pending = _has_pending(src, id)
        if not messages and not (catalog and metadata):
            why = ("it holds only a pending turn, which is never copied" if pending
                   else "no such session in the source")
            report.refused.append((id, why))
            continue
        if _exists_in(dst, id):
            report.refused.append((id, "it exists already in the destination (nothing of it "
                                       "was changed there)"))
            continue
        try:
            if catalog:
                dst_sessions.create(id, messages, metadata=metadata, history=history)
            elif supports_append(dst_sessions):
                dst_sessions.append(id, messages, expected_length=0)
            else:
                dst_sessions.save(id, messages)
        except (SessionExistsError, StoreConflictError):
            report.refused.append((id, "it was created in the destination meanwhile (nothing "
                                       "of it was changed there)"))
            continue
        report.copied.append((id, len(messages)))
        if pending:
            report.pending_left.append(id)
        if not catalog and (metadata or history):
            report.catalog_dropped.append(id)
    return report
