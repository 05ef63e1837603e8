"""Server-sent events of a turn for asyncio: the frames of :mod:`lousho_sync.sse`, yielded
asynchronously (an ASGI app sends each as a body chunk).

A heartbeat never cancels the pending read: the read stays one task that the stream waits on
again after each heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from lousho_sync.events import RunEvent
from lousho_sync.sse import (
    CONTENT_TYPE,
    HEADERS,
    HEARTBEAT,
    UI_MESSAGE_STREAM_DONE,
    UI_MESSAGE_STREAM_HEADERS,
    UIMessageParts,
    check_stream_args,
    check_turn,
    event_turn_id,
    parse_last_event_id,
    sse_frame,
    ui_frame,
)

__all__ = [
    "CONTENT_TYPE",
    "HEADERS",
    "HEARTBEAT",
    "UIMessageParts",
    "UI_MESSAGE_STREAM_DONE",
    "UI_MESSAGE_STREAM_HEADERS",
    "event_turn_id",
    "parse_last_event_id",
    "sse_frame",
    "sse_frames",
    "ui_frame",
    "ui_message_frames",
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
    turn_id: str | None,
) -> AsyncIterator[str]:
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
    events: AsyncIterable[RunEvent], heartbeat_s: float | None, turn_id: str | None
) -> AsyncIterator[str]:
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
