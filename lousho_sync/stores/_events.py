"""The event log's storage primitives: what a store keeps of a turn's events.

A turn's log is its head (:class:`TurnHead`: session, owner, start, last seq, status, end)
plus rows ``(seq, text)`` in seq order; ``text`` is an event's JSON, which the store never
reads. A backend writes :class:`EventOps` (each call one transaction or one script); the
rules — the events' JSON, coalescing text deltas into one write per interval, retention,
the bound on a turn's rows, reading live — are written once above the stores
(:mod:`lousho_sync._eventlog`). The log is not fsynced: the transcript is the durable
record, and a turn resumed after a crash says so with ``step.reset``.

:class:`MemoryEventOps` is the in-process backend (a condition variable wakes readers); a
store that keeps no log of its own gets one per store object (:func:`event_ops_of`), so
``start()``/``attach()`` work on every store within one process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from .base import capabilities_of

__all__ = [
    "PACK_ROWS",
    "EventOps",
    "HasEventLog",
    "LiveOps",
    "LiveTail",
    "MemoryEventOps",
    "TurnHead",
    "TurnStatus",
    "event_ops_of",
    "live_of",
    "pack_rows",
    "prune_events",
    "unpack_rows",
]

_log = logging.getLogger("lousho_sync.stores")

EVENT_TTL_S = 600.0
"""How long a finished turn's events are kept (``Session.event_ttl_s``'s default; what a
store's ``prune()`` keeps)."""

TurnStatus = Literal["running", "paused", "done"]

PACK_ROWS = 1000


def pack_rows(rows: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """The stored rows of a write of ``rows`` (SQLite, PostgreSQL): a lone event as it is,
    several by :data:`PACK_ROWS` to a row whose seq is its last event's and whose text is
    the flat JSON array ``[seq, event, seq, event, ...]`` (inserting a row costs about a
    microsecond: a turn's batch of 1,000 text deltas was a millisecond). An event's JSON is
    an object and a sealed one base64, so a row starting with ``[`` is a packed one (a lone
    event that starts so is packed too)."""
    if len(rows) == 1 and not rows[0][1].startswith("["):
        return list(rows)
    out = []
    for i in range(0, len(rows), PACK_ROWS):
        chunk = rows[i:i + PACK_ROWS]
        out.append((chunk[-1][0], json.dumps([x for row in chunk for x in row],
                                             ensure_ascii=False, separators=(",", ":"))))
    return out


def unpack_rows(stored: Sequence[tuple[Any, Any]], after: int) -> list[tuple[int, str]]:
    """The events of stored rows (in seq order) with seq > ``after``, each seq once (a
    retried write may have packed some again with later ones), in order."""
    out: list[tuple[int, str]] = []
    last = after
    for seq, data in stored:
        text = str(data)
        if text.startswith("["):
            flat = json.loads(text)
            for i in range(0, len(flat), 2):
                if flat[i] > last:
                    last = flat[i]
                    out.append((int(flat[i]), str(flat[i + 1])))
        elif int(seq) > last:
            last = int(seq)
            out.append((last, text))
    return out



@attrs.frozen(slots=True, kw_only=True)
class TurnHead:
    """What the log knows of one turn: ``last_seq`` is -1 before its first event;
    ``ended_at`` (a Unix time) is set when its last event (``run.done``) was written."""

    turn_id: str
    session_id: str
    owner: str
    started_at: float
    last_seq: int = -1
    status: TurnStatus = "running"
    ended_at: float | None = None
    rows: int = 0


class EventOps(Protocol):
    """A backend's event-log primitives. Thread-safe; every call may raise StoreError."""

    def begin(self, head: TurnHead) -> None:
        """Create (or replace, on takeover) the head of ``head.turn_id`` and make it its
        session's latest turn."""
        ...

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool | None:
        """Add ``rows`` (seqs growing, all above the head's ``last_seq``) and set the head's
        ``last_seq``, ``status`` and ``ended_at`` — only while the head's ``owner`` is
        ``owner``: False (nothing written) once another owner re-opened the turn with
        :meth:`begin` (a takeover); True (or None) when written."""
        ...

    def head(self, turn_id: str) -> TurnHead | None:
        """The head of ``turn_id``; None when the log holds no such turn."""
        ...

    def latest(self, session_id: str) -> str | None:
        """The id of the session's latest turn in the log (None: none)."""
        ...

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` rows of ``turn_id`` with seq > ``after``, in seq order."""
        ...

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        """Return when ``turn_id`` may have rows past ``after`` or a new head, or after
        ``timeout`` seconds (a spurious return is allowed)."""
        ...

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        """Replace every row with seq <= ``upto`` by ``rows`` (the bound on a turn's log)."""
        ...

    def drop(self, turn_id: str) -> None:
        """Remove the turn's head and rows (idempotent)."""
        ...

    def ended_before(self, when: float) -> list[str]:
        """The ids of the turns whose ``ended_at`` is before ``when``."""
        ...


WATCH_TTL_S = 5.0
"""How long a reader's mark that it watches a turn lasts (seconds): the writer sends the
turn's unwritten events live only while one is there (see :class:`LiveOps`)."""

WATCH_REFRESH_S = 2.0
"""How often a reader renews its mark (seconds)."""

LIVE_LOG = None
"""What :meth:`LiveTail.get` gives for "the log may have new rows" (a write, a reconnect)."""


class LiveTail(Protocol):
    """One reader's subscription to a turn's live rows (:meth:`LiveOps.tail`)."""

    def get(self, after: int, timeout: float) -> list[tuple[int, str] | None]:
        """What came since the last call, waiting up to ``timeout`` seconds for something:
        rows ``(seq, row)`` sent live, in the order sent, and None for "the log may have
        new rows" (rows past ``after``: the tail may poll the log with it). Renews the
        reader's mark when due."""
        ...

    def close(self) -> None:
        """Unsubscribe (idempotent)."""
        ...


class LiveOps(Protocol):
    """An event log's live tail, the optional capability ``EventOps.live`` (Redis,
    PostgreSQL): a turn's events the log does not have yet (text deltas waiting for their
    coalesced write) are sent to readers in other processes on a channel (Redis
    ``PUBLISH``, PostgreSQL ``NOTIFY``) while a reader watches the turn, so they get them
    within milliseconds; the log stays the record (replay, catch-up, ``run.done``). A
    reader marks the turn watched (:data:`WATCH_TTL_S`, renewed); the writer learns it from
    its log writes (:meth:`watched`), so a turn nobody watches from elsewhere costs nothing
    more. A send is fenced like a write (only by the head's owner), and the highest seq sent
    is kept (:meth:`sent`): a takeover goes on after it."""

    def watched(self, turn_id: str, *, ask: bool = False) -> bool:
        """Whether a reader watches the turn: as the turn's last write (``append``) here
        found it, no round trip; ``ask``: asked now (one round trip)."""
        ...

    def send(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str) -> None:
        """Send ``rows`` (a write's rows, seqs growing) to the turn's readers, only while
        ``owner`` is the head's owner; a row too large for the channel is not sent (nor
        those after it: the readers get them from the log)."""
        ...

    def sent(self, turn_id: str) -> int:
        """The highest seq sent live for the turn (-1: none)."""
        ...

    def tail(self, turn_id: str) -> LiveTail:
        """Subscribe to the turn's live rows and mark it watched; returns once subscribed
        (what is sent from then on is received)."""
        ...


class WatchCache:
    """What a live tail knows, per turn, of whether a reader watches it: as the turn's last
    write here found it (:meth:`found`, told by the store's ``append``), or asked now
    (:meth:`watched` with ``ask``: the store's :meth:`_ask`)."""

    def __init__(self) -> None:
        self._watched: dict[str, bool] = {}

    def found(self, turn_id: str, watched: bool, ended: bool) -> None:
        """What a write of the turn found; forgotten at its end."""
        if ended:
            self._watched.pop(turn_id, None)
        else:
            self._watched[turn_id] = watched

    def watched(self, turn_id: str, *, ask: bool = False) -> bool:
        """See :meth:`LiveOps.watched`."""
        if not ask:
            return self._watched.get(turn_id, False)
        found = self._ask(turn_id)
        self._watched[turn_id] = found
        return found

    def _ask(self, turn_id: str) -> bool:
        """Whether a reader watches the turn, asked of the store (one round trip)."""
        raise NotImplementedError


class WatchMark:
    """A reader's mark on its turn that it watches (``mark(turn_id)`` sets it for
    :data:`WATCH_TTL_S`), renewed every :data:`WATCH_REFRESH_S` while it reads."""

    def __init__(self, mark: Callable[[str], None], turn_id: str) -> None:
        self._mark = mark
        self._turn = turn_id
        self._marked = 0.0

    def renew(self) -> bool:
        """Renew the mark when due; True when it had lapsed, or could not be renewed (log
        writes may have gone unannounced meanwhile: read the log)."""
        now = time.monotonic()
        if now < self._marked + WATCH_REFRESH_S:
            return False
        lapsed = self._marked > 0 and now > self._marked + WATCH_TTL_S
        self._marked = now
        try:
            self._mark(self._turn)
        except Exception:  # tried again at the next renewal; the log is read meanwhile
            _log.debug("could not mark turn %s watched", self._turn, exc_info=True)
            return True
        return lapsed

    def wait_at_most(self, timeout: float) -> float:
        """``timeout``, cut to the time left until the next renewal."""
        return max(0.0, min(timeout, self._marked + WATCH_REFRESH_S - time.monotonic()))


def live_of(ops: object) -> LiveOps | None:
    """The live tail of an event log's primitives (``ops.live``), or None."""
    live: LiveOps | None = getattr(ops, "live", None)
    return live


@runtime_checkable
class HasEventLog(Protocol):
    """A store with an event log of its own (readers in other processes see it)."""

    def event_ops(self) -> EventOps:
        """The store's event-log primitives."""
        ...


class MemoryEventOps:
    """The event log in this process's memory (a condition variable wakes readers). Its
    rows may be the events themselves (``holds_events``: the writer skips their JSON)."""

    holds_events = True

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heads: dict[str, TurnHead] = {}
        self._rows: dict[str, list[tuple[int, Any]]] = {}
        self._latest: dict[str, str] = {}

    def begin(self, head: TurnHead) -> None:
        with self._cond:
            self._heads[head.turn_id] = head
            self._rows.setdefault(head.turn_id, [])
            self._latest[head.session_id] = head.turn_id
            self._cond.notify_all()

    def append(self, turn_id: str, rows: Sequence[tuple[int, Any]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        with self._cond:
            head = self._heads.get(turn_id)
            if head is None:
                return True
            if head.owner != owner:
                return False
            kept = self._rows.setdefault(turn_id, [])
            kept.extend(rows)
            last = rows[-1][0] if rows else head.last_seq
            self._heads[turn_id] = attrs.evolve(head, last_seq=last, owner=owner, status=status,
                                                ended_at=ended_at, rows=len(kept))
            self._cond.notify_all()
            return True

    def head(self, turn_id: str) -> TurnHead | None:
        with self._cond:
            return self._heads.get(turn_id)

    def latest(self, session_id: str) -> str | None:
        with self._cond:
            return self._latest.get(session_id)

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, Any]]:
        with self._cond:
            rows = self._rows.get(turn_id, [])
            lo, hi = 0, len(rows)
            while lo < hi:  # first row with seq > after
                mid = (lo + hi) // 2
                if rows[mid][0] <= after:
                    lo = mid + 1
                else:
                    hi = mid
            return rows[lo:lo + limit]

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        with self._cond:
            head = self._heads.get(turn_id)
            if head is not None and (head.last_seq > after or head.ended_at is not None):
                return
            self._cond.wait(timeout)

    def replace(self, turn_id: str, rows: Sequence[tuple[int, Any]], upto: int) -> None:
        with self._cond:
            old = self._rows.get(turn_id, [])
            kept = [*rows, *(r for r in old if r[0] > upto)]
            self._rows[turn_id] = kept
            head = self._heads.get(turn_id)
            if head is not None:
                self._heads[turn_id] = attrs.evolve(head, rows=len(kept))

    def drop(self, turn_id: str) -> None:
        with self._cond:
            head = self._heads.pop(turn_id, None)
            self._rows.pop(turn_id, None)
            if head is not None and self._latest.get(head.session_id) == turn_id:
                del self._latest[head.session_id]

    def ended_before(self, when: float) -> list[str]:
        with self._cond:
            return [h.turn_id for h in self._heads.values()
                    if h.ended_at is not None and h.ended_at < when]


_local: weakref.WeakKeyDictionary[object, MemoryEventOps] = weakref.WeakKeyDictionary()
_by_id: dict[int, MemoryEventOps] = {}
_local_lock = threading.Lock()


def event_ops_of(store: object) -> EventOps:
    """The event log of ``store``: its own (``capabilities.events``: :class:`HasEventLog`),
    else one in this process's memory kept as long as the store object lives."""
    if capabilities_of(store).events:
        return store.event_ops()  # type: ignore[attr-defined, no-any-return]
    with _local_lock:
        try:
            ops = _local.get(store)
            if ops is None:
                ops = _local[store] = MemoryEventOps()
            return ops
        except TypeError:  # not weakly referenceable: kept for the process's life
            ops = _by_id.get(id(store))
            if ops is None:
                ops = _by_id[id(store)] = MemoryEventOps()
            return ops


def now() -> float:
    """The log's clock (Unix time)."""
    return time.time()


def prune_events(ops: EventOps, ttl_s: float = EVENT_TTL_S) -> int:
    """Remove the event logs of the turns that ended more than ``ttl_s`` ago; how many."""
    ids = ops.ended_before(now() - ttl_s)
    for turn_id in ids:
        ops.drop(turn_id)
    return len(ids)
