"""Detached turns (``Session.start``) and readers of a turn's event log
(``Session.attach``).

A started turn is the same turn ``stream()`` makes — the same queue, policy, lease and
commit — driven to its end by a background thread of this process, which writes each event
to the store's event log (:mod:`lousho_sync._eventlog`). Its handle, and any attached
handle in any process sharing the store, read the events back from the log, so every
reader sees the same events with the same seqs; leaving a reader's loop leaves the turn
running.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator

import attrs

from ._eventlog import EventLog, Publisher, spawn
from .errors import LoushoError, RunConsumedError, RunTimeoutError, StoreUnavailableError
from .events import Event, RunDone, RunEvent, RunFailed, StepReset, TextDelta
from .inputs import InputLike
from .results import ExecutionResult
from .run import AgentRun
from .signal import Latch
from .stores._events import TurnHead

__all__ = ["AttachedRun", "StartedRun", "local_run", "take_over"]

_log = logging.getLogger(__name__)

_running: weakref.WeakValueDictionary[str, StartedRun] = weakref.WeakValueDictionary()
_running_lock = threading.Lock()


def local_run(turn_id: str) -> StartedRun | None:
    """The started run of ``turn_id`` when this process drives it."""
    with _running_lock:
        return _running.get(turn_id)


class _LogReader(AgentRun):
    """An AgentRun whose events are read from the event log (iterated once)."""

    def __init__(self, log: EventLog, turn_id: str, after: int) -> None:
        # AgentRun's own state is not used: this handle drives nothing.
        self._log_ = log
        self._turn_id = turn_id
        self._after = after
        self._iterated = False
        self._it_lock = threading.Lock()

    @property
    def run_id(self) -> str:
        """The turn's id (every event carries it)."""
        return self._turn_id

    @property
    def turn_id(self) -> str:
        """The turn's id (every event carries it)."""
        return self._turn_id

    @property
    def detached(self) -> bool:
        """True: leaving this run's loop leaves the turn running."""
        return True

    def __iter__(self) -> Iterator[Event]:
        with self._it_lock:
            if self._iterated:
                raise RunConsumedError(
                    f"run {self._turn_id} was already iterated; attach() again with the last "
                    "seq you read to read on"
                )
            self._iterated = True
        local = local_run(self._turn_id)
        if local is not None:  # driven here: its events as objects, at once
            return local._publisher.follow(self._after)
        return self._log_.follow(self._turn_id, self._after, idle=self._idle)

    def _idle(self, head: TurnHead) -> bool:
        return False

    def _end_from_log(self, timeout: float | None) -> ExecutionResult:
        """Wait for the turn's ``run.done`` in the log; its result (raise its error)."""
        box: list[Event] = []
        done = threading.Event()

        def read() -> None:
            try:
                error: BaseException | None = None
                for event in self._log_.follow(self._turn_id, -1, live=False):
                    if isinstance(event, RunFailed):
                        error = event.error
                    elif isinstance(event, RunDone):
                        box.append(event)
                if error is not None:
                    box.append(RunFailed(run_id=self._turn_id, seq=-1, error=error))
            except BaseException as exc:  # TurnNotFoundError, a store error
                box.append(RunFailed(run_id=self._turn_id, seq=-1, error=exc))
            finally:
                done.set()

        if timeout is None:
            read()
        else:
            threading.Thread(target=read, daemon=True,
                             name=f"lousho-attach-{self._turn_id[:8]}").start()
            if not done.wait(timeout):
                raise RunTimeoutError(
                    f"run {self._turn_id} did not finish within {timeout} s")
        for event in box:
            if isinstance(event, RunFailed):
                raise event.error
        for event in box:
            if isinstance(event, RunDone) and event.result is not None:
                return event.result
        raise RunTimeoutError(f"run {self._turn_id} ended without a result in the event log")

    def leave(self) -> None:
        """Nothing to do: leaving a reader's loop never aborts a detached turn."""

    def __del__(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._turn_id}>"


class StartedRun(_LogReader):
    """The handle ``Session.start()`` returns: the turn runs in a background thread to its
    end whether or not this handle is read; ``abort()`` ends it."""

    def __init__(self, inner: AgentRun, log: EventLog, publisher: Publisher) -> None:
        super().__init__(log, inner.run_id, -1)
        self._inner = inner
        self._publisher = publisher
        self._ended = Latch()
        self._result: ExecutionResult | None = None
        self._error: BaseException | None = None
        with _running_lock:
            _running[inner.run_id] = self
        spawn(self._drive, f"lousho-turn-{inner.run_id[:8]}")

    def _drive(self) -> None:
        publisher = self._publisher
        try:
            self._inner._pump(publisher.publish)
        except BaseException as exc:  # pragma: no cover - the run turns failures into events
            _log.warning("detached turn %s failed outside its run", self._turn_id,
                         exc_info=True)
            self._error = exc
        finally:
            publisher.close()
            try:
                self._result = self._inner.result()
            except BaseException as exc:
                self._error = exc
            self._ended.set()

    @property
    def done(self) -> bool:
        """True once the turn has ended."""
        return self._ended.is_set()

    def result(self, timeout: float | None = None) -> ExecutionResult:
        """Wait for the end of the turn and return its result (raise its error);
        ``timeout`` raises RunTimeoutError (the turn goes on)."""
        if not self._ended.wait(timeout):
            raise RunTimeoutError(f"run {self._turn_id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def abort(self, reason: object = None) -> None:
        """Abort the turn (the transcript stays as it was); idempotent, any thread."""
        self._inner.abort(reason)

    def enqueue(self, input: InputLike) -> bool:
        """Add user input to the running turn (see :meth:`AgentRun.enqueue`)."""
        return self._inner.enqueue(input)

    def steer(self, input: InputLike) -> bool:
        """Steer the running turn (see :meth:`AgentRun.steer`)."""
        return self._inner.steer(input)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the background thread's turn; True when it ended."""
        return self._ended.wait(timeout)


class AttachedRun(_LogReader):
    """The read-only handle ``Session.attach()`` returns. ``abort`` reaches the turn in
    any process (as ``Session.abort_turn(turn_id=...)``); ``enqueue``/``steer`` reach it
    when this process drives it (else they return False)."""

    def __init__(self, log: EventLog, turn_id: str, after: int,
                 idle: Callable[[TurnHead], bool] | None = None,
                 abort_turn: Callable[[object, str], object] | None = None,
                 replay: bool = False) -> None:
        super().__init__(log, turn_id, after)
        self._on_idle = idle
        self._abort_turn = abort_turn
        self._replay = replay

    def _idle(self, head: TurnHead) -> bool:
        return self._on_idle is not None and self._on_idle(head)

    @property
    def done(self) -> bool:
        """True once the turn's last event is in the log."""
        local = local_run(self._turn_id)
        if local is not None:
            return local.done
        head = self._log_.head(self._turn_id)
        return head is None or head.ended_at is not None

    def result(self, timeout: float | None = None) -> ExecutionResult:
        """Wait for the end of the turn and return its result (raise its error); the run
        of a keyed ``start()`` that attached to its key's turn says ``replayed``."""
        local = local_run(self._turn_id)
        result = local.result(timeout) if local is not None else self._end_from_log(timeout)
        return attrs.evolve(result, replayed=True) if self._replay else result

    def abort(self, reason: object = None) -> None:
        """Abort the turn, whichever process drives it (the transcript stays as it was);
        another process's turn is asked through the session's mailbox, as
        ``Session.abort_turn(turn_id=...)`` does. Does nothing once the turn ended."""
        local = local_run(self._turn_id)
        if local is not None:
            local.abort(reason)
        elif self._abort_turn is not None:
            self._abort_turn(reason, self._turn_id)

    def enqueue(self, input: InputLike) -> bool:
        """Add input to the turn when this process drives it; else False."""
        local = local_run(self._turn_id)
        return local is not None and local.enqueue(input)

    def steer(self, input: InputLike) -> bool:
        """Steer the turn when this process drives it; else False."""
        local = local_run(self._turn_id)
        return local is not None and local.steer(input)


# --- takeover ----------------------------------------------------------------------------------
_taking: set[str] = set()


def take_over(
    head: TurnHead,
    log: EventLog,
    owner: str,
    driver: Callable[[], Generator[RunEvent, None, ExecutionResult | None]],
    committed: Callable[[TurnHead], ExecutionResult | None],
) -> None:
    """Resume the turn of ``head`` (its driver died) in a background thread of this process
    and write its events to the log after the ones there: ``step.reset`` first, then the
    resumed turn's. Another process that wins the session's lease first finishes it instead
    (then this one writes nothing). A turn committed before its driver wrote ``run.done``
    gets ``step.reset``, its last step's text and ``run.done`` from the transcript
    (``committed``)."""
    with _running_lock:
        if head.turn_id in _taking:
            return
        _taking.add(head.turn_id)
    threading.Thread(target=_take_over, args=(head, log, owner, driver, committed),
                     daemon=True, name=f"lousho-takeover-{head.turn_id[:8]}").start()


_BEGIN_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""The waits between tries of a takeover's first write to the log (the store may be away
for a moment: a server restarting): about 3 s in all."""


def _begin(log: EventLog, head: TurnHead, owner: str, seq: int) -> Publisher:
    """The log of ``head``'s turn begun by ``owner`` after ``seq``, tried again while the
    store is unreachable (:data:`_BEGIN_RETRY_S`)."""
    for delay in (*_BEGIN_RETRY_S, None):
        try:
            return log.begin(head.turn_id, head.session_id, owner,
                             started_at=head.started_at, last_seq=seq)
        except StoreUnavailableError:
            if delay is None:
                raise
            _log.info("the event log of turn %s cannot be written yet (the store is "
                      "unreachable); trying again in %.2f s", head.turn_id, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _take_over(
    head: TurnHead,
    log: EventLog,
    owner: str,
    driver: Callable[[], Generator[RunEvent, None, ExecutionResult | None]],
    committed: Callable[[TurnHead], ExecutionResult | None],
) -> None:
    turn_id = head.turn_id
    publisher: Publisher | None = None
    gen: Generator[RunEvent, None, ExecutionResult | None] | None = None
    seq = head.last_seq

    def publish(event: RunEvent) -> None:
        nonlocal publisher, seq
        if publisher is None:  # this process holds the turn's lease now: the log is its
            publisher = _begin(log, head, owner, seq)
            # a driver that lost its lease (stopped past it) may have written rows up to
            # the begin, which refuses its later ones: go on after them
            written = log.ops.read(turn_id, seq, 1 << 30)
            if written:
                seq = written[-1][0]
            seq = max(seq, log.sent_live(turn_id))  # readers may have seen those live
        seq += 1
        publisher.publish(attrs.evolve(event, run_id=turn_id, seq=seq))

    try:
        # the log may hold rows past its head's last_seq (a driver killed between the two
        # writes of a store that cannot make them one): go on after the last row
        beyond = log.ops.read(turn_id, head.last_seq, 1 << 30)
        if beyond:
            head = attrs.evolve(head, last_seq=beyond[-1][0])
        seq = head.last_seq
        gen = driver()
        try:
            while True:
                publish(next(gen))
        except StopIteration as stop:
            result: ExecutionResult | None = stop.value
        gen = None
        if result is None and publisher is None:
            now_head = log.head(turn_id)
            if now_head is None or now_head.ended_at is not None or now_head.owner != head.owner:
                return  # another process finished it, or took it over
            result = committed(head)
            if result is None:
                raise LoushoError(
                    f"turn {turn_id} was lost: its driver died before the turn was recorded "
                    "(nothing was kept; send it again)")
            publish(StepReset(run_id=turn_id, seq=0, step=max(1, result.steps)))
            last = result.messages[-1].text if result.messages else ""
            if last:
                publish(TextDelta(run_id=turn_id, seq=0, text=last))
        if result is not None:
            publish(RunDone(run_id=turn_id, seq=0, finish_reason=result.finish_reason,
                            result=result))
    except StoreUnavailableError as exc:
        if publisher is None:
            # the store went away before this process could announce the takeover: the turn
            # is left as it was, pending (an abandoned driver would count as aborted and
            # drop it), for the next reader's takeover, send() or resume()
            _log.warning("could not take over turn %s (%s); it stays pending", turn_id, exc)
            if gen is not None:
                _throw_quietly(gen, exc)
        else:
            _end_failed(turn_id, exc, publish)
    except BaseException as exc:
        _end_failed(turn_id, exc, publish)
    finally:
        if publisher is not None:
            publisher.close()
        with _running_lock:
            _taking.discard(turn_id)


def _throw_quietly(gen: Generator[RunEvent, None, ExecutionResult | None],
                   exc: BaseException) -> None:
    """Hand ``exc`` to a suspended turn, which ends it as a failure (kept pending, its lease
    released), and swallow what it raises."""
    try:
        gen.throw(exc)
    except BaseException:  # the turn ends here, as it should (already logged)
        pass


def _end_failed(turn_id: str, exc: BaseException, publish: Callable[[RunEvent], None]) -> None:
    """A takeover that failed: ``error`` and an error ``run.done`` to its readers."""
    _log.warning("taking over turn %s failed", turn_id, exc_info=exc)
    try:
        publish(RunFailed(run_id=turn_id, seq=0, error=exc))
        publish(RunDone(run_id=turn_id, seq=0, finish_reason="error", result=None))
    except StoreUnavailableError:
        _log.warning("could not write the end of turn %s to its event log: the store is "
                     "unreachable", turn_id)
