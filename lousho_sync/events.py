"""Typed stream events. The ``type`` strings are permanent public API.

Each class's ``type`` is a ``Literal``: iterating a run yields :data:`Event` (the union of
the run events) and a session listener receives :data:`ListenerEvent`, so comparing
``event.type`` with a string narrows the event to its class under a type checker.

Run events carry ``run_id`` (of the handle they are read from), ``turn_id`` (the turn they
belong to: the same string for a turn's own run) and ``seq``: 0, 1, 2, … within the turn, only
growing, across processes and takeovers (a turn read back from the event log keeps the seq it
was written with). :func:`event_id` is the server-sent-events id ``"<turn_id>:<seq>"`` and
:func:`parse_event_id` reads it back. Session listener events (``compaction.*``,
``context.cleared``) carry ``session_id`` and ``seq`` instead of ``run_id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, TypeAlias

import attrs

from .errors import InvalidInputError
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
    "ListenerEvent",
    "RunDone",
    "RunEvent",
    "RunFailed",
    "RunStart",
    "SessionEvent",
    "StepReset",
    "StepStart",
    "TextDelta",
    "ToolCallStart",
    "ToolResultEvent",
    "UsageEvent",
    "event_id",
    "parse_event_id",
]


@attrs.frozen(slots=True, kw_only=True)
class RunEvent:
    """Base of the run events."""

    type: ClassVar[str] = ""
    run_id: str
    seq: int

    @property
    def turn_id(self) -> str:
        """The turn this event belongs to (a turn's events carry its id as ``run_id``)."""
        return self.run_id


@attrs.frozen(slots=True, kw_only=True)
class RunStart(RunEvent):
    """The turn started; ``input`` is its user messages."""

    type: ClassVar[Literal["run.start"]] = "run.start"
    session_id: str | None
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class StepStart(RunEvent):
    """A model call starts; ``step`` is 1 for the first."""

    type: ClassVar[Literal["step.start"]] = "step.start"
    step: int


@attrs.frozen(slots=True, kw_only=True)
class StepReset(RunEvent):
    """A turn resumed after its driver died makes step ``step`` again: drop what was shown
    of that step (its text deltas and anything after its ``step.start``). No other event is
    ever taken back."""

    type: ClassVar[Literal["step.reset"]] = "step.reset"
    step: int


@attrs.frozen(slots=True, kw_only=True)
class TextDelta(RunEvent):
    """A piece of the assistant's text, as it arrives."""

    type: ClassVar[Literal["text.delta"]] = "text.delta"
    text: str


@attrs.frozen(slots=True, kw_only=True)
class ToolCallStart(RunEvent):
    """A tool call is about to run."""

    type: ClassVar[Literal["tool.call"]] = "tool.call"
    call: ToolCall


@attrs.frozen(slots=True, kw_only=True)
class ToolResultEvent(RunEvent):
    """A tool call's result (as sent to the model)."""

    type: ClassVar[Literal["tool.result"]] = "tool.result"
    call_id: str
    result: str
    is_error: bool


@attrs.frozen(slots=True, kw_only=True)
class ApprovalRequested(RunEvent):
    """A ``needs_approval`` tool call waits for ``approvals.resolve(approval_id)``."""

    type: ClassVar[Literal["approval.requested"]] = "approval.requested"
    approval_id: str
    call: ToolCall


@attrs.frozen(slots=True, kw_only=True)
class InputQueued(RunEvent):
    """Input was queued into the running turn (``enqueue``/``steer`` or a joining call)."""

    type: ClassVar[Literal["input.queued"]] = "input.queued"
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class InputApplied(RunEvent):
    """Queued input joined the conversation; the next model call sees it."""

    type: ClassVar[Literal["input.applied"]] = "input.applied"
    input: tuple[Message, ...]


@attrs.frozen(slots=True, kw_only=True)
class UsageEvent(RunEvent):
    """Usage of one model call (``usage``) and of the turn so far (``total``)."""

    type: ClassVar[Literal["usage"]] = "usage"
    usage: Usage
    total: Usage


def _same_error(a: BaseException, b: BaseException) -> bool:
    # Exceptions compare by identity; one that crossed a process (pickle) is a copy.
    if a is b:
        return True
    same_fields = getattr(a, "__dict__", None) == getattr(b, "__dict__", None)
    return type(a) is type(b) and a.args == b.args and same_fields


@attrs.frozen(slots=True, kw_only=True)
class RunFailed(RunEvent):
    """The run failed with ``error``; ``run.done`` follows. Two are equal when their errors
    have the same type, arguments and fields (as after a pickle round trip)."""

    type: ClassVar[Literal["error"]] = "error"
    error: BaseException = attrs.field(eq=attrs.cmp_using(eq=_same_error), hash=False)


@attrs.frozen(slots=True, kw_only=True)
class RunDone(RunEvent):
    """Always the last event; ``result`` is None when ``finish_reason == "error"``."""

    type: ClassVar[Literal["run.done"]] = "run.done"
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

    type: ClassVar[Literal["compaction.start"]] = "compaction.start"
    messages_before: int


@attrs.frozen(slots=True, kw_only=True)
class CompactionDone(SessionEvent):
    """Compaction finished: ``messages_before`` became ``messages_after``."""

    type: ClassVar[Literal["compaction.done"]] = "compaction.done"
    messages_before: int
    messages_after: int


@attrs.frozen(slots=True, kw_only=True)
class ContextCleared(SessionEvent):
    """``clear()`` emptied the transcript."""

    type: ClassVar[Literal["context.cleared"]] = "context.cleared"


ListenerEvent: TypeAlias = CompactionStart | CompactionDone | ContextCleared
"""What a session listener (``session.on``) receives; ``event.type`` narrows it."""

Event: TypeAlias = (
    RunStart
    | StepStart
    | StepReset
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
"""What iterating a run yields; ``event.type == "text.delta"`` narrows it to :class:`TextDelta`."""


def event_id(event: RunEvent) -> str:
    """The server-sent-events id of a run event: ``"<turn_id>:<seq>"``."""
    return f"{event.turn_id}:{event.seq}"


def parse_event_id(text: str) -> tuple[str, int]:
    """``(turn_id, seq)`` of an id made by :func:`event_id`; InvalidInputError when ``text``
    is not one."""
    if not isinstance(text, str):
        raise InvalidInputError(
            f"an event id is a str \"<turn_id>:<seq>\"; got {type(text).__name__}"
        )
    turn_id, sep, seq = text.rpartition(":")
    if not sep or not turn_id or not seq.isascii() or not seq.isdigit() or len(seq) > 18:
        raise InvalidInputError(
            f"invalid event id {text[:80]!r}: an event id is \"<turn_id>:<seq>\" with seq a "
            "number >= 0 (as event_id() makes it)"
        )
    return turn_id, int(seq)
