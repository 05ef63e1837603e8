"""An asyncio service on detached turns: a plain ASGI app (no framework) on lousho_aio, one
durable session per user, answers read as server-sent events that survive dropped
connections.

    POST /chat/<user>         {"message": "..."}  ->  202 {"session_id", "turn_id"}
                              (400 without a message; 409 with the code when the session
                              cannot start a turn now)
    GET  /chat/<user>/events  [?turn=<turn_id>]   ->  text/event-stream of the turn (the
                              latest without ?turn), resumed after Last-Event-ID (400 when
                              it is malformed or names another turn; 404 with no turn)
    GET  /chat/<user>         ->  {"session_id", "messages", "turn": running turn or null}
    GET  /                    ->  static/chat.html, the chat page (EventSource)

The turn runs to its end whether or not anyone reads it; a client that hangs up only stops
its own reading (the app watches for ``http.disconnect``). <user> is any key (an e-mail,
"tenant:42", unicode): session_id_for() maps it to a valid session id. The model is
scripted (offline); set LOUSHO_MODEL=openai/gpt-4o-mini for a real one.

Run:   python examples/asyncio_app.py    (serves with uvicorn on 127.0.0.1, calls itself)
Serve: pip install 'lousho[asgi]'
       LOUSHO_DB=./chat.db uvicorn --app-dir examples asyncio_app:app
"""

from __future__ import annotations

import asyncio
import atexit
import http.client
import json
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import lousho_aio
from lousho_aio import (
    InvalidEventIdError,
    LoushoError,
    ModelRequest,
    ScriptedProvider,
    Step,
    TurnNotFoundError,
    session_id_for,
)
from lousho_aio.sse import HEADERS, sse_stream
from lousho_sync.sqlite import SqliteStore

PAGE = Path(__file__).resolve().parent / "static" / "chat.html"


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: says which turn this is, a few words at a time."""
    users = [m.text for m in req.messages if m.role == "user"]
    return Step(chunks=[f"turn {len(users)}: ", "you said ", repr(users[-1])])


def database() -> str:
    """$LOUSHO_DB, or a file in a temporary directory of this process (removed at exit)."""
    if os.environ.get("LOUSHO_DB"):
        return os.environ["LOUSHO_DB"]
    tmp = tempfile.TemporaryDirectory(prefix="lousho-asgi-")
    atexit.register(tmp.cleanup)
    return str(Path(tmp.name) / "agent.db")


agent = lousho_aio.create_agent(
    **({"model": os.environ["LOUSHO_MODEL"]} if os.environ.get("LOUSHO_MODEL")
       else {"provider": ScriptedProvider(default=model)}),
    store=SqliteStore(database()),
)


async def json_response(send: Any, status: int, body: object) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def message_of(body: bytes) -> str | None:
    """The ``"message"`` of a JSON request body: a non-empty str, else None (a 400)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    text = doc.get("message") if isinstance(doc, dict) else None
    return text if isinstance(text, str) and text else None


BAD_REQUEST = {"error": 'send a JSON object with a non-empty "message" string'}


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def stream_events(scope: dict[str, Any], receive: Any, send: Any, session: Any) -> None:
    """GET /chat/<user>/events: the turn as server-sent events until it ends or the client
    hangs up (which leaves the turn running)."""
    query = parse_qs(scope.get("query_string", b"").decode())
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    try:  # lousho_aio reads the store in its pool when the first frame is asked for
        frames = sse_stream(session, turn_id=query.get("turn", [None])[0],
                            last_event_id=headers.get("last-event-id"))
        first = await anext(frames)
    except InvalidEventIdError as exc:  # a bad or foreign Last-Event-ID
        await json_response(send, 400, {"error": str(exc), "code": exc.code})
        return
    except TurnNotFoundError as exc:
        await json_response(send, 404, {"error": str(exc), "code": exc.code})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (k.lower().encode(), v.encode()) for k, v in HEADERS.items()]})

    async def forward() -> None:
        await send({"type": "http.response.body", "body": first.encode(), "more_body": True})
        async for frame in frames:
            await send({"type": "http.response.body", "body": frame.encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def hang_up() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    forwarding = asyncio.ensure_future(forward())
    watching = asyncio.ensure_future(hang_up())
    await asyncio.wait([forwarding, watching], return_when=asyncio.FIRST_COMPLETED)
    for task in (forwarding, watching):  # the client left: stop reading (the turn goes on)
        task.cancel()
    await asyncio.gather(forwarding, watching, return_exceptions=True)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI application."""
    if scope["type"] != "http":
        return
    path, method = scope["path"], scope["method"]
    if path == "/" and method == "GET":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8")]})
        await send({"type": "http.response.body", "body": PAGE.read_bytes()})
        return
    prefix = "/chat/"
    if not path.startswith(prefix) or len(path) == len(prefix):
        await json_response(send, 404, {"error": "POST or GET /chat/<user>"})
        return
    user = path[len(prefix):]  # percent-decoded by the server
    if method == "GET" and user.endswith("/events"):
        session = agent.session(id=session_id_for(user[:-len("/events")]))
        await stream_events(scope, receive, send, session)
        return
    session = agent.session(id=session_id_for(user))
    if method == "GET":
        messages = await session.load()
        turn = await session.current_turn()
        await json_response(send, 200, {
            "session_id": session.id,
            "messages": [{"role": m.role, "text": m.text} for m in messages],
            "turn": None if turn is None else {"turn_id": turn.turn_id, "status": turn.status}})
        return
    text = message_of(await read_body(receive))
    if text is None:
        await json_response(send, 400, BAD_REQUEST)
        return
    try:
        run = await session.start(text)  # runs to its end, whoever reads it
    except LoushoError as exc:  # e.g. its turn waits for an approval
        await json_response(send, 409, {"error": str(exc), "code": exc.code})
        return
    await json_response(send, 202, {"session_id": session.id, "turn_id": run.turn_id})


def post_and_read(port: int, user: str, message: str) -> str:
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
    import uvicorn  # pip install 'lousho[asgi]'

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait here until the server runs
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for user in ("user0", "user1", "user2"):
            print(post_and_read(port, user, "hello"))
        print(post_and_read(port, "user0", "again"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/chat/user0")
        history = json.loads(conn.getresponse().read())
        print(f"{len(history['messages'])} messages in session {history['session_id']}")
    finally:
        server.should_exit = True
        thread.join(30)


if __name__ == "__main__":
    main()
