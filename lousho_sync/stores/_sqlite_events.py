"""The SQLite store's event-log primitives: rows in ``lousho_events`` and heads in
``lousho_turns`` (created on first use), written without a sync of their own; a reader in
another process wakes by polling ``PRAGMA data_version``, one in this process by a
condition variable.

A write of several events is one row per 1,000 (:func:`~._events.pack_rows`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._events import TurnHead, TurnStatus, pack_rows, unpack_rows
from ._sqlite_db import Conn, Db

__all__ = ["SqliteEventOps"]

POLL_S = 0.005
_SUPERSEDED = "lousho: the turn has another owner"
_T = TypeVar("_T")

_TABLES = (
    "CREATE TABLE IF NOT EXISTS lousho_turns (turn_id TEXT PRIMARY KEY, session_id TEXT "
    "NOT NULL, owner TEXT NOT NULL, started_at REAL NOT NULL, last_seq INTEGER NOT NULL, "
    "status TEXT NOT NULL, ended_at REAL, nrows INTEGER NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS lousho_turns_ended ON lousho_turns (ended_at)",
    "CREATE TABLE IF NOT EXISTS lousho_turn_latest (session_id TEXT PRIMARY KEY, "
    "turn_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS lousho_events (turn_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "data TEXT NOT NULL, PRIMARY KEY (turn_id, seq)) WITHOUT ROWID",
    # append in one statement (see SqliteEventOps.append): an INSERT into this view runs
    # the trigger, which refuses a writer that is not the turn's owner
    "CREATE VIEW IF NOT EXISTS lousho_event_writes AS SELECT NULL AS turn_id, NULL AS owner,"
    " NULL AS rows, NULL AS last, NULL AS n, NULL AS status, NULL AS ended_at WHERE 0",
    "CREATE TRIGGER IF NOT EXISTS lousho_event_write INSTEAD OF INSERT ON lousho_event_writes"
    " BEGIN"
    f" SELECT RAISE(ABORT, '{_SUPERSEDED}') FROM lousho_turns"
    " WHERE turn_id = NEW.turn_id AND owner <> NEW.owner;"
    " INSERT OR REPLACE INTO lousho_events SELECT NEW.turn_id, json_extract(value, '$[0]'),"
    " json_extract(value, '$[1]') FROM json_each(NEW.rows);"
    " UPDATE lousho_turns SET last_seq = coalesce(NEW.last, last_seq), status = NEW.status,"
    " ended_at = NEW.ended_at, nrows = nrows + NEW.n WHERE turn_id = NEW.turn_id;"
    " END",
)
_HEAD = ("SELECT turn_id, session_id, owner, started_at, last_seq, status, ended_at, nrows "
         "FROM lousho_turns WHERE turn_id = ?")


class SqliteEventOps:
    """:class:`~lousho_sync.stores._events.EventOps` on a SQLite store's connection."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._ready = False
        self._cond = threading.Condition()
        self._gen = 0

    def _run(self, what: str, fn: Callable[[Conn], _T], write: bool | None = False) -> _T:
        """``fn`` on the connection; ``write`` True: in a write transaction, None: ``fn``
        writes one statement (atomic on its own)."""

        def body(c: Conn) -> _T:
            if not self._ready:
                for sql in _TABLES:
                    c.execute(sql)
                self._ready = True
            if write:
                c.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(c)
                except BaseException:
                    c.rollback()
                    raise
                c.commit()
                return out
            return fn(c)

        out = self._db.run(what, body, sync=False)
        if write is not False:
            with self._cond:
                self._gen += 1
                self._cond.notify_all()
        return out

    def begin(self, head: TurnHead) -> None:
        def fn(c: Conn) -> None:
            c.execute("DELETE FROM lousho_turns WHERE turn_id = ?", (head.turn_id,))
            c.execute("INSERT INTO lousho_turns VALUES (?, ?, ?, ?, ?, ?, ?, "
                      "(SELECT count(*) FROM lousho_events WHERE turn_id = ?))",
                      (head.turn_id, head.session_id, head.owner, head.started_at,
                       head.last_seq, head.status, head.ended_at, head.turn_id))
            c.execute("INSERT OR REPLACE INTO lousho_turn_latest VALUES (?, ?)",
                      (head.session_id, head.turn_id))

        self._run("begin a turn's event log", fn, write=True)

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        # One statement (the view's trigger does the fence, the rows and the head), not a
        # transaction of several: SQLite's write lock is the file's, and a driver stopped
        # (SIGSTOP) between the statements of a transaction would keep it, so no takeover
        # could write until it went on. Inside one statement no Python runs (the GIL is
        # not handed over mid-write), which keeps that window to the statement itself.
        params = (turn_id, owner,
                  json.dumps(pack_rows(rows), ensure_ascii=False, separators=(",", ":")),
                  rows[-1][0] if rows else None, len(rows), status, ended_at)
        errors = self._db.errors

        def fn(c: Conn) -> bool:
            try:
                c.execute("INSERT INTO lousho_event_writes VALUES (?, ?, ?, ?, ?, ?, ?)", params)
            except errors as exc:
                if _SUPERSEDED in str(exc):
                    return False  # another owner re-opened the turn (a takeover)
                raise
            return True

        return self._run("write events", fn, write=None)

    def head(self, turn_id: str) -> TurnHead | None:
        row: Any = self._run("read a turn's event log",
                        lambda c: c.execute(_HEAD, (turn_id,)).fetchone())
        if row is None:
            return None
        t, s, o, st, last, status, ended, n = row
        return TurnHead(turn_id=t, session_id=s, owner=o, started_at=st, last_seq=last,
                        status=status, ended_at=ended, rows=n)

    def latest(self, session_id: str) -> str | None:
        row: Any = self._run("read a session's latest turn", lambda c: c.execute(
            "SELECT turn_id FROM lousho_turn_latest WHERE session_id = ?",
            (session_id,)).fetchone())
        return None if row is None else str(row[0])

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        rows: Any = self._run("read events", lambda c: c.execute(
            "SELECT seq, data FROM lousho_events WHERE turn_id = ? AND seq > ? ORDER BY seq "
            "LIMIT ?", (turn_id, after, limit)).fetchall())
        return unpack_rows(rows, after)[:limit]

    def _version(self) -> int:
        row: Any = self._db.run("poll the event log",
                           lambda c: c.execute("PRAGMA data_version").fetchone(), sync=False)
        return int(row[0])

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            gen = self._gen
        version = self._version()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with self._cond:
                if self._gen != gen:
                    return
                self._cond.wait(min(POLL_S, left))
                if self._gen != gen:
                    return
            if self._version() != version:
                return

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        def fn(c: Conn) -> None:
            later = unpack_rows(c.execute(
                "SELECT seq, data FROM lousho_events WHERE turn_id = ? AND seq > ? ORDER BY "
                "seq", (turn_id, upto)).fetchall(), upto)  # (a row may hold events <= upto)
            c.execute("DELETE FROM lousho_events WHERE turn_id = ?", (turn_id,))
            c.executemany("INSERT INTO lousho_events VALUES (?, ?, ?)",
                          [(turn_id, seq, text) for seq, text in
                           [*pack_rows(rows), *(pack_rows(later) if later else [])]])
            c.execute("UPDATE lousho_turns SET nrows = ? WHERE turn_id = ?",
                      (len(rows) + len(later), turn_id))

        self._run("bound a turn's event log", fn, write=True)

    def drop(self, turn_id: str) -> None:
        def fn(c: Conn) -> None:
            c.execute("DELETE FROM lousho_events WHERE turn_id = ?", (turn_id,))
            c.execute("DELETE FROM lousho_turns WHERE turn_id = ?", (turn_id,))
            c.execute("DELETE FROM lousho_turn_latest WHERE turn_id = ?", (turn_id,))

        self._run("remove a turn's event log", fn, write=True)

    def ended_before(self, when: float) -> list[str]:
        rows: Any = self._run("list ended turns", lambda c: c.execute(
            "SELECT turn_id FROM lousho_turns WHERE ended_at < ?", (when,)).fetchall())
        return [str(r[0]) for r in rows]
