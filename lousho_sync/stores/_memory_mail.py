"""The memory store's mailbox primitives: the mail of every session in one list under a
lock; a post wakes the subscribed owners at once (it notifies the condition variable their
mailbox watcher waits on; their "processes" are the threads and ``Session`` objects sharing
the store)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence

from ._mail import Mail, Wake

__all__ = ["MemoryMailOps"]


class MemoryMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` and
    :class:`~lousho_sync.stores._mail.MailPush` in memory. Thread-safe: ``_lock`` guards
    the mail, the version and the subscribers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mail: list[tuple[Mail, bool]] = []  # (mail, taken), in arrival order
        self._seq = itertools.count(1)
        self._version = 0
        self._wakes: list[Wake] = []

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        with self._lock:
            self._mail.append((Mail(next(self._seq), mail_id, session_id, kind, data,
                                    posted_at, poster), False))
            self._version += 1
            wakes = list(self._wakes)
        for wake in wakes:
            wake(session_id)

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        wanted = set(session_ids)
        with self._lock:
            out = [m for m, taken in self._mail if not taken and m.session_id in wanted]
            if out:
                self._mail = [(m, taken or m.session_id in wanted) for m, taken in self._mail]
            return out

    def line(self, session_id: str) -> list[Mail]:
        with self._lock:
            return [m for m, _ in self._mail if m.session_id == session_id]

    def drop(self, mail_id: str, session_id: str = "") -> None:
        with self._lock:
            self._mail = [(m, t) for m, t in self._mail if m.mail_id != mail_id]

    def prune(self, before: float) -> int:
        with self._lock:
            kept = [(m, t) for m, t in self._mail if m.posted_at >= before]
            count, self._mail = len(self._mail) - len(kept), kept
            return count

    def version(self) -> int:
        with self._lock:
            return self._version

    def subscribe(self, wake: Wake) -> Callable[[], None]:
        with self._lock:
            self._wakes.append(wake)
        wake(None)

        def stop() -> None:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)

        return stop
