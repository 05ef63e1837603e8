"""The workload and the tiny interface every peer module implements.

A peer module (``peer_*.py``) defines ``NAME`` (shown in the table), ``DISTRIBUTION`` (the
PyPI name whose version is shown) and ``open_backend(storage, path) -> Backend``. It imports
its framework at module level, so a framework that is not installed fails the import and
the runner reports "not installed".

Every framework answers from a canned model that costs next to nothing: a plain turn gets
``ANSWER``; in a chat with tools, a turn whose last message is the user's gets one call of
``get_weather`` with ``TOOL_ARGS``, and the turn after the tool result gets ``ANSWER``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

Storage = Literal["memory", "sqlite"]

USER_TEXT = (
    "Can you summarise the quarterly numbers for the north region, and tell me what changed "
    "since the last review?"
)
ANSWER = (
    "Here is the summary of the north region for the quarter: revenue grew 4% on the previous "
    "quarter, driven by the two new accounts; costs were flat; the margin improved by one "
    "point. The main risk is the delayed renewal of the largest contract, which the account "
    "team expects to close next month."
)
TOOL_NAME = "get_weather"
TOOL_ARGS = {"city": "Paris"}
TOOL_RESULT = "Sunny, 21 degrees C"


def user_text(turn: int) -> str:
    """The user's message of turn ``turn`` (1-based)."""
    return f"Turn {turn}. {USER_TEXT}"


TOOL_RUNS = {TOOL_NAME: 0}
"""How many times the tool actually ran, over all frameworks (the runner checks it)."""


def get_weather(city: str) -> str:
    """Return the current weather in a city."""
    TOOL_RUNS[TOOL_NAME] += 1
    return TOOL_RESULT


class Chat(Protocol):
    """One conversation (one session id) on one backend."""

    async def send(self, text: str) -> str:
        """Run one turn with the whole history; return the final answer text."""
        ...

    async def json_size(self) -> int:
        """Bytes of the conversation's history as the framework's own JSON."""
        ...

    def close(self) -> None:
        """Release what the chat holds (connections); the history stays in the backend."""
        ...


class Backend(Protocol):
    """A framework set up for one kind of history storage."""

    def chat(self, session_id: str, *, tools: bool) -> Chat:
        """A conversation; ``tools=True`` gives the agent the ``get_weather`` tool."""
        ...

    def close(self) -> None:
        """Close stores and connections (the SQLite file stays)."""
        ...


class PeerModule(Protocol):
    """What the runner reads from a ``peer_*`` module."""

    NAME: str
    DISTRIBUTION: str

    def open_backend(self, storage: Storage, path: Path) -> Backend:
        """A backend; ``path`` is the SQLite file for ``storage="sqlite"`` (unused otherwise)."""
        ...
