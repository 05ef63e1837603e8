"""Durable turns in one process: pending, resume, discard, approvals, failed checkpoints."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from conftest import WAIT

from lousho_sync import (
    AgentExecutor,
    AgentStore,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    Checkpoint,
    InMemoryApprovalStore,
    MemoryCheckpointStore,
    MemorySessionStore,
    Message,
    ModelRequest,
    PendingTurn,
    PropagatingToolError,
    ProviderError,
    ScriptedProvider,
    SessionAwaitingApprovalError,
    Step,
    StoreError,
    ToolCall,
    ToolContext,
    create_agent,
    memory_store,
    tool,
)


def texts(messages: Sequence[Message]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


class Flaky:
    """Fails the first ``n`` calls with a ProviderError, then answers by the request."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, request: ModelRequest) -> Step | str:
        if self.n > 0:
            self.n -= 1
            return Step(error=ProviderError("temporarily down", status=503, retryable=True))
        last = list(request.messages)[-1]
        return f"answer to {last.role}:{last.text}"


def test_a_provider_error_leaves_an_interrupted_turn_that_resume_finishes() -> None:
    counter = {"n": 0}

    @tool
    def charge(ctx: ToolContext) -> str:
        """Charge once."""
        counter["n"] += 1
        return f"charged {ctx.call.id}"

    provider = ScriptedProvider(
        [Step(tool_calls=[("charge", {})]), Step(error=ProviderError("down", status=503))],
        default="all done",
    )
    store = memory_store()
    agent = create_agent(provider=provider, tools=[charge], store=store)
    session = agent.session(id="u1")
    with pytest.raises(ProviderError):
        session.send("pay")
    assert session.messages == ()
    assert session.pending() == PendingTurn("interrupted")
    assert store.checkpoints.keys("u1.") == ["u1.turn-0"]  # type: ignore[union-attr]
    result = session.resume()
    assert result is not None and result.text == "all done"
    assert counter["n"] == 1  # the recorded tool result was not re-run
    assert provider.calls == 3  # the recorded model response was not requested again
    assert texts(session.messages) == ["user:pay", "assistant:", "tool:charged call_1_0",
                                       "assistant:all done"]
    assert session.pending() is None and session.resume() is None
    assert store.checkpoints.keys("u1.") == []  # type: ignore[union-attr]


@tool
def ping() -> str:
    """Answers pong."""
    return "pong"


PING = Step(tool_calls=(ToolCall("p1", "ping", {}),))


def test_send_resumes_a_pending_turn_first_then_sends() -> None:
    # the first turn fails after recording progress (a tool result), so it pends
    provider = ScriptedProvider([PING, Step(error=ProviderError("down"))],
                                default=lambda r: f"re: {list(r.messages)[-1].text}")
    session = create_agent(provider=provider, tools=[ping]).session()
    with pytest.raises(ProviderError) as failed:
        session.send("first")
    assert failed.value.pending is True and "session.resume()" in str(failed.value)
    result = session.send("second")
    assert texts(session.messages) == ["user:first", "assistant:", "tool:pong",
                                       "assistant:re: pong", "user:second",
                                       "assistant:re: second"]
    assert result.resumed is not None and result.resumed.text == "re: pong"


def test_a_resume_that_fails_again_raises_and_discard_pending_is_the_way_out() -> None:
    provider = ScriptedProvider([PING] + [Step(error=ProviderError("down"))] * 2,
                                default="fine")
    session = create_agent(provider=provider, tools=[ping]).session()
    with pytest.raises(ProviderError):
        session.send("first")
    with pytest.raises(ProviderError) as again:
        session.send("second")
    assert again.value.pending is True
    assert session.messages == () and provider.calls == 3
    assert session.pending() == PendingTurn("interrupted")
    session.discard_pending()
    assert session.pending() is None
    assert session.send("third").text == "fine"
    assert texts(session.messages) == ["user:third", "assistant:fine"]


def test_a_tool_that_was_running_runs_again_with_the_same_call_id() -> None:
    ids: list[str] = []

    @tool
    def ship(ctx: ToolContext) -> str:
        """Idempotent on call id."""
        ids.append(ctx.call.id)
        return "shipped"

    checkpoints = MemoryCheckpointStore()
    call = ToolCall("call-xyz", "ship", {})
    checkpoints.save("s.turn-0", Checkpoint(
        key="s.turn-0", session_id="s", run_id="r1", input=(Message("user", "go"),),
        recorded=(Message("assistant", "", tool_calls=(call,)),), started_call_ids=("call-xyz",),
    ))
    provider = ScriptedProvider(default="done")
    agent = create_agent(provider=provider, tools=[ship],
                         store=AgentStore(checkpoints=checkpoints))
    session = agent.session(id="s")
    assert session.pending() == PendingTurn("interrupted")
    result = session.resume()
    assert result is not None and ids == ["call-xyz"]
    assert texts(session.messages) == ["user:go", "assistant:", "tool:shipped", "assistant:done"]


def test_on_interrupted_report_does_not_rerun_and_tells_the_model() -> None:
    runs: list[str] = []

    @tool(on_interrupted="report")
    def pay(amount: float) -> str:
        """Pay."""
        runs.append("pay")
        return "paid"

    checkpoints = MemoryCheckpointStore()
    call = ToolCall("c-pay", "pay", {"amount": 5.0})
    checkpoints.save("s.turn-0", Checkpoint(
        key="s.turn-0", session_id="s", run_id="r1", input=(Message("user", "pay 5"),),
        recorded=(Message("assistant", "", tool_calls=(call,)),), started_call_ids=("c-pay",),
    ))
    provider = ScriptedProvider(default="I will check the payment first.")
    agent = create_agent(provider=provider, tools=[pay], store=AgentStore(checkpoints=checkpoints))
    result = agent.session(id="s").resume()
    assert runs == []
    assert result is not None
    tool_msg = result.messages[2]
    assert tool_msg.is_error and "may or may not have taken effect" in tool_msg.text
    assert list(provider.requests[0].messages)[-1] == tool_msg


def test_orphaned_tool_calls_are_repaired_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    store = MemorySessionStore()
    store.save("s", [Message("user", "go"),
                     Message("assistant", "", tool_calls=(ToolCall("c1", "x", {}),)),
                     Message("assistant", "stray")])
    provider = ScriptedProvider(default="ok")
    session = create_agent(provider=provider, store=store).session(id="s")
    session.send("next")
    sent = list(provider.requests[0].messages)
    assert [m.role for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[2].tool_call_id == "c1" and sent[2].is_error
    assert any("repaired" in r.getMessage() for r in caplog.records)


def test_a_failed_checkpoint_write_leaves_a_resumable_turn_or_an_unchanged_transcript() -> None:
    class Flaky(MemoryCheckpointStore):
        fail_on = 2
        writes = 0

        def save(self, key: str, checkpoint: Checkpoint) -> None:
            self.writes += 1
            if self.writes == self.fail_on:
                raise StoreError("disk full", path="/x")
            super().save(key, checkpoint)

    @tool
    def work() -> str:
        """Work."""
        return "worked"

    checkpoints = Flaky()
    provider = ScriptedProvider([Step(tool_calls=[("work", {})])], default="finished")
    sessions = MemorySessionStore()
    agent = create_agent(provider=provider, tools=[work],
                         store=AgentStore(sessions=sessions, checkpoints=checkpoints))
    session = agent.session(id="s")
    with pytest.raises(StoreError, match="disk full"):
        session.send("go")
    assert session.messages == () and sessions.load("s") is None
    assert session.pending() == PendingTurn("interrupted")
    result = session.resume()
    assert result is not None and result.text == "finished"
    msgs = session.messages
    calls = [c.id for m in msgs for c in m.tool_calls]
    results = [m.tool_call_id for m in msgs if m.role == "tool"]
    assert calls == results == ["call_1_0"]


def test_queued_input_in_a_failed_turn_stays_in_the_checkpoint_and_resume_applies_it() -> None:
    started = threading.Event()
    release = threading.Event()

    def second(request: ModelRequest) -> Step:
        started.set()
        return Step(error=ProviderError("down"), gate=release)

    # the turn records progress (a tool result) before its second model call fails
    provider = ScriptedProvider([PING, second], default=lambda r: "saw " + " / ".join(
        m.text for m in r.messages if m.role == "user"))
    store = memory_store()
    session = create_agent(provider=provider, store=store, tools=[ping]).session(
        id="q", turn_policy="queue")
    out: list[object] = []
    t1 = threading.Thread(target=lambda: out.append(_catch(lambda: session.send("one"))))
    t1.start()
    assert started.wait(WAIT)
    t2 = threading.Thread(target=lambda: out.append(_catch(lambda: session.send("two"))))
    t2.start()
    cur = session._state.current
    assert cur is not None and cur.control is not None
    assert cur.control.offered.wait(WAIT)
    release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    assert all(isinstance(o, ProviderError) for o in out) and out[0] is out[1]
    cp = store.checkpoints.load("q.turn-0")  # type: ignore[union-attr]
    assert cp is not None and cp.status == "interrupted"
    assert [m.text for m in cp.queued_inputs] == ["two"]
    result = session.resume()
    assert result is not None
    assert texts(session.messages) == ["user:one", "assistant:", "tool:pong", "user:two",
                                       "assistant:saw one / two"]


def _catch(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except BaseException as exc:
        return exc


# --- approvals ---------------------------------------------------------------------------------
@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money."""
    return f"sent {amount} to {to}"


@tool(needs_approval=lambda amount: amount > 100)
def refund(amount: float) -> str:
    """Refund; big ones need approval."""
    return f"refunded {amount}"


def test_approval_pauses_and_resolve_continues_as_the_next_turn() -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("transfer", {"amount": 25.0, "to": "Bob"})]), "Sent."],
        default="later")
    agent = create_agent(provider=provider, tools=[transfer])
    session = agent.session(id="a1")
    paused = session.send("Send 25 to Bob.")
    assert paused.finish_reason == "awaiting-approval" and paused.approval_id
    assert paused.approval_ids == (paused.approval_id,)
    assert session.messages == ()  # a paused turn is never in the transcript
    assert session.pending() == PendingTurn("awaiting-approval", paused.approval_id)
    record = agent.approvals.get(paused.approval_id)
    assert record is not None and record.session_id == "a1"
    assert record.call.name == "transfer" and dict(record.call.arguments) == {
        "amount": 25.0, "to": "Bob"}
    assert [r.id for r in agent.approvals.list(session_id="a1")] == [paused.approval_id]
    for call in (lambda: session.send("x"), lambda: session.stream("x"),
                 lambda: session.resume(), lambda: session.clear()):
        with pytest.raises(SessionAwaitingApprovalError) as info:
            call()
        assert info.value.approval_id == paused.approval_id
        assert info.value.code == "LOUSHO_SESSION_AWAITING_APPROVAL"
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert done is not None and done.text == "Sent."
    assert texts(session.messages) == ["user:Send 25 to Bob.", "assistant:",
                                       "tool:sent 25.0 to Bob", "assistant:Sent."]
    assert agent.approvals.list() == []
    with pytest.raises(ApprovalAlreadyResolvedError):
        agent.approvals.resolve(id=paused.approval_id, approved=False)
    with pytest.raises(ApprovalNotFoundError) as nf:
        agent.approvals.resolve(id="nope", approved=True)
    assert isinstance(nf.value, KeyError) and nf.value.code == "LOUSHO_APPROVAL_NOT_FOUND"


def test_a_denial_becomes_a_tool_result_and_the_model_answers() -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("transfer", {"amount": 9.0, "to": "Eve"})]), "Understood."])
    agent = create_agent(provider=provider, tools=[transfer])
    session = agent.session()
    paused = session.send("pay Eve")
    assert paused.approval_id is not None
    done = agent.approvals.resolve(id=paused.approval_id, approved=False, reason="suspicious")
    assert done is not None and done.text == "Understood."
    tool_msg = session.messages[2]
    assert tool_msg.is_error and "denied" in tool_msg.text and "suspicious" in tool_msg.text


def test_two_approvals_in_one_step_pause_once_and_continue_after_the_last() -> None:
    @tool
    def lookup() -> str:
        """No approval needed."""
        return "looked up"

    provider = ScriptedProvider([
        Step(tool_calls=[("transfer", {"amount": 1.0, "to": "A"}), ("lookup", {}),
                         ("refund", {"amount": 500.0}), ("refund", {"amount": 5.0})]),
        "All handled."])
    agent = create_agent(provider=provider, tools=[transfer, refund, lookup])
    session = agent.session()
    run = session.stream("do it all")
    events = list(run)
    types = [e.type for e in events]
    assert types[-2:] == ["approval.requested", "run.done"] or types.count(
        "approval.requested") == 2
    assert types[-1] == "run.done" and events[-1].finish_reason == "awaiting-approval"
    paused = run.result()
    assert len(paused.approval_ids) == 2
    first = agent.approvals.resolve(id=paused.approval_ids[1], approved=True)
    assert first is not None and first.finish_reason == "awaiting-approval"
    assert first.approval_ids == (paused.approval_ids[0],)
    assert session.messages == ()
    done = agent.approvals.resolve(id=paused.approval_ids[0], approved=True)
    assert done is not None and done.text == "All handled."
    tool_texts = sorted(m.text for m in session.messages if m.role == "tool")
    assert tool_texts == ["looked up", "refunded 5.0", "refunded 500.0", "sent 1.0 to A"]


def test_concurrent_resolve_from_8_threads_has_one_winner() -> None:
    provider = ScriptedProvider([Step(tool_calls=[("transfer", {"amount": 2.0, "to": "B"})])],
                                default="done")
    agent = create_agent(provider=provider, tools=[transfer])
    paused = agent.session().send("go")
    barrier = threading.Barrier(8)
    outcomes: list[object] = []
    lock = threading.Lock()

    def racer() -> None:
        barrier.wait(WAIT)
        try:
            r = agent.approvals.resolve(id=paused.approval_id or "", approved=True)
        except ApprovalAlreadyResolvedError as exc:
            r = exc  # type: ignore[assignment]
        with lock:
            outcomes.append(r)

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    winners = [o for o in outcomes if not isinstance(o, ApprovalAlreadyResolvedError)]
    assert len(outcomes) == 8 and len(winners) == 1


def test_inline_approve_callback() -> None:
    seen = []
    provider = ScriptedProvider(
        [Step(tool_calls=[("transfer", {"amount": 3.0, "to": "C"}),
                          ("transfer", {"amount": 4.0, "to": "D"})]), "ok"])
    agent = create_agent(provider=provider, tools=[transfer])

    def approve(record):  # type: ignore[no-untyped-def]
        seen.append(record.call.arguments["to"])
        return record.call.arguments["to"] == "C"

    result = agent.session().send("go", approve=approve)
    assert result.text == "ok" and seen == ["C", "D"]
    tools = [m for m in result.messages if m.role == "tool"]
    assert tools[0].text == "sent 3.0 to C" and tools[1].is_error


def test_one_shot_durable_run_is_finished_by_agent_resume() -> None:
    provider = ScriptedProvider([Step(tool_calls=[("refund", {"amount": 1.0})]),
                                 Step(error=ProviderError("down"))], default="refunded.")
    store = memory_store()
    agent = create_agent(provider=provider, tools=[refund], store=store)
    with pytest.raises(ProviderError):
        agent.send("refund 1", session_id="job-7")
    assert store.checkpoints.keys("job-7") == ["job-7"]  # type: ignore[union-attr]
    result = agent.resume("job-7")
    assert result is not None and result.text == "refunded."
    assert store.checkpoints.keys("job-7") == []  # type: ignore[union-attr]
    assert agent.resume("job-7") is None


def test_one_shot_approval_without_a_session() -> None:
    provider = ScriptedProvider([Step(tool_calls=[("transfer", {"amount": 1.0, "to": "Z"})]),
                                 "paid Z"])
    agent = create_agent(provider=provider, tools=[transfer])
    paused = agent.send("pay Z")
    assert paused.finish_reason == "awaiting-approval"
    done = agent.approvals.resolve(id=paused.approval_id or "", approved=True)
    assert done is not None and done.text == "paid Z"


def test_agent_executor_execute_with_checkpoints_and_resume_path() -> None:
    checkpoints = MemoryCheckpointStore()
    approvals = InMemoryApprovalStore()
    provider = ScriptedProvider([Step(tool_calls=[("transfer", {"amount": 1.0, "to": "Q"})]),
                                 "paid"])
    paused = AgentExecutor.execute("pay Q", provider=provider, tools=[transfer],
                                   session_id="low", checkpoint_store=checkpoints,
                                   approval_store=approvals)
    assert paused.finish_reason == "awaiting-approval"
    approvals.resolve(paused.approval_id or "", approved=True)
    done = AgentExecutor.execute((), provider=provider, tools=[transfer], session_id="low",
                                 checkpoint_store=checkpoints, approval_store=approvals)
    assert done.text == "paid" and checkpoints.keys("low") == []


def test_propagating_tool_error_leaves_the_turn_pending() -> None:
    state = {"fail": True}

    @tool
    def flaky() -> str:
        """Fails once, fatally."""
        if state["fail"]:
            state["fail"] = False
            raise PropagatingToolError("stop now")
        return "fine"

    provider = ScriptedProvider([Step(tool_calls=[("flaky", {})])], default="done")
    session = create_agent(provider=provider, tools=[flaky]).session()
    with pytest.raises(PropagatingToolError):
        session.send("go")
    assert session.pending() == PendingTurn("interrupted")
    result = session.resume()
    assert result is not None and result.text == "done"
    assert texts(session.messages) == ["user:go", "assistant:", "tool:fine", "assistant:done"]
