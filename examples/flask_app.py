"""A Flask app: one durable session per user, answers streamed as server-sent events.

    POST /chat/<user>   {"message": "..."}  ->  text/event-stream:
                        data: {"text": "..."}            one per text delta
                        event: done / data: {...}        finish_reason, session_id, messages
    GET  /chat/<user>                       ->  {"session_id": ..., "messages": [...]}

<user> is any key (an e-mail, "tenant:42", unicode): session_id_for() maps it to a valid
session id. A client that disconnects mid-stream aborts its turn: the transcript stays as
it was. The model is scripted (offline); set LOUSHO_MODEL=openai/gpt-4o-mini for a real one.

Run:   python examples/flask_app.py    (serves on 127.0.0.1 and calls itself over HTTP)
Serve: LOUSHO_DB=./chat.db flask --app examples/flask_app.py run
       LOUSHO_DB=./chat.db gunicorn -w 4 --chdir examples flask_app:app
       (set LOUSHO_DB so that every worker shares one SQLite file; without it each process
       keeps its sessions in a temporary directory of its own)

On PostgreSQL: set app.config["LOUSHO_POSTGRES_URL"] (here from $LOUSHO_POSTGRES_URL, e.g.
postgresql://app:secret@db.internal:5432/app) and the sessions go to a PostgresStore there
(tables in the schema app.config["LOUSHO_POSTGRES_SCHEMA"], default "lousho"), shared by
every worker and machine:
       LOUSHO_POSTGRES_URL=postgresql://... gunicorn -w 4 --chdir examples flask_app:app
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

from flask import Flask, Response, jsonify, request
from werkzeug.serving import make_server

from lousho_sync import (
    LoushoError,
    ModelRequest,
    ScriptedProvider,
    Step,
    create_agent,
    session_id_for,
)
from lousho_sync.sqlite import SqliteStore


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: says what it received, a word at a time; asked for
    a story, it goes on for a long while (long enough to hang up in the middle)."""
    users = [m.text for m in req.messages if m.role == "user"]
    if "story" in users[-1]:
        return Step(chunks=["Once upon a time"] + [" and then"] * 20_000 + ["."])
    words = f"Message {len(users)} received: {users[-1]}".split(" ")
    return Step(chunks=[w if i == 0 else " " + w for i, w in enumerate(words)])


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
    **({"model": os.environ["LOUSHO_MODEL"]} if os.environ.get("LOUSHO_MODEL")
       else {"provider": ScriptedProvider(default=model)}),
    store=store(),
)


def sse(data: object, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def message_of(body: bytes) -> str | None:
    """The ``"message"`` of a JSON request body: a non-empty str, else None (a 400)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    text = doc.get("message") if isinstance(doc, dict) else None
    return text if isinstance(text, str) and text else None


BAD_REQUEST = {"error": 'send a JSON object with a non-empty "message" string'}


@app.post("/chat/<path:user>")
def chat(user: str) -> Response:
    text = message_of(request.get_data())
    if text is None:
        response = jsonify(BAD_REQUEST)
        response.status_code = 400
        return response
    session = agent.session(id=session_id_for(user))
    try:
        run = session.stream(text)  # the turn joins the queue now
    except LoushoError as exc:  # e.g. its turn waits for an approval (a store without
        response = jsonify(error=str(exc), code=exc.code)  # checkpoints refuses at once)
        response.status_code = 409
        return response

    def events() -> Iterator[str]:
        # A client that hangs up makes the server close this generator: the loop stops,
        # and leaving it aborts the turn (nothing of it is saved).
        try:
            for event in run:
                if event.type == "text.delta":
                    yield sse({"text": event.text})
                elif event.type == "run.done":
                    yield sse({"finish_reason": event.finish_reason, "session_id": session.id,
                               "messages": len(session.messages)}, "done")
        except LoushoError as exc:  # e.g. SessionAwaitingApprovalError: told, not raised
            yield sse({"error": str(exc), "code": exc.code}, "error")

    return Response(events(), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@app.get("/chat/<path:user>")
def transcript(user: str) -> Response:
    session = agent.session(id=session_id_for(user))
    return jsonify(session_id=session.id,
                   messages=[{"role": m.role, "text": m.text} for m in session.messages])


def read_stream(port: int, user: str, message: str) -> str:
    """A client: POST a message, print the answer as it streams in."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", f"/chat/{quote(user)}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    text = ""
    for line in conn.getresponse():
        if line.startswith(b"data: ") and "text" in (data := json.loads(line[6:])):
            text += data["text"]
    conn.close()
    return text


def main() -> None:
    server = make_server("127.0.0.1", 0, app, threaded=True)  # a real HTTP server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for message in ("Hello", "How are you?"):
            print(read_stream(server.server_port, "ali@example.com", message))
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("GET", "/chat/ali@example.com")
        history = json.loads(conn.getresponse().read())
        print(f"{len(history['messages'])} messages in session {history['session_id']}")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
