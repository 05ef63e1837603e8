"""Compaction: replace older messages with one model-written summary.

The summary is ONE ``role="user"`` message whose ``metadata`` is
``{"lousho": "summary", "replaced": n, "steps": s, "tool_calls": t}``. A user message is
valid at the start of any transcript sent to OpenAI or Anthropic (several user messages in
a row are accepted by both), is never taken for the model's own words, and is never part
of a tool-call group. Its ``usage`` is the sum of the usage of the messages it replaced
plus the summary call's own usage, so session budgets keep counting them; ``steps`` and
``tool_calls`` record what the replaced messages held (the summary call itself adds tokens
and cost, not a step).

The cut: the last ``keep_last`` messages are kept; the cut then moves earlier to the
nearest user message, so the kept part starts a turn; when no user message is found before
it, to the nearest message that is not a tool result (an assistant message starts a
tool-call group), so a tool call is never separated from its results. When nothing older
than the cut is left (or only an earlier summary), nothing happens: no model call, no
event, the transcript is untouched.

Token estimate (automatic policy): about 4 characters per token, that is
``ceil(chars / 4) + 4`` per message, where chars counts the text, each tool call's name and
JSON arguments and the tool-call id; an image counts 1,000 tokens and a file
``len(data) / 4``. The system prompt and the tool specs (as JSON) count ``ceil(chars / 4)``.
The transcript's share is kept per session and updated by adding only the messages appended
since the last estimate, so a long transcript is not walked again on every turn.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .errors import ConfigError, LoushoError, ProviderError
from .limits import Price, cost_of, no_price_error, price_for
from .messages import FilePart, ImagePart, Message, TextPart, Usage
from .providers.base import ModelRequest, Provider, ToolSpec
from .signal import AbortController, Signal

__all__ = [
    "SUMMARY_INSTRUCTIONS",
    "Compaction",
    "TokenTally",
    "check_keep_last",
    "estimate_tokens",
    "fixed_tokens",
    "is_summary",
    "render",
    "split_point",
    "summarise",
]

_log = logging.getLogger(__name__)

SUMMARY_INSTRUCTIONS = (
    "You compact the earlier part of a conversation between a user and an AI assistant, so "
    "the assistant can continue without the original messages. Write a concise summary "
    "that keeps: what the user asked for and why, decisions taken, facts learned (names, "
    "numbers, identifiers, file paths, URLs), the tools called and what their results "
    "showed, and anything still open or promised. Write plain notes in the third person; do "
    "not address the user, do not continue the conversation, do not invent anything."
)
"""The system prompt of the summary call (``instructions`` are appended to it)."""

_SUMMARY_PREFIX = "Summary of the earlier conversation (older messages were compacted):\n\n"
_IMAGE_TOKENS = 1000
_MESSAGE_OVERHEAD = 4


@attrs.frozen(slots=True, kw_only=True)
class Compaction:
    """Automatic compaction: before a turn whose estimated input exceeds
    ``max_input_tokens``, compact the session keeping the last ``keep_last`` messages."""

    max_input_tokens: int
    keep_last: int = 8
    instructions: str | None = None


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a compaction summary."""
    return message.role == "user" and message.metadata.get("lousho") == "summary"


def check_keep_last(keep_last: object) -> None:
    """ConfigError unless ``keep_last`` is an int >= 0."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise ConfigError(f"keep_last must be an int >= 0; got {keep_last!r}")


# --- the cut and the summary ---------------------------------------------------------------
def split_point(messages: Sequence[Message], keep_last: int) -> int:
    """Index of the first kept message (0: nothing to compact). See the module docstring."""
    start = len(messages) - keep_last
    if start <= 0:
        return 0
    if keep_last == 0:
        return start  # everything is summarised
    for i in range(start, 0, -1):
        if messages[i].role == "user":
            return i
    for i in range(start, 0, -1):
        if messages[i].role != "tool":
            return i
    return 0


def summarise(
    provider: Provider,
    older: Sequence[Message],
    *,
    settings: Mapping[str, Any],
    prices: Mapping[str, Price] | None,
    cost_required: bool,
    instructions: str | None = None,
    signal: Signal | None = None,
    session_id: str | None = None,
) -> Message:
    """The summary message replacing ``older``, written by ``provider`` (one model call).

    Raises ProviderError when the call fails or the summary is empty.
    """
    system = SUMMARY_INSTRUCTIONS
    if instructions:
        system = f"{system}\n\nAlso: {instructions}"
    request = ModelRequest(
        system,
        [Message("user", "The conversation to summarise:\n\n" + render(older))],
        (),
        settings,
    )
    name = type(provider).__name__
    configured = getattr(provider, "model", None)
    configured = configured if isinstance(configured, str) and configured else None
    if cost_required and configured is not None and price_for(configured, prices) is None:
        raise no_price_error(configured)  # before the summary call is paid for
    try:
        response = provider.complete(
            request, signal=signal if signal is not None else AbortController().signal
        )
    except LoushoError:
        raise
    except Exception as exc:
        raise ProviderError(
            f"provider {name} failed while summarising session {session_id!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    text = response.message.text.strip()
    if not text:
        raise ProviderError(
            f"provider {name} returned an empty summary for session {session_id!r}; the "
            "transcript was left as it was"
        )
    call_usage = cost_of(response.message.usage or Usage(), response.model, prices,
                         required=cost_required, configured=configured)
    usage = call_usage
    steps = tool_calls = 0
    for m in older:
        if m.usage is not None:
            usage = usage + m.usage
        if m.role == "assistant":
            steps += 1
        elif m.role == "tool":
            tool_calls += 1
        elif is_summary(m):
            steps += _int(m.metadata.get("steps"))
            tool_calls += _int(m.metadata.get("tool_calls"))
    replaced = sum(_int(m.metadata.get("replaced")) if is_summary(m) else 1 for m in older)
    return Message(
        "user",
        _SUMMARY_PREFIX + text,
        usage=usage,
        metadata={"lousho": "summary", "replaced": replaced, "steps": steps,
                  "tool_calls": tool_calls},
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def render(messages: Sequence[Message]) -> str:
    """The messages as plain text for the summary call (images and files as placeholders)."""
    lines: list[str] = []
    for m in messages:
        if is_summary(m):
            lines.append(f"[earlier summary]\n{m.text}")
            continue
        label: str = m.role
        if m.role == "tool":
            label = f"tool result for {m.tool_call_id}{' (error)' if m.is_error else ''}"
        lines.append(f"[{label}]\n{_content_text(m)}")
        for call in m.tool_calls:
            lines.append(f"[assistant called {call.name} ({call.id}) with "
                         f"{json.dumps(dict(call.arguments), default=str)}]")
    return "\n\n".join(lines)


def _content_text(m: Message) -> str:
    if isinstance(m.content, str):
        return m.content
    out: list[str] = []
    for part in m.content:
        if isinstance(part, TextPart):
            out.append(part.text)
        elif isinstance(part, ImagePart):
            out.append(f"[image {part.media_type}]")
        else:
            out.append(f"[file {part.name or ''} {part.media_type}]".replace("  ", " "))
    return "\n".join(out)


# --- token estimate ------------------------------------------------------------------------------
def estimate_tokens(message: Message) -> int:
    """Estimated tokens of one message (see the module docstring)."""
    chars = 0
    tokens = _MESSAGE_OVERHEAD
    if isinstance(message.content, str):
        chars += len(message.content)
    else:
        for part in message.content:
            if isinstance(part, TextPart):
                chars += len(part.text)
            elif isinstance(part, ImagePart):
                tokens += _IMAGE_TOKENS
            elif isinstance(part, FilePart):
                chars += len(part.data)
    for call in message.tool_calls:
        chars += len(call.id) + len(call.name) + len(json.dumps(dict(call.arguments),
                                                                 default=str))
    if message.tool_call_id:
        chars += len(message.tool_call_id)
    return tokens + math.ceil(chars / 4)


class TokenTally:
    """Estimated tokens of a transcript, counting only the messages added since the last
    call. The transcript list is append-only while it is current (compaction and clear
    replace it), so the list's identity and the counted length keep the tally right.

    Thread-safe: one lock guards the tally.
    """

    __slots__ = ("_counted", "_lock", "_messages", "_tokens")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[Message] | None = None
        self._counted = 0
        self._tokens = 0

    def tokens(self, messages: list[Message]) -> int:
        """Estimated tokens of ``messages``."""
        with self._lock:
            if self._messages is not messages or self._counted > len(messages):
                self._messages, self._counted, self._tokens = messages, 0, 0
            n = len(messages)
            if self._counted < n:
                self._tokens += sum(estimate_tokens(messages[i])
                                    for i in range(self._counted, n))
                self._counted = n
            return self._tokens


def fixed_tokens(system: str | None, tool_specs: Sequence[ToolSpec]) -> int:
    """Estimated tokens of the system prompt and the tool specs (sent with every call)."""
    chars = len(system or "")
    if tool_specs:
        chars += len(json.dumps([attrs.asdict(s) for s in tool_specs], default=str))
    return math.ceil(chars / 4)
