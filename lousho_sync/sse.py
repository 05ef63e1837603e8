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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from .errors import InvalidEventIdError, InvalidInputError, LoushoError
from .event_json import event_to_dict
from .events import RunEvent

__all__ = [
    "CONTENT_TYPE",
    "HEADERS",
    "HEARTBEAT",
    "UIMessageParts",
    "UI_MESSAGE_STREAM_DONE",
    "UI_MESSAGE_STREAM_HEADERS",
    "event_turn_id",
    "parse_last_event_id",
    "sse_stream",
    "sse_frame",
    "sse_frames",
    "ui_frame",
    "ui_message_frames",
    "ui_message_stream",
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


def paced(events: Iterable[RunEvent], heartbeat_s: float | None) -> Iterator[RunEvent | None]:
    """``events`` with a None every ``heartbeat_s`` seconds while none comes (a heartbeat
    is due), ending after ``run.done``. With a heartbeat the source is read in a thread, so
    the wait never cancels a pending read; leaving closes the source at its next event."""
    if heartbeat_s is None:
        for event in events:
            yield event
            if event.type == "run.done":
                return
        return
    pump = _Pump(events)
    try:
        while True:
            try:
                item = pump.get(heartbeat_s)
            except queue.Empty:
                yield None
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, RunEvent)
            yield item
            if item.type == "run.done":
                return
    finally:
        pump.stop()


def _frames(
    events: Iterable[RunEvent], heartbeat_s: float | None, retry_ms: int, turn_id: str | None
) -> Iterator[str]:
    yield f"retry: {retry_ms}\n\n"
    for event in paced(events, heartbeat_s):
        if event is None:
            yield HEARTBEAT
            continue
        check_turn(event, turn_id)
        yield sse_frame(event)


# --- the AI SDK's UI message stream protocol ----------------------------------------------

UI_MESSAGE_STREAM_HEADERS: dict[str, str] = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}
"""The response headers of a UI message stream (``x-vercel-ai-ui-message-stream: v1`` tells
the AI SDK's ``useChat`` the protocol)."""

UI_MESSAGE_STREAM_DONE = "data: [DONE]\n\n"
"""The frame that ends a UI message stream."""

_FINISH_REASONS = {"stop": "stop", "tool_calls": "tool-calls", "length": "length",
                   "error": "error", "content_filter": "content-filter"}


class UIMessageParts:
    """Turns run events, in order, into the parts (chunks) of the AI SDK's UI message stream
    protocol: one assistant message per turn (``start`` … ``finish``), a ``start-step`` /
    ``finish-step`` pair per model call, ``text-start``/``text-delta``/``text-end`` per
    step's text, ``tool-input-available``, ``tool-output-available`` (or
    ``tool-output-error``), ``tool-approval-request``, ``error``, and lousho's own data parts
    ``data-step-reset`` (``{"step": n}``: drop what the named step showed) and
    ``data-usage`` (``{"usage", "total"}``)."""

    def __init__(self) -> None:
        self._step_open = False
        self._text_id: str | None = None
        self._tool_inputs: set[str] = set()
        self._texts = 0
        self._total: dict[str, Any] | None = None

    def _close_text(self) -> list[dict[str, Any]]:
        if self._text_id is None:
            return []
        text_id, self._text_id = self._text_id, None
        return [{"type": "text-end", "id": text_id}]

    def _close_step(self) -> list[dict[str, Any]]:
        parts = self._close_text()
        if self._step_open:
            self._step_open = False
            parts.append({"type": "finish-step"})
        return parts

    def _open_step(self) -> list[dict[str, Any]]:
        if self._step_open:
            return []
        self._step_open = True
        return [{"type": "start-step"}]

    def _tool_input(self, d: dict[str, Any]) -> list[dict[str, Any]]:
        call = d["call"]
        if call["id"] in self._tool_inputs:
            return []
        self._tool_inputs.add(call["id"])
        return [*self._close_text(), {"type": "tool-input-available", "toolCallId": call["id"],
                                      "toolName": call["name"], "input": call["arguments"]}]

    def parts(self, event: RunEvent) -> list[dict[str, Any]]:
        """The parts of one event (none for events the protocol has no place for)."""
        d = event_to_dict(event)
        kind = event.type
        if kind == "run.start":
            return [{"type": "start", "messageId": event_turn_id(event),
                     "messageMetadata": {"sessionId": d.get("session_id")}}]
        if kind == "step.start":
            return [*self._close_step(), *self._open_step()]
        if kind == "step.reset":
            step = d.get("step")
            return [*self._close_step(),
                    {"type": "data-step-reset", "data": {"step": step}}]
        if kind == "text.delta":
            parts = self._open_step()
            if self._text_id is None:
                self._texts += 1
                self._text_id = f"{event_turn_id(event)}-text-{self._texts}"
                parts.append({"type": "text-start", "id": self._text_id})
            parts.append({"type": "text-delta", "id": self._text_id, "delta": d["text"]})
            return parts
        if kind == "tool.call":
            return [*self._open_step(), *self._tool_input(d)]
        if kind == "approval.requested":
            return [*self._open_step(), *self._tool_input(d),
                    {"type": "tool-approval-request", "approvalId": d["approval_id"],
                     "toolCallId": d["call"]["id"]}]
        if kind == "tool.result":
            if d["is_error"]:
                return [{"type": "tool-output-error", "toolCallId": d["call_id"],
                         "errorText": d["result"]}]
            return [{"type": "tool-output-available", "toolCallId": d["call_id"],
                     "output": d["result"]}]
        if kind == "usage":
            self._total = d["total"]
            return [{"type": "data-usage", "data": {"usage": d["usage"], "total": d["total"]},
                     "transient": True}]
        if kind == "error":
            return [*self._close_text(), {"type": "error", "errorText": d["error"]["message"]}]
        if kind == "run.done":
            reason = d["finish_reason"]
            metadata: dict[str, Any] = {"finishReason": reason}
            if self._total is not None:
                metadata["usage"] = self._total
            return [*self._close_step(),
                    {"type": "finish", "finishReason": _FINISH_REASONS.get(reason, "other"),
                     "messageMetadata": metadata}]
        return []


def ui_frame(part: dict[str, Any]) -> str:
    """One UI message stream part as its ``data:`` frame."""
    return f"data: {json.dumps(part, ensure_ascii=False, separators=(',', ':'))}\n\n"


def ui_message_frames(
    events: Iterable[RunEvent],
    *,
    heartbeat_s: float | None = 15.0,
    turn_id: str | None = None,
) -> Iterator[str]:
    """The frames of ``events`` in the AI SDK's UI message stream protocol (see
    :class:`UIMessageParts`), a heartbeat comment every ``heartbeat_s`` seconds while the turn
    is quiet, and ``data: [DONE]`` after ``run.done``. An event of a turn other than
    ``turn_id`` raises :class:`~lousho_sync.errors.InvalidEventIdError` instead of being
    sent; bad arguments raise :class:`~lousho_sync.errors.InvalidInputError` at the call."""
    check_stream_args(heartbeat_s, 0)
    return _ui_frames(events, heartbeat_s, turn_id)


def _ui_frames(
    events: Iterable[RunEvent], heartbeat_s: float | None, turn_id: str | None
) -> Iterator[str]:
    parts = UIMessageParts()
    for event in paced(events, heartbeat_s):
        if event is None:
            yield HEARTBEAT
            continue
        check_turn(event, turn_id)
        for part in parts.parts(event):
            yield ui_frame(part)
        if event.type == "run.done":
            yield UI_MESSAGE_STREAM_DONE


# --- a session's turn -----------------------------------------------------------------------


class Attachable(Protocol):
    """What :func:`sse_stream` reads: a session with ``attach(turn_id, *, after)``."""

    def attach(self, turn_id: str | None = None, *, after: int = -1) -> Iterable[RunEvent]:
        """A turn's events with ``seq > after``, live until it ends or pauses."""
        ...


_Events = TypeVar("_Events")


def attach_for(
    attach: Callable[..., _Events], last_event_id: str | None, turn_id: str | None
) -> tuple[_Events, str | None]:
    """The events to send (what ``attach`` returns) and the turn they must belong to: after
    ``last_event_id`` (which must name ``turn_id`` when both are given), else ``turn_id``
    (None: the session's latest turn) from its start. A ``last_event_id`` naming a turn the
    session does not have raises :class:`~lousho_sync.errors.InvalidEventIdError`; other
    errors of ``attach`` (no turn at all: ``TurnNotFoundError``) pass through."""
    if last_event_id is None:
        return attach(turn_id), turn_id
    found, seq = parse_last_event_id(last_event_id, turn_id=turn_id)
    try:
        return attach(found, after=seq), found
    except LoushoError as exc:
        if exc.code != "LOUSHO_TURN_NOT_FOUND":
            raise
        raise unknown_turn(last_event_id, found) from exc


def unknown_turn(last_event_id: str, found: str) -> InvalidEventIdError:
    """The error of a ``Last-Event-ID`` naming turn ``found``, which the session does not
    have."""
    return InvalidEventIdError(
        f"Last-Event-ID {last_event_id!r} names turn {found!r}, which this session does not "
        "have (another session's turn, or one whose events expired); reconnect without it",
        event_id=last_event_id,
    )


def sse_stream(
    session: Attachable,
    *,
    last_event_id: str | None = None,
    turn_id: str | None = None,
    heartbeat_s: float | None = 15.0,
    retry_ms: int = 2000,
) -> Iterator[str]:
    """The server-sent event frames of a session's turn, read with ``session.attach()``:
    the turn named by ``last_event_id`` after the event it names (a reconnecting browser's
    ``Last-Event-ID`` header), else ``turn_id``'s (None: the latest turn's) from its start.
    See :func:`sse_frames` for the frames. A bad or foreign ``last_event_id`` raises
    :class:`~lousho_sync.errors.InvalidEventIdError` here, before any frame (answer HTTP
    400); reading the frames never affects the turn."""
    check_stream_args(heartbeat_s, retry_ms)
    events, expected = attach_for(session.attach, last_event_id, turn_id)
    return _frames(events, heartbeat_s, retry_ms, expected)


def ui_message_stream(
    session: Attachable,
    *,
    last_event_id: str | None = None,
    turn_id: str | None = None,
    heartbeat_s: float | None = 15.0,
) -> Iterator[str]:
    """A session's turn in the AI SDK's UI message stream protocol (see
    :func:`ui_message_frames`), read with ``session.attach()`` as :func:`sse_stream` reads
    it. ``useChat``'s resume endpoint (``GET <api>/<chat id>/stream``) answers with this
    (``turn_id`` None: the running turn, from its start) or, when the session has no
    unfinished turn, with HTTP 204."""
    check_stream_args(heartbeat_s, 0)
    events, expected = attach_for(session.attach, last_event_id, turn_id)
    return _ui_frames(events, heartbeat_s, expected)
