"""An asyncio service: a plain ASGI app (no framework) with one durable session per user,
and a streamed answer. Run: python examples/asyncio_app.py (drives the app in-process).

Serve it with any ASGI server, e.g. `uvicorn examples.asyncio_app:app`.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any
from urllib.parse import parse_qs

import lousho_aio
from lousho_sync import ModelRequest, ScriptedProvider, Step
from lousho_sync.sqlite import SqliteStore


def model(req: ModelRequest) -> Step:
    users = [m.text for m in req.messages if m.role == "user"]
    return Step(chunks=[f"turn {len(users)}: ", "you said ", repr(users[-1])])


DB = os.environ.get("LOUSHO_DB", os.path.join(tempfile.gettempdir(), "lousho-asgi.db"))
agent = lousho_aio.create_agent(provider=ScriptedProvider(default=model), store=SqliteStore(DB))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """POST /chat?user=ID with {"message": ...}: streams the answer as it is generated."""
    query = parse_qs(scope.get("query_string", b"").decode())
    user = query.get("user", ["anonymous"])[0]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    text = json.loads(body)["message"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    async for event in agent.session(id=user).stream(text):  # cancelling aborts the turn
        if event.type == "text.delta":
            await send({"type": "http.response.body", "body": event.text.encode(),
                        "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def call(user: str, text: str) -> str:
    """Drive the app in-process, as an ASGI server would."""
    scope = {"type": "http", "method": "POST", "path": "/chat",
             "query_string": f"user={user}".encode()}
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps({"message": text}).encode()}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    await app(scope, receive, send)
    return b"".join(sent).decode()


async def main() -> None:
    first = await asyncio.gather(*(call(f"user{i}", "hello") for i in range(3)))
    print(*first, sep="\n")
    print(await call("user0", "again"))


if __name__ == "__main__":
    asyncio.run(main())
