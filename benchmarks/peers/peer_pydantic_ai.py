"""Pydantic AI: ``FunctionModel`` with a canned answer, history passed to every run.

On SQLite the history is persisted the way the docs suggest: each run's
``new_messages_json()`` is one row of a ``sqlite3`` table (WAL, synchronous=FULL, like the
other SQLite stores here), read back with ``ModelMessagesTypeAdapter`` when a chat opens.
The chat keeps the history in memory between turns (cheaper than reloading every turn).
The canned responses carry their usage, so ``FunctionModel`` does not estimate tokens over
the whole history (which would cost the peer an O(history) pass that is not its own).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from .common import ANSWER, TOOL_ARGS, TOOL_NAME, Storage, get_weather

NAME = "pydantic-ai"
DISTRIBUTION = "pydantic-ai-slim"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    json BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session ON messages (session_id, id);
"""


def canned(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """``ANSWER``; with tools, first one ``get_weather`` call per user message."""
    usage = RequestUsage(input_tokens=1, output_tokens=1)
    last = messages[-1]
    if info.function_tools and not any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[ToolCallPart(TOOL_NAME, dict(TOOL_ARGS))], usage=usage)
    return ModelResponse(parts=[TextPart(ANSWER)], usage=usage)


class _Chat:
    def __init__(
        self, agent: Agent[None, str], session_id: str, conn: sqlite3.Connection | None
    ) -> None:
        self._agent = agent
        self._id = session_id
        self._conn = conn
        self._history: list[ModelMessage] = []
        if conn is not None:
            rows = conn.execute(
                "SELECT json FROM messages WHERE session_id = ? ORDER BY id", (session_id,)
            ).fetchall()
            for (blob,) in rows:
                self._history.extend(ModelMessagesTypeAdapter.validate_json(blob))

    async def send(self, text: str) -> str:
        result = await self._agent.run(text, message_history=self._history)
        if self._conn is not None:
            with self._conn:
                self._conn.execute(
                    "INSERT INTO messages (session_id, json) VALUES (?, ?)",
                    (self._id, result.new_messages_json()),
                )
        self._history = result.all_messages()
        return result.output

    async def json_size(self) -> int:
        return len(ModelMessagesTypeAdapter.dump_json(self._history))

    def close(self) -> None:
        pass


class _Backend:
    def __init__(self, storage: Storage, path: Path) -> None:
        self._conn: sqlite3.Connection | None = None
        if storage == "sqlite":
            self._conn = sqlite3.connect(path, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.executescript(_SCHEMA)
        self._agents: dict[bool, Agent[None, str]] = {
            False: Agent(FunctionModel(canned)),
            True: Agent(FunctionModel(canned), tools=[get_weather]),
        }

    def chat(self, session_id: str, *, tools: bool) -> _Chat:
        return _Chat(self._agents[tools], session_id, self._conn)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def open_backend(storage: Storage, path: Path) -> _Backend:
    """Pydantic AI with history in memory, or also appended to a SQLite table at ``path``."""
    return _Backend(storage, path)
