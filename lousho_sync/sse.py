"""Server-sent events of a turn, framework-free.

Each run event becomes one frame::

    id: <turn_id>:<seq>
    event: <type>
    data: <event_to_dict(event) as compact JSON>

The stream opens with a ``retry:`` hint (how long a browser's ``EventSource`` waits before
it reconnects), sends a comment line (``: keep-alive``) every ``heartbeat_s`` seconds while
the turn is quiet (so proxies keep the connection open), and ends after ``run.done`` (the
turn ended or paused for an approval). A browser that reconnects sends the last ``id`` it
saw as ``Last-Event-ID``; :func:`parse_last_event_id` reads it, and a malformed one, or one
naming another turn, raises :class:`~lousho_sync.errors.InvalidEventIdError` (answer it with
HTTP 400) — a stream never carries another turn's events.

:func:`sse_frames` frames any iterable of run events (a ``stream()`` run, a reader of a
turn); :func:`sse_frame` frames one event.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import InvalidEventIdError, InvalidInputError
from .event_json import event_to_dict
from .events import RunEvent

__all__ = [
    "CONTENT_TYPE",
    "HEADERS",
    "HEARTBEAT",
    "event_turn_id",
    "parse_last_event_id",
    "sse_frame",
    "sse_frames",
]

CONTENT_TYPE = "text/event-stream; charset=utf-8"
"""The ``Content-Type`` of a server-sent event stream."""

HEADERS: dict[str, str] = {
    "Content-Type": CONTENT_TYPE,
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
"""The response headers of an event stream (``X-Accel-Buffering: no`` stops nginx from
buffering it)."""

HEARTBEAT = ": keep-alive\n\n"
"""The comment frame sent while a turn is quiet; ``EventSource`` ignores it."""

_EVENT_ID = re.compile(r"([A-Za-z0-9_.:-]{1,200}):(0|[1-9][0-9]{0,17})")


def event_turn_id(event: RunEvent) -> str:
    """The turn an event belongs to: its ``turn_id`` when it has one, else its ``run_id``."""
    turn_id = getattr(event, "turn_id", None)
    return turn_id if isinstance(turn_id, str) and turn_id else event.run_id


def parse_last_event_id(value: object, *, turn_id: str | None = None) -> tuple[str, int]:
    """``(turn_id, seq)`` of a ``Last-Event-ID`` header (``<turn_id>:<seq>``). A value of
    another form, or one naming a turn other than ``turn_id`` (when given), raises
    :class:`~lousho_sync.errors.InvalidEventIdError`."""
    if not isinstance(value, str):
        raise InvalidEventIdError(
            f"Last-Event-ID must be a str, not {type(value).__name__}", event_id=value
        )
    match = _EVENT_ID.fullmatch(value.strip())
    if match is None:
        raise InvalidEventIdError(
            f"Last-Event-ID {value[:120]!r} is not of the form '<turn_id>:<seq>' (an id this "
            "server sent); reconnect without it to start over",
            event_id=value,
        )
    found, seq = match.group(1), int(match.group(2))
    if turn_id is not None and found != turn_id:
        raise InvalidEventIdError(
            f"Last-Event-ID {value!r} names turn {found!r}, not turn {turn_id!r}; "
            "reconnect without it to read this turn from its start",
            event_id=value,
        )
    return found, seq


def sse_frame(event: RunEvent) -> str:
    """One event's frame: ``id``, ``event`` and ``data`` lines and the blank line ending it."""
    data = json.dumps(event_to_dict(event), ensure_ascii=False, separators=(",", ":"))
    return f"id: {event_turn_id(event)}:{event.seq}\nevent: {event.type}\ndata: {data}\n\n"


def check_stream_args(heartbeat_s: object, retry_ms: object) -> None:
    """Refuse a ``heartbeat_s`` that is not a number > 0 or None, or a ``retry_ms`` that is
    not an int >= 0 (:class:`~lousho_sync.errors.InvalidInputError`)."""
    if heartbeat_s is not None and (
        type(heartbeat_s) not in (int, float) or not heartbeat_s > 0  # type: ignore[operator]
    ):
        raise InvalidInputError(f"heartbeat_s must be a number > 0 or None, not {heartbeat_s!r}")
    if type(retry_ms) is not int or retry_ms < 0:
        raise InvalidInputError(f"retry_ms must be an int >= 0, not {retry_ms!r}")


def check_turn(event: RunEvent, turn_id: str | None) -> str:
    found = event_turn_id(event)
    if turn_id is not None and found != turn_id:
        raise InvalidEventIdError(
            f"an event of turn {found!r} reached the stream of turn {turn_id!r}; "
            "it was not sent", event_id=f"{found}:{event.seq}")
    return found


_END = object()


class _Pump:
    """Reads ``events`` in a thread into a small queue, so the reader can wait with a
    timeout (for heartbeats) without cancelling a pending read."""

    def __init__(self, events: Iterable[RunEvent]) -> None:
        self._events = events
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lousho-sse", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.25)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        iterator = iter(self._events)
        try:
            for event in iterator:
                if not self._put(event):
                    break
            else:
                self._put(_END)
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc)
        finally:
            close = getattr(iterator, "close", None)
            if self._stop.is_set() and close is not None:
                close()

    def get(self, timeout: float | None) -> object:
        return self._queue.get(timeout=timeout)

    def stop(self) -> None:
        self._stop.set()


def sse_frames(
    events: Iterable[RunEvent],
    *,
    heartbeat_s: float | None = 15.0,
    retry_ms: int = 2000,
    turn_id: str | None = None,
) -> Iterator[str]:
    """The frames of ``events``: a ``retry:`` hint, one frame per event, a heartbeat comment
    every ``heartbeat_s`` seconds while no event comes (None: none), ending after
    ``run.done``. An event of a turn other than ``turn_id`` (when given) raises
    :class:`~lousho_sync.errors.InvalidEventIdError` instead of being sent. Bad arguments
    raise :class:`~lousho_sync.errors.InvalidInputError` at the call."""
    check_stream_args(heartbeat_s, retry_ms)
    return _frames(events, heartbeat_s, retry_ms, turn_id)


def _frames(
    events: Iterable[RunEvent], heartbeat_s: float | None, retry_ms: int, turn_id: str | None
) -> Iterator[str]:
    yield f"retry: {retry_ms}\n\n"
    if heartbeat_s is None:
        for event in events:
            check_turn(event, turn_id)
            yield sse_frame(event)
            if event.type == "run.done":
                return
        return
    pump = _Pump(events)
    try:
        while True:
            try:
                item = pump.get(heartbeat_s)
            except queue.Empty:
                yield HEARTBEAT
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, RunEvent)
            check_turn(item, turn_id)
            yield sse_frame(item)
            if item.type == "run.done":
                return
    finally:
        pump.stop()
