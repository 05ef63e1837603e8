"""Cancellation: :class:`AbortController` and :class:`Signal`.

A signal can be aborted from any thread; it carries the reason and runs its callbacks once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .errors import AbortedError

__all__ = ["AbortController", "Signal", "link"]

_log = logging.getLogger(__name__)


class Signal:
    """Read side of an abort: ``aborted``, ``reason``, ``wait()``, callbacks.

    Thread-safe: one lock guards the state and the callback list; callbacks run outside it,
    in the aborting thread (or at once in the registering thread if already aborted).
    """

    __slots__ = ("__weakref__", "_aborted", "_callbacks", "_event", "_lock", "_reason")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._event: threading.Event | None = None  # made on the first wait()
        self._reason: object = None
        self._callbacks: list[Callable[[], object]] = []

    @property
    def aborted(self) -> bool:
        """True once aborted."""
        return self._aborted

    @property
    def reason(self) -> object:
        """What was passed to ``abort()`` (None until then)."""
        return self._reason

    def wait(self, timeout: float | None = None) -> bool:
        """Block until aborted or ``timeout`` seconds pass; returns ``aborted``."""
        if self._aborted:
            return True
        with self._lock:
            if self._event is None:
                self._event = threading.Event()
                if self._aborted:
                    self._event.set()
            event = self._event
        return event.wait(timeout)

    def raise_if_aborted(self) -> None:
        """Raise :class:`AbortedError` if aborted."""
        if self._aborted:
            raise AbortedError(f"aborted: {self._reason}", reason=self._reason)

    def add_callback(self, fn: Callable[[], object]) -> Callable[[], None]:
        """Run ``fn`` once on abort (now, if already aborted). Returns a remover."""
        with self._lock:
            if not self._aborted:
                self._callbacks.append(fn)

                def remove() -> None:
                    with self._lock:
                        try:
                            self._callbacks.remove(fn)
                        except ValueError:
                            pass

                return remove
        _run_callback(fn)
        return _noop

    def _abort(self, reason: object) -> bool:
        with self._lock:
            if self._aborted:
                return False
            self._reason = reason
            self._aborted = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _run_callback(fn)
        return True

    def __repr__(self) -> str:
        state = f"aborted reason={self._reason!r}" if self.aborted else "active"
        return f"<Signal {state}>"


def _noop() -> None:
    return None


def _run_callback(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:
        _log.warning("abort callback %r raised", fn, exc_info=True)


class AbortController:
    """Owns a :class:`Signal`; ``abort(reason)`` aborts it (idempotent, any thread)."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = Signal()

    def abort(self, reason: object = None) -> bool:
        """Abort the signal. Returns False if it was already aborted."""
        return self.signal._abort("aborted" if reason is None else reason)

    def __repr__(self) -> str:
        return f"<AbortController {self.signal!r}>"


def link(signal: Signal | None, abort: Callable[[object], object]) -> Callable[[], None]:
    """Make ``signal`` (when given) call ``abort(reason)`` once it aborts; returns the
    unlink function (call it when the linked work ends). The one place signals are chained."""
    if signal is None:
        return _noop
    return signal.add_callback(lambda: abort(signal.reason))


class Latch:
    """A one-way flag like ``threading.Event``; the Event behind ``wait`` is made only when
    someone waits (most never do). Thread-safe (one module lock guards the lazy Event)."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """True once set."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake the waiters."""
        with _LATCH_LOCK:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds pass; returns whether set."""
        if self._set:
            return True
        with _LATCH_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._set:
                    self._event.set()
            event = self._event
        return event.wait(timeout)


_LATCH_LOCK = threading.Lock()
