"""AsyncAgentRun: a turn's handle for asyncio — ``async for`` its events,
``await run.result()``, ``abort()``, ``enqueue()``, ``steer()``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

from lousho_sync.errors import RunConsumedError, RunTimeoutError
from lousho_sync.events import Event, TextDelta
from lousho_sync.inputs import InputLike
from lousho_sync.results import ExecutionResult
from lousho_sync.run import AgentRun

from . import _bridge

__all__ = ["AsyncAgentRun", "DeferredRun"]


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
    def turn_id(self) -> str:
        """The id of the turn this run reads (what ``attach()`` takes)."""
        return self._run.turn_id

    @property
    def detached(self) -> bool:
        """True for a run of ``start()``/``attach()``: leaving its loop (or cancelling the
        reading task) leaves the turn running."""
        return self._run.detached

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
        detached = self._run.detached
        self._pump = _bridge.EventPump(
            self._run, abort=(lambda _: None) if detached else self._run.abort,
            leave=self._run.leave, ahead=_text)
        return _Reader(self._pump)

    async def result(self, timeout: float | None = None) -> ExecutionResult:
        """Wait for the end of the run and return its result (raise its error).

        When nobody reads the events, the run is driven in the pool (its events are
        discarded); when they are read, the reader never blocks this wait. ``timeout``
        raises TimeoutError (the run goes on); cancelling the awaiting task aborts the run.
        """
        if self._run.detached:
            run = self._run
            waiting = _bridge.start(lambda: run.result(timeout))
            await _bridge.wait(waiting, timeout=None, on_cancel=lambda: None)
            return waiting.result()
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


class DeferredRun(AgentRun):
    """A sync run made by ``make`` the first time it is needed, in the thread that needs it
    (the pool, for ``async for`` and ``await result()``): ``AsyncSession.attach`` reads the
    store there, never on the event loop. Errors of ``make`` (``TurnNotFoundError``) are
    raised where the run is first read, and again on each later use."""

    def __init__(self, make: Callable[[], AgentRun], turn_id: str | None) -> None:
        # AgentRun's own state is not used: this handle drives nothing.
        self._make = make
        self._given = turn_id
        self._made: AgentRun | None = None
        self._make_lock = threading.Lock()

    def _get(self) -> AgentRun:
        with self._make_lock:
            if self._made is None:
                self._made = self._make()
            return self._made

    def resolve(self) -> None:
        """Make the run now (blocking: call it in the pool); raises what ``make`` raises."""
        self._get()

    @property
    def run_id(self) -> str:
        """The turn's id (read from the store first when it was not given)."""
        if self._made is None and self._given is not None:
            return self._given
        return self._get().run_id

    @property
    def turn_id(self) -> str:
        """The turn's id (read from the store first when it was not given)."""
        return self.run_id

    @property
    def detached(self) -> bool:
        """True: leaving this run's loop leaves the turn running."""
        return True

    @property
    def done(self) -> bool:
        """True once the run was read and its turn ended."""
        return self._made is not None and self._made.done

    def __iter__(self) -> Generator[Any, None, None]:
        yield from self._get()

    def result(self, timeout: float | None = None) -> ExecutionResult:
        """The made run's result (see ``AgentRun.result``)."""
        return self._get().result(timeout)

    def abort(self, reason: object = None) -> None:
        """Abort the turn when this process drives it."""
        self._get().abort(reason)

    def enqueue(self, input: InputLike) -> bool:
        """See ``AgentRun.enqueue``."""
        return self._get().enqueue(input)

    def steer(self, input: InputLike) -> bool:
        """See ``AgentRun.steer``."""
        return self._get().steer(input)

    def leave(self) -> None:
        """Nothing to do: leaving a reader's loop never aborts a detached turn."""

    def __del__(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<DeferredRun {self._given or '(latest turn)'}>"
