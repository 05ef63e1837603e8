"""The PostgreSQL store's event-log primitives: rows in the UNLOGGED table
``lousho_events`` and heads in ``lousho_turns`` of the store's schema (created on first
use; never WAL-logged, so never fsynced); every write ends with ``NOTIFY`` on the schema's
channel, which the store's one listening connection (:mod:`._postgres_listen`) turns into
wake-ups of its readers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._events import TurnHead, TurnStatus
from ._postgres_db import Conn, Db
from ._postgres_listen import listener

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
)
# The writes a turn's driver makes all the time are one statement each, atomic in
# autocommit: the server runs it to its end however the client fares, so a client stopped
# (SIGSTOP) around it holds no lock a takeover would wait for. (A transaction of several
# statements, or a pipeline of them, leaves the server waiting for the stopped client with
# the rows locked.)
_BEGIN = (
    "WITH t AS (INSERT INTO {s}.lousho_turns VALUES (%(t)s, %(sid)s, %(o)s, %(st)s, "
    "%(last)s, %(status)s, %(ended)s, (SELECT count(*) FROM {s}.lousho_events WHERE "
    "turn_id = %(t)s)) ON CONFLICT (turn_id) DO UPDATE SET session_id = excluded.session_id,"
    " owner = excluded.owner, started_at = excluded.started_at, last_seq = excluded.last_seq,"
    " status = excluded.status, ended_at = excluded.ended_at, nrows = excluded.nrows), "
    "l AS (INSERT INTO {s}.lousho_turn_latest VALUES (%(sid)s, %(t)s) ON CONFLICT "
    "(session_id) DO UPDATE SET turn_id = excluded.turn_id) "
    "SELECT pg_notify(%(ch)s, '')"
)
# Fenced by the owner: the head's UPDATE matches only the owner's row (a takeover's begin
# that commits meanwhile is re-checked: its new owner does not match), and the rows go in
# only when it did, or when the turn has no head.
_APPEND = (
    "WITH up AS (UPDATE {s}.lousho_turns SET last_seq = coalesce(%(last)s, last_seq), "
    "status = %(status)s, ended_at = %(ended)s, nrows = nrows + %(n)s "
    "WHERE turn_id = %(t)s AND owner = %(o)s RETURNING 1), "
    "ok AS (SELECT EXISTS (SELECT FROM up) OR NOT EXISTS (SELECT FROM {s}.lousho_turns "
    "WHERE turn_id = %(t)s) AS ok), "
    "ins AS (INSERT INTO {s}.lousho_events SELECT %(t)s, r.seq, r.data FROM "
    "unnest(%(seqs)s::bigint[], %(data)s::text[]) AS r(seq, data) WHERE (SELECT ok FROM ok) "
    "ON CONFLICT (turn_id, seq) DO UPDATE SET data = excluded.data) "
    "SELECT ok, pg_notify(%(ch)s, '') FROM ok"
)
_DROP = (
    "WITH e AS (DELETE FROM {s}.lousho_events WHERE turn_id = %(t)s), "
    "h AS (DELETE FROM {s}.lousho_turns WHERE turn_id = %(t)s), "
    "l AS (DELETE FROM {s}.lousho_turn_latest WHERE turn_id = %(t)s) "
    "SELECT pg_notify(%(ch)s, '')"
)
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

    def _run(self, what: str, fn: Callable[[Conn], _T], write: bool | None = False) -> _T:
        """``fn`` on a connection; ``write`` True: in a transaction that ends with
        ``NOTIFY``, None: a single statement of ``fn``'s own that notifies (see
        :meth:`_write`)."""
        def body(c: Conn) -> _T:
            if not self._ready:
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                              (f"lousho events {self._db.schema}",))
                    for text in _TABLES:
                        c.execute(self._db.q(text))
                self._ready = True
            if not write:
                return fn(c)
            with c.transaction():  # a client stopped in it: the server ends its session

                out = fn(c)
                c.execute("SELECT pg_notify(%s, '')", (self._channel,))
            return out

        out = self._db.run(what, body)
        if write is not False:
            self._bump()
        return out

    def _write(self, what: str, statement: str, params: dict[str, Any]) -> Any:
        """One statement in autocommit (its ``pg_notify`` in it): the row it returns."""
        params["ch"] = self._channel
        query = self._db.q(statement)
        return self._run(what, lambda c: c.execute(query, params).fetchone(), write=None)

    def _bump(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def begin(self, head: TurnHead) -> None:
        # one statement (atomic in autocommit): a client stopped around it holds no lock
        # (see the module); an upsert, so an append waiting on the row sees the new owner
        self._write("begin a turn's event log", _BEGIN, {
            "t": head.turn_id, "sid": head.session_id, "o": head.owner,
            "st": head.started_at, "last": head.last_seq, "status": head.status,
            "ended": head.ended_at})

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        ok: Any = self._write("write events", _APPEND, {
            "t": turn_id, "o": owner, "status": status, "ended": ended_at,
            "last": rows[-1][0] if rows else None, "n": len(rows),
            "seqs": [seq for seq, _ in rows], "data": [text for _, text in rows]})
        return bool(ok[0])

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
        return [(int(s), str(d)) for s, d in rows]

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        notes = listener(self._db)
        with self._cond:
            if self._unlisten is None:
                self._unlisten = notes.subscribe(self._channel, lambda _: self._bump())
            # without a listener (yet, or after a lost connection), poll
            listening = notes.listening(self._channel)
            self._cond.wait(timeout if listening else min(timeout, 0.01))

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        q = self._db.q

        def fn(c: Conn) -> None:
            c.execute(q("DELETE FROM {s}.lousho_events WHERE turn_id = %s AND seq <= %s"),
                      (turn_id, upto))
            c.execute(q("INSERT INTO {s}.lousho_events SELECT %s, r.seq, r.data FROM "
                        "unnest(%s::bigint[], %s::text[]) AS r(seq, data)"),
                      (turn_id, [seq for seq, _ in rows], [text for _, text in rows]))
            c.execute(q("UPDATE {s}.lousho_turns SET nrows = (SELECT count(*) FROM "
                        "{s}.lousho_events WHERE turn_id = %s) WHERE turn_id = %s"),
                      (turn_id, turn_id))

        self._run("bound a turn's event log", fn, write=True)

    def drop(self, turn_id: str) -> None:
        self._write("remove a turn's event log", _DROP, {"t": turn_id})

    def ended_before(self, when: float) -> list[str]:
        rows: Any = self._run("list ended turns", lambda c: c.execute(self._db.q(
            "SELECT turn_id FROM {s}.lousho_turns WHERE ended_at < %s"), (when,)).fetchall())
        return [str(r[0]) for r in rows]
