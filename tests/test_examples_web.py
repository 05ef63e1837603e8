"""The web examples (Flask, Django, ASGI) served on 127.0.0.1 by a real HTTP server and
called through a real HTTP client: a POST starts a detached turn (202 and its id), its
events stream as server-sent events with ``id: <turn_id>:<seq>``, a reconnect with
Last-Event-ID resumes after that event, a bad or foreign Last-Event-ID is a 400, any user key
is a session, the transcript can be read back, and a client that hangs up mid-stream leaves
the turn running to its commit. On PostgreSQL (the ``postgres_url`` fixture: skipped
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


def parse_sse(raw: bytes) -> list[tuple[str, Any, str | None]]:
    """(event name, data, id) triples of the frames that carry data."""
    events = []
    for block in raw.decode().split("\n\n"):
        name, data, event_id = "message", None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line.startswith("id: "):
                event_id = line[4:]
        if data is not None:
            events.append((name, data, event_id))
    return events


def start(port: int, user: str, message: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("POST", f"/chat/{quote(user, safe='')}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    doc: dict[str, Any] = json.loads(response.read())
    conn.close()
    return response.status, doc


def read_events(port: int, user: str, turn_id: str | None = None,
                last_event_id: str | None = None) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    query = "" if turn_id is None else f"?turn={turn_id}"
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    conn.request("GET", f"/chat/{quote(user, safe='')}/events{query}", headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def post(port: int, user: str, message: str) -> tuple[dict[str, Any], list[Any]]:
    """Start a turn (202) and read its events to the end."""
    status, doc = start(port, user, message)
    assert status == 202, doc
    response, body = read_events(port, user, doc["turn_id"])
    assert response.status == 200, body
    return doc, parse_sse(body)


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
    status, started = start(port, user, "Hello")
    assert status == 202 and started["session_id"] == session_id_for(user)
    turn_id = started["turn_id"]
    response, body = read_events(port, user, turn_id)
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-cache"
    assert body.startswith(b"retry: ")
    events = parse_sse(body)
    assert [i for _, _, i in events] == [f"{turn_id}:{d['seq']}" for _, d, _ in events]
    assert all(d["type"] == name and d["turn_id"] == turn_id for name, d, _ in events)
    texts = [d["text"] for name, d, _ in events if name == "text.delta"]
    assert "Hello" in "".join(texts)
    assert events[0][0] == "run.start" and events[-1][0] == "run.done"
    assert events[-1][1]["finish_reason"] == "stop"
    assert events[-1][1]["result"]["text"] == "".join(texts)
    doc = transcript(port, user)
    assert doc["session_id"] == session_id_for(user) and doc["turn"] is None
    assert doc["messages"] == [{"role": "user", "text": "Hello"},
                               {"role": "assistant", "text": "".join(texts)}]
    # without ?turn: the latest turn
    _, latest = read_events(port, user)
    assert parse_sse(latest) == events


def test_a_reconnect_with_last_event_id_resumes_after_it(port: int) -> None:
    user = "reconnects@example.com"
    started, events = post(port, user, "one two three four")
    for cut in (0, 2, len(events) - 2):
        response, body = read_events(port, user, started["turn_id"],
                                     last_event_id=events[cut][2])
        assert response.status == 200
        assert parse_sse(body) == events[cut + 1:]


def test_a_bad_or_foreign_last_event_id_is_a_400_and_no_turn_a_404(port: int) -> None:
    mine, _ = post(port, "mine@example.com", "hi")
    theirs, _ = post(port, "theirs@example.com", "hi")
    for bad in ("garbage", f"{mine['turn_id']}", f"{mine['turn_id']}:-1",
                f"{theirs['turn_id']}:1"):  # another session's turn: never streamed
        response, body = read_events(port, "mine@example.com", last_event_id=bad)
        assert response.status == 400, (bad, body)
        assert json.loads(body)["code"] == "LOUSHO_INVALID_EVENT_ID"
    response, body = read_events(port, "mine@example.com", mine["turn_id"],
                                 last_event_id=f"{theirs['turn_id']}:1")
    assert response.status == 400 and b"names turn" in body
    response, body = read_events(port, "nobody@example.com")
    assert response.status == 404 and json.loads(body)["code"] == "LOUSHO_TURN_NOT_FOUND"


def test_any_user_key_is_its_own_session(port: int) -> None:
    keys = ["a.b", "bad/id", "ali@example.com", "tenant:42", "用户", "José", "x" * 300]
    for key in keys:
        _, events = post(port, key, f"I am {key}")
        assert events[-1][0] == "run.done", (key, events)
    for key in keys:
        doc = transcript(port, key)
        assert doc["session_id"] == session_id_for(key)
        assert [m["text"] for m in doc["messages"] if m["role"] == "user"] == [f"I am {key}"]
    assert len({session_id_for(k) for k in keys}) == len(keys)


def test_a_client_that_hangs_up_mid_stream_leaves_the_turn_to_commit(port: int) -> None:
    user = "hangs-up@example.com"
    status, started = start(port, user, "tell me a story")
    assert status == 202
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.sendall(b"GET /chat/" + quote(user, safe="").encode() + b"/events?turn="
                 + started["turn_id"].encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    received = b""
    while b"event: run.start" not in received:  # the turn's events have started
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    sock.close()  # hang up
    _, body = read_events(port, user, started["turn_id"])  # another reader: to the end
    assert parse_sse(body)[-1][1]["finish_reason"] == "stop"
    doc = transcript(port, user)
    assert [(m["role"], m["text"]) for m in doc["messages"]][0] == ("user", "tell me a story")
    assert len(doc["messages"]) == 2


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
                    self.stop()  # (its output is kept: output() reads it after stop())
                    raise AssertionError(f"{name} never listened: {self.output()}") from None
                time.sleep(0.05)

    def output(self) -> str:
        """What the app printed so far (also after :meth:`stop`)."""
        return Path(self.log.name).read_text(errors="replace")

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
            _, events = post(first.port, user, "Hello from process one")
            assert events[-1][0] == "run.done", (events, first.output())
            with PostgresStore(postgres_url, schema=postgres_schema) as store:
                stored = store.sessions.load(session_id_for(user))  # it is in PostgreSQL
            assert stored is not None
            assert [m.text for m in stored][0] == "Hello from process one"
            doc = transcript(second.port, user)  # read by the other process
            assert doc["session_id"] == session_id_for(user)
            assert [(m["role"], m["text"]) for m in doc["messages"]] == [
                (m.role, m.text) for m in stored]
            _, events = post(second.port, user, "And from process two")
            assert events[-1][1]["finish_reason"] == "stop"
            assert len(transcript(second.port, user)["messages"]) == 4
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


def test_the_chat_page_is_served_at_the_root(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("GET", "/")
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/html")
    assert body == (EXAMPLES / "static" / "chat.html").read_text()
    assert "new EventSource(" in body
