"""A small app with a tool that needs approval, for the ``--app`` of ``lousho approvals`` and
``lousho serve`` in tests: ``approval_app:make_agent`` builds it on the store it is given.

Its model is scripted and stateless, so any process continues any turn: asked to pay, it
calls ``pay`` with the amount, recipient and memo from ``$APPROVAL_APP_ARGS`` (JSON; a
default otherwise); after the tool's result it answers ``outcome: <result>``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lousho_sync import Agent, ScriptedProvider, Step, create_agent, tool
from lousho_sync.providers.base import ModelRequest


@tool(needs_approval=True, approval_ttl_s=3600)
def pay(amount: int, to: str, memo: str = "") -> str:
    """Send money."""
    return f"paid {amount} to {to}"


def brain(request: ModelRequest) -> Step | str:
    last = list(request.messages)[-1]
    if last.role == "tool":
        return f"outcome: {last.text}"
    args = json.loads(os.environ.get("APPROVAL_APP_ARGS") or '{"amount": 5, "to": "bob"}')
    return Step(tool_calls=[("pay", args)])


def make_agent(store: Any = None, **kw: Any) -> Agent:
    """The app's agent on ``store``."""
    return create_agent(provider=ScriptedProvider(default=brain), tools=[pay], store=store, **kw)


def pause(where: str, session_id: str, text: str = "pay bob", metadata: str = "") -> str:
    """Pause a turn of ``session_id`` in the store ``where`` names as ``--store`` does (a
    SQLite file, a directory, a redis:// or postgresql:// URL; encrypted with
    ``$LOUSHO_ENCRYPTION_KEYS``), its metadata set from the JSON ``metadata`` first; its
    approval id."""
    from lousho_sync.cli import open_store

    store = open_store(where, create=True)
    try:
        session = make_agent(store).session(session_id)
        if metadata:
            session.set_metadata(json.loads(metadata))
        result = session.send(text)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    assert result.approval_id is not None, result
    return result.approval_id


if __name__ == "__main__":  # python approval_app.py DB SESSION [TEXT [METADATA]]: pause
    import sys

    print(pause(*sys.argv[1:]), flush=True)
