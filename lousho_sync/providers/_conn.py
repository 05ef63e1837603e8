"""Connections that report themselves to the attempt using them, so an abort from another
thread can shut the socket down; and the per-thread ``requests.Session`` holder.

Thread-safe: a :class:`Tracker` guards its fields with its lock; which tracker a new
connection reports to is thread-local (:func:`track`).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["SessionHolder", "Tracker", "track"]

_tls = threading.local()


def track(tracker: Tracker | None) -> None:
    """Connections this thread opens or reuses from now on report to ``tracker`` (None:
    to no one)."""
    _tls.tracker = tracker


class Tracker:
    """The connection and response of one attempt, so an abort can cut them.

    Thread-safe: ``_lock`` guards every field; ``abort()`` runs in the aborting thread.
    """

    __slots__ = ("_aborted", "_conn", "_done", "_lock", "_resp", "_sock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: HTTPConnection | None = None
        # The connection's socket as last seen: a response delimited by the connection
        # closing (HTTP/1.0, or Connection: close without a length) takes the socket over
        # and the connection forgets it (http.client), yet the read still blocks on it.
        self._sock: socket.socket | None = None
        self._resp: requests.Response | None = None
        self._aborted = False
        self._done = False

    @property
    def sock(self) -> socket.socket | None:
        with self._lock:
            conn = self._conn
        return getattr(conn, "sock", None) if conn is not None else None

    def attach(self, conn: HTTPConnection) -> None:
        with self._lock:
            if self._done:
                return
            self._conn = conn
            sock = getattr(conn, "sock", None)
            if sock is not None:
                self._sock = sock
            if self._aborted:
                _shutdown(conn, self._sock)

    def set_response(self, resp: requests.Response) -> None:
        with self._lock:
            self._resp = resp
            aborted = self._aborted and not self._done
        if aborted:
            resp.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._done:
                return
            if self._conn is not None and _shutdown(self._conn, self._sock):
                return
            resp = self._resp
        if resp is not None:  # no socket known (e.g. a SOCKS proxy): close the response
            resp.close()

    def detach(self) -> None:
        with self._lock:
            self._done = True
            self._conn = None
            self._resp = None
            self._sock = None


def _shutdown(conn: HTTPConnection, seen: socket.socket | None = None) -> bool:
    """Shut ``conn``'s socket down (or ``seen``, the one it had when the connection handed
    it to a close-delimited response); False when there is none."""
    sock = getattr(conn, "sock", None) or seen
    if sock is None:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    return True


def _note(conn: HTTPConnection) -> None:
    tracker: Tracker | None = getattr(_tls, "tracker", None)
    if tracker is not None:
        tracker.attach(conn)


class _HTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _note(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _note(self)
        super().request(*args, **kwargs)


class _HTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _note(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _note(self)
        super().request(*args, **kwargs)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS: dict[str, type[HTTPConnectionPool]] = {"http": _HTTPPool, "https": _HTTPSPool}


class _Adapter(HTTPAdapter):
    """An adapter whose connections report themselves to the current attempt."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = _POOLS
        return manager


class SessionHolder:
    """One thread's Session; closed when the thread (or the client) lets go of it."""

    __slots__ = ("__weakref__", "session")

    def __init__(self) -> None:
        session = requests.Session()
        adapter = _Adapter(pool_connections=4, pool_maxsize=4, max_retries=0)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        session.headers["User-Agent"] = "lousho-python"
        self.session = session

    def __del__(self) -> None:
        try:
            self.session.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
