"""Typed stream events. The ``type`` strings are permanent public API.

Run events carry ``run_id`` (of the handle they are read from) and ``seq`` (0, 1, 2, … per
run). Session listener events (``compaction.*``, ``context.cleared``) carry ``session_id``
and ``seq`` instead of ``run_id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeAlias

import attrs

from .messages import Message, ToolCall, Usage

if TYPE_CHECKING:
    from .results import ExecutionResult

__all__ = [
    "ApprovalRequested",
    "CompactionDone",
    "CompactionStart",
    "ContextCleared",
    "Event",
    "InputApplied",
    "InputQueued",
    "RunDone",
    "RunEvent",
    "RunFailed",
    "RunStart",
    "SessionEvent",
    "StepStart",
    "TextDelta",
    "ToolCallStart",
    "ToolResultEvent",
    "UsageEvent",
]


@attrs.frozen(slots=True, kw_only=True)
class RunEvent:
    """Base of the run events."""

    type: ClassVar[str] = ""
    run_id: str
    seq: int


@attrs.frozen(slots=True, kw_only=True)
class RunStart(RunEvent):
    """The turn started; ``input`` is its user messages."""

    type: ClassVar[str] = "run.start"
    session_id: str | None
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class StepStart(RunEvent):
    """A model call starts; ``step`` is 1 for the first."""

    type: ClassVar[str] = "step.start"
    step: int


@attrs.frozen(slots=True, kw_only=True)
class TextDelta(RunEvent):
    """A piece of the assistant's text, as it arrives."""

    type: ClassVar[str] = "text.delta"
    text: str


@attrs.frozen(slots=True, kw_only=True)
class ToolCallStart(RunEvent):
    """A tool call is about to run."""

    type: ClassVar[str] = "tool.call"
    call: ToolCall


@attrs.frozen(slots=True, kw_only=True)
class ToolResultEvent(RunEvent):
    """A tool call's result (as sent to the model)."""

    type: ClassVar[str] = "tool.result"
    call_id: str
    result: str
    is_error: bool


@attrs.frozen(slots=True, kw_only=True)
class ApprovalRequested(RunEvent):
    """A ``needs_approval`` tool call waits for ``approvals.resolve(approval_id)``."""

    type: ClassVar[str] = "approval.requested"
    approval_id: str
    call: ToolCall


@attrs.frozen(slots=True, kw_only=True)
class InputQueued(RunEvent):
    """Input was queued into the running turn (``enqueue``/``steer`` or a joining call)."""

    type: ClassVar[str] = "input.queued"
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class InputApplied(RunEvent):
    """Queued input joined the conversation; the next model call sees it."""

    type: ClassVar[str] = "input.applied"
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class UsageEvent(RunEvent):
    """Usage of one model call (``usage``) and of the turn so far (``total``)."""

    type: ClassVar[str] = "usage"
    usage: Usage
    total: Usage


@attrs.frozen(slots=True, kw_only=True)
class RunFailed(RunEvent):
    """The run failed with ``error``; ``run.done`` follows."""

    type: ClassVar[str] = "error"
    error: BaseException


@attrs.frozen(slots=True, kw_only=True)
class RunDone(RunEvent):
    """Always the last event; ``result`` is None when ``finish_reason == "error"``."""

    type: ClassVar[str] = "run.done"
    finish_reason: str
    result: ExecutionResult | None


@attrs.frozen(slots=True, kw_only=True)
class SessionEvent:
    """Base of the session listener events."""

    type: ClassVar[str] = ""
    session_id: str
    seq: int


@attrs.frozen(slots=True, kw_only=True)
class CompactionStart(SessionEvent):
    """Compaction begins over ``messages_before`` messages."""

    type: ClassVar[str] = "compaction.start"
    messages_before: int


@attrs.frozen(slots=True, kw_only=True)
class CompactionDone(SessionEvent):
    """Compaction finished: ``messages_before`` became ``messages_after``."""

    type: ClassVar[str] = "compaction.done"
    messages_before: int
    messages_after: int


@attrs.frozen(slots=True, kw_only=True)
class ContextCleared(SessionEvent):
    """``clear()`` emptied the transcript."""

    type: ClassVar[str] = "context.cleared"


Event: TypeAlias = (
    RunStart
    | StepStart
    | TextDelta
    | ToolCallStart
    | ToolResultEvent
    | ApprovalRequested
    | InputQueued
    | InputApplied
    | UsageEvent
    | RunFailed
    | RunDone
)
