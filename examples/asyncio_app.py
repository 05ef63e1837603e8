"""An asyncio service: a plain ASGI app (no framework) with one durable session per user,
answers streamed as server-sent events.

    POST /chat/<user>   {"message": "..."}  ->  text/event-stream:
                        data: {"text": "..."}            one per text delta
                        event: done / data: {...}        finish_reason, session_id, messages
    GET  /chat/<user>                       ->  {"session_id": ..., "messages": [...]}

<user> is any key (an e-mail, "tenant:42", unicode): session_id_for() maps it to a valid
session id. A client that disconnects mid-stream aborts its turn (the app watches for
``http.disconnect`` and cancels the stream): the transcript stays as it was. The model is
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
from urllib.parse import quote

import lousho_aio
from lousho_aio import LoushoError, ModelRequest, ScriptedProvider, Step, session_id_for
from lousho_sync.sqlite import SqliteStore


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: says which turn this is, a few words at a time;
    asked for a story, it goes on for a long while (long enough to hang up in the middle)."""
    users = [m.text for m in req.messages if m.role == "user"]
    if "story" in users[-1]:
        return Step(chunks=["Once upon a time"] + [" and then"] * 20_000 + ["."])
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


def sse(data: object, event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


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


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI application."""
    if scope["type"] != "http":
        return
    prefix = "/chat/"
    if not scope["path"].startswith(prefix) or len(scope["path"]) == len(prefix):
        await json_response(send, 404, {"error": "POST or GET /chat/<user>"})
        return
    user = scope["path"][len(prefix):]  # percent-decoded by the server
    session = agent.session(id=session_id_for(user))
    if scope["method"] == "GET":
        messages = await session.load()
        await json_response(send, 200, {"session_id": session.id, "messages": [
            {"role": m.role, "text": m.text} for m in messages]})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    text = message_of(body)
    if text is None:
        await json_response(send, 400, BAD_REQUEST)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    async def stream() -> None:
        try:
            async for event in session.stream(text):
                if event.type == "text.delta":
                    await send({"type": "http.response.body", "body": sse({"text": event.text}),
                                "more_body": True})
                elif event.type == "run.done":
                    done = {"finish_reason": event.finish_reason, "session_id": session.id,
                            "messages": len(session.messages)}
                    await send({"type": "http.response.body", "body": sse(done, "done"),
                                "more_body": True})
        except LoushoError as exc:  # e.g. SessionAwaitingApprovalError: told, not raised
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse({"error": str(exc), "code": exc.code}, "error")})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def hang_up() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming = asyncio.ensure_future(stream())
    watching = asyncio.ensure_future(hang_up())
    await asyncio.wait([streaming, watching], return_when=asyncio.FIRST_COMPLETED)
    # the client hung up first: cancelling the stream aborts the turn (nothing is saved)
    for task in (streaming, watching):
        task.cancel()
    await asyncio.gather(streaming, watching, return_exceptions=True)


def read_stream(port: int, user: str, message: str) -> str:
    """A client: POST a message, collect the answer as it streams in."""
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
            print(read_stream(port, user, "hello"))
        print(read_stream(port, "user0", "again"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/chat/user0")
        history = json.loads(conn.getresponse().read())
        print(f"{len(history['messages'])} messages in session {history['session_id']}")
    finally:
        server.should_exit = True
        thread.join(30)


if __name__ == "__main__":
    main()
