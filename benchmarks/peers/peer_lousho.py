"""lousho: ``ScriptedProvider``, sessions in memory or in ``SqliteStore`` (synchronous="full").

``peer_lousho_normal`` reuses this module with ``synchronous="normal"`` (SQLite only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lousho_sync.agent import Agent, create_agent
from lousho_sync.codec import dumps_messages
from lousho_sync.providers.base import ModelRequest
from lousho_sync.providers.scripted import ScriptedProvider, Step
from lousho_sync.session import Session
from lousho_sync.sqlite import SqliteStore
from lousho_sync.tools import tool

from .common import ANSWER, TOOL_ARGS, TOOL_NAME, Storage, get_weather

NAME = "lousho"
DISTRIBUTION = "lousho"


def _answer(request: ModelRequest) -> Step | str:
    if request.messages[-1].role == "user":
        return Step(tool_calls=[(TOOL_NAME, TOOL_ARGS)])
    return ANSWER


class _Chat:
    def __init__(self, session: Session, provider: ScriptedProvider) -> None:
        self._session = session
        self._provider = provider

    async def send(self, text: str) -> str:
        result = self._session.send(text)
        # ScriptedProvider records every request for tests; the peers' fakes keep nothing.
        self._provider.requests.clear()
        return result.text

    async def json_size(self) -> int:
        return len(dumps_messages(self._session.messages).encode())

    def close(self) -> None:
        pass


class _Backend:
    def __init__(
        self, storage: Storage, path: Path, synchronous: Literal["full", "normal"] = "full"
    ) -> None:
        self._store = (
            SqliteStore(path, synchronous=synchronous) if storage == "sqlite" else None
        )
        self._plain = ScriptedProvider(default=ANSWER)
        self._tooled = ScriptedProvider(default=_answer)
        self._agents: dict[bool, Agent] = {
            False: create_agent(provider=self._plain, store=self._store),
            True: create_agent(
                provider=self._tooled, tools=[tool(get_weather)], store=self._store
            ),
        }

    def chat(self, session_id: str, *, tools: bool) -> _Chat:
        provider = self._tooled if tools else self._plain
        return _Chat(self._agents[tools].session(id=session_id), provider)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def open_backend(storage: Storage, path: Path) -> _Backend:
    """lousho with the default in-memory session store, or a SqliteStore at ``path``."""
    return _Backend(storage, path)
