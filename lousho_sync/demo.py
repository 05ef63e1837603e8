"""``lousho demo``: an offline tour on the scripted provider and the embedded SQLite store.

It shows a multi-turn session, a streamed turn, a tool call, a turn killed mid-way in a real
child process and resumed here, and an approval paused and resolved.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TextIO

from . import Agent, ModelRequest, create_agent
from .events import TextDelta, ToolCallStart, ToolResultEvent
from .providers.scripted import ScriptedProvider, Step
from .tools import ToolContext, tool

__all__ = ["run_demo"]

CRASH_SESSION = "demo-crash"


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"18°C and sunny in {city}"


@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money (needs a human's approval)."""
    return f"sent {amount:.2f} to {to}"


def _answer(request: ModelRequest) -> Step | str:
    """The scripted model: decides from the conversation, so any process can continue it."""
    last = list(request.messages)[-1]
    if last.role == "tool":
        return f"Done: {last.text}."
    text = last.text.lower()
    if "weather" in text:
        return Step(tool_calls=[("get_weather", {"city": "Rome"})])
    if "send" in text:
        return Step(tool_calls=[("transfer", {"amount": 25.0, "to": "Bob"})])
    if "report" in text:
        return Step(tool_calls=[("slow_report", {"year": 2026})])
    if "my name is" in text:
        return "Nice to meet you, Ali."
    if "what is my name" in text:
        names = [m.text for m in request.messages if m.role == "user" and "name is" in m.text]
        name = names[0].rsplit(" ", 1)[-1].rstrip(".") if names else "unknown"
        return Step(chunks=["Your ", "name ", "is ", f"{name}."])
    return "OK."


def _agent(db: Path, *, block_in_tool: bool) -> Agent:
    from .sqlite import SqliteStore

    @tool
    def slow_report(year: int, ctx: ToolContext) -> str:
        """Build a yearly report (slow)."""
        if block_in_tool:
            print("IN-TOOL", flush=True)
            threading.Event().wait(3600)  # the parent kills this process here
        return f"report {year} ready (call {ctx.call.id})"

    return create_agent(
        instructions="Be brief.",
        provider=ScriptedProvider(default=_answer),
        tools=[get_weather, transfer, slow_report],
        store=SqliteStore(db),
    )


def run_demo(directory: str | None, *, out: TextIO) -> int:
    """Run the tour in ``directory`` (a temporary one by default); returns the exit code."""
    with tempfile.TemporaryDirectory(prefix="lousho-demo-") as tmp:
        root = Path(directory or tmp)
        root.mkdir(parents=True, exist_ok=True)
        _tour(root / "agent.db", out)
    return 0


def _say(out: TextIO, text: str = "") -> None:
    out.write(text + "\n")
    out.flush()


def _tour(db: Path, out: TextIO) -> None:
    agent = _agent(db, block_in_tool=False)
    session = agent.session(id="demo-user")
    _say(out, f"lousho demo — offline: scripted model, SQLite store at {db}")

    _say(out, "\n== 1. A multi-turn session")
    _say(out, "user> My name is Ali.")
    _say(out, f"agent> {session.send('My name is Ali.').text}")

    _say(out, "\n== 2. A streamed turn (the model sees the first exchange)")
    out.write("user> What is my name?\nagent> ")
    for event in session.stream("What is my name?"):
        if isinstance(event, TextDelta):
            out.write(event.text)
    _say(out)

    _say(out, "\n== 3. A tool call")
    _say(out, "user> What is the weather in Rome?")
    for event in session.stream("What is the weather in Rome?"):
        if isinstance(event, ToolCallStart):
            _say(out, f"  tool.call   {event.call.name}({dict(event.call.arguments)})")
        elif isinstance(event, ToolResultEvent):
            _say(out, f"  tool.result {event.result}")
        elif isinstance(event, TextDelta):
            _say(out, f"agent> {event.text}")

    _say(out, "\n== 4. A crash mid-turn, resumed in another process")
    _crash_and_resume(db, out)

    _say(out, "\n== 5. An approval")
    _say(out, "user> Send 25 to Bob.")
    paused = session.send("Send 25 to Bob.")
    _say(out, f"  paused: finish_reason={paused.finish_reason}, approval {paused.approval_id}")
    _say(out, f"  pending: {session.pending()}")
    assert paused.approval_id is not None
    record = agent.approvals.get(paused.approval_id)
    assert record is not None
    _say(out, f"  a human approves {record.call.name}({dict(record.call.arguments)})")
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert done is not None
    _say(out, f"agent> {done.text}")

    _say(out, f"\n== The stored transcript of {session.id!r} ({len(session.messages)} messages)")
    for message in session.messages:
        what = message.text or ", ".join(f"{c.name}()" for c in message.tool_calls)
        _say(out, f"  {message.role:>9}: {what}")
    _say(out, "\ndemo finished: ok")


def _crash_and_resume(db: Path, out: TextIO) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "lousho_sync.demo", "--child", str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    try:
        line = child.stdout.readline().strip()
        if line != "IN-TOOL":
            raise RuntimeError(f"the demo's child process did not reach its tool (said "
                               f"{line!r})")
        _say(out, f"  child process {child.pid}: user> Build the 2026 report. (the tool is "
                  "running)")
    finally:  # also when stdout's reader left (lousho demo | head): no child outlives us
        child.kill()  # SIGKILL on POSIX: no cleanup, no goodbye
        child.wait(30)
        child.stdout.close()
    _say(out, f"  killed child process {child.pid} in the middle of its tool call")
    agent = _agent(db, block_in_tool=False)
    session = agent.session(id=CRASH_SESSION)
    _say(out, f"  this process finds the turn: pending() = {session.pending()}")
    result = agent.resume(CRASH_SESSION)
    assert result is not None
    _say(out, f"  resumed: agent> {result.text}")
    _say(out, f"  transcript now holds {len(session.messages)} messages; pending() = "
              f"{session.pending()}")


def _child(db: str) -> None:
    import logging
    import warnings

    from .errors import LoushoWarning

    # the parent already told the user about the store; the child stays quiet
    warnings.simplefilter("ignore", LoushoWarning)
    logging.getLogger("lousho_sync").setLevel(logging.ERROR)
    agent = _agent(Path(db), block_in_tool=True)
    agent.session(id=CRASH_SESSION).send("Build the 2026 report.")


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _child(sys.argv[2])
