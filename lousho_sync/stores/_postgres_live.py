"""The PostgreSQL store's live tail of the event log (:class:`~._events.LiveOps`): rows
sent with ``NOTIFY`` on the schema's live channel as ``"<turn> <seq> <row>"`` (a payload
over :data:`MAX_PAYLOAD` bytes is not sent: the reader gets it from the log), by a
statement that holds the head's row (``FOR SHARE``) while it checks the owner and records
the seq in ``lousho_turn_live``; readers take them, with the log's wake-ups, from the
store's one listening connection (:mod:`._postgres_listen`) and mark the turn watched in
``lousho_turn_live.watched_until`` (the server's clock, renewed while they read). The
NOTIFY of a send takes the server's notification lock at its commit: sends are made only
while a reader watches (the log's write says so, :meth:`PostgresLive.found`)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._events import LIVE_LOG, WATCH_TTL_S, WatchCache, WatchMark
from ._postgres_db import Conn, Db
from ._postgres_listen import listener

__all__ = ["MAX_PAYLOAD", "WATCHED", "PostgresLive", "PostgresTail"]

_T = TypeVar("_T")

MAX_PAYLOAD = 7900
"""The largest payload sent (bytes; PostgreSQL refuses 8,000 and more)."""

_LISTEN_S = 5.0
"""How long a reader waits for the listening connection to listen on its channels (it
marks the turn watched only then, so nothing is sent live that it could miss; past it, it
goes on, and what it misses it reads from the log)."""

WATCHED = ("EXISTS (SELECT 1 FROM {s}.lousho_turn_live WHERE turn_id = %(t)s AND "
           "watched_until > extract(epoch FROM clock_timestamp()))")
"""Whether a reader watches turn ``%(t)s`` (an SQL expression)."""

# The head's row held while its owner is checked (a takeover's begin waits for the send,
# or the send finds the new owner and sends nothing); the seq kept; the payloads sent.
_SEND = (
    "WITH h AS (SELECT 1 FROM {s}.lousho_turns WHERE turn_id = %(t)s AND owner = %(o)s "
    "FOR SHARE), "
    "u AS (UPDATE {s}.lousho_turn_live SET live_seq = greatest(live_seq, %(seq)s) "
    "WHERE turn_id = %(t)s AND EXISTS (SELECT 1 FROM h)) "
    "SELECT pg_notify(%(ch)s, p) FROM h, unnest(%(ps)s::text[]) WITH ORDINALITY AS x(p, i) "
    "ORDER BY i"
)
_MARK = (
    "INSERT INTO {s}.lousho_turn_live VALUES (%(t)s, extract(epoch FROM clock_timestamp()) "
    "+ %(ttl)s, -1) ON CONFLICT (turn_id) DO UPDATE SET watched_until = "
    "greatest({s}.lousho_turn_live.watched_until, excluded.watched_until)"
)


class PostgresLive(WatchCache):
    """:class:`~._events.LiveOps` on a PostgreSQL store's pool; ``run(what, fn)`` runs
    ``fn`` on a pooled connection of the event log (its tables made)."""

    def __init__(self, db: Db, run: Callable[[str, Callable[[Conn], Any]], Any],
                 wake_channel: str) -> None:
        self._db = db
        self._run = run
        self.channel = f"lousho_live_{db.schema}"
        self.wake_channel = wake_channel
        super().__init__()

    def _ask(self, turn_id: str) -> bool:
        row: Any = self._run("look for readers of a turn", lambda c: c.execute(
            self._db.q("SELECT " + WATCHED), {"t": turn_id}).fetchone())
        return bool(row[0])

    def send(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str) -> None:
        payloads: list[str] = []
        last = -1
        for seq, row in rows:
            payload = f"{turn_id} {seq} {row}"
            if len(payload.encode()) > MAX_PAYLOAD:
                break
            payloads.append(payload)
            last = seq
        if not payloads:
            return
        text = "{" + ",".join(['"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"'
                               for p in payloads]) + "}"
        self._run("send events live", lambda c: c.execute(self._db.q(_SEND), {
            "t": turn_id, "o": owner, "seq": last, "ch": self.channel, "ps": text}))

    def sent(self, turn_id: str) -> int:
        row: Any = self._run("read a turn's event log", lambda c: c.execute(self._db.q(
            "SELECT live_seq FROM {s}.lousho_turn_live WHERE turn_id = %s"),
            (turn_id,)).fetchone())
        return -1 if row is None else int(row[0])

    def mark(self, turn_id: str) -> None:
        """Mark the turn watched for :data:`WATCH_TTL_S`."""
        self._run("mark a turn watched", lambda c: c.execute(
            self._db.q(_MARK), {"t": turn_id, "ttl": WATCH_TTL_S}))

    def tail(self, turn_id: str) -> PostgresTail:
        return PostgresTail(self, self._db, turn_id)


class PostgresTail:
    """A reader's subscription (:class:`~._events.LiveTail`): callbacks on the store's
    listening connection for the log's wake-ups and the live channel's payloads of its
    turn. Without a listening connection (yet, or while it reconnects) it says "read the
    log" every 10 ms, as the log's own wait polls then."""

    def __init__(self, live: PostgresLive, db: Db, turn_id: str) -> None:
        self._live = live
        self._turn = turn_id
        self._prefix = turn_id + " "
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[int, str] | None] = collections.deque()
        self._heard: set[str] = set()
        notes = listener(db)
        self._notes = notes
        self._stops = [notes.subscribe(live.wake_channel, self._on_wake),
                       notes.subscribe(live.channel, self._on_live)]
        with self._cond:
            deadline = time.monotonic() + _LISTEN_S
            while len(self._heard) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        self._watch = WatchMark(live.mark, turn_id)
        self._watch.renew()

    def _on_wake(self, payload: str | None) -> None:
        with self._cond:
            if payload is None:
                self._heard.add("wake")
            if not self._items or self._items[-1] is not LIVE_LOG:  # (one read for several)
                self._items.append(LIVE_LOG)
                self._cond.notify_all()

    def _on_live(self, payload: str | None) -> None:
        if payload is None:
            with self._cond:
                self._heard.add("live")
                self._items.append(LIVE_LOG)  # (a reconnect: sends may have been missed)
                self._cond.notify_all()
            return
        if not payload.startswith(self._prefix):
            return
        seq, _, row = payload[len(self._prefix):].partition(" ")
        item: tuple[int, str] | None = LIVE_LOG
        if row and seq.lstrip("-").isdigit():
            item = (int(seq), row)
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def get(self, after: int, timeout: float) -> list[tuple[int, str] | None]:
        lapsed = self._watch.renew()
        timeout = self._watch.wait_at_most(timeout)
        listening = (self._notes.listening(self._live.channel)
                     and self._notes.listening(self._live.wake_channel))
        if not listening:
            timeout = min(timeout, 0.01)
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            out = list(self._items)
            self._items.clear()
        if lapsed or not listening:
            out.append(LIVE_LOG)
        return out

    def close(self) -> None:
        stops, self._stops = self._stops, []
        for stop in stops:
            stop()
