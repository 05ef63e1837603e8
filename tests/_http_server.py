"""A scripted HTTP server on 127.0.0.1 for provider tests (stdlib ``http.server`` in a thread).

``FakeServer`` answers each POST with the next queued :class:`Reply` (then ``default``),
records every request, and can stream, cut a stream, hang, or hold a stream open until
the client goes away (then it sets ``client_gone``). Every wait here has a timeout.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeAlias

FIXTURES = Path(__file__).parent / "provider_fixtures"
_HANDLER_WAIT_S = 10.0


@dataclass
class Reply:
    """One scripted answer.

    ``body`` is sent with Content-Length; ``chunks`` are streamed one write each (chunked
    transfer encoding, or raw until close when ``chunked=False``). ``cut`` drops the
    connection after the chunks without ending the body; ``hold`` keeps the stream open
    after the chunks until the client closes; ``hang`` never answers.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: list[bytes] | None = None
    chunked: bool = True
    cut: bool = False
    hold: bool = False
    hang: bool = False


Responder: TypeAlias = "Reply | Callable[[Recorded], Reply]"


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int

    def json(self) -> Any:
        return json.loads(self.body)


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """A JSON answer."""
    return Reply(
        status,
        {"Content-Type": "application/json", **(headers or {})},
        json.dumps(body).encode(),
    )


def sse_reply(text: str | bytes, *, split: str = "events", **options: Any) -> Reply:
    """An event stream; ``split="events"`` writes one event per chunk, ``"bytes"`` 7 bytes."""
    data = text.encode() if isinstance(text, str) else text
    if split == "events":
        pieces = [p + b"\n\n" for p in data.split(b"\n\n") if p.strip()]
    else:
        pieces = [data[i : i + 7] for i in range(0, len(data), 7)]
    return Reply(200, {"Content-Type": "text/event-stream"}, chunks=pieces, **options)


def fixture_reply(name: str, *, replace: dict[str, str] | None = None, **options: Any) -> Reply:
    """The reply stored in ``provider_fixtures/<name>`` (``.json`` with status or ``.sse``)."""
    text = (FIXTURES / name).read_text()
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    if name.endswith(".sse"):
        return sse_reply(text, **options)
    doc = json.loads(text)
    return json_reply(doc["body"], doc.get("status", 200), doc.get("headers"))


def fixture_body(name: str) -> Any:
    """The JSON body of a ``.json`` fixture."""
    return json.loads((FIXTURES / name).read_text())["body"]


class FakeServer:
    """Scripted HTTP/1.1 server; thread-safe (``_lock`` guards the queue and the records)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: deque[Responder] = deque()
        self.default: Responder | None = None
        self._requests: list[Recorded] = []
        self.client_gone = threading.Event()
        self.answered = threading.Event()
        self.received = threading.Event()
        self._stop = threading.Event()
        fake = self

        class Handler(_Handler):
            server_ref = fake

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def push(self, *replies: Responder) -> None:
        """Queue answers: a Reply, or a function of the request returning one."""
        with self._lock:
            self._replies.extend(replies)

    def _record(self, rec: Recorded) -> Reply:
        with self._lock:
            self._requests.append(rec)
            reply = self._replies.popleft() if self._replies else self.default
        self.received.set()
        if reply is None:
            return json_reply({"error": {"message": "no reply scripted"}}, 599)
        return reply if isinstance(reply, Reply) else reply(rec)

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms stall between the headers and the body
    server_ref: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake = self.server_ref
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        reply = fake._record(
            Recorded(
                "POST",
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                body,
                self.client_address[1],
            )
        )
        if reply.hang:
            self._wait_client_gone()
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.chunks is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            fake.answered.set()
            return
        if reply.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            for piece in reply.chunks:
                self._write(piece, reply.chunked)
            fake.answered.set()
            if reply.cut:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if reply.hold:
                self._wait_client_gone()
                self.close_connection = True
                return
            if reply.chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            fake.client_gone.set()
            self.close_connection = True

    def _write(self, piece: bytes, chunked: bool) -> None:
        if chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        else:
            self.wfile.write(piece)
        self.wfile.flush()

    def _wait_client_gone(self) -> None:
        """Block until the client closes the connection (EOF or error) or the server stops."""
        fake = self.server_ref
        sock = self.connection
        deadline = threading.Event()
        timer = threading.Timer(_HANDLER_WAIT_S, deadline.set)
        timer.start()
        try:
            while not fake._stop.is_set() and not deadline.is_set():
                readable, _, _ = select.select([sock], [], [], 0.02)
                if not readable:
                    continue
                try:
                    data = sock.recv(1024)
                except OSError:
                    data = b""
                if not data:
                    fake.client_gone.set()
                    return
        finally:
            timer.cancel()
