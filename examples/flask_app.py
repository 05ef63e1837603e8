"""A Flask app on detached turns: one durable session per user, answers read as server-sent
events that survive dropped connections, a chat page that needs no JavaScript of yours.

    POST /chat/<user>         {"message": "..."}  ->  202 {"session_id", "turn_id"}
                              (400 without a message; 409 with the code when the session
                              cannot start a turn now, e.g. one waits for an approval)
    GET  /chat/<user>/events  [?turn=<turn_id>]   ->  text/event-stream of the turn
                              (the latest without ?turn): ``id: <turn_id>:<seq>``,
                              ``event: <type>``, ``data: <JSON>``; a reconnecting browser's
                              Last-Event-ID resumes after the event it names (400 when it is
                              malformed or names another turn; 404 when there is no turn)
    GET  /chat/<user>         ->  {"session_id", "messages", "turn": running turn or null}
    GET  /                    ->  static/chat.html, the chat page (EventSource)

The turn runs to its end in the process that started it whether or not anyone reads it;
any worker sharing the store streams it (``session.attach()``). <user> is any key (an
e-mail, "tenant:42", unicode): session_id_for() maps it to a valid session id. The model is
scripted (offline): it answers word by word, LOUSHO_EXAMPLE_PACE_S seconds apart (default
0); set LOUSHO_MODEL=openai/gpt-4o-mini for a real one.

Run:   python examples/flask_app.py    (serves on 127.0.0.1 and calls itself over HTTP)
Serve: LOUSHO_DB=./chat.db flask --app examples/flask_app.py run   (then open /?user=ali)
       LOUSHO_DB=./chat.db gunicorn -w 4 --threads 8 --chdir examples flask_app:app
       (set LOUSHO_DB so that every worker shares one SQLite file; without it each process
       keeps its sessions in a temporary directory of its own. An event stream holds a
       thread while it is open: give workers threads.)

On PostgreSQL: set app.config["LOUSHO_POSTGRES_URL"] (here from $LOUSHO_POSTGRES_URL, e.g.
postgresql://app:secret@db.internal:5432/app) and the sessions go to a PostgresStore there
(tables in the schema app.config["LOUSHO_POSTGRES_SCHEMA"], default "lousho"), shared by
every worker and machine:
       LOUSHO_POSTGRES_URL=postgresql://... gunicorn -w 4 --threads 8 --chdir examples flask_app:app
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flask import Flask, Response, jsonify, request, send_file
from werkzeug.serving import make_server

from lousho_sync import (
    InvalidEventIdError,
    LoushoError,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    Provider,
    ScriptedProvider,
    Signal,
    Step,
    TurnNotFoundError,
    create_agent,
    session_id_for,
)
from lousho_sync.sqlite import SqliteStore
from lousho_sync.sse import HEADERS, sse_stream

PAGE = Path(__file__).resolve().parent / "static" / "chat.html"


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: says what it received, a word at a time."""
    users = [m.text for m in req.messages if m.role == "user"]
    words = f"Message {len(users)} received: {users[-1]}".split(" ")
    return Step(chunks=[w if i == 0 else " " + w for i, w in enumerate(words)])


class Paced:
    """A provider that passes another one's answer on, ``pace_s`` seconds between text
    deltas: a slow model, so that a page shows an answer arriving."""

    def __init__(self, inner: Provider, pace_s: float) -> None:
        self.inner = inner
        self.pace_s = pace_s

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        for event in self.inner.stream(request, signal=signal):
            if isinstance(event, ModelTextDelta) and self.pace_s and signal.wait(self.pace_s):
                signal.raise_if_aborted()
            yield event

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        return self.inner.complete(request, signal=signal)


def database() -> str:
    """$LOUSHO_DB, or a file in a temporary directory of this process (removed at exit)."""
    if os.environ.get("LOUSHO_DB"):
        return os.environ["LOUSHO_DB"]
    tmp = tempfile.TemporaryDirectory(prefix="lousho-flask-")
    atexit.register(tmp.cleanup)
    return str(Path(tmp.name) / "agent.db")


app = Flask(__name__)
app.config.update(LOUSHO_POSTGRES_URL=os.environ.get("LOUSHO_POSTGRES_URL"),
                  LOUSHO_POSTGRES_SCHEMA=os.environ.get("LOUSHO_POSTGRES_SCHEMA", "lousho"))


def store() -> Any:
    """A PostgresStore when app.config names a PostgreSQL database, else SQLite."""
    url = app.config["LOUSHO_POSTGRES_URL"]
    if url:
        from lousho_sync.postgres import PostgresStore

        pg = PostgresStore(url, schema=app.config["LOUSHO_POSTGRES_SCHEMA"])
        atexit.register(pg.close)
        return pg
    return SqliteStore(database())


agent = create_agent(
    **({"model": os.environ["LOUSHO_MODEL"]} if os.environ.get("LOUSHO_MODEL") else
       {"provider": Paced(ScriptedProvider(default=model),
                          float(os.environ.get("LOUSHO_EXAMPLE_PACE_S", "0")))}),
    store=store(),
)


def message_of(body: bytes) -> str | None:
    """The ``"message"`` of a JSON request body: a non-empty str, else None (a 400)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    text = doc.get("message") if isinstance(doc, dict) else None
    return text if isinstance(text, str) and text else None


BAD_REQUEST = {"error": 'send a JSON object with a non-empty "message" string'}


def error(status: int, exc: LoushoError | None = None, **body: Any) -> Response:
    response = jsonify(**body) if exc is None else jsonify(error=str(exc), code=exc.code)
    response.status_code = status
    return response


@app.get("/")
def page() -> Response:
    return send_file(PAGE, mimetype="text/html")


@app.post("/chat/<path:user>")
def chat(user: str) -> Response:
    text = message_of(request.get_data())
    if text is None:
        return error(400, **BAD_REQUEST)
    session = agent.session(id=session_id_for(user))
    try:
        run = session.start(text)  # runs to its end here, whoever reads it
    except LoushoError as exc:  # e.g. its turn waits for an approval
        return error(409, exc)
    response = jsonify(session_id=session.id, turn_id=run.turn_id)
    response.status_code = 202
    return response


@app.get("/chat/<path:user>/events")
def events(user: str) -> Response:
    session = agent.session(id=session_id_for(user))
    try:
        frames = sse_stream(session, turn_id=request.args.get("turn"),
                            last_event_id=request.headers.get("Last-Event-ID"))
    except InvalidEventIdError as exc:  # a bad or foreign Last-Event-ID
        return error(400, exc)
    except TurnNotFoundError as exc:
        return error(404, exc)
    # a client that hangs up closes the generator: the turn goes on
    return Response(frames, headers=HEADERS)


@app.get("/chat/<path:user>")
def transcript(user: str) -> Response:
    session = agent.session(id=session_id_for(user))
    turn = session.current_turn()
    return jsonify(session_id=session.id,
                   messages=[{"role": m.role, "text": m.text} for m in session.messages],
                   turn=None if turn is None else {"turn_id": turn.turn_id,
                                                   "status": turn.status})


def send(port: int, user: str, message: str) -> str:
    """A client: POST a message (202 and the turn's id), then read the turn's events and
    return the answer's text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", f"/chat/{quote(user)}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    started = conn.getresponse()
    assert started.status == 202, started.read()
    turn_id = json.loads(started.read())["turn_id"]
    conn.request("GET", f"/chat/{quote(user)}/events?turn={turn_id}")
    text, kind = "", ""
    for line in conn.getresponse():
        if line.startswith(b"event: "):
            kind = line[7:].decode().strip()
        elif line.startswith(b"data: ") and kind == "text.delta":
            text += json.loads(line[6:])["text"]
    conn.close()
    return text


def main() -> None:
    server = make_server("127.0.0.1", 0, app, threaded=True)  # a real HTTP server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for message in ("Hello", "How are you?"):
            print(send(server.server_port, "ali@example.com", message))
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("GET", "/chat/ali@example.com")
        history = json.loads(conn.getresponse().read())
        print(f"{len(history['messages'])} messages in session {history['session_id']}")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
