"""The data of one turn: the agent-wide :class:`TurnConfig` and the mutable
:class:`TurnState` a checkpoint records. The running turn that works on them is
:class:`lousho_sync.executor.Turn`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .limits import Limits, Price
from .messages import Message, Usage
from .providers.base import Provider, ToolSpec
from .records import ApprovalRecord, Checkpoint, now
from .tools import Tool

__all__ = ["ApproveCallback", "TurnConfig", "TurnState", "configured_model"]

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
