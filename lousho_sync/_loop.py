"""Repairing a loaded transcript: every tool call gets a result (pure: no I/O)."""

from __future__ import annotations

import logging

from .messages import Message

__all__ = ["repair_orphans"]

_log = logging.getLogger(__name__)


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
