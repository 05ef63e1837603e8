"""``lousho demo``: an offline tour on the scripted provider."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TextIO

from . import create_agent
from .events import TextDelta, ToolCallStart, ToolResultEvent
from .providers.scripted import ScriptedProvider, Step
from .tools import tool

__all__ = ["run_demo"]


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"18°C and sunny in {city}"


@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money (needs a human's approval)."""
    return f"sent {amount:.2f} to {to}"


def run_demo(directory: str | None, *, out: TextIO) -> int:
    """Run the tour; returns the exit code."""
    with tempfile.TemporaryDirectory(prefix="lousho-demo-") as tmp:
        root = Path(directory or tmp)
        root.mkdir(parents=True, exist_ok=True)
        _tour(root, out)
    return 0


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def _tour(root: Path, out: TextIO) -> None:
    provider = ScriptedProvider(
        [
            "Nice to meet you, Ali.",
            Step(chunks=["Your ", "name ", "is ", "Ali."]),
            Step(tool_calls=[("get_weather", {"city": "Rome"})]),
            "It is 18°C and sunny in Rome.",
            Step(tool_calls=[("transfer", {"amount": 25.0, "to": "Bob"})]),
            "Done: 25.00 was sent to Bob.",
        ]
    )
    agent = create_agent(instructions="Be brief.", provider=provider,
                         tools=[get_weather, transfer])
    session = agent.session(id="demo-user")

    _say(out, "== 1. A multi-turn session")
    _say(out, "user> My name is Ali.")
    _say(out, f"agent> {session.send('My name is Ali.').text}")

    _say(out, "== 2. A streamed turn (the model sees the first exchange)")
    out.write("user> What is my name?\nagent> ")
    for event in session.stream("What is my name?"):
        if isinstance(event, TextDelta):
            out.write(event.text)
    _say(out, "")

    _say(out, "== 3. A tool call")
    _say(out, "user> Weather in Rome?")
    for event in session.stream("Weather in Rome?"):
        if isinstance(event, ToolCallStart):
            _say(out, f"  tool.call   {event.call.name}({dict(event.call.arguments)})")
        elif isinstance(event, ToolResultEvent):
            _say(out, f"  tool.result {event.result}")
        elif isinstance(event, TextDelta):
            _say(out, f"agent> {event.text}")

    _say(out, "== 4. An approval")
    _say(out, "user> Send 25 to Bob.")
    paused = session.send("Send 25 to Bob.")
    _say(out, f"  finish_reason={paused.finish_reason} approval_id={paused.approval_id}")
    assert paused.approval_id is not None
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert done is not None
    _say(out, f"  approved -> agent> {done.text}")

    _say(out, f"== The transcript holds {len(session.messages)} messages:")
    for message in session.messages:
        label = message.role if not message.tool_calls else "assistant(tool call)"
        _say(out, f"  {label:>20}: {message.text or [c.name for c in message.tool_calls]}")
    _say(out, "demo finished: ok")
