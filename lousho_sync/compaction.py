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
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from . import _otel
from .errors import (
    LoushoError,
    ProviderError,
    SessionAwaitingApprovalError,
    SessionBusyError,
)
from .events import CompactionDone, CompactionStart
from .limits import cost_of, exceeded_before_model_call
from .messages import FilePart, ImagePart, Message, TextPart, Usage
from .providers.base import ModelRequest
from .signal import AbortController, Signal

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "SUMMARY_INSTRUCTIONS",
    "Compaction",
    "compact_session",
    "estimate_input_tokens",
    "estimate_tokens",
    "is_summary",
    "maybe_compact",
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


# --- manual compaction -------------------------------------------------------------------------
def compact_session(
    session: Session,
    *,
    keep_last: int = 8,
    instructions: str | None = None,
    signal: Signal | None = None,
) -> bool:
    """Compact ``session`` now (see :meth:`Session.compact`); True when it changed.

    Refused with SessionBusyError while a turn runs or waits to start, or while an
    interrupted turn pends (resume or discard it first), and with
    SessionAwaitingApprovalError while a turn waits on an approval. Atomic: a provider or
    store failure raises and leaves the transcript as it was, in memory and in the store
    (listeners then saw ``compaction.start`` and no ``compaction.done``). Nothing to compact:
    no model call, no event, False.
    """
    _check_keep_last(keep_last)
    with session._exclusive("compact()"):
        session._sync()
        _refuse_if_pending(session)
        return compact_held(session, keep_last=keep_last, instructions=instructions,
                            signal=signal)


def _check_keep_last(keep_last: int) -> None:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        from .errors import ConfigError

        raise ConfigError(f"keep_last must be an int >= 0; got {keep_last!r}")


def _refuse_if_pending(session: Session) -> None:
    cp = session._pending_checkpoint()
    if cp is None:
        return
    if cp.status == "awaiting-approval":
        pending = session._still_pending(cp)
        if pending:
            raise SessionAwaitingApprovalError(
                f"session {session.id!r} has a turn waiting on approval {pending[0]!r}; "
                "resolve it or discard_pending() before compact()",
                approval_id=pending[0],
                session_id=session.id,
            )
    raise SessionBusyError(
        f"session {session.id!r} has an unfinished turn; resume() or discard_pending() it "
        "before compact()",
        session_id=session.id,
    )


def compact_held(
    session: Session,
    *,
    keep_last: int,
    instructions: str | None,
    signal: Signal | None = None,
) -> bool:
    """Compact while the caller holds the session's turn slot (and lease) and the cached
    transcript is current; True when the transcript changed."""
    st = session._state
    messages = st.messages
    before = len(messages)
    cut = split_point(messages, keep_last)
    if cut == 0 or (cut == 1 and is_summary(messages[0])):
        return False
    older, kept = messages[:cut], messages[cut:]
    session._emit(CompactionStart, messages_before=before)
    with _otel.compaction(session.id, before):  # tracing (issue 18)
        summary = _summarise(session, older, instructions, signal)
    new = [summary, *kept]
    _drop_stale_checkpoints(session)
    session.store.save(session.id, new)
    from .session import _counters

    revision = session.store.revision(session.id) if st.has_revision else None  # type: ignore[attr-defined]
    with st.lock:
        st.messages = new
        st.used = _counters(new)
        st.revision = revision
        st.loaded = True
    _log.info("session %s: compacted %d messages into a summary (%d -> %d)", session.id,
              cut, before, len(new))
    session._emit(CompactionDone, messages_before=before, messages_after=len(new))
    return True


def _drop_stale_checkpoints(session: Session) -> None:
    """Delete the session's turn checkpoints: none pends (checked by the caller), and a
    shorter transcript would otherwise take a leftover ``<id>.turn-<n>`` for its own."""
    store = session.checkpoint_store
    if store is None:
        return
    for key in store.keys(f"{session.id}.turn-"):
        store.delete(key)


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


def _summarise(
    session: Session, older: Sequence[Message], instructions: str | None, signal: Signal | None
) -> Message:
    cfg = session._config(None)
    system = SUMMARY_INSTRUCTIONS
    if instructions:
        system = f"{system}\n\nAlso: {instructions}"
    request = ModelRequest(
        system,
        [Message("user", "The conversation to summarise:\n\n" + render(older))],
        (),
        cfg.settings,
    )
    provider = cfg.provider
    name = type(provider).__name__
    try:
        response = provider.complete(
            request, signal=signal if signal is not None else AbortController().signal
        )
    except LoushoError:
        raise
    except Exception as exc:
        raise ProviderError(
            f"provider {name} failed while summarising session {session.id!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    text = response.message.text.strip()
    if not text:
        raise ProviderError(
            f"provider {name} returned an empty summary for session {session.id!r}; the "
            "transcript was left as it was"
        )
    call_usage = cost_of(response.message.usage or Usage(), response.model, cfg.prices,
                         required=cfg.cost_required)
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


@attrs.define(slots=True)
class _Tally:
    messages: list[Message]
    counted: int
    tokens: int


_TALLIES: weakref.WeakKeyDictionary[Any, _Tally] = weakref.WeakKeyDictionary()
_TALLY_LOCK = threading.Lock()


def _transcript_tokens(state: Any) -> int:
    """Estimated tokens of ``state.messages``, counting only messages not counted before.

    The transcript list is append-only while it is current (compaction and clear replace
    it), so a tally keyed by the list's identity and its counted length stays right.
    """
    messages: list[Message] = state.messages
    with _TALLY_LOCK:
        tally = _TALLIES.get(state)
        if tally is None or tally.messages is not messages or tally.counted > len(messages):
            tally = _Tally(messages, 0, 0)
            _TALLIES[state] = tally
        n = len(messages)
        if tally.counted < n:
            tally.tokens += sum(estimate_tokens(messages[i]) for i in range(tally.counted, n))
            tally.counted = n
        return tally.tokens


def estimate_input_tokens(session: Session, new_input: Sequence[Message] = ()) -> int:
    """Estimated input tokens of the session's next model call: system prompt, tool specs,
    transcript and ``new_input`` (see the module docstring)."""
    cfg = session._config(None)
    fixed = len(cfg.system or "")
    if cfg.tool_specs:
        fixed += len(json.dumps([attrs.asdict(s) for s in cfg.tool_specs], default=str))
    return (
        math.ceil(fixed / 4)
        + _transcript_tokens(session._state)
        + sum(estimate_tokens(m) for m in new_input)
    )


# --- automatic policy --------------------------------------------------------------------------
def maybe_compact(
    session: Session,
    new_input: Sequence[Message] = (),
    *,
    signal: Signal | None = None,
) -> bool:
    """The automatic policy, called at the start of a turn while the turn holds the
    session's slot and lease, after the cached transcript was synced: when the agent has a
    :class:`Compaction` and the estimated input (system + tools + transcript + ``new_input``)
    exceeds its ``max_input_tokens``, compact. True when the transcript changed.

    Skipped when a turn pends (its checkpoint is keyed by the transcript length) and when
    the session budget is already spent (the turn will be refused anyway). An abort of
    ``signal`` during the summary call is swallowed (False; the turn then sees the abort);
    any other failure raises and leaves the transcript as it was.
    """
    policy = getattr(session._agent, "compaction", None)
    if not isinstance(policy, Compaction):
        return False
    estimate = estimate_input_tokens(session, new_input)
    if estimate <= policy.max_input_tokens:
        return False
    if session._pending_checkpoint() is not None:
        return False
    if exceeded_before_model_call(session.limits, session._state.used) is not None:
        return False
    _log.info("session %s: estimated input %d tokens > %d; compacting", session.id, estimate,
              policy.max_input_tokens)
    try:
        return compact_held(session, keep_last=policy.keep_last,
                            instructions=policy.instructions, signal=signal)
    except Exception:
        if signal is not None and signal.aborted:
            _log.info("session %s: compaction aborted with its turn", session.id)
            return False
        raise
