"""Session operations on every store: metadata, undo, fork and the compaction history, as a
user calls them — with a turn running in another thread and in another process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import test_store_contract as contract
from conftest import STORE_KINDS, WAIT, wait
from crash_child import make_store

import lousho_aio
from lousho_sync import (
    ConfigError,
    InvalidMetadataError,
    Limits,
    ModelRequest,
    ScriptedProvider,
    SessionAwaitingApprovalError,
    SessionBusyError,
    SessionExistsError,
    Step,
    Usage,
    create_agent,
    tool,
)
from lousho_sync.compaction import SUMMARY_INSTRUCTIONS
from lousho_sync.messages import Message

kit = contract.kit
store = contract.store
HERE = Path(__file__).resolve().parent


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(needs_approval=True)
def transfer(amount: float) -> str:
    """Send money."""
    return f"sent {amount}"


def calculator(request: ModelRequest) -> Step | str:
    """Each turn: one add() call, then an answer naming the sum."""
    last = list(request.messages)[-1]
    if last.role == "tool":
        return Step(text=f"the sum is {last.content}", usage=Usage(10, 2, 0.25))
    return Step(tool_calls=[("add", {"a": len(last.text), "b": 1})], usage=Usage(10, 2, 0.25))


def agent_on(store: Any, **kw: Any) -> Any:
    return create_agent(provider=ScriptedProvider(default=calculator), tools=[add, transfer],
                        store=store, **kw)


def no_split_pairs(messages: Any) -> None:
    """Every tool call in ``messages`` has its result, right after its assistant message."""
    open_calls: set[str] = set()
    for m in messages:
        if m.role == "user":
            assert not open_calls, f"a user message while {open_calls} wait for results"
        open_calls |= {c.id for c in m.tool_calls}
        if m.role == "tool":
            assert m.tool_call_id in open_calls
            open_calls.discard(m.tool_call_id)
    assert not open_calls


def user_texts(messages: Any) -> list[str]:
    return [m.text for m in messages if m.role == "user"]


# --- metadata ----------------------------------------------------------------------------------


def test_metadata_is_kept_with_the_session_and_not_a_turn(kit: contract.Kit, store: Any) -> None:
    session = agent_on(store).session("chat-1")
    assert session.metadata == {}
    session.set_metadata({"title": "Sums", "owner": "ana", "tags": ["math"]})
    session.send("2+2")
    with kit.reopened() as again:
        other = agent_on(again).session("chat-1")
        assert other.metadata == {"title": "Sums", "owner": "ana", "tags": ["math"]}
        assert len(other.messages) == 4  # user, tool call, tool result, answer
        assert [(i.id, i.messages, i.title) for i in again.sessions.list()] == [
            ("chat-1", 4, "Sums")]
    copy = session.metadata
    copy["title"] = "changed here only"
    assert session.metadata["title"] == "Sums"
    with pytest.raises(InvalidMetadataError, match="the limit is 16384 bytes"):
        session.set_metadata({"notes": "x" * 20_000})
    assert session.metadata["title"] == "Sums"


def test_clear_keeps_metadata_unless_asked(store: Any) -> None:
    session = agent_on(store).session("chat-1")
    session.set_metadata({"title": "keep me"})
    session.send("1+1")
    session.clear()
    assert session.messages == () and session.metadata == {"title": "keep me"}
    session.send("2+2")
    session.clear(keep_metadata=False)
    assert session.messages == () and session.metadata == {}
    assert store.sessions.info("chat-1") is None


def test_delete_takes_the_lease_and_removes_the_session_and_its_pending_turn(
    kit: contract.Kit, store: Any
) -> None:
    provider = ScriptedProvider([Step(text="hi"), Step(tool_calls=[("transfer", {"amount": 5})])])
    agent = create_agent(provider=provider, tools=[transfer], store=store)
    session = agent.session("gone")
    session.set_metadata({"title": "to delete"})
    session.send("hello")
    paused = session.send("pay 5")
    assert paused.finish_reason == "awaiting-approval"
    (request,) = agent.approvals.list()
    leases = getattr(store, "sessions", store)
    if hasattr(leases, "acquire_lease"):  # another owner holds the lease: refused, kept
        assert leases.acquire_lease("gone", owner="elsewhere:1:x", ttl_s=30.0, wait_s=0)
        with pytest.raises(SessionBusyError):
            session.delete()
        assert session.pending() is not None
        leases.release_lease("gone", owner="elsewhere:1:x")
    session.delete()
    assert session.messages == () and session.pending() is None
    assert agent.approvals.get(request.id).status == "denied"
    with kit.reopened() as again:
        other = agent_on(again).session("gone")
        assert other.messages == () and other.metadata == {} and other.pending() is None
        assert "gone" not in [i.id for i in again.sessions.list()]


# --- undo --------------------------------------------------------------------------------------


def test_undo_removes_whole_turns_and_returns_them(kit: contract.Kit, store: Any) -> None:
    session = agent_on(store).session("u")
    for text in ("one", "two", "three"):
        session.send(text)
    removed = session.undo()
    assert [m.role for m in removed] == ["user", "assistant", "tool", "assistant"]
    assert removed[0].text == "three" and removed[-1].text == "the sum is 6"
    assert user_texts(session.messages) == ["one", "two"]
    with kit.reopened() as again:
        assert user_texts(agent_on(again).session("u").messages) == ["one", "two"]
    assert user_texts(session.undo(2)) == ["one", "two"]
    assert session.messages == ()
    with pytest.raises(ConfigError, match="holds 0 turn"):
        session.undo()
    session.send("four")
    with pytest.raises(ConfigError, match=r"holds 1 turn\(s\); undo\(turns=2\)"):
        session.undo(2)
    for bad in (0, -1, True, "1"):
        with pytest.raises(ConfigError, match="turns must be an int >= 1"):
            session.undo(bad)
    assert user_texts(session.messages) == ["four"]


def test_undo_gives_the_budget_back(store: Any) -> None:
    session = agent_on(store).session("b", limits=Limits(max_cost_usd=1.0))
    assert session.send("one").finish_reason == "stop"  # 0.5 spent (two calls)
    assert session.send("two").finish_reason == "stop"  # 1.0 spent
    assert session.send("three").exceeded == "max_cost_usd"
    session.undo()  # the refused turn left nothing; the last kept turn is "two"
    assert user_texts(session.messages) == ["one"]
    assert session.send("two again").finish_reason == "stop"


def test_undo_is_refused_while_a_turn_pends(store: Any) -> None:
    provider = ScriptedProvider([Step(text="hi"), Step(tool_calls=[("transfer", {"amount": 5})])])
    session = create_agent(provider=provider, tools=[transfer], store=store).session("p")
    session.send("hello")
    paused = session.send("pay 5")
    assert paused.finish_reason == "awaiting-approval"
    with pytest.raises(SessionAwaitingApprovalError):
        session.undo()
    with pytest.raises(SessionAwaitingApprovalError):
        session.clear()
    session.discard_pending()
    assert user_texts(session.undo()) == ["hello"]


def test_undo_refused_and_fork_and_metadata_allowed_while_a_turn_runs_in_a_thread(
    store: Any,
) -> None:
    started, release = threading.Event(), threading.Event()

    def held(request: ModelRequest) -> Step | str:
        if list(request.messages)[-1].text == "slow":
            started.set()
            return Step(text="slow answer", gate=release)
        return "quick answer"

    agent = create_agent(provider=ScriptedProvider(default=held), store=store)
    agent.session("t").send("first")
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(agent.session("t").send("slow")))
    runner.start()
    try:
        wait(started, "the running turn")
        session = agent.session("t")
        with pytest.raises(SessionBusyError):
            session.undo()
        session.set_metadata({"title": "during"})
        fork = session.fork("t-copy")
        assert user_texts(fork.messages) == ["first"]  # the running turn is not copied
    finally:
        release.set()
        runner.join(WAIT)
    assert result[0].text == "slow answer"
    assert user_texts(agent.session("t").messages) == ["first", "slow"]
    assert agent.session("t").metadata == {"title": "during"}
    assert user_texts(agent.session("t-copy").messages) == ["first"]


# --- fork --------------------------------------------------------------------------------------


def test_fork_copies_turns_metadata_and_goes_its_own_way(kit: contract.Kit, store: Any) -> None:
    agent = agent_on(store)
    session = agent.session("base")
    session.set_metadata({"title": "Plan", "owner": "ana"})
    for text in ("one", "two", "three"):
        session.send(text)
    whole = session.fork("whole")
    assert whole.id == "whole" and whole.messages == session.messages
    assert whole.metadata == {"title": "Plan", "owner": "ana", "forked_from": "base"}
    first = session.fork("first", at_turn=1)
    assert user_texts(first.messages) == ["one"]
    no_split_pairs(first.messages)
    assert session.fork("none", at_turn=0).messages == ()
    first.send("other way")
    assert user_texts(first.messages) == ["one", "other way"]
    assert user_texts(session.messages) == ["one", "two", "three"]
    with kit.reopened() as again:
        ids = [i.id for i in again.sessions.list()]
        assert set(ids) == {"base", "whole", "first", "none"} and ids[0] == "first"
    auto = session.fork()
    assert auto.id != session.id and len(auto.messages) == 12
    with pytest.raises(SessionExistsError, match="'whole'"):
        session.fork("whole")
    with pytest.raises(SessionExistsError):
        session.fork("base")
    with pytest.raises(ConfigError, match=r"fork\(at_turn=4\) asks for more"):
        session.fork("too-far", at_turn=4)
    assert store.sessions.info("too-far") is None


def test_fork_never_copies_a_pending_turn(store: Any) -> None:
    provider = ScriptedProvider([Step(text="hi"), Step(tool_calls=[("transfer", {"amount": 5})])])
    agent = create_agent(provider=provider, tools=[transfer], store=store)
    session = agent.session("p")
    session.send("hello")
    assert session.send("pay").finish_reason == "awaiting-approval"
    fork = session.fork("p2")
    assert user_texts(fork.messages) == ["hello"] and fork.pending() is None
    assert session.pending() is not None


def test_fork_on_an_agent_without_a_store() -> None:
    agent = create_agent(provider=ScriptedProvider(default=calculator), tools=[add])
    session = agent.session("mine")
    session.send("hi")
    fork = session.fork("yours")
    assert agent.session("yours").messages == session.messages == fork.messages


# --- compaction history -----------------------------------------------------------------------


def test_history_keeps_what_compaction_replaced(kit: contract.Kit, store: Any) -> None:
    def answer(request: ModelRequest) -> Step | str:
        if request.system is not None and request.system.startswith(SUMMARY_INSTRUCTIONS):
            return "SUMMARY"
        return calculator(request)

    agent = create_agent(provider=ScriptedProvider(default=answer), tools=[add], store=store)
    session = agent.session("h")
    for text in ("one", "two", "three"):
        session.send(text)
    before = session.messages
    assert session.compact(keep_last=4)
    assert len(session.messages) == 5 and session.messages[1:] == before[8:]
    summary = session.messages[0]
    assert session.history() == (*before[:8], summary, *before[8:])
    assert session.history(include_compacted=False) == session.messages
    with kit.reopened() as again:
        assert agent_on(again).session("h").history() == session.history()
    session.send("four")
    assert user_texts(session.history()) == ["one", "two", summary.text, "three", "four"]
    session.clear()
    assert session.history() == () and store.sessions.history("h") == []


# --- asyncio twins -----------------------------------------------------------------------------


def test_the_asyncio_twins(store: Any) -> None:
    async def main() -> None:
        agent = lousho_aio.create_agent(provider=ScriptedProvider(default=calculator),
                                        tools=[add], store=store)
        session = agent.session("a")
        await session.set_metadata({"title": "async"})
        await session.send("one")
        await session.send("two")
        assert await session.metadata == {"title": "async"}
        fork = await session.fork("a2", at_turn=1)
        assert isinstance(fork, lousho_aio.AsyncSession)
        assert user_texts(await fork.load()) == ["one"]
        removed = await session.undo()
        assert user_texts(removed) == ["two"]
        assert user_texts(await session.history()) == ["one"]
        await session.clear(keep_metadata=False)
        assert await session.metadata == {}

    asyncio.run(main())


# --- another process running turns -------------------------------------------------------------


class Child:
    def __init__(self, mode: str, kind: str, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "proc_child.py"), mode, kind, str(root), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.expect("READY")

    def expect(self, marker: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != marker:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"expected {marker!r}, got {line!r}; stderr: {err}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self) -> Any:
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", STORE_KINDS, indirect=True)
def test_undo_refused_while_another_process_runs_a_turn(kind: str, tmp_path: Path) -> None:
    agent = agent_on(make_store(kind, tmp_path))
    agent.session("x").send("mine")
    child = Child("hold", kind, tmp_path, "x")
    child.go()
    child.expect("IN-TURN")  # the child holds the lease, its model call waiting
    session = agent.session("x")
    with pytest.raises(SessionBusyError):
        session.undo()
    session.set_metadata({"title": "set meanwhile"})
    assert user_texts(session.fork("x-fork").messages) == ["mine"]
    child.go()
    assert child.result() == {"text": "held answer"}
    assert user_texts(session.load()) == ["mine", "from the child"]
    assert [m.text for m in session.undo()] == ["from the child", "held answer"]
    assert user_texts(session.load()) == ["mine"]
    assert session.metadata == {"title": "set meanwhile"}


@pytest.mark.parametrize("kind", STORE_KINDS, indirect=True)
def test_undo_racing_another_process_loses_nothing_and_splits_no_pair(
    kind: str, tmp_path: Path
) -> None:
    child = Child("toolturns", kind, tmp_path, "race", "c", "20")
    agent = agent_on(make_store(kind, tmp_path))
    session = agent.session("race")
    removed: list[Message] = []
    child.go()
    while child.proc.poll() is None and len(removed) < 5 * 4:
        try:
            removed += session.undo()
        except (SessionBusyError, ConfigError):
            session.load()  # busy, or nothing to undo yet: look again
    assert child.result() == {"ok": 20}
    final = session.load()
    no_split_pairs(final)
    no_split_pairs(removed)
    kept, undone = user_texts(final), user_texts(removed)
    assert sorted(kept + undone) == sorted(f"c-m{j}" for j in range(20))  # nothing lost
    assert not set(kept) & set(undone)
    assert kept == sorted(kept, key=lambda t: int(t.split("m")[1]))  # still in order
