"""The only code between threads and the event loop: the executor, contextvars, task
cancellation -> abort, and the event pump.

Executor. ``lousho_aio`` runs the blocking core in its own ``ThreadPoolExecutor`` — not the
loop's default one (``min(32, cpu + 4)`` threads would serialize thousands of sessions). A
turn that waits on its provider parks one thread, so the pool is sized for many concurrent
turns: ``max_workers`` is ``$LOUSHO_AIO_THREADS`` or :data:`DEFAULT_MAX_WORKERS` (2048), or
what :func:`configure` set. Threads are started on demand (one per concurrent blocking
call, up to the limit), then kept idle for reuse; measured cost: about 75 KiB of resident
memory per thread (2048 threads: about 150 MiB). Calls beyond the limit wait in the pool's
FIFO queue for a free thread. The pool is created lazily on first use.

Every call runs in a copy of the caller's :mod:`contextvars` context, which also names the
loop on which the turn's ``async def`` tools run.

Cancellation. ``asyncio.CancelledError`` never reaches a worker thread, so a cancelled
awaiting task aborts the work through its abort hook (the turn's ``run.abort("cancelled")``
or an :class:`~lousho_sync.signal.AbortController`), waits for the worker to finish
(shielded from further cancellation), then re-raises ``CancelledError``. A call that has no
abort hook and has not started yet is dropped from the pool's queue.

Event pump. A stream is iterated by one pool thread that forwards each event to the
consumer task through a bounded buffer (:data:`EVENT_BUFFER` events): a slow consumer slows
the producer and loses no event; the loop is woken only when the consumer waits, so a burst
of events costs one wake-up. Measured against one executor hop per event (see
``benchmarks/bench_aio.py``), the pump is several times cheaper per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from lousho_sync._tool_run import use_loop_for_tools
from lousho_sync.callers import calling_as, context_for, declared_caller
from lousho_sync.errors import ConfigError, LoopClosedError
from lousho_sync.signal import AbortController, Signal

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "EVENT_BUFFER",
    "EventPump",
    "as_current_task",
    "call",
    "call_aborting",
    "configure",
    "linked_controller",
    "max_workers",
    "settle",
    "start",
    "to_thread_callback",
    "wait",
]

_log = logging.getLogger("lousho_sync.aio")  # one logger tree: lousho_sync

T = TypeVar("T")

DEFAULT_MAX_WORKERS = 2048
"""Default pool size: concurrent blocking calls (each waiting turn holds one thread)."""
ENV_THREADS = "LOUSHO_AIO_THREADS"
EVENT_BUFFER = 64
"""Events a stream's producer may run ahead of its consumer."""
_SETTLE_WARN_S = 30.0
_PRODUCER_WAIT_S = 1.0
_CALLBACK_POLL_S = 1.0

_lock = threading.Lock()  # guards _executor and _configured
_executor: ThreadPoolExecutor | None = None
_configured: int | None = None


def _from_env() -> int:
    raw = os.environ.get(ENV_THREADS)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_WORKERS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"${ENV_THREADS} must be a positive integer; got {raw!r}")
    return value


def max_workers() -> int:
    """The pool size in force (or that the pool will have when first used)."""
    with _lock:
        return _configured if _configured is not None else _from_env()


def configure(*, max_workers: int) -> None:
    """Set the pool size (overrides ``$LOUSHO_AIO_THREADS``).

    Before first use it just sets the size. Afterwards a new pool takes the new calls and
    the old one is shut down without waiting: calls already running there finish.
    """
    global _executor, _configured
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigError(f"max_workers must be a positive integer; got {max_workers!r}")
    with _lock:
        old, _executor, _configured = _executor, None, max_workers
    if old is not None:
        old.shutdown(wait=False)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            size = _configured if _configured is not None else _from_env()
            _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="lousho-aio")
        return _executor


def _submit(fn: Callable[[], T]) -> ConcurrentFuture[T]:
    """Run ``fn`` in the pool, in a copy of this context that names the calling task (so
    the sync core can tell a task waiting behind its own unread stream)."""
    caller = task_caller()
    context = context_for(caller) if caller is not None else contextvars.copy_context()
    try:
        context.run(use_loop_for_tools, asyncio.get_running_loop())  # async def tools
    except RuntimeError:  # no running loop: a plain thread's call
        pass
    return _pool().submit(context.run, fn)


def task_caller() -> object | None:
    """Who calls, for the sync core's turn queue: a caller declared in this context, else
    the running task; None outside a task. (On Python 3.11 ``asyncio.wait_for`` runs its
    awaitable in a task of its own, which then counts as another caller.)"""
    declared = declared_caller()
    if declared is not None:
        return declared
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


@contextlib.contextmanager
def as_current_task() -> Iterator[None]:
    """Sync calls made in this block on the loop thread are this task's (see
    :func:`task_caller`)."""
    caller = task_caller()
    if caller is None:
        yield
        return
    with calling_as(caller):
        yield


async def settle(fut: asyncio.Future[Any]) -> bool:
    """Wait until ``fut`` is done even if this task is cancelled meanwhile (``fut`` is never
    cancelled); returns whether a cancellation arrived. ``fut``'s outcome is consumed."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait({fut}, timeout=_SETTLE_WARN_S)
        except asyncio.CancelledError:
            cancelled = True
        else:
            if not fut.done():
                _log.warning("still waiting for an aborted lousho call to finish in its thread")
    if not fut.cancelled():
        fut.exception()  # retrieved: an error after an abort is not "never retrieved"
    return cancelled


async def call(
    fn: Callable[..., T], /, *args: Any, on_cancel: Callable[[], object] | None = None,
    **kwargs: Any,
) -> T:
    """Run ``fn(*args, **kwargs)`` in the pool and await it.

    If the awaiting task is cancelled: without ``on_cancel`` a call still queued is dropped;
    otherwise ``on_cancel()`` is called, the worker is waited for (shielded), and
    ``CancelledError`` is re-raised.
    """
    cf = _submit(functools.partial(fn, *args, **kwargs))
    fut = asyncio.wrap_future(cf)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if on_cancel is None and cf.cancel():
            raise
        if on_cancel is not None:
            try:
                on_cancel()
            except Exception:
                _log.warning("abort hook %r raised", on_cancel, exc_info=True)
        await settle(fut)
        raise


def start(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run ``fn()`` in the pool now (in a copy of the current context); its future."""
    return asyncio.wrap_future(_submit(fn))


async def wait(
    fut: asyncio.Future[Any], *, timeout: float | None, on_cancel: Callable[[], object]
) -> bool:
    """Wait up to ``timeout`` seconds for ``fut`` (never cancelling it); False on timeout.
    If this task is cancelled: ``on_cancel()``, wait for ``fut`` (shielded), re-raise."""
    try:
        done, _ = await asyncio.wait({fut}, timeout=timeout)
    except asyncio.CancelledError:
        try:
            on_cancel()
        except Exception:
            _log.warning("abort hook %r raised", on_cancel, exc_info=True)
        await settle(fut)
        raise
    if done and not fut.cancelled():
        fut.exception()  # the caller reads the outcome elsewhere
    return bool(done)


async def call_aborting(
    fn: Callable[..., T], /, *args: Any, signal: Signal | None, **kwargs: Any
) -> T:
    """``call(fn, *args, signal=s, **kwargs)`` where ``s`` aborts when the caller's
    ``signal`` does and when the awaiting task is cancelled (reason ``"cancelled"``)."""
    controller, unlink = linked_controller(signal)
    try:
        return await call(
            fn, *args, signal=controller.signal,
            on_cancel=lambda: controller.abort("cancelled"), **kwargs,
        )
    finally:
        unlink()


def linked_controller(signal: Signal | None) -> tuple[AbortController, Callable[[], None]]:
    """A controller for one call that the caller's ``signal`` (if any) also aborts, and a
    function that unlinks it."""
    controller = AbortController()
    if signal is None:
        return controller, _noop
    unlink = signal.add_callback(lambda: controller.abort(signal.reason))
    return controller, unlink


def _noop() -> None:
    return None


def to_thread_callback(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` made callable from a pool thread: a coroutine function is run on the current
    event loop and waited for; a plain function is returned as it is (it runs in the
    worker thread)."""
    if not inspect.iscoroutinefunction(fn):
        return fn
    loop = asyncio.get_running_loop()

    def blocking(*args: Any, **kwargs: Any) -> Any:
        cf = asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop)
        while True:
            try:
                return cf.result(timeout=_CALLBACK_POLL_S)
            except TimeoutError:
                if loop.is_closed():
                    cf.cancel()
                    raise LoopClosedError(
                        f"the event loop running {fn!r} closed before it returned"
                    ) from None

    return blocking


class _End:
    pass


_END = _End()


class EventPump(Generic[T]):
    """Forwards the items of a blocking iterable, read in one pool thread, to one asyncio
    consumer through a bounded buffer.

    Thread-safe: ``_lock`` (with the condition ``_space``) guards ``_buf``, ``_waiter``,
    ``_bounded``, ``_discard`` and ``_ended``. The producer blocks while the buffer holds
    ``bound`` items, unless :meth:`unbound` was called (``result()`` waiting) or the consumer
    left (items are then dropped).
    """

    def __init__(
        self,
        source: Iterable[T],
        *,
        abort: Callable[[str], object],
        leave: Callable[[], object] | None = None,
        bound: int = EVENT_BUFFER,
        ahead: Callable[[T], bool] | None = None,
    ) -> None:
        self._source = source
        self._abort = abort
        self._leave_source = leave
        self._bound = bound
        self._ahead = ahead
        self._wanting = False  # the consumer waits for an item (a sync reader's next())
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._buf: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._bounded = True
        self._discard = False
        self._ended = False
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._job: asyncio.Future[None] | None = None

    # --- producer (pool thread) --------------------------------------------------------------
    def _produce(self) -> None:
        try:
            for item in self._source:
                self._put(item)
        except BaseException as exc:
            self._error = exc
        finally:
            with self._lock:
                self._ended = True
                waiter, self._waiter = self._waiter, None
            self._wake(waiter)

    def _put(self, item: T) -> None:
        orphaned = False
        with self._space:
            while self._bounded and not self._discard and len(self._buf) >= self._bound:
                if not self._space.wait(_PRODUCER_WAIT_S) and self._loop_closed():
                    orphaned = self._discard = True  # nobody can read on
                    self._buf.clear()
            if self._discard:
                waiter = None
            else:
                self._buf.append(item)
                self._wanting = False  # answered; the consumer asks again when it wants more
                waiter, self._waiter = self._waiter, None
        if orphaned:
            self._abort("the event loop closed")
        self._wake(waiter)
        if self._ahead is not None and not self._ahead(item):
            self._wait_for_reader()

    def _wait_for_reader(self) -> None:
        """After an item that may not be run ahead of: go on only when the consumer took
        it and asks for the next one (as a sync reader's ``next()``), or left."""
        orphaned = False
        with self._space:
            while self._bounded and not self._discard and (self._buf or not self._wanting):
                if not self._space.wait(_PRODUCER_WAIT_S) and self._loop_closed():
                    orphaned = self._discard = True
                    self._buf.clear()
        if orphaned:
            self._abort("the event loop closed")

    def _loop_closed(self) -> bool:
        return self._loop is not None and self._loop.is_closed()

    def _wake(self, waiter: asyncio.Future[None] | None) -> None:
        if waiter is None or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(_resolve, waiter)
        except RuntimeError:  # the loop is closed: nobody will read what follows
            with self._lock:
                self._discard = True
                self._buf.clear()
            self._abort("the event loop closed")

    # --- consumer (event loop) -----------------------------------------------------------------
    def start(self) -> asyncio.Future[None]:
        """Start the producer (once); returns its future."""
        if self._job is None:
            self._loop = asyncio.get_running_loop()
            self._job = asyncio.wrap_future(_submit(self._produce))
        return self._job

    async def _get(self) -> T | _End:
        assert self._loop is not None
        while True:
            with self._space:
                if self._buf:
                    item = self._buf.popleft()
                    if len(self._buf) < self._bound:
                        self._space.notify()
                    return item
                if self._ended:
                    return _END
                waiter = self._waiter = self._loop.create_future()
                self._wanting = True
                self._space.notify()
            await waiter

    def unbound(self) -> None:
        """Let the producer run ahead without limit (keeping the items): a waiter for the end
        must never deadlock on a buffer nobody reads."""
        with self._space:
            self._bounded = False
            self._space.notify_all()

    def _unseen_ahead(self) -> bool:
        """Whether the consumer leaves items it was not shown that were run ahead of it (a
        sync reader leaving there would have had the run go on past them: it aborts)."""
        with self._space:
            return self._ahead is not None and any(self._ahead(i) for i in self._buf)

    def _leave(self) -> None:
        with self._space:
            self._discard = True
            self._buf.clear()
            self._space.notify_all()

    def left(self, reason: str = "the consumer stopped iterating") -> None:
        """The consumer left (does not wait): tell the source as a sync reader's leaving
        does (abort it when the consumer leaves items it was not shown that were read
        ahead of it) and drop what is buffered. Idempotent."""
        with self._space:
            if self._discard or (self._ended and not self._buf):
                return
        if self._leave_source is not None and not self._unseen_ahead():
            self._leave_source()
        else:
            self._abort(reason)
        self._leave()

    async def stop(self, reason: str, *, left: bool = False) -> bool:
        """Abort the source (or, when the consumer ``left``, see :meth:`left`), drop what
        is buffered, wait (shielded) for the producer to end; True if a cancellation
        arrived meanwhile."""
        if left:
            self.left(reason)
        else:
            self._abort(reason)
            self._leave()
        return await settle(self.start())

    async def events(self) -> AsyncGenerator[T, None]:
        """The items, in order. Cancelling the consumer aborts the source; leaving the loop
        early tells it the consumer left (see ``AgentRun.leave``); both wait for the
        producer to end."""
        self.start()
        try:
            while True:
                item = await self._get()
                if isinstance(item, _End):
                    break
                yield item
        except asyncio.CancelledError:
            await self.stop("cancelled")
            raise
        except GeneratorExit:
            if await self.stop("the consumer stopped iterating", left=True):
                raise asyncio.CancelledError from None
            raise
        if self._error is not None:
            raise self._error


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
