"""The README's code, as a user writes it, checked by ``mypy --strict`` (CI and
tests/test_typing.py). Never run: it only has to type-check.

Each function holds one README snippet; ``assert_type`` pins what a type checker infers, and
the ``# type: ignore[...]`` lines are mistakes mypy must keep refusing (``--strict`` reports
an ignore that is no longer needed).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, assert_type

import annotated_types as at
from flask import Flask, request

import lousho_aio
from lousho_sync import (
    AgentStore,
    AnthropicProvider,
    ApprovalRecord,
    Compaction,
    CompactionDone,
    ContextCleared,
    ExecutionResult,
    ListenerEvent,
    Message,
    OpenAIProvider,
    ScriptedProvider,
    SessionBusyError,
    Step,
    TextDelta,
    ToolCall,
    create_agent,
    message_from_dict,
    message_to_dict,
    result_from_dict,
    result_to_dict,
    tool,
)
from lousho_sync.events import Event
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores.memory import MemoryCheckpointStore, MemorySessionStore
from lousho_sync.tools import Tool


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"18°C in {city}"


@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money."""
    return f"sent {amount} to {to}"


def quickstart() -> None:
    agent = create_agent(
        instructions="Be brief.", model="openai/gpt-4o-mini", tools=[get_weather]
    )
    session = agent.session(id="user-42")
    session.send("My name is Ali.")
    print(session.send("What is my name?").text)

    for event in session.stream("Weather in Rome?"):
        assert_type(event, Event)
        if event.type == "text.delta":
            assert_type(event, TextDelta)
            print(event.text, end="")
        elif event.type == "tool.call":
            assert_type(event.call, ToolCall)
            print(event.call.name, dict(event.call.arguments))
        elif event.type == "usage":
            print(event.usage.input_tokens, event.total.output_tokens)
        elif event.type == "run.done":
            if event.result is not None:
                assert_type(event.result, ExecutionResult)
        elif event.type == "error":
            assert_type(event.error, BaseException)


def durable_sessions() -> None:
    agent = create_agent(model="openai/gpt-4o-mini", store=SqliteStore("./.lousho/agent.db"))
    result = agent.resume("user-42")
    assert_type(result, ExecutionResult | None)
    agent.session(id="user-42").pending()


def stores() -> None:
    create_agent(model="openai/gpt-4o-mini", store=MemorySessionStore())
    create_agent(
        model="openai/gpt-4o-mini",
        store=AgentStore(sessions=MemorySessionStore(), checkpoints=MemoryCheckpointStore()),
    )
    agent = create_agent(model="openai/gpt-4o-mini")
    agent.session("s", store=SqliteStore("./.lousho/agent.db"))
    agent.session("s", store=MemorySessionStore(), checkpoint_store=MemoryCheckpointStore())
    create_agent(model="openai/gpt-4o-mini", store="x.db")  # type: ignore[arg-type]


def compaction_and_listeners() -> None:
    agent = create_agent(
        model="openai/gpt-4o-mini", compaction=Compaction(max_input_tokens=50_000)
    )
    create_agent(model="openai/gpt-4o-mini", compaction=42)  # type: ignore[arg-type]
    session = agent.session("user-42")

    def listener(event: ListenerEvent) -> None:
        if event.type == "compaction.done":
            assert_type(event, CompactionDone)
            print(event.messages_before, "->", event.messages_after)
        elif event.type == "context.cleared":
            assert_type(event, ContextCleared)

    remove = session.on(listener)
    remove()


def approvals() -> None:
    agent = create_agent(model="openai/gpt-4o-mini", tools=[transfer])
    session = agent.session("user-42")
    paused = session.send("Pay Bob 25.")
    pending: list[ApprovalRecord] = agent.approvals.list()
    print(pending[0].call.arguments["amount"])
    assert paused.approval_id is not None
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    print(done)


def flask_app() -> Flask:
    app = Flask(__name__)
    agent = create_agent(model="openai/gpt-4o-mini", store=SqliteStore("./.lousho/agent.db"))

    @app.post("/chat/<user_id>")
    def chat(user_id: str) -> tuple[dict[str, str], int]:
        session = agent.session(id=user_id, turn_policy="reject")
        try:
            body = request.json
            assert isinstance(body, dict)
            return {"text": session.send(body["message"]).text}, 200
        except SessionBusyError:
            return {"error": "a turn is already running"}, 409

    return app


def aio() -> None:
    agent = lousho_aio.create_agent(model="openai/gpt-4o-mini", store=SqliteStore("agent.db"))

    async def handle(user_id: str, text: str) -> str:
        result = await agent.session(id=user_id).send(text)
        return result.text

    async def stream(user_id: str, text: str) -> AsyncIterator[str]:
        async for event in agent.session(id=user_id).stream(text):
            if event.type == "text.delta":
                assert_type(event, TextDelta)
                yield event.text

    print(handle, stream)


def providers() -> None:
    provider: OpenAIProvider | AnthropicProvider
    provider = OpenAIProvider("llama3.2", base_url="http://localhost:11434/v1", api_key="ollama")
    provider = AnthropicProvider("claude-3-5-haiku-latest")
    create_agent(provider=provider, instructions="Be brief.")


def records_cross_processes(result: ExecutionResult, message: Message) -> None:
    assert_type(result_from_dict(result_to_dict(result)), ExecutionResult)
    assert_type(message_from_dict(message_to_dict(message)), Message)
    by_message = {message: result}  # frozen records are hashable
    print(by_message, hash(message.tool_calls))


@dataclass
class Guest:
    name: str
    seats: Annotated[int, at.Ge(1), at.Le(8)] = 2


@tool(timeout_s=10)
def book(day: dt.date, guest: Guest) -> str:
    """Book a table."""
    return f"booked {guest.seats} seats for {guest.name} on {day:%A}"


@tool
async def lookup(city: str) -> str:
    """Look a city up."""
    return city


def tools() -> None:
    assert_type(book, Tool)
    assert_type(lookup, Tool)
    model = ScriptedProvider([
        Step(tool_calls=[("book", {"day": "2025-03-14", "guest": {"name": "Ann", "seats": 9}})]),
        Step(tool_calls=[("book", {"day": "2025-03-14", "guest": {"name": "Ann"}})]),
        "Booked.",
    ])
    result = create_agent(provider=model, tools=[book]).send("A table, please")
    assert_type(result.messages[2].text, str)
    aio_agent = lousho_aio.create_agent(provider=ScriptedProvider(default="ok"), tools=[lookup])
    assert_type(aio_agent, lousho_aio.AsyncAgent)

