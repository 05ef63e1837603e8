"""Sessions: transcript, the turn queue and its five policies, atomic turns, listeners."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from conftest import WAIT, wait

from lousho_sync import (
    AbortController,
    AgentStore,
    ContextCleared,
    ExecutionResult,
    InvalidSessionIdError,
    Limits,
    MemoryCheckpointStore,
    MemorySessionStore,
    Message,
    ModelRequest,
    PropagatingToolError,
    ProviderError,
    ScriptedProvider,
    SessionBusyError,
    Step,
    create_agent,
    tool,
)


def echo(request: ModelRequest) -> str:
    """Answer naming every user message since the last assistant answer."""
    msgs = list(request.messages)
    tail: list[str] = []
    for m in reversed(msgs):
        if m.role == "assistant":
            break
        if m.role == "user":
            tail.append(m.text)
    return "re: " + " + ".join(reversed(tail))


def texts(messages: tuple[Message, ...] | list[Message]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


class Gated:
    """A provider script item that signals when the model call starts and waits for a gate."""

    def __init__(self, answer: str | Step) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.answer = answer

    def __call__(self, request: ModelRequest) -> Step:
        self.started.set()
        base = self.answer if isinstance(self.answer, Step) else Step(text=self.answer)
        return Step(text=base.text, chunks=base.chunks, tool_calls=base.tool_calls,
                    gate=self.release, error=base.error)


def joined(session: object) -> None:
    """Wait until a joining call has queued its input into the running turn."""
    current = session._state.current  # type: ignore[attr-defined]
    assert current is not None and current.control is not None
    wait(current.control.offered, "the joining call's input")


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=target)
    t.start()
    return t, out


# --- ids and basics ------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 129, "sp ace", "é", 7])
def test_bad_session_ids_are_refused_before_any_io(bad: object, tmp_path: object) -> None:
    agent = create_agent(provider=ScriptedProvider(default="ok"))
    with pytest.raises(InvalidSessionIdError) as info:
        agent.session(id=bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert repr(bad) in str(info.value) and "^[A-Za-z0-9_-]{1,128}$" in str(info.value)


def test_generated_ids_and_multi_turn_history() -> None:
    provider = ScriptedProvider(default=echo)
    agent = create_agent(provider=provider)
    session = agent.session()
    assert len(session.id) == 36
    session.send("My name is Ali.")
    result = session.send("What is my name?")
    assert result.messages == (Message("user", "What is my name?"),
                               result.messages[1])
    assert texts(list(provider.requests[1].messages)) == [
        "user:My name is Ali.", "assistant:re: My name is Ali.", "user:What is my name?"]
    snapshot = session.messages
    assert isinstance(snapshot, tuple) and len(snapshot) == 4
    with pytest.raises(AttributeError):
        snapshot[0].content = "edited"  # type: ignore[misc]


def test_sessions_with_the_same_store_and_id_share_the_transcript() -> None:
    store = MemorySessionStore()
    agent = create_agent(provider=ScriptedProvider(default=echo), store=store)
    agent.session(id="u1").send("one")
    again = create_agent(provider=ScriptedProvider(default=echo), store=store).session(id="u1")
    assert texts(again.messages) == ["user:one", "assistant:re: one"]
    assert store.load("u1") == list(again.messages)


def test_stream_builds_the_same_transcript_and_saves_before_run_done() -> None:
    store = MemorySessionStore()
    agent = create_agent(provider=ScriptedProvider(default=echo), store=store)
    session = agent.session(id="s")
    seen_at_done: list[int] = []
    for event in session.stream("hello"):
        if event.type == "run.done":
            seen_at_done.append(len(store.load("s") or []))
    assert seen_at_done == [2]
    assert texts(session.messages) == ["user:hello", "assistant:re: hello"]


# --- atomic turns --------------------------------------------------------------------------
def test_failures_and_aborts_leave_memory_and_store_unchanged() -> None:
    @tool
    def fatal() -> str:
        """Propagates."""
        raise PropagatingToolError("stop")

    store = MemorySessionStore()
    provider = ScriptedProvider(["ok", Step(tool_calls=[("fatal", {})])], default="x")
    agent = create_agent(provider=provider, store=store, tools=[fatal])
    session = agent.session(id="s", checkpoint_store=None)
    session.send("first")
    before = session.messages
    with pytest.raises(PropagatingToolError):
        session.send("second")
    assert session.messages == before and tuple(store.load("s") or ()) == before

    failing = create_agent(provider=ScriptedProvider(default=Step(error=ProviderError("503"))),
                           store=store)
    s2 = failing.session(id="s")
    with pytest.raises(ProviderError):
        s2.send("third")
    assert s2.messages == before and tuple(store.load("s") or ()) == before

    controller = AbortController()
    controller.abort()
    aborted = agent.session(id="s").send("fourth", signal=controller.signal)
    assert aborted.finish_reason == "aborted"
    assert tuple(store.load("s") or ()) == before


def test_breaking_out_of_a_session_stream_leaves_the_transcript(gate: threading.Event) -> None:
    provider = ScriptedProvider(["a1", Step(chunks=["x", "y"]), "a3"])
    session = create_agent(provider=provider).session()
    session.send("q1")
    for event in session.stream("q2"):
        if event.type == "text.delta":
            break
    assert texts(session.messages) == ["user:q1", "assistant:a1"]
    session.send("q3")
    assert texts(session.messages)[-2:] == ["user:q3", "assistant:a3"]


# --- policies: deterministic ---------------------------------------------------------------
def test_wait_runs_turns_one_after_another_in_call_order() -> None:
    first = Gated("a1")
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="wait")
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "first model call")
    run2 = session.stream("q2")  # joins the queue now, before iteration
    t3, _r3 = in_thread(lambda: session.send("q3"))
    first.release.set()
    result2 = run2.result(timeout=WAIT)
    t1.join(WAIT)
    t3.join(WAIT)
    assert texts(session.messages) == [
        "user:q1", "assistant:a1", "user:q2", "assistant:re: q2", "user:q3", "assistant:re: q3"]
    assert isinstance(r1[0], ExecutionResult) and result2.text == "re: q2"


def test_queue_joins_the_running_turn_and_returns_the_same_result() -> None:
    @tool
    def search(q: str) -> str:
        """Search flights."""
        return f"flights for {q}"

    first = Gated(Step(tool_calls=[("search", {"q": "Rome"})]))
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider, tools=[search]).session(turn_policy="queue")
    run1 = session.stream("Find flights to Rome.")
    events: list[object] = []
    t1, _ = in_thread(lambda: events.extend(run1))
    wait(first.started, "first model call")
    t2, r2 = in_thread(lambda: session.send("Only direct ones, please."))
    joined(session)
    first.release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    result1 = run1.result()
    assert r2[0] is result1
    assert texts(session.messages) == [
        "user:Find flights to Rome.",
        "assistant:",
        "tool:flights for Rome",
        "user:Only direct ones, please.",
        "assistant:re: Only direct ones, please.",
    ]
    types = [getattr(e, "type", "") for e in events]
    assert types.index("tool.result") < types.index("input.applied")


def test_queue_joining_stream_yields_only_run_done() -> None:
    first = Gated("a1")
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="queue")
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "first model call")
    joined = session.stream("q2")
    first.release.set()
    events = list(joined)
    t1.join(WAIT)
    assert [e.type for e in events] == ["run.done"]
    assert events[0].run_id == joined.run_id and events[0].seq == 0
    assert events[0].result is r1[0]
    assert texts(session.messages) == ["user:q1", "assistant:a1", "user:q2",
                                       "assistant:re: q2"]


def test_steer_redoes_the_silent_model_call() -> None:
    first = Gated("stale answer")
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="steer")
    t1, r1 = in_thread(lambda: session.send("Book a flight to Paris."))
    wait(first.started, "first model call")
    result2 = session.send("No, to Rome.")
    t1.join(WAIT)
    assert r1[0] is result2
    assert texts(session.messages) == [
        "user:Book a flight to Paris.", "user:No, to Rome.",
        "assistant:re: Book a flight to Paris. + No, to Rome."]
    assert provider.calls == 2


def test_steer_after_the_call_emitted_waits_for_the_next_safe_point() -> None:
    emitted = threading.Event()
    release = threading.Event()

    class Provider(ScriptedProvider):
        def stream(self, request, *, signal):  # type: ignore[no-untyped-def]
            for i, event in enumerate(super().stream(request, signal=signal)):
                yield event
                if i == 0 and self.calls == 1:
                    emitted.set()
                    assert release.wait(WAIT)

    provider = Provider([Step(chunks=["part ", "one"])], default=echo)
    session = create_agent(provider=provider).session(turn_policy="steer")
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(emitted, "first delta")
    t2, r2 = in_thread(lambda: session.send("q2"))
    joined(session)
    release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    assert r1[0] is r2[0]
    assert texts(session.messages) == ["user:q1", "assistant:part one", "user:q2",
                                       "assistant:re: q2"]


def test_reject_raises_while_busy_and_leaves_the_running_turn() -> None:
    first = Gated("a1")
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="reject")
    t1, _r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "first model call")
    with pytest.raises(SessionBusyError) as info:
        session.send("q2")
    assert info.value.code == "LOUSHO_SESSION_BUSY"
    with pytest.raises(SessionBusyError):
        session.stream("q2")
    first.release.set()
    t1.join(WAIT)
    assert texts(session.messages) == ["user:q1", "assistant:a1"]
    session.send("q3")
    assert texts(session.messages)[-2:] == ["user:q3", "assistant:re: q3"]


def test_rollback_drops_the_running_turn_and_runs_the_new_input() -> None:
    first = Gated("never stored")
    provider = ScriptedProvider(["a0", first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="rollback")
    session.send("q0")
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "second model call")
    result = session.send("q2")
    t1.join(WAIT)
    assert r1[0].finish_reason == "aborted"  # type: ignore[union-attr]
    assert result.text == "re: q2"
    assert texts(session.messages) == ["user:q0", "assistant:a0", "user:q2", "assistant:re: q2"]


def test_queue_falls_back_to_a_new_turn_when_the_running_turn_is_aborted() -> None:
    first = Gated("a1")
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="queue")
    run1 = session.stream("q1")
    t1, _ = in_thread(lambda: run1.result(timeout=WAIT))
    wait(first.started, "first model call")
    t2, r2 = in_thread(lambda: session.send("q2"))
    joined(session)
    run1.abort()
    t1.join(WAIT)
    t2.join(WAIT)
    assert run1.result().finish_reason == "aborted"
    assert r2[0].text == "re: q2"  # type: ignore[union-attr]
    assert texts(session.messages) == ["user:q2", "assistant:re: q2"]


def test_queue_falls_back_when_the_turn_hits_its_limit() -> None:
    @tool
    def slow() -> str:
        """A tool."""
        return "done"

    first = Gated(Step(tool_calls=[("slow", {})]))
    provider = ScriptedProvider([first], default=echo)
    agent = create_agent(provider=provider, tools=[slow], limits=Limits(max_steps=1))
    session = agent.session(turn_policy="queue")
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "first model call")
    t2, r2 = in_thread(lambda: session.send("q2"))
    joined(session)
    first.release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    assert r1[0].finish_reason == "limit"  # type: ignore[union-attr]
    assert r2[0] is not r1[0] and r2[0].text == "re: q2"  # type: ignore[union-attr]
    assert texts(session.messages) == ["user:q1", "assistant:", "tool:done", "user:q2",
                                       "assistant:re: q2"]


def test_a_failed_turn_raises_the_same_error_in_every_joined_call() -> None:
    first = Gated(Step(error=ProviderError("upstream down")))
    provider = ScriptedProvider([first], default=echo)
    session = create_agent(provider=provider).session(turn_policy="queue",
                                                      checkpoint_store=None)
    t1, r1 = in_thread(lambda: session.send("q1"))
    wait(first.started, "first model call")
    t2, r2 = in_thread(lambda: session.send("q2"))
    joined(session)
    first.release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    assert isinstance(r1[0], ProviderError) and r2[0] is r1[0]
    assert session.messages == ()


# --- policies under load -------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["wait", "queue", "steer", "reject", "rollback"])
def test_16_threads_x_25_sends(policy: str) -> None:
    provider = ScriptedProvider(default=echo)
    session = create_agent(provider=provider).session(turn_policy=policy)  # type: ignore[arg-type]
    barrier = threading.Barrier(16)
    outcomes: dict[int, list[object]] = {i: [] for i in range(16)}

    def worker(i: int) -> None:
        barrier.wait(WAIT)
        for j in range(25):
            try:
                outcomes[i].append(session.send(f"t{i}-m{j}"))
            except SessionBusyError as exc:
                outcomes[i].append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 6)
        assert not t.is_alive()
    transcript = session.messages
    users = [m.text for m in transcript if m.role == "user"]
    # no interleaving: every user message is answered before the next turn's message
    # and each thread's messages appear in its own call order
    for i in range(16):
        mine = [u for u in users if u.startswith(f"t{i}-")]
        assert mine == sorted(mine, key=lambda u: int(u.split("-m")[1]))
    assert len(users) == len(set(users))
    assert transcript[-1].role == "assistant"
    # every answer names exactly the user messages since the previous answer
    pending: list[str] = []
    for m in transcript:
        if m.role == "user":
            pending.append(m.text)
        else:
            assert m.text == "re: " + " + ".join(pending)
            pending = []
    stored = {u for u in users}
    for i in range(16):
        for j, outcome in enumerate(outcomes[i]):
            text = f"t{i}-m{j}"
            if isinstance(outcome, SessionBusyError):
                assert policy == "reject" and text not in stored
            elif outcome.finish_reason == "aborted":  # type: ignore[union-attr]
                assert policy in ("rollback",) and text not in stored
            else:
                assert text in stored
    if policy in ("wait", "queue", "steer"):
        assert len(users) == 400


# --- clear and listeners -------------------------------------------------------------------
def test_clear_empties_and_saves_and_is_refused_while_a_turn_runs() -> None:
    store = MemorySessionStore()
    first = Gated("a2")
    provider = ScriptedProvider(["a1", first], default=echo)
    session = create_agent(provider=provider, store=store).session(id="c")
    events: list[object] = []
    remove = session.on(events.append)
    session.send("q1")
    t, _ = in_thread(lambda: session.send("q2"))
    wait(first.started, "model call")
    with pytest.raises(SessionBusyError):
        session.clear()
    first.release.set()
    t.join(WAIT)
    session.clear()
    assert session.messages == () and store.load("c") is None
    assert [type(e) for e in events] == [ContextCleared]
    assert events[0].session_id == "c"  # type: ignore[attr-defined]
    remove()
    session.clear()
    assert len(events) == 1
    session.send("again")
    assert texts(session.messages) == ["user:again", "assistant:re: again"]


def test_a_raising_listener_is_logged_and_does_not_break_the_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = create_agent(provider=ScriptedProvider(default="ok")).session()
    got: list[object] = []

    def bad(event: object) -> None:
        raise RuntimeError("listener bug")

    session.on(bad)
    session.on(got.append)
    with caplog.at_level(logging.WARNING):
        session.clear()
    assert len(got) == 1
    assert any("listener" in r.getMessage() for r in caplog.records)
    assert session.send("still works").text == "ok"


# --- stores that fail --------------------------------------------------------------------------
class BrokenStore(MemorySessionStore):
    def __init__(self, *, fail_load: bool = False, fail_save: bool = False) -> None:
        super().__init__()
        self.fail_load = fail_load
        self.fail_save = fail_save

    def load(self, id: str) -> list[Message] | None:
        if self.fail_load:
            from lousho_sync import StoreUnavailableError

            raise StoreUnavailableError("disk gone", path="/nowhere", session_id=id)
        return super().load(id)

    def append(self, id: str, messages, *, expected_length: int) -> None:  # type: ignore[no-untyped-def]
        if self.fail_save:
            from lousho_sync import StoreUnavailableError

            raise StoreUnavailableError("disk full", path="/nowhere", session_id=id)
        super().append(id, messages, expected_length=expected_length)


def test_a_store_that_fails_to_load_fails_the_run_before_run_start() -> None:
    from lousho_sync import StoreUnavailableError

    session = create_agent(provider=ScriptedProvider(default="x"),
                           store=BrokenStore(fail_load=True)).session(id="s")
    run = session.stream("hi")
    events = list(run)
    assert [e.type for e in events] == ["error", "run.done"]
    assert events[-1].finish_reason == "error"
    with pytest.raises(StoreUnavailableError, match="disk gone"):
        run.result()


def test_a_store_that_fails_to_save_fails_the_run_after_run_start() -> None:
    from lousho_sync import StoreUnavailableError

    store = BrokenStore(fail_save=True)
    agent = create_agent(provider=ScriptedProvider(default="answer"),
                         store=AgentStore(sessions=store, checkpoints=MemoryCheckpointStore()))
    session = agent.session(id="s")
    events = list(session.stream("hi"))
    types = [e.type for e in events]
    assert types[0] == "run.start" and types[-2:] == ["error", "run.done"]
    assert isinstance(events[-2].error, StoreUnavailableError)
    assert session.messages == () and store.load("s") is None
    # the finished turn waits in its checkpoint; once the disk is back it is committed
    store.fail_save = False
    result = session.resume()
    assert result is not None and result.text == "answer"
    assert texts(store.load("s") or []) == ["user:hi", "assistant:answer"]


def test_a_send_behind_an_unread_stream_of_the_same_thread_is_refused_not_deadlocked() -> None:
    session = create_agent(provider=ScriptedProvider(default=echo)).session()
    run = session.stream("first")
    with pytest.raises(SessionBusyError, match="has not been read yet"):
        session.send("second")
    assert run.result(timeout=WAIT).text == "re: first"
    assert session.send("third").text == "re: third"
    assert texts(session.messages) == ["user:first", "assistant:re: first", "user:third",
                                       "assistant:re: third"]
