"""Server-sent events of a turn for asyncio: the frames of :mod:`lousho_sync.sse`, yielded
asynchronously (an ASGI app sends each as a body chunk).

A heartbeat never cancels the pending read: the read stays one task that the stream waits on
again after each heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol

from lousho_sync.errors import LoushoError
from lousho_sync.events import RunEvent
from lousho_sync.sse import (
    CONTENT_TYPE,
    HEADERS,
    HEARTBEAT,
    UI_MESSAGE_STREAM_DONE,
    UI_MESSAGE_STREAM_HEADERS,
    UIMessageParts,
    attach_for,
    check_stream_args,
    check_turn,
    event_turn_id,
    parse_last_event_id,
    sse_frame,
    ui_frame,
    unknown_turn,
)

from . import _bridge
from .run import AsyncAgentRun, DeferredRun

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


def sse_frames(
    events: AsyncIterable[RunEvent],
    *,
    heartbeat_s: float | None = 15.0,
    retry_ms: int = 2000,
    turn_id: str | None = None,
) -> AsyncIterator[str]:
    """The frames of ``events`` (an ``async for`` source), as
    :func:`lousho_sync.sse.sse_frames` makes them: a ``retry:`` hint, one frame per event, a
    heartbeat comment every ``heartbeat_s`` seconds while no event comes, ending after
    ``run.done``. Bad arguments raise ``InvalidInputError`` at the call."""
    check_stream_args(heartbeat_s, retry_ms)
    return _frames(events, heartbeat_s, retry_ms, turn_id)


async def paced(
    events: AsyncIterable[RunEvent], heartbeat_s: float | None
) -> AsyncIterator[RunEvent | None]:
    """``events`` with a None every ``heartbeat_s`` seconds while none comes, ending after
    ``run.done``; the pending read is never cancelled by a heartbeat."""
    iterator = aiter(events)
    pending: asyncio.Task[Any] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                event = task.result()
            except StopAsyncIteration:
                return
            yield event
            if event.type == "run.done":
                return
    finally:
        if pending is not None:
            pending.cancel()
            try:
                await pending
            except (asyncio.CancelledError, Exception):  # the reader left: nothing to say
                pass
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


async def _frames(
    events: AsyncIterable[RunEvent], heartbeat_s: float | None, retry_ms: int,
    turn_id: str | None, last_event_id: str | None = None,
) -> AsyncIterator[str]:
    await _read_store(events, last_event_id, turn_id)
    yield f"retry: {retry_ms}\n\n"
    async for event in paced(events, heartbeat_s):
        if event is None:
            yield HEARTBEAT
            continue
        check_turn(event, turn_id)
        yield sse_frame(event)


def ui_message_frames(
    events: AsyncIterable[RunEvent],
    *,
    heartbeat_s: float | None = 15.0,
    turn_id: str | None = None,
) -> AsyncIterator[str]:
    """The frames of ``events`` in the AI SDK's UI message stream protocol, as
    :func:`lousho_sync.sse.ui_message_frames` makes them, asynchronously."""
    check_stream_args(heartbeat_s, 0)
    return _ui_frames(events, heartbeat_s, turn_id)


async def _ui_frames(
    events: AsyncIterable[RunEvent], heartbeat_s: float | None, turn_id: str | None,
    last_event_id: str | None = None,
) -> AsyncIterator[str]:
    await _read_store(events, last_event_id, turn_id)
    parts = UIMessageParts()
    async for event in paced(events, heartbeat_s):
        if event is None:
            yield HEARTBEAT
            continue
        check_turn(event, turn_id)
        for part in parts.parts(event):
            yield ui_frame(part)
        if event.type == "run.done":
            yield UI_MESSAGE_STREAM_DONE


class AsyncAttachable(Protocol):
    """What :func:`sse_stream` reads: an ``AsyncSession`` (``attach()`` gives an ``async for``
    run of a turn's events)."""

    def attach(self, turn_id: str | None = None, *, after: int = -1) -> AsyncIterable[RunEvent]:
        """A turn's events with ``seq > after``, live until it ends or pauses."""
        ...


def sse_stream(
    session: AsyncAttachable,
    *,
    last_event_id: str | None = None,
    turn_id: str | None = None,
    heartbeat_s: float | None = 15.0,
    retry_ms: int = 2000,
) -> AsyncIterator[str]:
    """The frames of :func:`lousho_sync.sse.sse_stream`, asynchronously (``async for``). A bad
    ``last_event_id`` raises ``InvalidEventIdError`` here; one naming a turn the session does
    not have raises it when the first frame is asked for, before any frame (the store is
    read in the pool, never on the event loop)."""
    check_stream_args(heartbeat_s, retry_ms)
    events, expected = attach_for(session.attach, last_event_id, turn_id)
    return _frames(events, heartbeat_s, retry_ms, expected, last_event_id)


def ui_message_stream(
    session: AsyncAttachable,
    *,
    last_event_id: str | None = None,
    turn_id: str | None = None,
    heartbeat_s: float | None = 15.0,
) -> AsyncIterator[str]:
    """The frames of :func:`lousho_sync.sse.ui_message_stream`, asynchronously."""
    check_stream_args(heartbeat_s, 0)
    events, expected = attach_for(session.attach, last_event_id, turn_id)
    return _ui_frames(events, heartbeat_s, expected, last_event_id)


async def _read_store(
    events: AsyncIterable[RunEvent], last_event_id: str | None, found: str | None
) -> None:
    """An ``AsyncSession.attach`` run reads the store in the pool first, before any frame:
    a ``last_event_id`` naming a turn the session does not have raises
    ``InvalidEventIdError`` there (``TurnNotFoundError`` without one)."""
    if isinstance(events, AsyncAgentRun) and isinstance(events.sync, DeferredRun):
        try:
            await _bridge.call(events.sync.resolve)
        except LoushoError as exc:
            if last_event_id is None or found is None or exc.code != "LOUSHO_TURN_NOT_FOUND":
                raise
            raise unknown_turn(last_event_id, found) from exc
