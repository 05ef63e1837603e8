"""LangGraph: ``create_react_agent`` over a minimal canned chat model, ``thread_id`` per chat.

In memory the checkpointer is ``InMemorySaver``; on SQLite it is ``SqliteSaver`` (from
``langgraph-checkpoint-sqlite``) on one connection, which sets WAL mode. LangSmith tracing
stays off (no key, and ``LANGSMITH_TRACING=false``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, messages_to_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from .common import ANSWER, TOOL_ARGS, TOOL_NAME, Storage, get_weather

with warnings.catch_warnings():
    # create_react_agent is deprecated in favour of langchain's create_agent, which needs the
    # whole langchain package; the prebuilt graph is still LangGraph's own ReAct agent.
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

NAME = "langgraph"
DISTRIBUTION = "langgraph"

os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"


class CannedChatModel(BaseChatModel):
    """``ANSWER``; with tools bound, first one ``get_weather`` call per user message."""

    use_tools: bool = False
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "canned"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls += 1
        if self.use_tools and not isinstance(messages[-1], ToolMessage):
            call = {"name": TOOL_NAME, "args": dict(TOOL_ARGS), "id": f"call_{self.calls}"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            message = AIMessage(content=ANSWER)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """The canned model decides by itself; binding changes nothing."""
        return self


class _Chat:
    def __init__(self, graph: Any, session_id: str) -> None:
        self._graph = graph
        self._config: RunnableConfig = {"configurable": {"thread_id": session_id}}
        self._messages: list[BaseMessage] = []

    async def send(self, text: str) -> str:
        state = self._graph.invoke({"messages": [("user", text)]}, self._config)
        self._messages = state["messages"]
        return str(self._messages[-1].content)

    async def json_size(self) -> int:
        return len(json.dumps(messages_to_dict(self._messages)).encode())

    def close(self) -> None:
        pass


class _Backend:
    def __init__(self, storage: Storage, path: Path) -> None:
        self._conn: sqlite3.Connection | None = None
        saver: BaseCheckpointSaver[Any]
        if storage == "sqlite":
            self._conn = sqlite3.connect(path, check_same_thread=False)
            saver = SqliteSaver(self._conn)
        else:
            saver = InMemorySaver()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._graphs = {
                False: create_react_agent(CannedChatModel(), tools=[], checkpointer=saver),
                True: create_react_agent(
                    CannedChatModel(use_tools=True),
                    tools=[tool(get_weather)],
                    checkpointer=saver,
                ),
            }

    def chat(self, session_id: str, *, tools: bool) -> _Chat:
        return _Chat(self._graphs[tools], session_id)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def open_backend(storage: Storage, path: Path) -> _Backend:
    """LangGraph with ``InMemorySaver``, or ``SqliteSaver`` on a file at ``path``."""
    return _Backend(storage, path)
