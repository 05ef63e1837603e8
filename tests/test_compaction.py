"""Compaction: session.compact(), the summary message, atomicity, and the automatic policy."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import WAIT, wait

from lousho_sync import (
    AbortController,
    Checkpoint,
    Compaction,
    CompactionDone,
    CompactionStart,
    Limits,
    MemorySessionStore,
    Message,
    ModelRequest,
    ProviderError,
    ScriptedProvider,
    SessionAwaitingApprovalError,
    SessionBusyError,
    SessionEvent,
    Step,
    StoreUnavailableError,
    ToolCall,
    Usage,
    create_agent,
    tool,
)
from lousho_sync.compaction import (
    SUMMARY_INSTRUCTIONS,
    estimate_tokens,
    is_summary,
    split_point,
)
from lousho_sync.session import Session
from lousho_sync.sqlite import SqliteStore

STEP_USAGE = Usage(10, 1, 0.01)
SUMMARY_USAGE = Usage(7, 3, 0.07)


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@tool(needs_approval=True)
def launch() -> str:
    """Needs a human."""
    return "launched"


class Model:
    """Turns: a user message ``"<name> rounds=<k>"`` gets ``k`` ping rounds, then
    ``"re: <name>"``. Summary calls (recognised by their system prompt) answer ``summary``,
    which may be a Step (an error, a gate) or a callable."""

    def __init__(self, summary: Step | None = None) -> None:
        self.summary = summary or Step(text="SUMMARY", usage=SUMMARY_USAGE)
        self.summary_started = threading.Event()
        self.provider = ScriptedProvider(default=self)

    def __call__(self, request: ModelRequest) -> Step:
        if request.system is not None and request.system.startswith(SUMMARY_INSTRUCTIONS):
            self.summary_started.set()
            return self.summary
        msgs = list(request.messages)
        last_user = max(i for i, m in enumerate(msgs) if m.role == "user")
        name, _, rounds = msgs[last_user].text.partition(" rounds=")
        done = sum(1 for m in msgs[last_user:] if m.role == "assistant")
        if done < int(rounds or 0):
            return Step(tool_calls=[("ping", {})], usage=STEP_USAGE)
        return Step(text=f"re: {name}", usage=STEP_USAGE)

    @property
    def summary_calls(self) -> list[ModelRequest]:
        return [r for r in self.provider.requests
                if r.system is not None and r.system.startswith(SUMMARY_INSTRUCTIONS)]


def usage_is(usage: Usage | None, input_tokens: int, output_tokens: int, cost: float) -> bool:
    """``usage`` has these token counts and (about) this cost."""
    return (
        usage is not None
        and (usage.input_tokens, usage.output_tokens) == (input_tokens, output_tokens)
        and usage.cost_usd == pytest.approx(cost)
    )


def texts(messages: Sequence[Message]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


def assert_pairs_whole(messages: Sequence[Message]) -> None:
    """Every tool result follows its call; every call has all its results before the next
    non-tool message."""
    open_ids: set[str] = set()
    for m in messages:
        if m.role == "tool":
            assert m.tool_call_id in open_ids, f"orphan tool result {m.tool_call_id}"
            open_ids.discard(m.tool_call_id)
            continue
        assert not open_ids, f"tool calls without results: {open_ids}"
        if m.role == "assistant":
            open_ids = {c.id for c in m.tool_calls}
    assert not open_ids


def build(session: Session, turns: Sequence[tuple[str, int]]) -> None:
    for name, rounds in turns:
        assert session.send(f"{name} rounds={rounds}").finish_reason == "stop"


def listen(session: Session) -> list[SessionEvent]:
    events: list[SessionEvent] = []
    session.on(events.append)
    return events


THREE_TURNS = [("q1", 1), ("q2", 2), ("q3", 0)]
# 0 u q1, 1 a(ping), 2 tool, 3 a re: q1, 4 u q2, 5 a(ping), 6 tool, 7 a(ping), 8 tool,
# 9 a re: q2, 10 u q3, 11 a re: q3


# --- the cut -------------------------------------------------------------------------------------
def test_split_point_moves_earlier_to_a_user_message_then_to_a_group_start() -> None:
    call = ToolCall("c1", "ping", {})
    calls2 = (ToolCall("c2", "ping", {}), ToolCall("c3", "ping", {}))
    turns = [
        Message("user", "q1"), Message("assistant", "", tool_calls=(call,)),
        Message("tool", "pong", tool_call_id="c1"), Message("assistant", "a1"),
        Message("user", "q2"), Message("assistant", "", tool_calls=calls2),
        Message("tool", "pong", tool_call_id="c2"), Message("tool", "pong", tool_call_id="c3"),
        Message("assistant", "a2"),
    ]
    assert split_point(turns, 9) == 0 and split_point(turns, 20) == 0
    assert split_point(turns, 2) == 4  # inside q2's turn: back to its user message
    assert split_point(turns, 6) == 3  # no user message after index 0: a group start
    assert split_point(turns, 0) == 9  # keep nothing: everything is summarised
    one_turn = turns[4:]  # a single user message at 0: fall back to the assistant message
    assert split_point(one_turn, 1) == 4
    assert split_point(one_turn, 2) == 1  # never between a call and its results
    assert split_point(one_turn, 3) == 1


def test_compact_keeps_tool_call_pairs_whole_and_starts_at_a_user_message() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    assert len(session.messages) == 12
    session.compact(keep_last=4, instructions="Keep the numbers.")  # cut 8 is a tool result
    after = session.messages
    assert len(after) == 9
    assert is_summary(after[0]) and after[0].role == "user"
    assert after[0].text.endswith("SUMMARY")
    assert texts(after[1:]) == [
        "user:q2 rounds=2", "assistant:", "tool:pong", "assistant:", "tool:pong",
        "assistant:re: q2", "user:q3 rounds=0", "assistant:re: q3",
    ]
    assert_pairs_whole(after)
    # what the model was asked
    (request,) = model.summary_calls
    assert request.system is not None and request.system.endswith("Keep the numbers.")
    assert request.tools == ()
    (prompt,) = request.messages
    assert prompt.role == "user"
    assert "q1 rounds=1" in prompt.text and "ping" in prompt.text and "re: q1" in prompt.text
    assert "q2" not in prompt.text


def test_compact_inside_one_long_turn_cuts_at_an_assistant_message() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, [("long", 5)])  # u, (a, tool) x5, a: 12 messages, one user message
    session.compact(keep_last=4)  # index 8 is a tool result: the cut moves to 7
    after = session.messages
    assert len(after) == 6
    assert after[1].role == "assistant" and after[1].tool_calls
    assert_pairs_whole(after)


def test_the_transcript_after_compaction_is_what_the_next_turn_sends() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    session.compact(keep_last=2)
    assert texts(session.messages)[1:] == ["user:q3 rounds=0", "assistant:re: q3"]
    session.send("q4 rounds=1")
    request = model.provider.requests[-2]  # the turn's first model call
    sent = list(request.messages)
    assert is_summary(sent[0]) and sent[0].role == "user"
    assert texts(sent[1:]) == ["user:q3 rounds=0", "assistant:re: q3", "user:q4 rounds=1"]
    assert_pairs_whole(session.messages)


# --- events and usage ----------------------------------------------------------------------------
def test_compaction_emits_start_and_done_with_message_counts() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    events = listen(session)
    session.compact(keep_last=4)
    assert [type(e) for e in events] == [CompactionStart, CompactionDone]
    start, done = events
    assert isinstance(start, CompactionStart) and isinstance(done, CompactionDone)
    assert start.type == "compaction.start" and start.messages_before == 12
    assert done.type == "compaction.done"
    assert (done.messages_before, done.messages_after) == (12, 9)
    assert start.session_id == done.session_id == session.id
    assert done.seq > start.seq


def test_nothing_to_compact_makes_no_model_call_and_no_event() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, [("q1", 1)])
    events = listen(session)
    before = session.messages
    session.compact(keep_last=4)
    session.compact(keep_last=8)
    assert model.summary_calls == [] and events == []
    assert session.messages == before
    session.compact(keep_last=2)  # now there is something
    assert len(model.summary_calls) == 1
    session.compact(keep_last=2)  # only the summary is older than the kept part
    assert len(model.summary_calls) == 1 and len(events) == 2


def test_the_summary_carries_the_usage_of_what_it_replaced_plus_its_own() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    replaced = session.messages[:4]  # q1's turn: two model calls
    session.compact(keep_last=4)
    summary = session.messages[0]
    assert usage_is(summary.usage, 2 * 10 + 7, 2 * 1 + 3, 0.02 + 0.07)
    assert summary.metadata["lousho"] == "summary"
    assert summary.metadata["replaced"] == len(replaced) == 4
    assert (summary.metadata["steps"], summary.metadata["tool_calls"]) == (2, 1)
    # a second compaction folds the first summary in
    session.compact(keep_last=2)
    again = session.messages[0]
    assert again.metadata["replaced"] == 10 and again.metadata["steps"] == 5
    assert usage_is(again.usage, 5 * 10 + 2 * 7, 5 * 1 + 2 * 3, 0.05 + 0.14)
    assert "[earlier summary]" in model.summary_calls[-1].messages[0].text


def test_session_token_budgets_still_count_what_a_summary_replaced(tmp_path: Path) -> None:
    model = Model()
    path = tmp_path / "agent.db"
    with SqliteStore(path) as store:
        session = create_agent(provider=model.provider, tools=[ping], store=store).session(
            "s1", limits=Limits(max_input_tokens=67)
        )
        build(session, THREE_TURNS)  # 6 model calls: 60 input tokens
        session.compact(keep_last=2)  # + 7 for the summary call
        result = session.send("q4 rounds=0")
        assert (result.finish_reason, result.exceeded) == ("limit", "max_input_tokens")
    with SqliteStore(path) as store:  # reopened: the stored summary still carries it
        later = Model()
        session = create_agent(provider=later.provider, store=store).session(
            "s1", limits=Limits(max_input_tokens=67)
        )
        assert len(session.messages) == 3
        assert session.send("q5 rounds=0").exceeded == "max_input_tokens"
        assert later.provider.calls == 0


def test_session_step_and_tool_call_budgets_still_count_what_a_summary_replaced() -> None:
    """Needs the lead's patch to ``session._counters`` (summary metadata steps/tool_calls)."""
    model = Model()
    store = MemorySessionStore()
    agent = create_agent(provider=model.provider, tools=[ping], store=store)
    session = agent.session("s2", limits=Limits(max_steps=6))
    build(session, THREE_TURNS)  # 6 model calls
    session.compact(keep_last=2)
    assert session.send("q4 rounds=0").exceeded == "max_steps"
    copy = MemorySessionStore()  # what another process would load
    copy.save("s2", store.load("s2") or [])
    fresh = create_agent(provider=model.provider, store=copy).session(
        "s2", limits=Limits(max_steps=6)
    )
    assert fresh.send("q5 rounds=0").exceeded == "max_steps"
    tools = agent.session("s2", limits=Limits(max_tool_calls=3))
    assert tools.send("q6 rounds=1").exceeded == "max_tool_calls"


# --- atomicity -----------------------------------------------------------------------------------
def test_a_provider_failure_leaves_the_transcript_unchanged_in_memory_and_store(
    tmp_path: Path,
) -> None:
    model = Model(summary=Step(error=ProviderError("upstream down", status=503)))
    with SqliteStore(tmp_path / "a.db") as store:
        session = create_agent(provider=model.provider, tools=[ping], store=store).session("s")
        build(session, THREE_TURNS)
        before = session.messages
        events = listen(session)
        with pytest.raises(ProviderError, match="upstream down"):
            session.compact(keep_last=4)
        assert session.messages == before
        assert store.sessions.load("s") == list(before)
        assert [type(e) for e in events] == [CompactionStart]  # no compaction.done
        session.send("q4 rounds=0")  # the session still works
        assert len(session.messages) == 14


def test_an_empty_summary_is_a_provider_error_and_changes_nothing() -> None:
    model = Model(summary=Step(text="   "))
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    before = session.messages
    with pytest.raises(ProviderError, match="empty summary"):
        session.compact(keep_last=4)
    assert session.messages == before


class FailingSaves(MemorySessionStore):
    """A session store whose ``save`` and ``compact`` fail once ``broken`` is set."""

    broken = False

    def save(self, id: str, messages: Sequence[Message]) -> None:
        if self.broken:
            raise StoreUnavailableError("disk gone", session_id=id)
        super().save(id, messages)

    def compact(self, id: str, messages: Sequence[Message], *, replaced: Sequence[Message],
                fence: object = None) -> None:
        if self.broken:
            raise StoreUnavailableError("disk gone", session_id=id)
        super().compact(id, messages, replaced=replaced)


def test_a_store_failure_leaves_the_transcript_unchanged() -> None:
    model = Model()
    store = FailingSaves()
    session = create_agent(provider=model.provider, tools=[ping], store=store).session("s")
    build(session, THREE_TURNS)
    before = session.messages
    store.broken = True
    with pytest.raises(StoreUnavailableError):
        session.compact(keep_last=4)
    assert session.messages == before and store.load("s") == list(before)
    assert store.history("s") == []
    store.broken = False
    session.compact(keep_last=4)
    assert len(session.messages) == 9 and store.load("s") == list(session.messages)


def test_compaction_drops_leftover_turn_checkpoints_a_shorter_transcript_would_take() -> None:
    model = Model()
    session = create_agent(provider=model.provider, tools=[ping]).session("s")
    build(session, THREE_TURNS)
    store = session.checkpoint_store
    assert store is not None
    leftover = Checkpoint(key="s.turn-9", session_id="s", run_id="old",
                          input=(Message("user", "stale"),), status="interrupted")
    store.save("s.turn-9", leftover)  # e.g. a delete that failed long ago
    assert session.pending() is None  # only the key at the current length counts
    session.compact(keep_last=4)  # 12 -> 9 messages
    assert len(session.messages) == 9
    assert session.pending() is None and store.keys("s.turn-") == []
    session.send("q4 rounds=0")
    assert texts(session.messages)[-2:] == ["user:q4 rounds=0", "assistant:re: q4"]


# --- refused while busy ---------------------------------------------------------------------------
def test_compact_is_refused_while_a_turn_runs(gate: threading.Event) -> None:
    started = threading.Event()

    def held(request: ModelRequest) -> Step:
        started.set()
        return Step(text="late", gate=gate)

    provider = ScriptedProvider(["a", "b", held], default="SUMMARY")
    session = create_agent(provider=provider).session()
    session.send("1")
    session.send("2")
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(session.send("3")))
    worker.start()
    wait(started, "the turn's model call")
    with pytest.raises(SessionBusyError, match="compact"):
        session.compact(keep_last=1)
    gate.set()
    worker.join(WAIT)
    assert not worker.is_alive()
    session.compact(keep_last=2)
    assert len(session.messages) == 3


def test_a_turn_sent_during_compaction_waits_and_sees_the_compacted_transcript(
    gate: threading.Event,
) -> None:
    model = Model(summary=Step(text="SUMMARY", gate=gate))
    session = create_agent(provider=model.provider, tools=[ping]).session()
    build(session, THREE_TURNS)
    compacting = threading.Thread(target=lambda: session.compact(keep_last=2))
    compacting.start()
    wait(model.summary_started, "the summary call")
    results: list[object] = []
    sender = threading.Thread(target=lambda: results.append(session.send("q4 rounds=0")))
    sender.start()
    gate.set()
    compacting.join(WAIT)
    sender.join(WAIT)
    assert not compacting.is_alive() and not sender.is_alive()
    assert texts(session.messages)[1:] == [
        "user:q3 rounds=0", "assistant:re: q3", "user:q4 rounds=0", "assistant:re: q4"
    ]
    assert is_summary(model.provider.requests[-1].messages[0])


def test_compact_is_refused_while_a_turn_waits_on_an_approval() -> None:
    provider = ScriptedProvider(["hi", Step(tool_calls=[("launch", {})])], default="SUMMARY")
    session = create_agent(provider=provider, tools=[launch]).session()
    session.send("one")
    paused = session.send("go")
    assert paused.finish_reason == "awaiting-approval"
    with pytest.raises(SessionAwaitingApprovalError) as info:
        session.compact(keep_last=0)
    assert info.value.approval_id == paused.approval_id
    assert len(session.messages) == 2


def test_compact_is_refused_while_an_interrupted_turn_pends() -> None:
    provider = ScriptedProvider(
        ["hi", Step(tool_calls=[("ping", {})]), Step(error=ProviderError("down"))],
        default="SUMMARY",
    )
    session = create_agent(provider=provider, tools=[ping]).session()
    session.send("one")
    with pytest.raises(ProviderError):
        session.send("two")
    assert session.pending() is not None and session.pending().status == "interrupted"  # type: ignore[union-attr]
    with pytest.raises(SessionBusyError, match=re.escape("resume() or discard_pending()")):
        session.compact(keep_last=0)
    session.discard_pending()
    session.compact(keep_last=0)
    assert len(session.messages) == 1 and is_summary(session.messages[0])


# --- the token estimate ---------------------------------------------------------------------------
def test_the_estimate_is_about_four_characters_per_token_and_kept_incrementally() -> None:
    assert estimate_tokens(Message("user", "x" * 400)) == 104
    assert estimate_tokens(Message("user", "")) == 4
    model = Model()
    agent = create_agent(provider=model.provider, tools=[ping], instructions="y" * 40)
    session = agent.session()
    new = (Message("user", "z" * 40),)

    def fresh() -> int:
        spec = len(json.dumps(
            [{"name": s.name, "description": s.description, "parameters": dict(s.parameters)}
             for s in agent._base.config.tool_specs]))
        return (-(-(40 + spec) // 4) + sum(estimate_tokens(m) for m in session.messages)
                + estimate_tokens(new[0]))

    assert session.estimate_input_tokens(new) == fresh()
    build(session, THREE_TURNS)
    assert session.estimate_input_tokens(new) == fresh()
    session.compact(keep_last=2)  # a new list: counted again from scratch
    assert session.estimate_input_tokens(new) == fresh()
    session.clear()
    assert session.estimate_input_tokens(new) == fresh()


# --- automatic compaction (needs the lead's hook in Session._turn_driver) ----------------------
def auto_session(
    model: Model, max_input_tokens: int = 300, keep_last: int = 2
) -> tuple[Session, list[SessionEvent]]:
    agent = create_agent(provider=model.provider, tools=[ping], compaction=Compaction(
        max_input_tokens=max_input_tokens, keep_last=keep_last, instructions="Be terse."))
    session = agent.session()
    return session, listen(session)


LONG = "x" * 400  # about 104 tokens


def test_a_turn_whose_estimated_input_exceeds_the_threshold_compacts_first() -> None:
    model = Model()
    session, events = auto_session(model)
    assert session.estimate_input_tokens() < 100  # system prompt and tool specs
    session.send(f"{LONG}1")
    session.send(f"{LONG}2")  # transcript + input still under 300 tokens
    assert events == [] and model.summary_calls == []
    assert session.estimate_input_tokens((Message("user", f"{LONG}3"),)) > 300
    result = session.send(f"{LONG}3")
    assert [e.type for e in events] == ["compaction.start", "compaction.done"]
    start = events[0]
    assert isinstance(start, CompactionStart) and start.messages_before == 4
    done = events[1]
    assert isinstance(done, CompactionDone)
    assert (done.messages_before, done.messages_after) == (4, 3)
    (summary_call,) = model.summary_calls
    assert summary_call.system is not None and summary_call.system.endswith("Be terse.")
    turn_request = model.provider.requests[-1]
    assert is_summary(turn_request.messages[0])
    assert [m.text for m in turn_request.messages[1:]] == [f"{LONG}2", "re: " + f"{LONG}2",
                                                           f"{LONG}3"]
    assert result.finish_reason == "stop"
    assert result.usage == STEP_USAGE  # the summary call is the session's, not the turn's
    assert len(session.messages) == 5 and is_summary(session.messages[0])
    assert_pairs_whole(session.messages)


def test_no_automatic_compaction_below_the_threshold_or_without_a_policy() -> None:
    model = Model()
    session, events = auto_session(model, max_input_tokens=100_000)
    for i in range(4):
        session.send(f"{LONG}{i}")
    plain = Model()
    other = create_agent(provider=plain.provider).session()
    for i in range(4):
        other.send(f"{LONG}{i}")
    assert events == [] and model.summary_calls == [] and plain.summary_calls == []
    assert len(session.messages) == 8


def test_an_aborted_turn_during_automatic_compaction_changes_nothing(
    gate: threading.Event,
) -> None:
    model = Model(summary=Step(text="SUMMARY", gate=gate))
    session, events = auto_session(model)
    session.send(f"{LONG}1")
    session.send(f"{LONG}2")
    before = session.messages
    controller = AbortController()
    out: list[object] = []
    worker = threading.Thread(
        target=lambda: out.append(session.send(f"{LONG}3", signal=controller.signal))
    )
    worker.start()
    wait(model.summary_started, "the automatic summary call")
    controller.abort("user left")
    worker.join(WAIT)
    assert not worker.is_alive()
    (result,) = out
    assert getattr(result, "finish_reason", None) == "aborted"
    assert session.messages == before
    assert [e.type for e in events] == ["compaction.start"]


def test_a_failed_automatic_compaction_fails_the_turn_and_changes_nothing() -> None:
    model = Model(summary=Step(error=ProviderError("summariser down")))
    session, _ = auto_session(model)
    session.send(f"{LONG}1")
    session.send(f"{LONG}2")
    before = session.messages
    with pytest.raises(ProviderError, match="summariser down"):
        session.send(f"{LONG}3")
    assert session.messages == before and session.pending() is None


def test_automatic_compaction_is_skipped_when_the_session_budget_is_spent() -> None:
    model = Model()
    agent = create_agent(provider=model.provider, compaction=Compaction(max_input_tokens=150))
    session = agent.session(limits=Limits(max_steps=2))
    session.send(f"{LONG}1")
    session.send(f"{LONG}2")
    result = session.send(f"{LONG}3")
    assert (result.finish_reason, result.exceeded) == ("limit", "max_steps")
    assert model.summary_calls == [] and len(session.messages) == 4

