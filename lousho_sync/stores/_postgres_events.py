"""The PostgreSQL store's event-log primitives: rows in the UNLOGGED table
``lousho_events`` and heads in ``lousho_turns`` of the store's schema (created on first
use; never WAL-logged, so never fsynced); every write ends with ``NOTIFY`` on the schema's
channel, which the store's one listening connection (:mod:`._postgres_listen`) turns into
wake-ups of its readers. A write of several events is one row per 1,000
(:func:`~._events.pack_rows`). A write also says whether a reader watches the turn
(``lousho_turn_live``, the live tail: :mod:`._postgres_live`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._events import TurnHead, TurnStatus, pack_rows, unpack_rows
from ._postgres_db import Conn, Db
from ._postgres_listen import listener
from ._postgres_live import WATCHED, PostgresLive

__all__ = ["PostgresEventOps"]

_T = TypeVar("_T")

_TABLES = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.lousho_turns (turn_id TEXT PRIMARY KEY, "
    "session_id TEXT NOT NULL, owner TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, "
    "last_seq BIGINT NOT NULL, status TEXT NOT NULL, ended_at DOUBLE PRECISION, "
    "nrows BIGINT NOT NULL DEFAULT 0)",
    "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.lousho_turn_latest (session_id TEXT PRIMARY "
    "KEY, turn_id TEXT NOT NULL)",
    "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.lousho_events (turn_id TEXT NOT NULL, "
    "seq BIGINT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (turn_id, seq))",
    "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.lousho_turn_live (turn_id TEXT PRIMARY KEY, "
    "watched_until DOUBLE PRECISION NOT NULL, live_seq BIGINT NOT NULL DEFAULT -1)",
)
# A turn's head made (or replaced, on takeover: its rows stay) and its session's latest
# turn set, in one statement; then NOTIFY.
_BEGIN = (
    "WITH head AS (INSERT INTO {s}.lousho_turns VALUES (%(t)s, %(s)s, %(o)s, %(at)s, "
    "%(last)s, %(st)s, %(end)s, (SELECT count(*) FROM {s}.lousho_events WHERE turn_id = "
    "%(t)s)) ON CONFLICT (turn_id) DO UPDATE SET session_id = excluded.session_id, owner = "
    "excluded.owner, started_at = excluded.started_at, last_seq = excluded.last_seq, "
    "status = excluded.status, ended_at = excluded.ended_at, nrows = excluded.nrows), "
    "latest AS (INSERT INTO {s}.lousho_turn_latest VALUES (%(s)s, %(t)s) ON CONFLICT "
    "(session_id) DO UPDATE SET turn_id = excluded.turn_id) "
    "SELECT pg_notify(%(ch)s, '')"
)
# A write of rows, in one statement (one round trip): the head's update is the fence — it
# matches only while the head's owner is the writer's (an update waiting on a takeover's
# begin sees its new owner); the rows go in (one INSERT from two array literals) when it
# matched, or when the turn has no head (as the other stores); a row whose seq the log
# holds already is left out (the retry of a write that was made; rows come in seq order).
# Returns whether it was written, and whether a reader watches the turn; NOTIFY.
_APPEND = (
    "WITH head AS (UPDATE {s}.lousho_turns SET last_seq = coalesce(%(last)s, last_seq), "
    "status = %(st)s, ended_at = %(end)s, nrows = nrows + %(n)s "
    "WHERE turn_id = %(t)s AND owner = %(o)s RETURNING 1), "
    "ok AS (SELECT EXISTS (SELECT 1 FROM head) OR NOT EXISTS (SELECT 1 FROM "
    "{s}.lousho_turns WHERE turn_id = %(t)s) AS ok), "
    "rows AS (INSERT INTO {s}.lousho_events SELECT %(t)s, r.seq, r.data FROM "
    "unnest(%(seqs)s::bigint[], %(rows)s::text[]) AS r(seq, data) WHERE (SELECT ok FROM ok) "
    "AND r.seq > (SELECT coalesce(max(seq), -1) FROM {s}.lousho_events WHERE turn_id = "
    "%(t)s)) "
    "SELECT ok, pg_notify(%(ch)s, ''), " + WATCHED + " FROM ok"
)

# A turn's log removed in one statement (none of the log's writes is a transaction a
# client stopped in it could keep open with the rows locked); NOTIFY.
_DROP = (
    "WITH e AS (DELETE FROM {s}.lousho_events WHERE turn_id = %(t)s), "
    "h AS (DELETE FROM {s}.lousho_turns WHERE turn_id = %(t)s), "
    "l AS (DELETE FROM {s}.lousho_turn_latest WHERE turn_id = %(t)s), "
    "w AS (DELETE FROM {s}.lousho_turn_live WHERE turn_id = %(t)s) "
    "SELECT pg_notify(%(ch)s, '')"
)


def _array(texts: Sequence[str]) -> str:
    """The PostgreSQL array literal of ``texts`` (one parameter: psycopg adapts a list of
    1,000 str element by element, ten times slower)."""
    return "{" + ",".join(['"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'
                           for t in texts]) + "}"


_HEAD = ("SELECT turn_id, session_id, owner, started_at, last_seq, status, ended_at, nrows "
         "FROM {s}.lousho_turns WHERE turn_id = %s")


class PostgresEventOps:
    """:class:`~lousho_sync.stores._events.EventOps` on a PostgreSQL store's pool."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._ready = False
        self._channel = f"lousho_events_{db.schema}"
        self._cond = threading.Condition()
        self._gen = 0
        self._unlisten: Callable[[], None] | None = None
        self.live = PostgresLive(db, self._run, self._channel)
        """The live tail (:class:`~._events.LiveOps`)."""

    def _run(self, what: str, fn: Callable[[Conn], _T], write: bool = False,
             one_statement: bool = False) -> _T:
        """``fn`` on a pooled connection; ``write``: in a transaction that ends with
        ``NOTIFY``; ``one_statement``: ``fn`` is one statement that notifies itself (one
        round trip, its own transaction)."""
        def body(c: Conn) -> _T:
            if not self._ready and not self._tables_exist(c):
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                              (f"lousho events {self._db.schema}",))
                    for text in _TABLES:
                        c.execute(self._db.q(text))
            self._ready = True
            if not write or one_statement:
                return fn(c)
            with c.transaction():
                out = fn(c)
                c.execute("SELECT pg_notify(%s, '')", (self._channel,))
            return out

        out = self._db.run(what, body)
        if write:
            self._bump()
        return out

    def _tables_exist(self, c: Conn) -> bool:
        """Whether the log's tables are there (one query; their creation takes a lock)."""
        names = [f'"{self._db.schema}".{t}' for t in
                 ("lousho_turns", "lousho_turn_latest", "lousho_events", "lousho_turn_live")]
        row: Any = c.execute("SELECT " + " AND ".join(["to_regclass(%s) IS NOT NULL"]
                                                       * len(names)), names).fetchone()
        return bool(row[0])

    def _bump(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def begin(self, head: TurnHead) -> None:
        # one statement: the head replaced (an upsert, so an append of the owner it
        # replaces, waiting on the row, sees the new owner), the session's latest turn set
        def fn(c: Conn) -> None:
            c.execute(self._db.q(_BEGIN), {
                "t": head.turn_id, "s": head.session_id, "o": head.owner,
                "at": head.started_at, "last": head.last_seq, "st": head.status,
                "end": head.ended_at, "ch": self._channel})

        self._run("begin a turn's event log", fn, write=True, one_statement=True)

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        packed = pack_rows(rows)  # one row per 1,000 events

        def fn(c: Conn) -> bool:
            row: Any = c.execute(self._db.q(_APPEND), {
                "t": turn_id, "o": owner, "st": status, "end": ended_at, "n": len(rows),
                "last": rows[-1][0] if rows else None,
                "seqs": "{" + ",".join([str(seq) for seq, _ in packed]) + "}",
                "rows": _array([text for _, text in packed]), "ch": self._channel}).fetchone()
            if row[0]:
                self.live.found(turn_id, bool(row[2]), ended_at is not None)
            return bool(row[0])

        return self._run("write events", fn, write=True, one_statement=True)

    def head(self, turn_id: str) -> TurnHead | None:
        row: Any = self._run("read a turn's event log",
                             lambda c: c.execute(self._db.q(_HEAD), (turn_id,)).fetchone())
        if row is None:
            return None
        t, s, o, st, last, status, ended, n = row
        return TurnHead(turn_id=t, session_id=s, owner=o, started_at=st, last_seq=last,
                        status=status, ended_at=ended, rows=n)

    def latest(self, session_id: str) -> str | None:
        row: Any = self._run("read a session's latest turn", lambda c: c.execute(
            self._db.q("SELECT turn_id FROM {s}.lousho_turn_latest WHERE session_id = %s"),
            (session_id,)).fetchone())
        return None if row is None else str(row[0])

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        rows: Any = self._run("read events", lambda c: c.execute(self._db.q(
            "SELECT seq, data FROM {s}.lousho_events WHERE turn_id = %s AND seq > %s "
            "ORDER BY seq LIMIT %s"), (turn_id, after, limit)).fetchall())
        return unpack_rows(rows, after)[:limit]

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        notes = listener(self._db)
        with self._cond:
            if self._unlisten is None:
                # held weakly: the listener's thread keeps no store alive
                me = weakref.ref(self)

                def bump(_: object) -> None:
                    ops = me()
                    if ops is not None:
                        ops._bump()

                self._unlisten = notes.subscribe(self._channel, bump)
            # without a listener (yet, or after a lost connection), poll
            listening = notes.listening(self._channel)
            self._cond.wait(timeout if listening else min(timeout, 0.01))

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        q = self._db.q

        def fn(c: Conn) -> None:
            later = unpack_rows(c.execute(q(
                "SELECT seq, data FROM {s}.lousho_events WHERE turn_id = %s AND seq > %s "
                "ORDER BY seq"), (turn_id, upto)).fetchall(), upto)  # (a row may hold <= upto)
            c.execute(q("DELETE FROM {s}.lousho_events WHERE turn_id = %s"), (turn_id,))
            with c.cursor() as cur:
                cur.executemany(q("INSERT INTO {s}.lousho_events VALUES (%s, %s, %s)"),
                                [(turn_id, seq, text) for seq, text in
                                 [*pack_rows(rows), *(pack_rows(later) if later else [])]])
            c.execute(q("UPDATE {s}.lousho_turns SET nrows = %s WHERE turn_id = %s"),
                      (len(rows) + len(later), turn_id))

        self._run("bound a turn's event log", fn, write=True)

    def drop(self, turn_id: str) -> None:
        self._run("remove a turn's event log", lambda c: c.execute(self._db.q(_DROP), {
            "t": turn_id, "ch": self._channel}), write=True, one_statement=True)

    def ended_before(self, when: float) -> list[str]:
        rows: Any = self._run("list ended turns", lambda c: c.execute(self._db.q(
            "SELECT turn_id FROM {s}.lousho_turns WHERE ended_at < %s"), (when,)).fetchall())
        return [str(r[0]) for r in rows]
