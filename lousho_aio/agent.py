"""create_agent, AsyncAgent and the approvals front, for asyncio."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from lousho_sync import agent as _sync_agent
from lousho_sync.agent import Agent, Approvals
from lousho_sync.approvals import ApprovalPage
from lousho_sync.compaction import Compaction
from lousho_sync.inputs import InputLike
from lousho_sync.limits import Limits, Price
from lousho_sync.providers.base import Provider
from lousho_sync.results import ExecutionResult
from lousho_sync.session import TurnPolicy
from lousho_sync.signal import Signal
from lousho_sync.stores.base import ApprovalRecord, ApprovalStore, CheckpointStore
from lousho_sync.stores.bundle import AnyStore
from lousho_sync.tools import Tool

from . import _bridge
from .run import AsyncAgentRun
from .session import AsyncApproveCallback, AsyncSession, drive

__all__ = ["AsyncAgent", "AsyncApprovals", "create_agent"]


class AsyncAgent:
    """An agent for asyncio (wraps a sync :class:`~lousho_sync.agent.Agent`).

    Coroutines run the blocking core in lousho_aio's pool; cancelling the awaiting task
    aborts the turn. Safe to share between tasks and threads.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._approvals = AsyncApprovals(agent.approvals)

    @property
    def sync(self) -> Agent:
        """The wrapped sync agent."""
        return self._agent

    @property
    def approvals(self) -> AsyncApprovals:
        """Resolve, list and get approval records."""
        return self._approvals

    @property
    def provider(self) -> Provider:
        """The provider."""
        return self._agent.provider

    @property
    def instructions(self) -> str | None:
        """The system prompt (with project instructions appended)."""
        return self._agent.instructions

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools by name."""
        return self._agent.tools

    @property
    def limits(self) -> Limits | None:
        """Per-turn budgets."""
        return self._agent.limits

    @property
    def prices(self) -> dict[str, Price] | None:
        """Price table overrides."""
        return self._agent.prices

    @property
    def compaction(self) -> Compaction | None:
        """The automatic compaction policy."""
        return self._agent.compaction

    @property
    def store(self) -> AnyStore | None:
        """The store given to ``create_agent`` (None: each session keeps its own)."""
        return self._agent.store

    @property
    def approval_ttl_s(self) -> float | None:
        """How long an approval request waits before it is denied as expired."""
        return self._agent.approval_ttl_s

    @property
    def on_approval_requested(self) -> Callable[[ApprovalRecord], object] | None:
        """Told of each approval request once it is durable."""
        return self._agent.on_approval_requested

    @property
    def settings(self) -> Mapping[str, Any]:
        """Provider settings passed through."""
        return self._agent.settings

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """The agent's checkpoint store."""
        return self._agent.checkpoint_store

    @property
    def approval_store(self) -> ApprovalStore:
        """The agent's approval store."""
        return self._agent.approval_store

    async def send(
        self,
        input: InputLike,
        *,
        signal: Signal | None = None,
        session_id: str | None = None,
        approve: AsyncApproveCallback | None = None,
    ) -> ExecutionResult:
        """A single turn from an empty history (``session_id`` makes it durable)."""
        if approve is None:
            with _bridge.as_current_task():
                run = self._agent.stream(input, signal=signal, session_id=session_id)
            return await drive(run)
        return await _bridge.call_aborting(
            self._agent.send, input, signal=signal, session_id=session_id,
            approve=_bridge.to_thread_callback(approve),
        )

    def stream(
        self, input: InputLike, *, signal: Signal | None = None, session_id: str | None = None
    ) -> AsyncAgentRun:
        """``send()`` as an :class:`AsyncAgentRun` of typed events."""
        with _bridge.as_current_task():
            return AsyncAgentRun(self._agent.stream(input, signal=signal, session_id=session_id))

    def session(
        self,
        id: str | None = None,
        *,
        store: AnyStore | None = None,
        checkpoint_store: CheckpointStore | None = None,
        turn_policy: TurnPolicy = "wait",
        limits: Limits | None = None,
        lease_ttl_s: float | None = None,
        idempotency_ttl_s: float | None = None,
    ) -> AsyncSession:
        """A multi-turn session (see ``Agent.session``); does no I/O."""
        return AsyncSession(
            self._agent.session(
                id, store=store, checkpoint_store=checkpoint_store, turn_policy=turn_policy,
                limits=limits, lease_ttl_s=lease_ttl_s, idempotency_ttl_s=idempotency_ttl_s,
            )
        )

    async def resume(self, id: str, *, signal: Signal | None = None) -> ExecutionResult | None:
        """Finish what ``id`` left unfinished (see ``Agent.resume``); None if nothing."""
        return await _bridge.call_aborting(self._agent.resume, id, signal=signal)

    def __repr__(self) -> str:
        return f"<AsyncAgent {self._agent!r}>"


class AsyncApprovals:
    """``agent.approvals`` for asyncio: resolve, list and get approval records."""

    def __init__(self, approvals: Approvals) -> None:
        self._approvals = approvals

    async def get(self, id: str) -> ApprovalRecord | None:
        """One record, or None."""
        return await _bridge.call(self._approvals.get, id)

    async def list(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        return await _bridge.call(self._approvals.list, session_id)

    async def page(
        self,
        status: Literal["pending"] = "pending",
        *,
        session_prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> ApprovalPage:
        """One page of the pending approvals of every session, newest first (see
        ``Approvals.page``)."""
        return await _bridge.call(self._approvals.page, status, session_prefix=session_prefix,
                                  limit=limit, cursor=cursor)

    async def resolve(
        self, *, id: str, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ExecutionResult | None:
        """Approve or deny, by ``by`` (see ``Approvals.resolve``); when it was the turn's
        last open approval the turn continues, and its result is returned. Cancelling the
        task waits for the continued turn to end (the sync call takes no signal)."""
        return await _bridge.call(
            self._approvals.resolve, id=id, approved=approved, reason=reason, by=by
        )


def create_agent(
    *,
    instructions: str | None = None,
    provider: Provider | None = None,
    model: str | None = None,
    tools: Iterable[Tool] = (),
    store: AnyStore | None = None,
    approval_store: ApprovalStore | None = None,
    limits: Limits | None = None,
    prices: Mapping[str, Price] | None = None,
    project_instructions: bool | str | Path = False,
    compaction: Compaction | None = None,
    settings: Mapping[str, Any] | None = None,
    approval_ttl_s: float | None = None,
    on_approval_requested: Callable[[ApprovalRecord], object] | None = None,
) -> AsyncAgent:
    """Build an :class:`AsyncAgent` (same parameters as ``lousho_sync.create_agent``;
    ``on_approval_requested`` is a plain function, called on a worker thread)."""
    return AsyncAgent(
        _sync_agent.create_agent(
            instructions=instructions, provider=provider, model=model, tools=tools,
            store=store, approval_store=approval_store, limits=limits, prices=prices,
            project_instructions=project_instructions, compaction=compaction,
            settings=settings, approval_ttl_s=approval_ttl_s,
            on_approval_requested=on_approval_requested,
        )
    )
