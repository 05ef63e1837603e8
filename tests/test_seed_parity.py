"""Seed parity (SPEC §16): approvals that run after the session object is gone, queue joins
that are told they failed leave no trace, leaving a stream after the model finished keeps
the turn (sync and aio alike), no endless wait in asyncio, a consumed run says so, and
``context.cleared`` follows the session id."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import WAIT, wait

import lousho_aio
from lousho_sync import (
    ApprovalTurnMissingError,
    ContextCleared,
    LoushoError,
    ModelEvent,
    ModelRequest,
    ModelTextDelta,
    RunConsumedError,
    ScriptedProvider,
    SessionAwaitingApprovalError,
    SessionBusyError,
    SessionEvent,
    Signal,
    Step,
    create_agent,
    tool,
)


def texts(messages: Any) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


# --- approvals ----------------------------------------------------------------------------------
def test_resolving_after_the_session_object_was_dropped_runs_the_tool() -> None:
    paid: list[int] = []

    @tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Send money."""
        paid.append(amount)
        return f"sent {amount}"

    agent = create_agent(provider=ScriptedProvider(
        ["hi", Step(tool_calls=[("transfer", {"amount": 5})]), "Sent."]), tools=[transfer])
    s = agent.session(id="chat1")
    s.send("hello")
    r = s.send("pay 5")
    assert r.approval_id is not None
    del s
    gc.collect()  # the request that held the session ended
    res = agent.approvals.resolve(id=r.approval_id, approved=True)
    assert res is not None and res.text == "Sent." and paid == [5]
    record = agent.approvals.get(r.approval_id)
    assert record is not None and record.status == "approved"
    assert agent.checkpoint_store is not None and agent.checkpoint_store.keys("chat1.") == []
    assert texts(res.messages) == ["user:pay 5", "assistant:", "tool:sent 5", "assistant:Sent."]


def test_resolving_a_turn_that_cannot_be_found_raises_and_leaves_the_record_pending() -> None:
    @tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Send money."""
        return f"sent {amount}"

    agent = create_agent(provider=ScriptedProvider(
        [Step(tool_calls=[("transfer", {"amount": 5})])]), tools=[transfer])
    r = agent.session(id="gone").send("pay 5")
    assert r.approval_id is not None and agent.checkpoint_store is not None
    for key in agent.checkpoint_store.keys("gone."):  # e.g. kept in another process' memory
        agent.checkpoint_store.delete(key)
    with pytest.raises(ApprovalTurnMissingError, match="left pending") as missing:
        agent.approvals.resolve(id=r.approval_id, approved=True)
    assert missing.value.code == "LOUSHO_APPROVAL_TURN_MISSING"
    record = agent.approvals.get(r.approval_id)
    assert record is not None and record.status == "pending"


def test_a_queue_join_told_it_failed_is_not_applied_later() -> None:
    gate, started = threading.Event(), threading.Event()

    @tool(needs_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return f"paid {amount}"

    def first_call(req: ModelRequest) -> Step:
        started.set()
        return Step(tool_calls=[("pay", {"amount": 5})], gate=gate)

    agent = create_agent(provider=ScriptedProvider([first_call], default="ok"), tools=[pay])
    s = agent.session(turn_policy="queue")
    out: dict[str, object] = {}

    def call(k: str, text: str) -> None:
        try:
            out[k] = s.send(text)
        except Exception as e:
            out[k] = e

    t1 = threading.Thread(target=call, args=("first", "pay bob"))
    t1.start()
    assert started.wait(WAIT)
    t2 = threading.Thread(target=call, args=("second", "and say thanks"))
    t2.start()
    current = s._state.current
    assert current is not None and current.control is not None
    wait(current.control.offered, "the joining call")
    gate.set()
    t1.join(WAIT)
    t2.join(WAIT)
    first = out["first"]
    assert getattr(first, "finish_reason", None) == "awaiting-approval"
    assert isinstance(out["second"], SessionAwaitingApprovalError)
    agent.approvals.resolve(id=first.approval_id, approved=True)  # type: ignore[attr-defined]
    assert texts(s.messages) == ["user:pay bob", "assistant:", "tool:paid 5", "assistant:ok"]
    s.send("and say thanks")  # the caller was told its call failed, so it retries
    assert texts(s.messages).count("user:and say thanks") == 1


# --- leaving a stream ----------------------------------------------------------------------------
class Held:
    """Streams ``a``, then waits for ``release`` before the rest of the answer (``b c``
    and the end), so a test knows exactly where the reader is."""

    def __init__(self, *, tool_call: bool = False) -> None:
        self.release = threading.Event()
        self.tool_call = tool_call

    def complete(self, request: ModelRequest, *, signal: Signal) -> Any:
        raise NotImplementedError

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        inner = ScriptedProvider([Step(text="abc", chunks=["a", "b", "c"])])
        for event in inner.stream(request, signal=signal):
            yield event
            if isinstance(event, ModelTextDelta) and event.text == "a":
                assert self.release.wait(WAIT)


def model() -> ScriptedProvider:
    return ScriptedProvider([Step(text="abc", chunks=["a", "b", "c"])])


def test_leaving_a_sync_stream_after_the_last_delta_saves_the_turn() -> None:
    s = create_agent(provider=model()).session()
    run = s.stream("x")
    for e in run:
        if e.type == "text.delta" and e.text == "c":  # the model has produced everything
            break
    assert run.result().finish_reason == "stop"
    assert texts(s.messages) == ["user:x", "assistant:abc"]


def test_leaving_a_sync_stream_mid_answer_aborts_and_saves_nothing() -> None:
    held = Held()
    s = create_agent(provider=held).session()
    run = s.stream("x")
    for e in run:
        if e.type == "text.delta" and e.text == "a":
            held.release.set()  # more text follows: the reader left before the answer
            break
    assert run.result().finish_reason == "aborted"
    assert s.messages == ()


def test_leaving_a_sync_stream_with_a_tool_left_to_run_aborts() -> None:
    ran: list[str] = []

    @tool
    def look() -> str:
        """Look."""
        ran.append("look")
        return "seen"

    s = create_agent(provider=ScriptedProvider(
        [Step(text="let me look", chunks=["let me look"], tool_calls=[("look", {})])],
        default="done"), tools=[look]).session()
    run = s.stream("x")
    for e in run:
        if e.type == "text.delta":
            break
    assert run.result().finish_reason == "aborted" and ran == [] and s.messages == ()


def test_leaving_after_the_last_delta_keeps_the_turn_in_aio_too() -> None:
    async def main() -> list[str]:
        s = lousho_aio.create_agent(provider=model()).session()
        run = s.stream("x")
        async for e in run:
            if e.type == "text.delta" and e.text == "c":
                break
        assert (await run.result()).finish_reason == "stop"
        return texts(await s.load())

    assert asyncio.run(main()) == ["user:x", "assistant:abc"]


# --- no endless waits ----------------------------------------------------------------------------
def test_a_sync_send_behind_its_own_unread_stream_is_refused() -> None:
    s = create_agent(provider=ScriptedProvider(default="ok")).session()
    run = s.stream("first")
    with pytest.raises(SessionBusyError, match="has not been read yet"):
        s.send("second")
    assert run.result(timeout=WAIT).text == "ok"


@pytest.mark.parametrize("through", ["await", "wait_for"])
def test_an_aio_send_behind_its_own_unread_stream_is_refused(through: str) -> None:
    async def main() -> str:
        s = lousho_aio.create_agent(provider=ScriptedProvider(default="ok")).session()
        run = s.stream("first")  # not iterated yet
        with pytest.raises(SessionBusyError, match="has not been read yet"):
            if through == "await":
                async with asyncio.timeout(WAIT):
                    await s.send("second")
            else:  # on Python 3.11 wait_for runs the call in a task of its own
                await asyncio.wait_for(s.send("second"), WAIT)
        return (await run.result()).text

    assert asyncio.run(main()) == "ok"


def test_another_task_waits_for_a_stream_its_owner_reads() -> None:
    async def main() -> list[str]:
        s = lousho_aio.create_agent(provider=ScriptedProvider(default="ok")).session()
        run = s.stream("first")
        second = asyncio.ensure_future(s.send("second"))  # another task: it waits its turn
        events = [e.type async for e in run]
        assert events[-1] == "run.done"
        assert (await asyncio.wait_for(second, WAIT)).text == "ok"
        return texts(await s.load())

    assert asyncio.run(main()) == ["user:first", "assistant:ok", "user:second", "assistant:ok"]


def test_a_queue_join_returns_the_same_result_in_sync_and_aio() -> None:
    def sync() -> bool:
        gate = threading.Event()
        s = create_agent(provider=ScriptedProvider([Step(text="one", gate=gate)],
                                                   default="two")).session(turn_policy="queue")
        run = s.stream("a")
        it = iter(run)
        assert next(it).type == "run.start"
        joined: list[object] = []
        t = threading.Thread(target=lambda: joined.append(s.send("b")))
        t.start()
        current = s._state.current
        assert current is not None and current.control is not None
        wait(current.control.offered, "the join")
        gate.set()
        list(it)
        t.join(WAIT)
        return joined[0] is run.result()

    async def aio() -> bool:
        gate = threading.Event()
        s = lousho_aio.create_agent(provider=ScriptedProvider(
            [Step(text="one", gate=gate)], default="two")).session(turn_policy="queue")
        run = s.stream("a")
        it = run.__aiter__()
        assert (await it.__anext__()).type == "run.start"
        second = asyncio.ensure_future(s.send("b"))
        offered = s._session._state.current.control.offered  # type: ignore[union-attr]
        assert await asyncio.to_thread(offered.wait, WAIT)
        gate.set()
        async for _ in it:
            pass
        return (await second) is (await run.result())

    assert sync() and asyncio.run(aio())


# --- runs and listeners ---------------------------------------------------------------------------
def test_iterating_a_run_after_result_raises_a_lousho_error() -> None:
    run = create_agent(provider=ScriptedProvider(default="ok")).stream("x")
    assert run.result().text == "ok"
    with pytest.raises(RunConsumedError, match="already consumed") as consumed:
        iter(run)
    assert isinstance(consumed.value, LoushoError) and isinstance(consumed.value, RuntimeError)


def test_context_cleared_reaches_listeners_of_every_session_object_of_the_id() -> None:
    agent = create_agent(provider=ScriptedProvider(default="ok"))
    first = agent.session(id="shared")
    seen: list[SessionEvent] = []
    first.on(seen.append)
    first.send("hello")
    agent.session(id="shared").clear()  # through another object for the same id
    assert [type(e) for e in seen] == [ContextCleared]
    assert first.messages == ()

