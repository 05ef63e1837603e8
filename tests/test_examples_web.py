"""The web examples (Flask, Django, ASGI) served on 127.0.0.1 by a real HTTP server and
called through a real HTTP client: answers stream as server-sent events, any user key is a
session, the transcript can be read back, and a client that hangs up mid-stream aborts its
turn without changing the transcript. On PostgreSQL (the ``postgres_url`` fixture: skipped
with the reason without a server, failing under ``CI``), the Flask and Django examples run
as two processes each, by their dev servers, sharing one database: a turn sent to one is
in PostgreSQL and read by the other."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import pytest
from conftest import free_port

from lousho_sync import session_id_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WAIT = 30.0


def load(name: str) -> ModuleType:
    """The example module, imported once per test run (Django's settings are global)."""
    key = f"lousho_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def serve_flask() -> Iterator[int]:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, load("flask_app").app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    thread.join(WAIT)


def serve_django() -> Iterator[int]:
    from django.core.servers.basehttp import ThreadedWSGIServer

    module = load("django_view")
    server = ThreadedWSGIServer(("127.0.0.1", 0), module.QuietHandler)
    server.set_app(module.application)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join(WAIT)


def serve_asgi() -> Iterator[int]:
    uvicorn = pytest.importorskip("uvicorn")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(load("asyncio_app").app, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(WAIT)


SERVERS = {"flask": serve_flask, "django": serve_django, "asgi": serve_asgi}


@pytest.fixture(params=sorted(SERVERS))
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    yield from SERVERS[request.param]()


def parse_sse(raw: bytes) -> list[tuple[str, Any]]:
    """(event name, data) pairs; the name is "message" when the event has none."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        events.append((name, data))
    return events


def post(port: int, user: str, message: str) -> tuple[http.client.HTTPResponse, list[Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("POST", f"/chat/{quote(user, safe='')}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    events = parse_sse(response.read())
    conn.close()
    return response, events


def transcript(port: int, user: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("GET", f"/chat/{quote(user, safe='')}")
    response = conn.getresponse()
    assert response.status == 200
    doc: dict[str, Any] = json.loads(response.read())
    conn.close()
    return doc


def test_a_request_without_a_message_is_answered_400_and_stores_nothing(port: int) -> None:
    user = "careless@example.com"
    for body in (b'{"text": "Hi"}', b'{"message": 5}', b'{"message": ""}', b"[1, 2]",
                 b"not json"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        conn.request("POST", f"/chat/{quote(user, safe='')}", body,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        doc = json.loads(response.read())
        conn.close()
        assert response.status == 400, (body, doc)
        assert '"message"' in doc["error"], doc
    assert transcript(port, user)["messages"] == []


def test_an_answer_streams_as_server_sent_events(port: int) -> None:
    user = "first@example.com"
    response, events = post(port, user, "Hello")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    texts = [data["text"] for name, data in events if name == "message"]
    assert len(texts) >= 2  # streamed in pieces, not one body
    assert "Hello" in "".join(texts)
    assert events[-1] == ("done", {"finish_reason": "stop", "session_id": session_id_for(user),
                                   "messages": 2})
    doc = transcript(port, user)
    assert doc["session_id"] == session_id_for(user)
    assert doc["messages"] == [{"role": "user", "text": "Hello"},
                               {"role": "assistant", "text": "".join(texts)}]


def test_any_user_key_is_its_own_session(port: int) -> None:
    keys = ["a.b", "bad/id", "ali@example.com", "tenant:42", "用户", "José", "x" * 300]
    for key in keys:
        response, events = post(port, key, f"I am {key}")
        assert response.status == 200 and events[-1][0] == "done", (key, events)
    for key in keys:
        doc = transcript(port, key)
        assert doc["session_id"] == session_id_for(key)
        assert [m["text"] for m in doc["messages"] if m["role"] == "user"] == [f"I am {key}"]
    assert len({session_id_for(k) for k in keys}) == len(keys)


def test_a_client_that_hangs_up_mid_stream_aborts_the_turn(port: int) -> None:
    user = "hangs-up@example.com"
    body = json.dumps({"message": "tell me a story"}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.sendall(b"POST /chat/" + quote(user, safe="").encode() + b" HTTP/1.1\r\n"
                 b"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"Once upon a time" not in received:  # the story has started streaming
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    sock.close()  # hang up in the middle of the story

    # the same user's next turn waits for the story's turn to end, which the hang-up aborted
    _, events = post(port, user, "short")
    assert events[-1][0] == "done" and events[-1][1]["messages"] == 2
    doc = transcript(port, user)
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert doc["messages"][0]["text"] == "short"
    assert "story" not in json.dumps(doc) and "and then" not in json.dumps(doc)


# --- on PostgreSQL: two app processes share the sessions --------------------------------------

ROOT = EXAMPLES.parent


def _pg_env(name: str, url: str, schema: str) -> dict[str, str]:
    """The environment that puts example ``name`` on PostgreSQL: Django's DATABASES from
    POSTGRES_* (the example's settings), Flask's app.config from LOUSHO_POSTGRES_URL."""
    from psycopg.conninfo import conninfo_to_dict

    env = {k: v for k, v in os.environ.items()
           if k not in ("LOUSHO_DB", "LOUSHO_MODEL", "LOUSHO_POSTGRES_URL")
           and not k.startswith("POSTGRES_")}
    env.update(PYTHONPATH=str(ROOT), LOUSHO_POSTGRES_SCHEMA=schema)
    if name == "flask_app":
        env["LOUSHO_POSTGRES_URL"] = url
        return env
    params = conninfo_to_dict(url)
    env.update(POSTGRES_DB=str(params.get("dbname") or params.get("user") or ""),
               POSTGRES_USER=str(params.get("user") or ""),
               POSTGRES_PASSWORD=str(params.get("password") or ""),
               POSTGRES_HOST=str(params.get("host") or ""),
               POSTGRES_PORT=str(params.get("port") or ""))
    return env


class AppProcess:
    """An example served by its documented dev server in a process of its own."""

    def __init__(self, name: str, env: dict[str, str], tmp: Path) -> None:
        self.port = free_port()
        if name == "flask_app":
            command = [sys.executable, "-m", "flask", "--app", str(EXAMPLES / "flask_app.py"),
                       "run", "--port", str(self.port), "--no-reload"]
        else:
            command = [sys.executable, str(EXAMPLES / "django_view.py"), "runserver",
                       f"127.0.0.1:{self.port}", "--noreload"]
        self.log = (tmp / f"{name}-{self.port}.log").open("w+")
        self.proc = subprocess.Popen(command, env=env, cwd=tmp, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{name} exited {self.proc.returncode}: {self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"{name} never listened: {self.output()}") from None
                time.sleep(0.05)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(WAIT)
        except Exception:
            self.proc.kill()
            self.proc.wait(WAIT)
        self.log.close()


@pytest.mark.parametrize("name", ["flask_app", "django_view"])
def test_on_postgres_a_turn_sent_over_http_is_read_by_another_app_process(
    name: str, postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    from lousho_sync.postgres import PostgresStore

    env = _pg_env(name, postgres_url, postgres_schema)
    user = "pg-user@example.com"
    first = AppProcess(name, env, tmp_path)
    try:
        second = AppProcess(name, env, tmp_path)
        try:
            response, events = post(first.port, user, "Hello from process one")
            assert response.status == 200 and events[-1][0] == "done", (
                events, first.output())
            with PostgresStore(postgres_url, schema=postgres_schema) as store:
                stored = store.sessions.load(session_id_for(user))  # it is in PostgreSQL
            assert stored is not None
            assert [m.text for m in stored][0] == "Hello from process one"
            doc = transcript(second.port, user)  # read by the other process
            assert doc["session_id"] == session_id_for(user)
            assert [(m["role"], m["text"]) for m in doc["messages"]] == [
                (m.role, m.text) for m in stored]
            _, events = post(second.port, user, "And from process two")
            assert events[-1] == ("done", {"finish_reason": "stop",
                                           "session_id": session_id_for(user), "messages": 4})
            assert [m["text"] for m in transcript(first.port, user)["messages"]][::2] == [
                "Hello from process one", "And from process two"]
        finally:
            second.stop()
    finally:
        first.stop()


def test_the_django_helper_builds_the_conninfo_from_databases() -> None:
    pytest.importorskip("django")
    conninfo_to_dict = pytest.importorskip("psycopg.conninfo").conninfo_to_dict

    module = load("django_view")
    conninfo = module.postgres_conninfo({
        "ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "al",
        "PASSWORD": "p w'd", "HOST": "db.internal", "PORT": 6543,
        "OPTIONS": {"sslmode": "require", "isolation_level": 1}})
    assert conninfo_to_dict(conninfo) == {"dbname": "app", "user": "al", "password": "p w'd",
                                          "host": "db.internal", "port": "6543",
                                          "sslmode": "require"}
    assert conninfo_to_dict(module.postgres_conninfo({"NAME": "app", "HOST": ""})) == {
        "dbname": "app"}
