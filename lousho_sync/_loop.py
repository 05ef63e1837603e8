"""Pure decisions of the step loop: no I/O, no threads."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import overload

from .messages import Message, ToolCall

__all__ = ["MessageView", "final_text", "repair_orphans", "unresolved_calls"]

_log = logging.getLogger(__name__)


class MessageView(Sequence[Message]):
    """A read-only concatenation of list prefixes, built in O(1).

    The transcript and a turn's messages are append-only lists; a view fixes each one's
    length when it is made, so it never changes afterwards and nothing is copied.
    """

    __slots__ = ("_len", "_parts")

    def __init__(self, *parts: Sequence[Message]) -> None:
        self._parts = tuple((p, len(p)) for p in parts if len(p))
        self._len = sum(n for _, n in self._parts)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Message]:
        for part, n in self._parts:
            for i in range(n):
                yield part[i]

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("message index out of range")
        for part, n in self._parts:
            if index < n:
                return part[index]
            index -= n
        raise IndexError("message index out of range")  # pragma: no cover

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, MessageView)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageView({list(self)!r})"


def unresolved_calls(recorded: Sequence[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message in ``recorded`` that have no result yet."""
    for i in range(len(recorded) - 1, -1, -1):
        message = recorded[i]
        if message.role == "assistant":
            if not message.tool_calls:
                return []
            done = {m.tool_call_id for m in recorded[i + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in done]
    return []


def ends_with_answer(recorded: Sequence[Message]) -> bool:
    """True when the last recorded message is an assistant answer without tool calls."""
    return bool(recorded) and recorded[-1].role == "assistant" and not recorded[-1].tool_calls


def final_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message ("" if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return messages[i].text
    return ""


def repair_orphans(messages: list[Message], *, session_id: str | None = None) -> list[Message]:
    """Give every assistant tool call lacking a result an error result (logged).

    Returns ``messages`` itself when nothing was missing.
    """
    missing_any = False
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        message = messages[i]
        out.append(message)
        i += 1
        if message.role != "assistant" or not message.tool_calls:
            continue
        results: list[Message] = []
        while i < n and messages[i].role == "tool":
            results.append(messages[i])
            i += 1
        out.extend(results)
        have = {m.tool_call_id for m in results}
        for call in message.tool_calls:
            if call.id not in have:
                missing_any = True
                out.append(
                    Message(
                        "tool",
                        f"error: the result of tool call {call.id} ({call.name}) was never "
                        "recorded; it may or may not have run",
                        tool_call_id=call.id,
                        is_error=True,
                    )
                )
    if not missing_any:
        return messages
    _log.warning(
        "session %s: repaired a transcript with tool calls lacking results (written by other "
        "code); each missing result became an error result",
        session_id,
    )
    return out
