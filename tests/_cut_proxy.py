"""A TCP proxy on 127.0.0.1 in front of a PostgreSQL server that can lose one reply: the
request is forwarded and the server's whole answer read (the transaction committed), then
the connection is cut before the client sees it — a connection dropped after COMMIT."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"  # the server's last message of an answer


class CutProxy:
    """Forwards every connection to ``port``; once :meth:`arm`-ed, the first request whose
    bytes hold ``marker`` is executed but its answer is dropped and the connection cut,
    after ``on_cut()`` ran."""

    def __init__(self, port: int, on_cut: Callable[[], None]) -> None:
        self._target = port
        self._on_cut = on_cut
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def _take(self, chunk: bytes) -> bool:
        with self._lock:
            if self._marker is not None and self._marker in chunk:
                self._marker = None
                return True
            return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target))
            self._open += [client, server]
            cutting = threading.Event()
            threading.Thread(target=self._up, args=(client, server, cutting),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cutting),
                             daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket,
            cutting: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                if self._take(chunk):
                    cutting.set()
                server.sendall(chunk)
        _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket,
              cutting: threading.Event) -> None:
        held = b""
        with contextlib.suppress(OSError):
            while chunk := server.recv(65536):
                if not cutting.is_set():
                    client.sendall(chunk)
                    continue
                held += chunk  # the answer to the armed request: read whole, never sent
                if READY_FOR_QUERY in held:
                    self.cuts += 1
                    self._on_cut()
                    break
        _close(client, server)

    def close(self) -> None:
        self._listener.close()
        for s in self._open:
            _close(s)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
