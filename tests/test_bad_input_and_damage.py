"""Input that would store half a tool pair is refused; an unreadable pending turn does not
brick its session (discard_pending() and clear() remove it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lousho_sync import (
    InvalidInputError,
    Message,
    ProviderError,
    ScriptedProvider,
    Step,
    StoreCorruptError,
    ToolCall,
    create_agent,
    tool,
)
from lousho_sync.sqlite import SqliteStore


def test_input_with_a_tool_call_lacking_its_result_is_refused(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "a.db") as st:
        agent = create_agent(provider=ScriptedProvider(default="ok"), store=st)
        with pytest.raises(InvalidInputError, match="'zz'"):
            agent.session(id="s").send([
                Message("user", "x"),
                Message("assistant", "", tool_calls=(ToolCall("zz", "echo", {}),))])
        with pytest.raises(InvalidInputError, match="'nope'"):
            agent.session(id="t").send([Message("tool", "r", tool_call_id="nope")])
        assert st.sessions.load("s") is None and st.sessions.load("t") is None
        # a whole pair is fine
        agent.session(id="u").send([
            Message("user", "x"),
            Message("assistant", "", tool_calls=(ToolCall("c1", "echo", {}),)),
            Message("tool", "r", tool_call_id="c1"),
            Message("user", "go on")])
        assert [m.role for m in st.sessions.load("u") or []] == [
            "user", "assistant", "tool", "user", "assistant"]


@tool
def ping() -> str:
    """Pong."""
    return "pong"


def _broken_pending(db: Path) -> None:
    provider = ScriptedProvider([Step(tool_calls=(ToolCall("p", "ping", {}),)),
                                 Step(error=ProviderError("x"))], default="ok")
    with pytest.raises(ProviderError):
        create_agent(provider=provider, tools=[ping], store=SqliteStore(db)).session(
            id="s").send("fails after progress")  # leaves an interrupted checkpoint
    c = sqlite3.connect(db)
    c.execute("update checkpoints set json='garbage'")
    c.commit()
    c.close()


@pytest.mark.parametrize("way_out", ["discard_pending", "clear"])
def test_an_unreadable_pending_turn_says_how_to_remove_it_and_can_be(
    tmp_path: Path, way_out: str
) -> None:
    db = tmp_path / "a.db"
    _broken_pending(db)
    session = create_agent(provider=ScriptedProvider(default="ok"), tools=[ping],
                           store=SqliteStore(db)).session(id="s")
    for call in (lambda: session.send("hi"), session.pending):
        with pytest.raises(StoreCorruptError, match=r"discard_pending\(\) or session\.clear"):
            call()
    getattr(session, way_out)()
    assert session.pending() is None
    assert session.send("hi").text == "ok"
