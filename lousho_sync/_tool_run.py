"""Running a tool's function away from the turn's thread, so that an abort or a tool's
``timeout_s`` gives the turn back at once.

A plain function runs on a small pool of daemon threads (started on demand, reused while
busy, ended after a minute idle), in a copy of the turn's :mod:`contextvars` context. When
the turn is aborted or the call times out, the turn goes on without it; the function itself
cannot be stopped and may still finish in the background (its result is then dropped).
Where neither can happen — no ``timeout_s``, and nobody can ask for an abort while the call
runs (``here``) — the function runs on the turn's own thread (in a copy of its context), which
spares the hand-off to a worker and back.

An ``async def`` tool runs on the event loop that :mod:`lousho_aio` named for this context
(:func:`use_loop_for_tools`); there an abort or a timeout cancels it. The sync core has no
loop, so it refuses such tools (:func:`tool_loop` is None).

Thread-safe: ``_lock`` guards the idle-worker count; each call has its own :class:`_Job`.
"""

from __future__ import annotations

import _thread
import contextvars
import os
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError
from concurrent.futures import Future as ConcurrentFuture
from typing import TYPE_CHECKING, Any, Literal

from .signal import Signal

if TYPE_CHECKING:  # asyncio (and ssl with it) is imported when an async tool is called
    import asyncio

__all__ = ["Outcome", "call_async", "call_sync", "tool_loop", "use_loop_for_tools"]

_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "lousho_tool_loop", default=None
)
_IDLE_S = 60.0

Outcome = tuple[Literal["done", "aborted", "timeout"], Any, BaseException | None]
"""``("done", value, None)``, ``("done", None, error)``, ``("aborted"|"timeout", None, None)``."""


def use_loop_for_tools(loop: asyncio.AbstractEventLoop) -> None:
    """``async def`` tools called in this context run on ``loop`` (set by lousho_aio)."""
    _LOOP.set(loop)


def tool_loop() -> asyncio.AbstractEventLoop | None:
    """The loop ``async def`` tools run on here, or None (the plain sync core)."""
    return _LOOP.get()


class _Job:
    __slots__ = ("context", "done", "error", "finished", "fn", "kwargs", "value")

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.fn, self.kwargs = fn, kwargs
        self.context = contextvars.copy_context()
        self.done = _thread.allocate_lock()  # released when finished, or by an abort
        self.done.acquire()
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        """Run the call; the worker counts itself idle *before* waking the caller, so the
        caller's next call reuses this thread instead of starting another."""
        global _idle
        try:
            self.value = self.context.run(self.fn, **self.kwargs)
        except BaseException as exc:  # handed to the turn's thread as it is
            self.error = exc
        self.finished = True
        with _lock:
            _idle += 1
        self.wake()

    def wake(self) -> None:
        """Let the waiting caller go on (once: a second wake finds nothing to release)."""
        try:
            self.done.release()
        except RuntimeError:  # already released (by an abort, or by the call's end)
            pass


_lock = threading.Lock()
_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_idle = 0


def _submit(job: _Job) -> None:
    global _idle
    with _lock:
        spawn = _idle == 0
        if not spawn:
            _idle -= 1  # that worker is now spoken for
    if spawn:
        threading.Thread(target=_work, name="lousho-tool", daemon=True).start()
    _jobs.put(job)


def _work() -> None:
    global _idle
    while True:
        try:
            job = _jobs.get(timeout=_IDLE_S)
        except queue.Empty:
            with _lock:
                if _idle > 0:  # nobody counts on this worker: end it
                    _idle -= 1
                    return
            continue  # a job is on its way to it
        job.run()  # counts this worker idle again when done
        del job


def _after_fork() -> None:
    global _idle, _jobs, _lock
    _idle, _jobs, _lock = 0, queue.SimpleQueue(), threading.Lock()  # no workers in a child


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork)


def call_sync(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    *,
    signal: Signal,
    timeout_s: float | None,
    here: bool = False,
) -> Outcome:
    """Call ``fn(**kwargs)`` on a worker thread; wait for it, an abort, or ``timeout_s``.
    ``here``: nobody can abort the turn while the call runs, so without ``timeout_s`` it
    runs on this thread."""
    if here and timeout_s is None:
        try:
            return ("done", contextvars.copy_context().run(fn, **kwargs), None)
        except BaseException as exc:  # handed back as a worker would hand it
            return ("done", None, exc)
    job = _Job(fn, kwargs)
    remove = signal.add_callback(job.wake)
    try:
        _submit(job)
        job.done.acquire(timeout=-1 if timeout_s is None else timeout_s)
    finally:
        remove()
    if job.finished:
        return ("done", job.value, job.error)
    return ("aborted" if signal.aborted else "timeout", None, None)


def call_async(
    fn: Callable[..., Coroutine[Any, Any, Any]],
    kwargs: dict[str, Any],
    loop: asyncio.AbstractEventLoop,
    *,
    signal: Signal,
    timeout_s: float | None,
) -> Outcome:
    """Run ``fn(**kwargs)`` on ``loop``; an abort or ``timeout_s`` cancels it."""
    import asyncio

    done = threading.Event()
    try:
        fut: ConcurrentFuture[Any] = asyncio.run_coroutine_threadsafe(fn(**kwargs), loop)
    except RuntimeError as exc:  # the loop is closed
        return ("done", None, exc)
    fut.add_done_callback(lambda _: done.set())
    remove = signal.add_callback(done.set)
    try:
        done.wait(timeout_s)
    finally:
        remove()
    if fut.done():
        try:
            return ("done", fut.result(), None)
        except CancelledError:
            return ("aborted", None, None)
        except BaseException as exc:
            return ("done", None, exc)
    fut.cancel()
    return ("aborted" if signal.aborted else "timeout", None, None)
