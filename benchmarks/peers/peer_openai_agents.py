"""OpenAI Agents SDK: a ``Model`` subclass returning a canned ``ModelResponse``.

In memory the history is carried by hand (``result.to_input_list()`` plus the next user
message, the SDK's manual pattern); on SQLite it is the SDK's ``SQLiteSession`` (WAL, one
row per item). Tracing is disabled, so nothing is exported.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import SQLiteSession
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from .common import ANSWER, TOOL_ARGS, TOOL_NAME, Storage, get_weather

NAME = "openai-agents"
DISTRIBUTION = "openai-agents"

set_tracing_disabled(True)


class CannedModel(Model):
    """Answers ``ANSWER``; with tools, first calls ``get_weather`` once per user message."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        n = next(self._ids)
        last: Any = input[-1] if isinstance(input, list) and input else {}
        output: list[Any]
        if tools and last.get("type") != "function_call_output":
            output = [
                ResponseFunctionToolCall(
                    id=f"fc_{n}",
                    call_id=f"call_{n}",
                    type="function_call",
                    name=TOOL_NAME,
                    arguments=json.dumps(TOOL_ARGS),
                    status="completed",
                )
            ]
        else:
            output = [
                ResponseOutputMessage(
                    id=f"msg_{n}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(
                            text=ANSWER, type="output_text", annotations=[], logprobs=[]
                        )
                    ],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        """Not used by the benchmark."""
        raise NotImplementedError


class _MemoryChat:
    def __init__(self, agent: Agent[Any]) -> None:
        self._agent = agent
        self._history: list[TResponseInputItem] = []

    async def send(self, text: str) -> str:
        user: TResponseInputItem = {"role": "user", "content": text}
        result = await Runner.run(self._agent, [*self._history, user])
        self._history = result.to_input_list()
        return str(result.final_output)

    async def json_size(self) -> int:
        return len(json.dumps(self._history).encode())

    def close(self) -> None:
        pass


class _SqliteChat:
    def __init__(self, agent: Agent[Any], session_id: str, path: Path) -> None:
        self._agent = agent
        self._session = SQLiteSession(session_id, path)

    async def send(self, text: str) -> str:
        result = await Runner.run(self._agent, text, session=self._session)
        return str(result.final_output)

    async def json_size(self) -> int:
        return len(json.dumps(await self._session.get_items()).encode())

    def close(self) -> None:
        self._session.close()


class _Backend:
    def __init__(self, storage: Storage, path: Path) -> None:
        self._storage = storage
        self._path = path
        self._agents: dict[bool, Agent[Any]] = {
            False: Agent(name="bench", model=CannedModel()),
            True: Agent(name="bench", model=CannedModel(), tools=[function_tool(get_weather)]),
        }

    def chat(self, session_id: str, *, tools: bool) -> _MemoryChat | _SqliteChat:
        agent = self._agents[tools]
        if self._storage == "sqlite":
            return _SqliteChat(agent, session_id, self._path)
        return _MemoryChat(agent)

    def close(self) -> None:
        pass


def open_backend(storage: Storage, path: Path) -> _Backend:
    """The SDK with hand-carried history, or ``SQLiteSession`` files at ``path``."""
    return _Backend(storage, path)
