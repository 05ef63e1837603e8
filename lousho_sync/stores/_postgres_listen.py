"""One ``LISTEN`` connection per PostgreSQL store, shared by the event log and the session
mailbox: each subscribes a callback to a channel; the connection's thread calls it with the
payload of each ``NOTIFY``, and with None once listening starts and after every reconnect
(a notification sent while nobody listened is lost: the subscriber looks at everything).

The listener holds its store's ``Db`` weakly: a store dropped without ``close()`` is
collected (its pool closed by its finaliser), and the listening thread then ends within one
poll, as it does after ``close()``. A subscriber's callback must not hold the store either
(the event log's holds its ops weakly; the mailbox watcher's thread unsubscribes when it
ends).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Listener", "listener"]

_log = logging.getLogger("lousho_sync.stores")

_POLL_S = 0.25  # how soon a channel subscribed while connected is listened to
_RETRY_S = 0.5


class Listener:
    """The ``LISTEN`` connection of one store (``db``: its ``connect()``, ``closed`` and
    ``where``). Thread-safe: ``_lock`` guards the subscriptions and ``listening``."""

    def __init__(self, db: Any) -> None:
        self._db: Callable[[], Any] = weakref.ref(db)
        self._schema = str(db.schema)
        self._where = str(db.where)
        self._lock = threading.Lock()
        self._subs: dict[str, list[Callable[[str | None], None]]] = {}
        self._listened: set[str] = set()  # on the current connection
        self._thread: threading.Thread | None = None

    def subscribe(self, channel: str, fn: Callable[[str | None], None]) -> Callable[[], None]:
        """Call ``fn`` for each NOTIFY on ``channel`` (see the module) until the returned
        function is called."""
        with self._lock:
            self._subs.setdefault(channel, []).append(fn)
            listened = channel in self._listened
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"lousho-listen-{self._schema}")
                self._thread.start()
        if listened:  # it missed the None of the LISTEN
            fn(None)

        def stop() -> None:
            with self._lock:
                fns = self._subs.get(channel, [])
                if fn in fns:
                    fns.remove(fn)

        return stop

    def listening(self, channel: str) -> bool:
        """Whether the connection listens on ``channel`` now."""
        with self._lock:
            return channel in self._listened

    def _call(self, channel: str | None, payload: str | None) -> None:
        with self._lock:
            fns = [f for c, fs in self._subs.items() if channel in (None, c) for f in fs]
        for fn in fns:
            try:
                fn(payload)
            except Exception:
                _log.warning("a NOTIFY subscriber of %s failed", self._where, exc_info=True)

    def _open(self) -> bool:
        """Whether the store is still there and not closed."""
        db = self._db()
        return db is not None and not db.closed

    def _connect(self) -> Any:
        db = self._db()
        if db is None or db.closed:
            return None
        return db.connect()

    def _loop(self) -> None:
        try:
            self._listen()
        finally:
            with self._lock:
                self._thread = None

    def _listen(self) -> None:
        while self._open():
            try:
                conn = self._connect()
                if conn is None:
                    return
                try:
                    while self._open():
                        with self._lock:
                            new = [c for c in self._subs if c not in self._listened]
                        for channel in new:
                            conn.execute(f'LISTEN "{channel}"')
                            with self._lock:
                                self._listened.add(channel)
                            self._call(channel, None)
                        for note in conn.notifies(timeout=_POLL_S, stop_after=1):
                            self._call(note.channel, note.payload or None)
                finally:
                    with self._lock:
                        self._listened.clear()
                    conn.close()
            except Exception:
                _log.debug("the LISTEN connection of %s was lost; reconnecting", self._where,
                           exc_info=True)
                time.sleep(_RETRY_S)


_listeners: weakref.WeakKeyDictionary[Any, Listener] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def listener(db: Any) -> Listener:
    """The one :class:`Listener` of ``db``."""
    with _lock:
        found = _listeners.get(db)
        if found is None:
            found = _listeners[db] = Listener(db)
        return found
