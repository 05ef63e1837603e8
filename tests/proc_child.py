"""Child processes for cross-process session tests.

    python tests/proc_child.py MODE KIND DIR [ARGS...]

Each child prints READY and waits for a line on stdin before it starts (so the parent can
start several at once without sleeping), then prints one JSON line with its outcome.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from crash_child import make_store

from lousho_sync import (
    ApprovalAlreadyResolvedError,
    ModelRequest,
    ScriptedProvider,
    SessionBusyError,
    Step,
    create_agent,
    tool,
)


def echo(request: ModelRequest) -> str:
    return "re: " + list(request.messages)[-1].text


@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money."""
    return f"sent {amount} to {to}"


def _ready() -> None:
    print("READY", flush=True)
    sys.stdin.readline()


def _out(value: Any) -> None:
    print(json.dumps(value), flush=True)


def main() -> None:
    mode, kind, root_s, *args = sys.argv[1:]
    root = Path(root_s)
    store = make_store(kind, root)
    if mode == "turns":  # ARGS: session id, label, count
        sid, label, count = args[0], args[1], int(args[2])
        agent = create_agent(provider=ScriptedProvider(default=echo), store=store)
        session = agent.session(id=sid)
        _ready()
        for j in range(count):
            session.send(f"{label}-m{j}")
        _out({"ok": count})
    elif mode == "toolturns":  # ARGS: session id, label, count; each turn calls a tool
        sid, label, count = args[0], args[1], int(args[2])

        @tool
        def add(a: int, b: int) -> int:
            """Add."""
            return a + b

        def answer(request: ModelRequest) -> Step | str:
            last = list(request.messages)[-1]
            if last.role == "tool":
                return "sum " + str(last.content)
            return Step(tool_calls=[("add", {"a": len(last.text), "b": 1})])

        agent = create_agent(provider=ScriptedProvider(default=answer), tools=[add],
                             store=store)
        session = agent.session(id=sid)
        _ready()
        for j in range(count):
            session.send(f"{label}-m{j}")
        _out({"ok": count})
    elif mode == "hold":  # run one turn whose model call waits for a stdin line
        def held(request: ModelRequest) -> str:
            print("IN-TURN", flush=True)
            sys.stdin.readline()
            return "held answer"

        agent = create_agent(provider=ScriptedProvider([held]), store=store)
        _ready()
        result = agent.session(id=args[0]).send("from the child")
        _out({"text": result.text})
    elif mode == "pause":  # a turn that pauses on an approval; prints the approval id
        provider = ScriptedProvider([Step(tool_calls=[("transfer", {"amount": 5.0, "to": "Bo"})])])
        agent = create_agent(provider=provider, tools=[transfer], store=store)
        _ready()
        result = agent.session(id=args[0]).send("pay Bo 5")
        _out({"finish": result.finish_reason, "approval_id": result.approval_id})
    elif mode == "resolve":  # ARGS: approval id
        agent = create_agent(provider=ScriptedProvider(default="Paid Bo."), tools=[transfer],
                             store=store)
        _ready()
        try:
            result = agent.approvals.resolve(id=args[0], approved=True)
            _out({"won": True, "text": result.text if result else None})
        except ApprovalAlreadyResolvedError:
            _out({"won": False})
    elif mode == "reject":  # one send with turn_policy=reject
        agent = create_agent(provider=ScriptedProvider(default=echo), store=store)
        _ready()
        try:
            agent.session(id=args[0], turn_policy="reject").send("rejected?")
            _out({"busy": False})
        except SessionBusyError:
            _out({"busy": True})
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
