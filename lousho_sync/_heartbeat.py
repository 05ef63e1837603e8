"""One daemon thread that renews every held lease on time."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["HEARTBEAT"]

_log = logging.getLogger(__name__)


class _Heartbeat:
    """Calls registered functions every ``interval_s`` until cancelled.

    Thread-safe: one condition guards the schedule; the thread starts on first use.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, float, Callable[[], object]]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0  # when the thread will look at the schedule next (monotonic)

    def add(self, fn: Callable[[], object], interval_s: float) -> Callable[[], None]:
        """Run ``fn`` every ``interval_s`` seconds; returns a cancel function."""
        token = next(self._ids)
        with self._cond:
            self._live.add(token)
            due = time.monotonic() + interval_s
            heapq.heappush(self._heap, (due, token, interval_s, fn))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="lousho-heartbeat",
                                                daemon=True)
                self._thread.start()
            elif due < self._wake_at:  # wake the thread only when it would look too late
                self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._live.discard(token)

        return cancel

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._wake_at = time.monotonic() + 5.0
                        self._cond.wait(5.0)
                        continue
                    due = self._heap[0][0] - time.monotonic()
                    if due <= 0:
                        _, token, interval, fn = heapq.heappop(self._heap)
                        again = (time.monotonic() + interval, token, interval, fn)
                        heapq.heappush(self._heap, again)
                        break
                    self._wake_at = time.monotonic() + due
                    self._cond.wait(due)
            try:
                fn()
            except Exception:
                _log.warning("lease renewal failed", exc_info=True)


HEARTBEAT = _Heartbeat()
