"""A turn whose tool stops in the middle, for the SIGSTOP split-brain test.

    python tests/stop_child.py KIND LOCATION TOOL TTL

Runs one turn on session ``split`` that calls TOOL (``plain`` or ``pay``, the latter
``on_interrupted="report"``). In this process the tool prints ``IN_TOOL`` and waits for a
line on stdin; the parent SIGSTOPs it there. Prints ``DONE`` or ``ERROR <code>``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from storm_worker import make_store  # noqa: E402

from lousho_sync import (  # noqa: E402
    LoushoError,
    ModelRequest,
    ScriptedProvider,
    Step,
    ToolCall,
    ToolContext,
    create_agent,
    tool,
)

SESSION = "split"


def make_agent(kind: str, location: str, block: bool, log: list[str] | None = None) -> Any:
    """The agent: its tools block on stdin when ``block`` (the child), else return at once."""

    def work(context: ToolContext) -> str:
        if log is not None:
            log.append(context.call.id)
        if block:
            print("IN_TOOL", flush=True)
            sys.stdin.readline()
        return f"did {context.call.id} in {'child' if block else 'parent'}"

    @tool
    def plain(context: ToolContext) -> str:
        """May run again after a crash."""
        return work(context)

    @tool(on_interrupted="report")
    def pay(context: ToolContext) -> str:
        """Must never run twice."""
        return work(context)

    def answer(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            name = last.text
            return Step(tool_calls=(ToolCall(f"{name}-1", name, {}),))
        return Step(text="finished")

    return create_agent(provider=ScriptedProvider(default=answer), tools=[plain, pay],
                        store=make_store(kind, location))


def main() -> None:
    kind, location, which, ttl = sys.argv[1:5]
    session = make_agent(kind, location, block=True).session(id=SESSION, lease_ttl_s=float(ttl))
    try:
        session.send(which)
    except LoushoError as exc:
        print(f"ERROR {exc.code}", flush=True)
        return
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
