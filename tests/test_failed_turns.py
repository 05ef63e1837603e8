"""Failed turns a user can see and retry (SPEC §16): a turn that fails before recording any
progress leaves nothing pending; errors say whether the turn was kept (``pending``); a
call that first finishes a pending turn returns that turn's result too (``resumed``); a
store without checkpoints is not durable; a stream that breaks mid-way before any reader
saw it is made again."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from _http_server import FakeServer, fixture_reply, sse_reply

from lousho_sync import (
    AgentStore,
    FileSessionStore,
    OpenAIProvider,
    PendingTurn,
    ProviderError,
    ScriptedProvider,
    Step,
    ToolCall,
    create_agent,
    tool,
)
from lousho_sync.sqlite import SqliteStore

KEY = "sk-test-failed-turns"


@tool
def ping() -> str:
    """Answers pong."""
    return "pong"


PING = Step(tool_calls=(ToolCall("p1", "ping", {}),))


def texts(messages: object) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]  # type: ignore[attr-defined]


def test_a_retry_after_an_error_stores_the_question_once_without_checkpoints() -> None:
    # repro_retry_after_error_duplicates.py: a store given without checkpoints
    prov = ScriptedProvider(["Hi Ali.", Step(error=ProviderError("429")), "ANSWER-1",
                             "ANSWER-2"])
    agent = create_agent(provider=prov, store=AgentStore(
        sessions=FileSessionStore(tempfile.mkdtemp())))
    s = agent.session(id="u1")
    s.send("My name is Ali.")
    with pytest.raises(ProviderError) as failed:
        s.send("What is my name?")
    assert failed.value.pending is False
    assert s.checkpoint_store is None and s.pending() is None
    r = s.send("What is my name?")  # the user retries
    assert r.text == "ANSWER-1" and r.resumed is None and prov.calls == 3
    assert texts(s.messages) == ["user:My name is Ali.", "assistant:Hi Ali.",
                                 "user:What is my name?", "assistant:ANSWER-1"]


def test_a_turn_failing_before_any_progress_leaves_nothing_pending(tmp_path: Path) -> None:
    prov = ScriptedProvider([Step(error=ProviderError("503", retryable=True))],
                            default="fine")
    with SqliteStore(tmp_path / "a.db") as store:
        session = create_agent(provider=prov, store=store).session(id="s")
        with pytest.raises(ProviderError) as failed:
            session.send("question")
        assert failed.value.pending is False and "resume()" not in str(failed.value)
        assert session.pending() is None and store.checkpoints.keys("s.") == []
        assert session.messages == () and store.sessions.load("s") is None
        result = session.send("question")
        assert result.text == "fine" and result.resumed is None
        assert texts(store.sessions.load("s")) == ["user:question", "assistant:fine"]


def test_a_turn_failing_after_progress_pends_and_says_so(tmp_path: Path) -> None:
    prov = ScriptedProvider([PING, Step(error=ProviderError("cut"))],
                            default=lambda r: f"re: {list(r.messages)[-1].text}")
    with SqliteStore(tmp_path / "a.db") as store:
        session = create_agent(provider=prov, store=store, tools=[ping]).session(id="s")
        with pytest.raises(ProviderError) as failed:
            session.send("first")
        assert failed.value.pending is True
        assert "session.resume()" in str(failed.value)
        assert "session.discard_pending()" in str(failed.value)
        assert session.pending() == PendingTurn("interrupted")
        # a stream that finishes the pending turn first says so on run.done
        run = session.stream("second")
        events = list(run)
        done = events[-1]
        assert done.type == "run.done" and done.result is not None
        assert done.result.text == "re: second"
        assert done.result.resumed is not None and done.result.resumed.text == "re: pong"
        assert [e.type for e in events].count("run.start") == 1  # resumed turn: no events
        assert texts(store.sessions.load("s")) == [
            "user:first", "assistant:", "tool:pong", "assistant:re: pong",
            "user:second", "assistant:re: second"]


def test_a_resume_error_says_pending_and_an_awaiting_error_too() -> None:
    @tool(needs_approval=True)
    def pay() -> str:
        """Pay."""
        return "paid"

    prov = ScriptedProvider([Step(tool_calls=(ToolCall("c1", "pay", {}),))], default="ok")
    session = create_agent(provider=prov, tools=[pay]).session()
    paused = session.send("pay")
    assert paused.finish_reason == "awaiting-approval"
    with pytest.raises(Exception) as refused:
        session.send("more")
    assert refused.value.code == "LOUSHO_SESSION_AWAITING_APPROVAL"  # type: ignore[attr-defined]
    assert refused.value.pending is True  # type: ignore[attr-defined]


def test_a_store_without_checkpoints_is_not_durable_but_approvals_still_pause() -> None:
    @tool(needs_approval=True)
    def pay() -> str:
        """Pay."""
        return "paid"

    prov = ScriptedProvider([PING, Step(error=ProviderError("down")),
                             Step(tool_calls=(ToolCall("c1", "pay", {}),))], default="done")
    agent = create_agent(provider=prov, tools=[ping, pay], store=AgentStore(
        sessions=FileSessionStore(tempfile.mkdtemp())))
    session = agent.session(id="u")
    with pytest.raises(ProviderError) as failed:
        session.send("a")  # progress was made, but nothing is durable: nothing pends
    assert failed.value.pending is False and session.pending() is None
    paused = session.send("b")
    assert paused.finish_reason == "awaiting-approval"
    assert session.pending() == PendingTurn("awaiting-approval", paused.approval_id)
    assert paused.approval_id is not None
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert done is not None and done.text == "done"
    assert texts(session.messages)[-3:] == ["assistant:", "tool:paid", "assistant:done"]


def test_create_agent_without_a_store_keeps_in_memory_checkpoints() -> None:
    prov = ScriptedProvider([PING, Step(error=ProviderError("down"))], default="ok")
    session = create_agent(provider=prov, tools=[ping]).session()
    with pytest.raises(ProviderError):
        session.send("a")
    assert session.pending() == PendingTurn("interrupted")
    assert session.resume() is not None and texts(session.messages)[-1] == "assistant:ok"


# --- a stream broken mid-way -------------------------------------------------------------------
def _events(name: str) -> list[str]:
    text = (Path(__file__).parent / "provider_fixtures" / name).read_text()
    return [e for e in text.split("\n\n") if e.strip() and not e.startswith(":")]


def _cut_after(n: int) -> object:
    """The text stream fixture cut after its first ``n`` events (connection dropped)."""
    return sse_reply("\n\n".join(_events("openai_text_stream.sse")[:n]) + "\n\n", cut=True)


def test_send_makes_a_call_again_when_its_stream_breaks_mid_way(server: FakeServer) -> None:
    server.push(_cut_after(3), fixture_reply("openai_text_stream.sse"))  # type: ignore[arg-type]
    with OpenAIProvider("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1",
                        backoff_s=0.001) as provider:
        session = create_agent(provider=provider).session()
        result = session.send("Hello!")
    assert result.text == "Hello there, how may I assist you today?"
    assert len(server.requests) == 2 and result.steps == 1
    assert texts(session.messages) == ["user:Hello!", f"assistant:{result.text}"]


def test_a_stream_whose_reader_saw_text_fails_when_it_breaks(server: FakeServer) -> None:
    server.push(_cut_after(3))  # type: ignore[arg-type]
    server.default = fixture_reply("openai_text_stream.sse")
    with OpenAIProvider("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1",
                        backoff_s=0.001) as provider:
        session = create_agent(provider=provider).session()
        events = list(session.stream("Hello!"))
    kinds = [e.type for e in events]
    assert "text.delta" in kinds and kinds[-2:] == ["error", "run.done"]
    assert len(server.requests) == 1 and session.messages == ()


def test_a_stream_broken_before_any_text_reached_the_reader_is_made_again(
    server: FakeServer,
) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Weather."""
        return f"sunny in {city}"

    tool_events = _events("openai_parallel_tools_stream.sse")
    # cut after two tool-call deltas: something was delivered, but no text to a reader
    server.push(sse_reply("\n\n".join(tool_events[:3]) + "\n\n", cut=True),
                fixture_reply("openai_parallel_tools_stream.sse"),
                fixture_reply("openai_text_stream.sse"))
    with OpenAIProvider("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1",
                        backoff_s=0.001) as provider:
        session = create_agent(provider=provider, tools=[get_weather]).session()
        events = list(session.stream("Weather?"))
    kinds = [e.type for e in events]
    assert "error" not in kinds and kinds[-1] == "run.done"
    assert kinds.count("step.start") == 2  # the broken call was made again, not a new step
    assert len(server.requests) == 3


def test_the_call_is_made_again_only_within_the_providers_retry_budget(
    server: FakeServer,
) -> None:
    server.push(_cut_after(3))  # type: ignore[arg-type]
    server.default = fixture_reply("openai_text_stream.sse")
    with OpenAIProvider("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1",
                        backoff_s=0.001, max_retries=0) as provider:
        session = create_agent(provider=provider).session()
        with pytest.raises(ProviderError) as failed:
            session.send("Hello!")
    assert failed.value.retryable and failed.value.pending is False
    assert len(server.requests) == 1 and session.messages == ()


def test_a_chaos_soak_stores_each_successful_question_once(
    server: FakeServer, tmp_path: Path
) -> None:
    """150 turns on a SQLite session against a server that answers 30% of requests with
    429/500/503 and cuts 16% of streams after their first chunk (seeded): every question
    whose send() returned is stored exactly once, no failed one is stored later, and
    nothing is left pending."""
    import json
    import random

    from _http_server import Recorded, Reply, json_reply

    seed = int(os.environ.get("LOUSHO_SOAK_SEED") or random.randrange(2**32))
    print(f"chaos soak seed {seed} (LOUSHO_SOAK_SEED={seed} replays)")
    rng = random.Random(seed)
    full = _events("openai_text_stream.sse")

    def chaos(rec: Recorded) -> Reply:
        roll = rng.random()
        if roll < 0.30:
            status = rng.choice((429, 500, 503))
            return json_reply({"error": {"message": "chaos", "type": "server_error"}}, status)
        if roll < 0.46:
            return sse_reply("\n\n".join(full[:2]) + "\n\n", cut=True)
        question = rec.json()["messages"][-1]["content"]
        body = ("\n\n".join(full).replace('"content":"Hello"', '"content":' + json.dumps(
            f"re: {question}")).replace('"content":" there"', '"content":""').replace(
            '"content":", how may I assist you today?"', '"content":""'))
        return sse_reply(body + "\n\n")

    server.default = chaos
    ok: list[str] = []
    failed = 0
    with SqliteStore(tmp_path / "soak.db") as store, OpenAIProvider(
        "gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1", backoff_s=0.0005,
        max_retries=2,
    ) as provider:
        session = create_agent(provider=provider, store=store).session(id="soak")
        for i in range(150):
            question = f"q{i}"
            try:
                result = session.send(question)
            except ProviderError as exc:
                assert exc.pending is False  # one model call, no progress: nothing kept
                failed += 1
                continue
            assert result.text == f"re: {question}" and result.resumed is None
            ok.append(question)
        assert session.pending() is None
        stored = [m.text for m in session.load() if m.role == "user"]
    assert stored == ok  # each successful question once, in order; no failed one
    assert ok, f"seed {seed}: nothing succeeded"
    print(f"chaos soak: {len(ok)} succeeded, {failed} raised, {len(stored)} stored")
