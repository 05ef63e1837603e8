"""A Flask view: one durable session per user, in a SQLite file shared by every worker.

Run: python examples/flask_app.py   (drives the app with Flask's test client)
Serve: flask --app examples/flask_app.py run
"""

from __future__ import annotations

import os
import tempfile

from flask import Flask, jsonify, request

from lousho_sync import (
    ModelRequest,
    ScriptedProvider,
    SessionAwaitingApprovalError,
    SessionBusyError,
    create_agent,
)
from lousho_sync.sqlite import SqliteStore


def model(req: ModelRequest) -> str:
    users = [m.text for m in req.messages if m.role == "user"]
    return f"Message {len(users)} received: {users[-1]}"


DB = os.environ.get("LOUSHO_DB", os.path.join(tempfile.gettempdir(), "lousho-flask.db"))
agent = create_agent(provider=ScriptedProvider(default=model), store=SqliteStore(DB))
app = Flask(__name__)


@app.post("/chat/<user_id>")
def chat(user_id: str):  # type: ignore[no-untyped-def]
    # turn_policy="reject": a double-click gets 409 instead of a second concurrent turn
    session = agent.session(id=user_id, turn_policy="reject")
    try:
        result = session.send(request.get_json()["message"])
    except SessionBusyError:
        return jsonify(error="a turn is already running"), 409
    except SessionAwaitingApprovalError as exc:
        return jsonify(error="waiting for approval", approval_id=exc.approval_id), 409
    return jsonify(text=result.text, messages=len(session.messages))


def main() -> None:
    client = app.test_client()
    for text in ("Hello", "How are you?"):
        reply = client.post("/chat/ali", json={"message": text}).get_json()
        print(reply["text"], f"({reply['messages']} messages stored)")


if __name__ == "__main__":
    main()
