"""A session turn on SqliteStore takes its lease and writes its first checkpoint in one
transaction when the cached transcript is current and no turn pends. What a user sees must
not change when the transcript moved meanwhile, when a turn pends, or when another owner
holds the lease. Two SqliteStore objects on one file stand for two processes (each has its
own lease owner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lousho_sync import ScriptedProvider, SessionBusyError, create_agent
from lousho_sync.providers.base import ModelRequest
from lousho_sync.sqlite import SqliteStore


def _echo(request: ModelRequest) -> str:
    return f"re: {list(request.messages)[-1].text}"


def test_a_turn_after_another_writer_sees_and_keeps_its_turn(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as a, SqliteStore(tmp_path / "s.db") as b:
        prov = ScriptedProvider(default=_echo)
        mine = create_agent(provider=prov, store=a).session(id="s")
        other = create_agent(provider=ScriptedProvider(default=_echo), store=b).session(id="s")
        mine.send("one")  # this side's cache is current now
        other.send("two")  # the transcript moves under it
        result = mine.send("three")
        assert result.text == "re: three"
        assert [m.text for m in prov.requests[-1].messages] == [
            "one", "re: one", "two", "re: two", "three"]
        assert [m.text for m in a.sessions.load("s") or []] == [
            "one", "re: one", "two", "re: two", "three", "re: three"]
        assert a.checkpoints.keys("s.") == []


def test_a_turn_refused_while_another_owner_holds_the_lease_writes_nothing(
    tmp_path: Path,
) -> None:
    with SqliteStore(tmp_path / "s.db") as a, SqliteStore(tmp_path / "s.db") as b:
        agent = create_agent(provider=ScriptedProvider(default=_echo), store=a)
        agent.session(id="s").send("one")
        token = b.acquire_lease("s", owner="elsewhere", ttl_s=30.0, wait_s=0.0)
        assert token
        with pytest.raises(SessionBusyError):
            agent.session(id="s", turn_policy="reject").send("two")
        assert a.checkpoints.keys("s.") == []
        b.release_lease("s", owner="elsewhere")
        assert agent.session(id="s", turn_policy="reject").send("two").text == "re: two"
        assert [m.text for m in a.sessions.load("s") or []] == [
            "one", "re: one", "two", "re: two"]

