"""AsyncAgentRun: a turn's handle for asyncio — ``async for`` its events,
``await run.result()``, ``abort()``, ``enqueue()``, ``steer()``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from lousho_sync.errors import RunConsumedError, RunTimeoutError
from lousho_sync.events import Event, TextDelta
from lousho_sync.inputs import InputLike
from lousho_sync.results import ExecutionResult
from lousho_sync.run import AgentRun

from . import _bridge

__all__ = ["AsyncAgentRun"]


class AsyncAgentRun:
    """A running turn (wraps a sync :class:`~lousho_sync.run.AgentRun`).

    ``async for`` reads its events once, through the event pump of :mod:`lousho_aio._bridge`
    (a bounded buffer of ``EVENT_BUFFER`` events); leaving the loop early or cancelling the
    task aborts the run. ``await result()`` works whether or not the events are read.
    Use it from one event loop; ``abort``/``enqueue``/``steer`` are safe from any thread.
    """

    def __init__(self, run: AgentRun) -> None:
        self._run = run
        self._pump: _bridge.EventPump[Event] | None = None
        self._driver: asyncio.Future[ExecutionResult] | None = None

    @property
    def sync(self) -> AgentRun:
        """The wrapped sync run."""
        return self._run

    @property
    def run_id(self) -> str:
        """The id every event of this run carries."""
        return self._run.run_id

    @property
    def done(self) -> bool:
        """True once the run has ended (``result()`` will not wait)."""
        return self._run.done

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._pump is not None or self._driver is not None:
            raise RunConsumedError(
                f"run {self.run_id} is already being read (iterate an AsyncAgentRun once, "
                "before awaiting result())"
            )
        self._pump = _bridge.EventPump(self._run, abort=self._run.abort, leave=self._run.leave,
                                       ahead=_text)
        return _Reader(self._pump)

    async def result(self, timeout: float | None = None) -> ExecutionResult:
        """Wait for the end of the run and return its result (raise its error).

        When nobody reads the events, the run is driven in the pool (its events are
        discarded); when they are read, the reader never blocks this wait. ``timeout``
        raises TimeoutError (the run goes on); cancelling the awaiting task aborts the run.
        """
        if not self._run.done:
            fut: asyncio.Future[Any]
            if self._pump is not None:
                self._pump.unbound()
                fut = self._pump.start()
            else:
                if self._driver is None:
                    self._driver = _bridge.start(self._run.result)
                fut = self._driver
            if not await _bridge.wait(
                fut, timeout=timeout, on_cancel=lambda: self._run.abort("cancelled")
            ):
                raise RunTimeoutError(f"run {self.run_id} did not finish within {timeout} s")
        return self._run.result(timeout=0)

    def abort(self, reason: object = None) -> None:
        """Abort the turn (the transcript stays as it was); idempotent, any thread."""
        self._run.abort(reason)

    def leave(self) -> None:
        """Say the reader stopped reading (see ``AgentRun.leave``)."""
        self._run.leave()

    def enqueue(self, input: InputLike) -> bool:
        """Add user input to the running turn (see ``AgentRun.enqueue``); False when the turn
        no longer takes input."""
        return self._run.enqueue(input)

    def steer(self, input: InputLike) -> bool:
        """Redirect the running turn (see ``AgentRun.steer``); False when the turn no longer
        takes input."""
        return self._run.steer(input)

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<AsyncAgentRun {self.run_id} {state}>"


def _text(event: Event) -> bool:
    """Whether the pump may read on past ``event`` before the reader took it: only a text
    delta (more of the same model answer); past anything else the turn may run a tool or
    call the model, which a sync run does only when its reader asks for the next event."""
    return type(event) is TextDelta


class _Reader:
    """The ``async for`` iterator of a run. Leaving the loop drops it at once (CPython frees
    it on ``break``), which tells the run its reader left before anything else can drive
    it — as a sync reader's ``break`` does; the pump's own clean-up follows later."""

    __slots__ = ("_events", "_pump")

    def __init__(self, pump: _bridge.EventPump[Event]) -> None:
        self._pump = pump
        self._events = pump.events()

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Stop reading (as leaving the loop does) and wait for the run to settle."""
        await self._events.aclose()

    def __del__(self) -> None:
        self._pump.left()
