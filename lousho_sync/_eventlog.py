"""The event log's rules, written once over a store's primitives
(:class:`~lousho_sync.stores._events.EventOps`).

* Each write is one row ``(seq, JSON)`` (:mod:`._event_rows`: a lone event's JSON, or
  several events' under the seq of the last, split again by seq when read, so every event
  keeps its own seq); an encrypting store seals it like a message.
* Writes are coalesced: text deltas (and ``run.start``, ``step.start`` and a step's
  ``usage``, see :data:`_LAZY`) wait until ``interval_s`` (default 50 ms) has passed since
  the turn's last write (the log's begin counts as one), so a turn makes at most one write
  per interval plus one per other event. The log is never fsynced: the transcript is the
  durable record.
* Retention: a turn that ended is kept ``ttl_s`` (default 600 s) after its end, then
  removed lazily (a read finds it expired) and by :meth:`EventLog.prune`.
* A turn's log is bounded: past ``max_rows`` rows its older text deltas are merged (one
  row per run of consecutive deltas, carrying the seq of the last).
* Readers follow a turn live: rows after a seq, then a wait on the store's wake-up
  (condition variable, ``PRAGMA data_version``, file size, ``XREAD BLOCK``, ``LISTEN``).
* A live tail (Redis, PostgreSQL: :class:`~lousho_sync.stores._events.LiveOps`): while a
  reader in another process watches the turn, the writer sends the events that wait for
  their coalesced write on the turn's channel, at most once per ``live_interval_s``
  (default 5 ms), so that reader has them within milliseconds; the log is still written
  once per ``interval_s``. The reader subscribes before it reads the log and merges the
  two by seq (a live row that does not follow on from what it has waits for the log;
  ``run.done`` only ever comes from the log). A send is fenced like a write, and a takeover
  goes on after the highest seq sent (:meth:`EventLog.sent_live`): no seq a reader saw is
  used twice. Unwatched, nothing is sent: the writer learns from its writes whether a reader
  watches (and asks, at most once per :data:`_WATCH_CHECK_S`, only when ``interval_s`` is
  longer than that).
  Readers in the process that drives the turn take the events from its :class:`Publisher`
  as objects, the moment they are made (its ``run.done`` once that is stored).
* The writes are made by a thread of the publisher's own (reused daemon threads,
  :func:`spawn`); the memory log keeps the events themselves, the others their JSON, and
  its writes of other events than text deltas are made by the publishing thread (a list
  append costs less than waking a thread). A local reader waiting for the turn's
  ``run.done`` to be stored writes what waits itself.
* Fencing: a takeover re-opens the turn's log under its own owner (``begin``); each
  store's ``append`` checks the owner in the write's transaction, so a driver that lost
  its lease writes nothing more (:attr:`Publisher.superseded`).
* A logged turn's commit records its id in its last message (:func:`seal_turn`), so a
  takeover finds a turn committed just before its driver died exactly
  (:func:`committed_turn`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import attrs

from ._event_rows import encode_rows, events_of, merge_deltas
from ._message_form import dump_usage, load_usage
from .errors import StoreCorruptError, TurnNotFoundError
from .events import (
    Event,
    RunDone,
    RunEvent,
    RunStart,
    StepStart,
    TextDelta,
    UsageEvent,
)
from .ids import is_session_id
from .messages import Message
from .results import ExecutionResult
from .stores._events import (
    EVENT_TTL_S,
    EventOps,
    LiveTail,
    TurnHead,
    TurnStatus,
    live_of,
    now,
)

__all__ = [
    "TURN_EXTRA",
    "EventLog",
    "Publisher",
    "committed_turn",
    "seal_turn",
    "spawn",
]

_log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
DEFAULT_LIVE_INTERVAL_S = 0.005
DEFAULT_TTL_S = EVENT_TTL_S
DEFAULT_MAX_ROWS = 10_000
_READ_BATCH = 1000
_LIVE_CHUNK = 64
"""Events to a live row at most (a row is one channel message; PostgreSQL's are small)."""
_WATCH_CHECK_S = 1.0
"""How stale the writer's knowledge of whether a reader watches its turn may get while
events wait for a write that is not due (it learns it from each write: asked only when
``interval_s`` is longer than this)."""


# --- which turn a commit was -------------------------------------------------------------------
TURN_EXTRA = "lousho_turn"
"""The key, in the ``extra`` of a logged turn's last committed message, of what rebuilds the
turn's result from the transcript (its id, message count, steps, finish reason, usage)."""


def seal_turn(result: ExecutionResult, turn_id: str) -> ExecutionResult:
    """``result`` with its last message recording that it ends turn ``turn_id`` (written in
    the commit, so a takeover finds a committed turn exactly; see :func:`committed_turn`)."""
    if not result.messages:
        return result
    last = result.messages[-1]
    stamp = {"id": turn_id, "count": len(result.messages), "steps": result.steps,
             "finish_reason": result.finish_reason, "usage": dump_usage(result.usage)}
    sealed = attrs.evolve(last, extra={**last.extra, TURN_EXTRA: stamp})
    return attrs.evolve(result, messages=(*result.messages[:-1], sealed))


def committed_turn(messages: Sequence[Message], turn_id: str) -> ExecutionResult | None:
    """The result of turn ``turn_id`` rebuilt from the transcript ``messages`` when a commit
    sealed by :func:`seal_turn` is in it; None otherwise."""
    for i in range(len(messages) - 1, -1, -1):
        stamp = messages[i].extra.get(TURN_EXTRA) if messages[i].extra else None
        if not isinstance(stamp, Mapping) or stamp.get("id") != turn_id:
            continue
        try:
            count = int(stamp["count"])
            msgs = tuple(messages[max(0, i + 1 - count): i + 1])
            return ExecutionResult(
                text=next((m.text for m in reversed(msgs) if m.role == "assistant"), ""),
                finish_reason=str(stamp["finish_reason"]), messages=msgs,
                usage=load_usage(stamp["usage"]), steps=int(stamp["steps"]), run_id=turn_id)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptError(
                f"the commit of turn {turn_id} in the transcript cannot be read: {exc}") from exc
    return None


_CLOSE_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""The pauses between the last tries of a closing publisher to write what a failed write
left (its ``run.done``, say), before its readers are let go without it (seconds)."""


# --- threads ------------------------------------------------------------------------------------
_IDLE_S = 10.0
"""How long a finished worker thread waits for the next task before it ends."""


class _Worker:
    """A daemon thread that runs tasks handed to it, one at a time, and waits ``_IDLE_S``
    for the next one (so a turn's driver and writer start without a thread start of their
    own: handing a task over does not wait for the thread to be scheduled)."""

    def __init__(self, task: Callable[[], None], name: str) -> None:
        self.tasks: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()
        self.tasks.put((task, name))
        threading.Thread(target=self._run, daemon=True, name=name).start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                task, name = self.tasks.get(timeout=_IDLE_S)
            except queue.Empty:
                with _workers_lock:
                    if self in _idle:
                        _idle.remove(self)
                        return
                task, name = self.tasks.get()  # taken from the idle list: its task comes
            me.name = name
            try:
                task()
            except BaseException:  # pragma: no cover - tasks handle their own errors
                _log.warning("a background task of the event log failed", exc_info=True)
            del task  # an idle thread keeps nothing of its last task alive
            me.name = "lousho-idle"
            with _workers_lock:
                _idle.append(self)


_idle: list[_Worker] = []
_workers_lock = threading.Lock()


def spawn(task: Callable[[], None], name: str) -> None:
    """Run ``task`` in a daemon thread (an idle one of this module's, else a new one)."""
    with _workers_lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        _Worker(task, name)
    else:
        worker.tasks.put((task, name))


# --- the log -------------------------------------------------------------------------------------
class EventLog:
    """A store's event log with its rules. Thread-safe (the primitives are)."""

    def __init__(self, ops: EventOps, *, interval_s: float = DEFAULT_INTERVAL_S,
                 ttl_s: float = DEFAULT_TTL_S, max_rows: int = DEFAULT_MAX_ROWS,
                 poll_s: float = 0.25,
                 live_interval_s: float = DEFAULT_LIVE_INTERVAL_S) -> None:
        self.ops = ops
        self.interval_s = interval_s
        self.live_interval_s = live_interval_s
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        self.poll_s = poll_s

    def begin(self, turn_id: str, session_id: str, owner: str, *,
              started_at: float | None = None, last_seq: int = -1,
              announce: bool = False) -> Publisher:
        """Open (or, on takeover, re-open) the log of a turn; returns its writer. The
        opening counts as the turn's first write (its first events wait ``interval_s``
        like deltas), unless ``announce``: a keyed turn's ``run.start`` is written at once
        (a retry in another process looks for it there)."""
        head = TurnHead(turn_id=turn_id, session_id=session_id, owner=owner,
                        started_at=now() if started_at is None else started_at,
                        last_seq=last_seq)
        self.ops.begin(head)
        return Publisher(self, head, announce=announce)

    def head(self, turn_id: str) -> TurnHead | None:
        """The turn's head; None when absent, expired (then it is removed) or not a turn
        id."""
        if not is_session_id(turn_id):
            return None
        head = self.ops.head(turn_id)
        if head is not None and self._expired(head):
            self.ops.drop(turn_id)
            return None
        return head

    def latest(self, session_id: str) -> TurnHead | None:
        """The head of the session's latest turn still kept."""
        turn_id = self.ops.latest(session_id)
        return None if turn_id is None else self.head(turn_id)

    def _expired(self, head: TurnHead) -> bool:
        return head.ended_at is not None and head.ended_at + self.ttl_s < now()

    def prune(self) -> int:
        """Remove the turns that ended more than ``ttl_s`` ago; how many."""
        ids = self.ops.ended_before(now() - self.ttl_s)
        for turn_id in ids:
            self.ops.drop(turn_id)
        return len(ids)

    def seals_commit(self, turn_id: str) -> bool:
        """Whether the turn's ``run.start`` row was written by a release whose commits are
        sealed with the turn's id (:func:`seal_turn`); False for an older row, or none."""
        rows = self.ops.read(turn_id, -1, 1)
        if not rows:
            return False
        row = rows[0][1]
        if isinstance(row, RunEvent | tuple):
            return True  # kept as objects: written by this process's release
        try:
            d = json.loads(row)
            if isinstance(d, dict) and d.get("type") == "events":  # a write's row
                d = d["items"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return False
        return isinstance(d, dict) and d.get("type") == "run.start" and d.get("sealed") is True

    def sent_live(self, turn_id: str) -> int:
        """The highest seq of the turn sent to readers live (-1: none, or no live tail):
        readers may have seen events up to it that the log never got (their driver died
        first), so a takeover numbers its events after it."""
        live = live_of(self.ops)
        return -1 if live is None else live.sent(turn_id)

    def first_event(self, turn_id: str) -> Event | None:
        """The turn's first event in the log (its ``run.start``); None when it has none."""
        rows = self.ops.read(turn_id, -1, 1)
        for seq, row in rows:
            for event in events_of(row, turn_id, seq, -1):
                return event
        return None

    def follow(
        self,
        turn_id: str,
        after: int,
        *,
        idle: Callable[[TurnHead], bool] | None = None,
        live: bool = True,
    ) -> Iterator[Event]:
        """The turn's events with seq > ``after`` in order, live until ``run.done``.
        TurnNotFoundError when the turn is not (or no longer) in the log. ``idle`` is
        called with the head whenever nothing new came within ``poll_s``; True ends the
        reading (its caller took the turn over). ``live``: on a store with a live tail,
        watch the turn and take its unwritten events from it (False: a reader that only
        waits for the end)."""
        if self.head(turn_id) is None:
            raise TurnNotFoundError(
                f"turn {turn_id!r} is not in the event log (it never existed, or it ended "
                f"more than event_ttl_s={self.ttl_s:g} s ago)", turn_id=turn_id)
        tails = live_of(self.ops) if live else None
        if tails is not None:
            tail = tails.tail(turn_id)  # subscribed before the log is read
            try:
                yield from self._follow_live(turn_id, after, idle, tail)
            finally:
                tail.close()
            return
        ops = self.ops
        while True:
            after, rows, done = yield from self._take(turn_id, after)
            if done:
                return
            if rows:
                continue
            if self._head_of_reader(turn_id, after) is None:
                return  # ended, and this reader has everything (a log without run.done)
            deadline = time.monotonic() + self.poll_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                ops.wait(turn_id, after, left)
                if ops.read(turn_id, after, 1):
                    break
            else:  # pragma: no cover - the loop ends by break
                pass
            if idle is not None and not ops.read(turn_id, after, 1):
                head = ops.head(turn_id)
                if head is not None and head.ended_at is None and idle(head):
                    return

    def _take(self, turn_id: str, after: int) -> Generator[Event, None, tuple[int, int, bool]]:
        """One read of the turn's log: yields its events after ``after`` (up to its
        ``run.done``); returns the last seq yielded (else ``after``), how many rows were
        read (``_READ_BATCH`` at most) and whether ``run.done`` came."""
        rows = self.ops.read(turn_id, after, _READ_BATCH)
        for seq, text in rows:
            # (after the last event taken: a retried write may hold some of them again)
            for event in events_of(text, turn_id, seq, after):
                after = event.seq
                yield event
                if isinstance(event, RunDone):
                    return after, len(rows), True
        return after, len(rows), False

    def _head_of_reader(self, turn_id: str, after: int) -> TurnHead | None:
        """The head of a turn read up to ``after``: None when the turn ended and the reader
        has all of it; TurnNotFoundError when it was removed under the reader (prune,
        expiry)."""
        head = self.ops.head(turn_id)
        if head is None:
            raise TurnNotFoundError(
                f"turn {turn_id!r} was removed from the event log while it was read",
                turn_id=turn_id)
        return None if head.ended_at is not None and head.last_seq <= after else head

    def _follow_live(self, turn_id: str, after: int,
                     idle: Callable[[TurnHead], bool] | None,
                     tail: LiveTail) -> Iterator[Event]:
        """:meth:`follow` with a live tail: the log's rows, and the rows sent live that
        follow on from the last seq yielded (one past a gap waits until the log filled
        it); the log is read again whenever the tail says it was written (or anything was
        missed), and at least every ``poll_s`` while nothing new comes."""
        ops = self.ops
        waiting: list[tuple[int, str]] = []  # live rows past a gap, in the order sent
        read_log = True
        arrived = False  # rows came from the tail since the log was last read
        quiet = time.monotonic()  # since when nothing new came
        while True:
            if read_log:
                read_log = False
                while True:
                    after, rows, done = yield from self._take(turn_id, after)
                    if done:
                        return
                    if rows:
                        quiet = time.monotonic()
                    if rows < _READ_BATCH:
                        break  # (a later write is announced on the tail)
            kept: list[tuple[int, str]] = []
            behind = False  # the log has (or will have) what the tail does not give
            for seq, text in waiting:  # in the order sent: what follows on now goes out
                try:
                    events = events_of(text, turn_id, seq, after)
                except StoreCorruptError:
                    behind = True  # (the log has it)
                    continue
                if not events:
                    continue  # had it
                if events[0].seq != after + 1:  # a gap: the log fills it within an interval
                    kept.append((seq, text))
                    behind = True
                    continue
                for event in events:
                    if isinstance(event, RunDone):  # (only ever taken from the log)
                        behind = True
                        break
                    after = event.seq
                    quiet = time.monotonic()
                    yield event
            waiting = kept[-_READ_BATCH:]
            if behind and arrived:  # the log once for what came (then its write's notice)
                arrived = False
                read_log = True
                continue
            arrived = False
            left = quiet + self.poll_s - time.monotonic()
            if left <= 0:  # quiet for a while: as :meth:`follow` without a tail
                quiet = time.monotonic()
                if ops.read(turn_id, after, 1):
                    read_log = True
                    continue
                head = self._head_of_reader(turn_id, after)
                if head is None:
                    return  # ended, and this reader has everything (a log without run.done)
                if idle is not None and head.ended_at is None and idle(head):
                    return
                continue
            for item in tail.get(after, left):
                if item is None:
                    read_log = True
                else:
                    waiting.append(item)
                    arrived = True


_LAZY = frozenset({TextDelta, UsageEvent, StepStart, RunStart})
"""The events whose write may wait for the next one, as a text delta's does: a step's
usage comes just before the commit or the next step's events, a ``step.start`` just before
its deltas, a ``run.start`` just after the log's begin (so a short turn's log is written
once, at its end, not also before its commit; the store is not written while the turn
takes its lease)."""


class Publisher:
    """Writes one turn's events to the log, coalescing text deltas (see the module), and
    hands them to readers in this process as objects (:meth:`follow`), at once and without
    JSON. The writes are made by a thread of the publisher's own, so the turn never waits
    for the store. Thread-safe; a write that fails is logged and retried with the next one.
    When the log says another owner took the turn over (``EventOps.append`` returned
    False), nothing more is written (:attr:`superseded`)."""

    def __init__(self, log: EventLog, head: TurnHead, *, announce: bool = False) -> None:
        self._log = log
        self.turn_id = head.turn_id
        self.owner = head.owner
        self._objects = bool(getattr(log.ops, "holds_events", False))
        self._lock = threading.Lock()  # guards everything below but the writing itself
        self._readable = threading.Condition(self._lock)  # local readers wait on it
        self._writable = threading.Condition(self._lock)  # the writer thread waits on it
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._local: list[Any] = []  # the events published (readers here; the writer)
        self._dropped = 0  # how many were dropped from the front of ``_local``
        self._unwritten = 0  # the position (counting dropped ones) of the first unwritten
        self._stored = 0  # the position of the first event not (yet) in the store
        self._store_wanted = False  # a local reader waits for a write to be stored
        self._finished = False  # closed, and its last write made (or failed)
        self._told = False  # the writer knows there is something to write
        self._urgent = False  # an unwritten event that is not lazy (see _LAZY)
        self._wanted = False  # a local reader waits for the next event
        self._writer_waits = False
        self._closed = False
        self._writer: threading.Event | None = None  # set when the writer's task ended
        self._last_write = 0.0 if announce else time.monotonic()  # (the log's begin)
        self._status: TurnStatus = "running"
        self._ended: float | None = None
        self._written = 0
        self.superseded = False
        self.writes = 0
        # the live tail (see the module): sent by the writer thread while a reader watches
        self._live = live_of(log.ops)
        self._watched = False  # what the last write (or ask) found; a new turn: nobody
        self._known_at = time.monotonic()  # when that was learned (the log's begin)
        self._live_sent = 0  # the position of the first event not sent live (nor written)
        self._last_live = 0.0

    def publish(self, event: RunEvent) -> None:
        """Add ``event`` to the log: readers in this process have it at once; it is written
        by the publisher's thread at once (by the caller, to a log in memory), or, a text
        delta within ``interval_s`` of the last write, with the next write."""
        # A text delta takes no lock: appending to a list and reading a flag are atomic,
        # and a local reader (``follow``) and the writer (``_write_loop``) look at the list
        # again after setting their flag, so nothing appended here goes unnoticed. Any
        # other event is added under the lock with the status it gives the turn, so the
        # write that takes it carries that status.
        if type(event) is TextDelta:
            self._local.append(event)
            if self._wanted:
                with self._lock:
                    self._wanted = False
                    self._readable.notify_all()
            if self._told:
                return  # the writer takes it with what it was told of
            with self._lock:
                if self._dropped + len(self._local) <= self._unwritten:
                    return  # a write took it already
                self._tell_locked()
            return
        with self._lock:
            if isinstance(event, RunDone):
                self._status = ("paused" if event.finish_reason == "awaiting-approval"
                                else "done")
                self._ended = now()
            self._local.append(event)
            if self._wanted:
                self._wanted = False
                self._readable.notify_all()
            if not self._objects:
                if type(event) is RunDone:
                    return  # written at once by close(), which comes next, or by a reader
                self._urgent = self._urgent or type(event) not in _LAZY
                self._tell_locked()
                return
        # a log in this process's memory: written here and now (a list append), not by a
        # wake-up of the publisher's thread
        if not self.flush():  # pragma: no cover - the memory log does not fail
            with self._lock:
                self._urgent = True
                self._tell_locked()

    def _tell_locked(self) -> None:
        """Have the writer write what waits (when due). Caller holds ``_lock``."""
        if self.superseded or self._closed:
            return
        self._told = True
        if self._writer is None:
            self._writer = threading.Event()
            spawn(self._write_loop, f"lousho-events-{self.turn_id[:8]}")
        elif self._writer_waits:
            self._writable.notify()

    def _write_loop(self) -> None:
        """The publisher's thread: write what waits, when it is due."""
        try:
            self._write_until_closed()
        finally:
            assert self._writer is not None
            self._writer.set()

    def _write_until_closed(self) -> None:
        interval = self._log.interval_s
        while True:
            live = ""
            with self._lock:
                while True:
                    if self._dropped + len(self._local) > self._unwritten:
                        if self._urgent or self._closed:
                            break
                        due = self._last_write + interval - time.monotonic()
                        if due <= 0:
                            break
                        timeout: float | None = due
                        if self._live is not None and not self.superseded:
                            live, timeout = self._live_due_locked(due)
                            if live:
                                break
                    elif self._closed:
                        return
                    else:
                        timeout = None
                    self._writer_waits = True
                    try:
                        self._writable.wait(timeout)
                    finally:
                        self._writer_waits = False
                closed = self._closed
            if live == "send":
                self._send_live()
            elif live == "ask":
                self._ask_watched()
            elif not self.flush() and closed:
                return  # the store is away: close() tries once more

    def _live_due_locked(self, due: float) -> tuple[str, float]:
        """What the live tail wants while events wait for a write due in ``due`` s:
        ``"send"`` them, ``"ask"`` whether a reader watches, or ``""`` and how long to wait
        (a watched turn's writer looks for new events every ``live_interval_s``)."""
        now_ = time.monotonic()
        if now_ - self._known_at >= _WATCH_CHECK_S:
            return "ask", 0.0
        timeout = min(due, self._known_at + _WATCH_CHECK_S - now_)
        if not self._watched:
            return "", timeout
        wait = self._last_live + self._log.live_interval_s - now_
        if wait > 0:
            return "", min(timeout, wait)
        if self._dropped + len(self._local) > max(self._live_sent, self._unwritten):
            return "send", 0.0
        return "", min(timeout, self._log.live_interval_s)

    def _ask_watched(self) -> None:
        """Ask the store whether a reader watches the turn (see :meth:`_live_due_locked`)."""
        assert self._live is not None
        try:
            watched = self._live.watched(self.turn_id, ask=True)
        except Exception:
            _log.debug("could not ask whether turn %s is watched", self.turn_id,
                       exc_info=True)
            watched = False
        with self._lock:
            self._watched = watched
            self._known_at = time.monotonic()

    def _send_live(self) -> None:
        """Send the events that wait for their write, and were not sent yet, to the
        turn's readers in other processes (the live tail; the writer thread's)."""
        assert self._live is not None
        with self._write_lock:  # (not while a write of them is made)
            with self._lock:
                start = max(self._live_sent, self._unwritten)
                events = self._local[start - self._dropped:]
                self._live_sent = start + len(events)
                self._last_live = time.monotonic()
                self._told = False  # the next event wakes this thread (see publish)
                if self.superseded:
                    return
            for i, event in enumerate(events):  # what waits (the rest is written at once)
                if type(event) not in _LAZY:
                    events = events[:i]
                    break
            rows: list[tuple[int, str]] = []
            for i in range(0, len(events), _LIVE_CHUNK):
                rows.extend(encode_rows(events[i:i + _LIVE_CHUNK]))
            if not rows:
                return
            try:
                self._live.send(self.turn_id, rows, owner=self.owner)
            except Exception:  # its readers have them from the log within one interval
                _log.debug("could not send events of turn %s live", self.turn_id,
                           exc_info=True)

    def flush(self) -> bool:
        """Write what waits, now, in the calling thread; False when the write failed."""
        with self._write_lock:
            with self._lock:
                if self.superseded:  # nothing more is written: everything counts as done
                    self._unwritten = self._dropped + len(self._local)
                    self._told = self._urgent = False
                    return True
                start = self._unwritten
                events = self._local[start - self._dropped:]
                self._unwritten = start + len(events)
                self._told = self._urgent = False
                status, ended = self._status, self._ended
            if not events:
                return True
            if self._objects:  # one row: the events (a tuple; see events_of)
                rows: list[tuple[int, Any]] = [(events[-1].seq, tuple(events))]
            else:
                rows = encode_rows(events)
            try:
                ok = self._log.ops.append(self.turn_id, rows, owner=self.owner,
                                          status=status, ended_at=ended)
            except Exception:
                _log.warning("could not write %d event(s) of turn %s to the event log; "
                             "retried with the next write", len(rows), self.turn_id,
                             exc_info=True)
                with self._lock:
                    self._unwritten = start
                    self._told = True
                    self._last_write = time.monotonic()  # retried one interval later
                return False
            with self._lock:
                self._last_write = time.monotonic()
                if self._live is not None:  # the write found whether a reader watches
                    self._watched = self._live.watched(self.turn_id)
                    self._known_at = self._last_write
                if ok is not False:
                    self._stored = start + len(events)
                    if self._store_wanted:
                        self._store_wanted = False
                        self._readable.notify_all()
                if ok is False:
                    self.superseded = True
                    self._readable.notify_all()
                    _log.info("turn %s was taken over by another process: this one writes "
                              "no more of its events", self.turn_id)
                    return True
                local = self._local
                if len(local) > self._log.max_rows:  # readers that far behind read the log
                    drop = min(len(local) // 2, self._unwritten - self._dropped)
                    del local[:drop]
                    self._dropped += drop
            self.writes += 1
            self._written += len(rows)
            if self._written > self._log.max_rows and ended is None:
                self._bound()
            return True

    def close(self) -> None:
        """Write what waits, end the publisher's thread, and end the local readers once they
        have read everything. Idempotent."""
        with self._lock:
            self._closed = True
            self._readable.notify_all()
        # what waits, a failed write left, or came after the thread ended is written here
        # (not handed to the thread, whose wake-up would be on the turn's path to its end;
        # it is woken to end after this write); the turn's end is handed to local readers
        # (and result()) once stored, so a store that failed a write gets a few more tries
        # before they are let go without it
        for delay in (*_CLOSE_RETRY_S, None):
            if self.flush() or delay is None:
                break
            time.sleep(delay)
        with self._lock:
            self._finished = True
            self._readable.notify_all()
            self._writable.notify_all()  # the thread ends

    def _wait_stored(self, pos: int) -> bool:
        """Wait until the event at ``pos`` is in the store (or the publisher ended without
        storing it); False when another owner took the turn over first. The reader writes
        what waits itself rather than wait for the publisher's thread to wake and write it
        (a turn's ``run.done``: its last write, on its readers' path to the end)."""
        with self._lock:
            if self._stored > pos or self.superseded or self._finished:
                return self._stored > pos or not self.superseded
        self.flush()  # (a write that failed is retried by the publisher's thread or close)
        with self._lock:
            while self._stored <= pos and not self.superseded and not self._finished:
                self._store_wanted = True
                self._readable.wait()
            return self._stored > pos or not self.superseded

    def follow(self, after: int) -> Iterator[Event]:
        """The turn's events with seq > ``after`` as this process publishes them (objects,
        at once), until ``run.done``; a reader that fell behind what is kept here, or whose
        turn was taken over by another process, reads on from the log."""
        pos = -1
        last = after
        while True:
            with self._lock:
                local = self._local
                if pos < 0:  # where ``after`` is
                    pos = self._dropped
                    for i, event in enumerate(local):
                        if event.seq > after:
                            pos = self._dropped + i
                            break
                    else:
                        pos = self._dropped + len(local)
                    if local and local[0].seq > after + 1 and after >= 0:
                        pos = -2  # older than what is kept
                while pos >= 0 and not self.superseded and not self._closed \
                        and pos - self._dropped >= len(local):
                    self._wanted = True
                    if pos - self._dropped < len(local):  # appended meanwhile (no lock)
                        break
                    self._readable.wait()
                if pos < self._dropped or self.superseded:
                    batch = None
                else:
                    batch = local[pos - self._dropped:]
                    pos += len(batch)
            if batch is None:
                yield from self._log.follow(self.turn_id, last)
                return
            if not batch:
                return  # closed, and everything was read
            if type(batch[-1]) is not RunDone:  # (a turn's run.done is its last event)
                yield from batch  # the commonest batch: handed on without a loop of ours
                last = batch[-1].seq
                continue
            start = pos - len(batch)
            for i, event in enumerate(batch):
                if type(event) is RunDone and not self._wait_stored(start + i):
                    # (its end is read once stored, so the store agrees with it: after
                    # run.done, current_turn() and attach() see the turn ended)
                    yield from self._log.follow(self.turn_id, last)  # taken over: the log
                    return
                last = event.seq
                yield event
                if type(event) is RunDone:
                    return

    def _bound(self) -> None:
        """Merge the older text deltas of the turn's log (all but the last tenth)."""
        ops = self._log.ops
        rows: list[tuple[int, str]] = []
        after = -1
        while True:
            batch = ops.read(self.turn_id, after, _READ_BATCH)
            if not batch:
                break
            rows.extend(batch)
            after = batch[-1][0]
        keep = max(1, len(rows) // 10)
        old = rows[:-keep]
        if not old:
            return
        merged = merge_deltas(old, self.turn_id, objects=self._objects)
        try:
            ops.replace(self.turn_id, merged, old[-1][0])
        except Exception:
            _log.warning("could not bound the event log of turn %s", self.turn_id,
                         exc_info=True)
            return
        self._written = len(merged) + keep
