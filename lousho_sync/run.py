"""AgentRun: a turn's handle — iterate it for events, ``result()``, ``abort()``,
``enqueue()``, ``steer()``.

The run is driven by whoever pulls it: iterating it runs the turn in the consumer's thread,
one event at a time, so the buffer between producer and consumer holds at most the events
of the moment (the terminal ``error`` + ``run.done`` pair at most: two). A slow consumer
slows the model stream and loses no event. ``result()`` drives the run itself when nobody is
iterating (discarding the events), so it never deadlocks.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import cast

from .control import TurnControl
from .errors import RunConsumedError, RunTimeoutError
from .events import Event, RunDone, RunEvent, RunFailed
from .inputs import InputLike, to_messages
from .results import ExecutionResult
from .signal import Latch

__all__ = ["AgentRun"]

_log = logging.getLogger(__name__)

Driver = Generator[RunEvent, None, ExecutionResult]
_Events = Generator[Event, None, ExecutionResult]  # every RunEvent the executor yields is one
DriverFactory = Callable[[bool], Driver]
"""Starts the turn's driver; its argument says whether anyone will read the events (when
False the driver builds none and yields nothing)."""


class AgentRun:
    """A running turn.

    Thread-safe: ``_drive_lock`` serialises pulling the turn forward; ``_lock`` guards the
    iteration bookkeeping; ``abort``/``enqueue``/``steer`` may be called from any thread.
    """

    def __init__(
        self,
        driver: DriverFactory,
        control: TurnControl,
        *,
        on_discard: Callable[[], None] | None = None,
    ) -> None:
        self._factory = driver
        self._driver: _Events | None = None
        self._quiet = False
        self._control = control
        self._on_discard = on_discard
        self._lock = threading.Lock()
        self._drive_lock = threading.Lock()
        self._done = Latch()
        self._pending: deque[Event] = deque()
        self._result: ExecutionResult | None = None
        self._error: BaseException | None = None
        self._started = False
        self._iterating_thread: int | None = None
        self._iter_closed = False
        self._finished = False
        self._background: threading.Thread | None = None

    @property
    def run_id(self) -> str:
        """The id every event of this run carries."""
        return self._control.run_id

    @property
    def turn_id(self) -> str:
        """The id of the turn this run reads (what ``Session.attach()`` takes)."""
        return self.run_id

    @property
    def detached(self) -> bool:
        """True for a run of ``Session.start()``/``attach()``: its events come from the
        event log and leaving its loop leaves the turn running."""
        return False

    @property
    def done(self) -> bool:
        """True once the run has ended (``result()`` will not block)."""
        return self._done.is_set()

    # --- driving ------------------------------------------------------------------------
    def _pull(self) -> Event | None:
        """Next event, or None when the run is over. Caller holds ``_drive_lock``."""
        if self._pending:
            return self._pending.popleft()
        if self._finished:
            return None
        self._started = True
        try:
            if self._driver is None:
                self._driver = cast(_Events, self._factory(not self._quiet))
            return next(self._driver)
        except StopIteration as stop:
            result: ExecutionResult = stop.value
            self._result = result
            if self._quiet:
                self._finish()
                return None
            done = RunDone(
                run_id=self.run_id,
                seq=self._control.next_seq(),
                finish_reason=result.finish_reason,
                result=result,
            )
        except BaseException as exc:
            self._error = exc
            failed = RunFailed(run_id=self.run_id, seq=self._control.next_seq(), error=exc)
            self._pending.append(
                RunDone(
                    run_id=self.run_id,
                    seq=self._control.next_seq(),
                    finish_reason="error",
                    result=None,
                )
            )
            self._finish()
            return failed
        self._finish()
        return done

    def _finish(self) -> None:
        self._finished = True
        self._done.set()

    def _drain(self) -> None:
        with self._drive_lock:
            while self._pull() is not None:
                pass

    # --- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        self._claim()
        return self._events()

    def _claim(self) -> None:
        """Take the run's events for this thread (RunConsumedError when taken already)."""
        with self._lock:
            if self._iterating_thread is not None:
                raise RunConsumedError(
                    f"run {self.run_id} was already consumed (iterated, or driven by "
                    "result()); its events can be read only once"
                )
            self._iterating_thread = threading.get_ident()

    def _events(self) -> Generator[Event, None, None]:
        complete = False
        try:
            while True:
                with self._drive_lock:
                    event = self._pull()
                if event is None:
                    complete = True
                    return
                yield event
        finally:
            with self._lock:
                self._iter_closed = True
            if not complete and not self._done.is_set():
                self.leave()
                self._drain()

    def _pump(self, sink: Callable[[Event], None]) -> None:
        """Drive the run to its end in this thread, handing each event to ``sink`` (a
        detached turn's driver: one hold of ``_drive_lock`` for the run, no generator of
        ours per event). The run counts as iterated."""
        self._claim()
        with self._drive_lock:
            pull = self._pull
            while (event := pull()) is not None:
                sink(event)
        with self._lock:
            self._iter_closed = True

    # --- result -------------------------------------------------------------------------------
    def result(self, timeout: float | None = None) -> ExecutionResult:
        """Wait for the end of the run and return its result (raise its error).

        Works whether or not the events were iterated; when nobody is iterating, the run is
        driven here (its events are discarded). ``timeout`` raises TimeoutError (the run
        goes on); a TimeoutError, RunTimeoutError.
        """
        if not self._done.is_set():
            with self._lock:
                me = threading.get_ident()
                drive_here = (
                    self._iterating_thread is None
                    or self._iter_closed
                    or self._iterating_thread == me
                )
                if drive_here and self._iterating_thread is None:
                    self._iterating_thread = me
                    self._iter_closed = True
                    self._quiet = True  # nobody can read the events any more
            if drive_here:
                if timeout is None:
                    self._drain()
                else:
                    self._drive_in_background()
            if not self._done.wait(timeout):
                raise RunTimeoutError(f"run {self.run_id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _drive_in_background(self) -> None:
        with self._lock:
            if self._background is None:
                self._background = threading.Thread(
                    target=self._drain, name=f"lousho-run-{self.run_id[:8]}", daemon=True
                )
                self._background.start()

    # --- control ----------------------------------------------------------------------------
    def abort(self, reason: object = None) -> None:
        """Abort the turn (the transcript stays as it was); idempotent, any thread."""
        self._control.abort("aborted" if reason is None else reason)

    def leave(self) -> None:
        """Say the reader stopped reading (as leaving the ``for`` loop does): a run whose
        final answer was already streamed (its text ended, no tool call) finishes and is
        saved; one with anything left to do (a tool, another model call, more text) is
        aborted. Does not wait; any thread."""
        self._control.leave()

    def enqueue(self, input: InputLike) -> bool:
        """Add user input to the running turn: it is applied after the current step's tool
        results and the next model call sees it. False when the turn no longer takes input."""
        return self._control.offer(to_messages(input), steer=False)

    def steer(self, input: InputLike) -> bool:
        """Like ``enqueue``, but if the current model call has emitted nothing yet it is
        aborted and made again with the input, and the step's tool calls not yet started are
        skipped. False when the turn no longer takes input."""
        return self._control.offer(to_messages(input), steer=True)

    def __del__(self) -> None:
        try:
            if self._done.is_set():
                return
            if not self._started:
                self._control.abort("the run was discarded")
                if self._on_discard is not None:
                    self._on_discard()
                return
            if not self._drive_lock.locked():
                self._control.abort("the run was discarded")
                self._drain()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<AgentRun {self.run_id} {state}>"


