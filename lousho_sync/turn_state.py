"""The data of one turn: the agent-wide :class:`TurnConfig`, the per-turn
:class:`TurnEnv`, the mutable :class:`TurnState` a checkpoint records, and the small pieces
the step loop and the tool calls share (events, checkpoint writes, results)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from . import _loop, _otel
from ._writes import TurnWriter
from .control import TurnControl
from .events import RunEvent
from .limits import Counters, Limits, Price
from .messages import Message, Usage
from .providers.base import Provider, ToolSpec
from .records import ApprovalRecord, Checkpoint, now
from .results import ExecutionResult
from .tools import Tool

__all__ = [
    "ApproveCallback",
    "Emit",
    "TurnAborted",
    "TurnConfig",
    "TurnEnv",
    "TurnState",
    "cost_required",
    "result_of",
    "save",
]

ApproveCallback = Callable[[ApprovalRecord], bool]


@attrs.frozen(slots=True, kw_only=True)
class TurnConfig:
    """What every turn of an agent shares: built once by the agent, never changed."""

    provider: Provider
    system: str | None = None
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    tool_specs: tuple[ToolSpec, ...] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    limits: Limits | None = None
    prices: Mapping[str, Price] | None = None
    approval_ttl_s: float | None = None
    """How long an approval request waits before it is denied as expired (None: forever),
    for tools that do not set their own."""
    on_approval_requested: Callable[[ApprovalRecord], object] | None = None
    """Told of each approval request once it is durable (the turn's pause is saved)."""
    async_tools: tuple[str, ...] = attrs.field(
        default=attrs.Factory(
            lambda self: tuple(n for n, t in self.tools.items() if t.is_async), takes_self=True
        ),
        init=False,
    )
    """The ``async def`` tools, which run only where lousho_aio named an event loop."""
    model: str | None = attrs.field(
        default=attrs.Factory(lambda self: configured_model(self.provider), takes_self=True),
        init=False,
    )
    """The model the provider was configured with (its ``model``), for prices."""


def configured_model(provider: object) -> str | None:
    """``provider.model`` when it is a non-empty str (the built-in providers have one)."""
    model = getattr(provider, "model", None)
    return model if isinstance(model, str) and model else None


@attrs.frozen(slots=True, kw_only=True)
class TurnEnv:
    """What one turn adds to its agent's config: where it writes, how approvals are
    decided, and the session budget it counts against."""

    writer: TurnWriter
    approve: ApproveCallback | None = None
    session_limits: Limits | None = None
    session_used: Counters = Counters()
    durable: bool = True
    """False: write a checkpoint only to pause on an approval (runs nobody can resume)."""


def cost_required(cfg: TurnConfig, env: TurnEnv) -> bool:
    """Whether a cost limit is set (then every model call must have a known cost)."""
    return (cfg.limits is not None and cfg.limits.max_cost_usd is not None) or (
        env.session_limits is not None and env.session_limits.max_cost_usd is not None
    )


@attrs.define(slots=True, kw_only=True)
class TurnState:
    """The mutable state of one turn; what a checkpoint records."""

    run_id: str
    key: str | None
    session_id: str | None
    turn_index: int = 0
    input: tuple[Message, ...] = ()
    recorded: list[Message] = attrs.field(factory=list)
    started: list[str] = attrs.field(factory=list)
    pending_approvals: list[str] = attrs.field(factory=list)
    usage: Usage = Usage()
    created_at: float = attrs.field(factory=now)
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_checkpoint(cls, cp: Checkpoint) -> TurnState:
        """The state a checkpoint recorded."""
        return cls(
            run_id=cp.run_id,
            key=cp.key,
            session_id=cp.session_id,
            turn_index=cp.turn_index,
            input=cp.input,
            recorded=list(cp.recorded),
            started=list(cp.started_call_ids),
            pending_approvals=list(cp.pending_approval_ids),
            usage=cp.usage,
            created_at=cp.created_at,
            extra=cp.extra,
        )

    def checkpoint(self, status: str, queued: Sequence[Message]) -> Checkpoint:
        """A checkpoint of this state."""
        assert self.key is not None
        return Checkpoint(
            key=self.key,
            session_id=self.session_id,
            run_id=self.run_id,
            turn_index=self.turn_index,
            input=self.input,
            recorded=tuple(self.recorded),
            started_call_ids=tuple(self.started),
            queued_inputs=tuple(queued),
            pending_approval_ids=tuple(self.pending_approvals),
            usage=self.usage,
            status=status,  # type: ignore[arg-type]
            created_at=self.created_at,
            updated_at=now(),
            extra=self.extra,
        )

    def counters(self) -> Counters:
        """Steps, tool calls and usage of the turn so far (derived from ``recorded``)."""
        steps = sum(1 for m in self.recorded if m.role == "assistant")
        tools = sum(1 for m in self.recorded if m.role == "tool")
        return Counters(steps, tools, self.usage)


class TurnAborted(Exception):
    """Raised inside the step loop when the turn's signal is aborted."""


def save(env: TurnEnv, state: TurnState, ctl: TurnControl, status: str) -> None:
    """Write the turn's checkpoint with ``status`` (only an approval pause when the turn
    is not durable)."""
    if not env.durable and status != "awaiting-approval":
        return
    writer = env.writer
    if writer.checkpoints is not None and state.key is not None:
        if ctl.otel is _otel.OFF:
            writer.save(state.checkpoint(status, ctl.queued()))
        else:  # tracing or DEBUG logging (issue 18)
            with ctl.otel.checkpoint(status):
                writer.save(state.checkpoint(status, ctl.queued()))


class Emit:
    """Builds the run's events, or none when nobody can read them (``emit=False``)."""

    __slots__ = ("_ctl", "_emit", "_run_id")

    def __init__(self, ctl: TurnControl, emit: bool) -> None:
        self._ctl = ctl
        self._run_id = ctl.run_id
        self._emit = emit

    def __call__(self, cls: Callable[..., RunEvent], **fields: Any) -> tuple[RunEvent, ...]:
        if not self._emit:
            return ()
        return (cls(run_id=self._run_id, seq=self._ctl.next_seq(), **fields),)


def result_of(
    state: TurnState,
    ctl: TurnControl,
    finish: str,
    *,
    messages: tuple[Message, ...] | None = None,
    exceeded: str | None = None,
) -> ExecutionResult:
    """The turn's result as it stands, ending with ``finish``."""
    msgs = (*state.input, *state.recorded) if messages is None else messages
    approvals = tuple(state.pending_approvals) if finish == "awaiting-approval" else ()
    return ExecutionResult(
        text=_loop.final_text(msgs),
        finish_reason=finish,
        messages=msgs,
        usage=state.usage,
        steps=sum(1 for m in state.recorded if m.role == "assistant"),
        run_id=ctl.run_id,
        approval_id=approvals[0] if approvals else None,
        approval_ids=approvals,
        exceeded=exceeded,
    )
