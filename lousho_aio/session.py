"""AsyncSession: a multi-turn conversation for asyncio (wraps a sync Session)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from lousho_sync.events import ListenerEvent
from lousho_sync.inputs import InputLike
from lousho_sync.limits import Limits
from lousho_sync.messages import Message
from lousho_sync.results import ExecutionResult, PendingTurn, TurnInfo
from lousho_sync.run import AgentRun
from lousho_sync.session import Session, TurnPolicy, check_attach_args
from lousho_sync.signal import Signal
from lousho_sync.stores.base import ApprovalRecord, ApprovalStore, CheckpointStore, SessionStore

from . import _bridge
from .run import AsyncAgentRun, DeferredRun

__all__ = ["AsyncApproveCallback", "AsyncSession"]

AsyncApproveCallback = Callable[[ApprovalRecord], bool | Awaitable[bool]]
"""An ``approve=`` callback: a plain function (run in the worker thread) or an async one
(run on the caller's event loop)."""


async def drive(run: AgentRun) -> ExecutionResult:
    """Drive ``run`` to its end in the pool; cancelling the awaiting task aborts it."""
    return await _bridge.call(run.result, on_cancel=lambda: run.abort("cancelled"))


class AsyncSession:
    """A multi-turn conversation. Create it with ``agent.session()``.

    Every coroutine runs the blocking sync call in lousho_aio's pool; cancelling the awaiting
    task aborts a turn (the transcript stays as it was) and waits for its thread to finish
    before ``CancelledError`` propagates. Safe to use from several tasks (and threads): the
    sync session queues the turns.
    """

    def __init__(self, session: Session) -> None:
        self._session = session

    # --- plain members ---------------------------------------------------------------------
    @property
    def sync(self) -> Session:
        """The wrapped sync session."""
        return self._session

    @property
    def id(self) -> str:
        """The session id."""
        return self._session.id

    @property
    def store(self) -> SessionStore:
        """The session store holding the transcript."""
        return self._session.store

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """Where this session's turns are checkpointed."""
        return self._session.checkpoint_store

    @property
    def approval_store(self) -> ApprovalStore | None:
        """Where this session's approvals are kept."""
        return self._session.approval_store

    @property
    def turn_policy(self) -> TurnPolicy:
        """What a call does while a turn runs (see SPEC §3)."""
        return self._session.turn_policy

    @turn_policy.setter
    def turn_policy(self, value: TurnPolicy) -> None:
        self._session.turn_policy = value

    @property
    def limits(self) -> Limits | None:
        """Session budgets (counted across turns)."""
        return self._session.limits

    @limits.setter
    def limits(self, value: Limits | None) -> None:
        self._session.limits = value

    @property
    def idempotency_ttl_s(self) -> float:
        """How long a used ``idempotency_key`` starts no second turn (seconds)."""
        return self._session.idempotency_ttl_s

    @property
    def messages(self) -> tuple[Message, ...]:
        """A read-only snapshot of the transcript. The first access of a session never
        loaded reads the store in the calling thread: ``await load()`` first to avoid it."""
        return self._session.messages

    def on(self, listener: Callable[[ListenerEvent], object]) -> Callable[[], None]:
        """Listen for ``compaction.*`` and ``context.cleared`` events (the listener runs in
        the thread that emits them: a pool thread); returns a remover."""
        return self._session.on(listener)

    # --- turns -------------------------------------------------------------------------------
    async def send(
        self,
        input: InputLike,
        *,
        signal: Signal | None = None,
        approve: AsyncApproveCallback | None = None,
        idempotency_key: str | None = None,
    ) -> ExecutionResult:
        """One turn with the whole transcript. The turn joins the session's queue when
        ``send()`` is called (with ``approve``: when its pool thread starts).
        ``idempotency_key``: as for the sync ``Session.send``."""
        if approve is None:
            with _bridge.as_current_task():
                run = self._session.stream(input, signal=signal,
                                           idempotency_key=idempotency_key)
            return await drive(run)
        return await _bridge.call_aborting(
            self._session.send, input, signal=signal,
            approve=_bridge.to_thread_callback(approve), idempotency_key=idempotency_key,
        )

    def stream(
        self, input: InputLike, *, signal: Signal | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncAgentRun:
        """The same turn as an :class:`AsyncAgentRun`; it joins the queue now
        (``idempotency_key``: as for the sync ``Session.stream``)."""
        with _bridge.as_current_task():
            return AsyncAgentRun(self._session.stream(input, signal=signal,
                                                      idempotency_key=idempotency_key))

    async def start(
        self, input: InputLike, *, signal: Signal | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncAgentRun:
        """Start the turn detached (see ``Session.start``): it runs to its end in the pool
        whether or not anyone reads it; ``async for`` reads its events live."""
        run = await _bridge.call(self._session.start, input, signal=signal,
                                 idempotency_key=idempotency_key)
        return AsyncAgentRun(run)

    def attach(
        self, turn_id: str | None = None, *, after: int = -1, takeover: bool = True
    ) -> AsyncAgentRun:
        """A read-only run of a detached turn's events with ``seq > after`` (see
        ``Session.attach``, also for ``takeover``); ``async for`` it. The store is read in
        the pool when the run is first read (``TurnNotFoundError`` is raised there), never
        on the event loop."""
        check_attach_args(turn_id, after)
        session = self._session
        return AsyncAgentRun(DeferredRun(
            lambda: session.attach(turn_id, after=after, takeover=takeover), turn_id))

    async def abort_turn(self, reason: object = None, *, turn_id: str | None = None) -> bool:
        """Abort the running (or named) turn from any process (see ``Session.abort_turn``)."""
        return await _bridge.call(self._session.abort_turn, reason, turn_id=turn_id)

    async def current_turn(self) -> TurnInfo | None:
        """The session's unfinished detached turn (see ``Session.current_turn``)."""
        return await _bridge.call(self._session.current_turn)

    @property
    def event_ttl_s(self) -> float:
        """How long a detached turn's events are kept after its end (seconds)."""
        return self._session.event_ttl_s

    @event_ttl_s.setter
    def event_ttl_s(self, value: float) -> None:
        self._session.event_ttl_s = value

    @property
    def event_interval_s(self) -> float:
        """At most one event-log write of text deltas per this many seconds of a turn."""
        return self._session.event_interval_s

    @event_interval_s.setter
    def event_interval_s(self, value: float) -> None:
        self._session.event_interval_s = value

    @property
    def event_live_interval_s(self) -> float:
        """On Redis and PostgreSQL, while a reader in another process watches the turn: at
        most one live send per this many seconds of the events that wait for their write."""
        return self._session.event_live_interval_s

    @event_live_interval_s.setter
    def event_live_interval_s(self, value: float) -> None:
        self._session.event_live_interval_s = value

    async def resume(self, *, signal: Signal | None = None) -> ExecutionResult | None:
        """Finish the interrupted turn; None when nothing pends."""
        return await _bridge.call_aborting(self._session.resume, signal=signal)

    # --- transcript --------------------------------------------------------------------------
    async def load(self) -> tuple[Message, ...]:
        """Read the stored transcript; returns it."""
        return await _bridge.call(self._session.load)

    async def compact(
        self, *, keep_last: int = 8, instructions: str | None = None,
        signal: Signal | None = None,
    ) -> bool:
        """Replace older messages with one summary written by the model (True when the
        transcript changed); cancelling the task (or ``signal``) aborts the summary call
        (the transcript stays as it was)."""
        return await _bridge.call_aborting(
            self._session.compact, keep_last=keep_last, instructions=instructions,
            signal=signal,
        )

    def estimate_input_tokens(self, new_input: Sequence[Message] = ()) -> int:
        """Estimated input tokens of the next model call (see ``Session``)."""
        return self._session.estimate_input_tokens(new_input)

    async def clear(self, *, keep_metadata: bool = True) -> None:
        """Empty the transcript and save it empty (see ``Session.clear``)."""
        await _bridge.call(self._session.clear, keep_metadata=keep_metadata)

    async def delete(self) -> None:
        """Delete the session under its lease (see ``Session.delete``)."""
        await _bridge.call(self._session.delete)

    async def undo(self, turns: int = 1) -> tuple[Message, ...]:
        """Remove the last ``turns`` turns; the removed messages (see ``Session.undo``)."""
        return await _bridge.call(self._session.undo, turns)

    async def fork(self, new_id: str | None = None, *, at_turn: int | None = None
                   ) -> AsyncSession:
        """A new session holding a copy of this one (see ``Session.fork``)."""
        return AsyncSession(await _bridge.call(self._session.fork, new_id, at_turn=at_turn))

    @property
    def metadata(self) -> Awaitable[dict[str, Any]]:
        """``await session.metadata``: a copy of the session's metadata, read in the pool
        (``Session.metadata``)."""
        return _bridge.call(lambda: self._session.metadata)

    async def set_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata atomically (see ``Session.set_metadata``)."""
        await _bridge.call(self._session.set_metadata, metadata)

    async def history(self, *, include_compacted: bool = True) -> tuple[Message, ...]:
        """Every message committed, compacted ones included (see ``Session.history``)."""
        return await _bridge.call(self._session.history, include_compacted=include_compacted)

    async def pending(self) -> PendingTurn | None:
        """The unfinished turn, or None."""
        return await _bridge.call(self._session.pending)

    async def discard_pending(self) -> None:
        """Drop the unfinished turn (and deny its open approvals) without running it."""
        await _bridge.call(self._session.discard_pending)

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id!r} policy={self.turn_policy}>"
