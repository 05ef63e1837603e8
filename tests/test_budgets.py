"""Budgets (per turn and per session), cost accounting and project instructions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lousho_sync import (
    ConfigError,
    FileSessionStore,
    Limits,
    Message,
    Price,
    ScriptedProvider,
    Step,
    Usage,
    create_agent,
    tool,
)
from lousho_sync.sqlite import SqliteStore

CALLS: list[str] = []


@tool
def ping() -> str:
    """Answer pong."""
    CALLS.append("ping")
    return "pong"


def usage_is(usage: Usage | None, input_tokens: int, output_tokens: int, cost: float) -> bool:
    """``usage`` has these token counts and (about) this cost."""
    return (
        usage is not None
        and (usage.input_tokens, usage.output_tokens) == (input_tokens, output_tokens)
        and usage.cost_usd == pytest.approx(cost)
    )


def roles(messages: Sequence[Message]) -> list[str]:
    return [m.role for m in messages]


def looping(usage: Usage = Usage(100, 10, 0.1), model: str = "scripted") -> ScriptedProvider:
    """A model that asks for ``ping`` on every step, each step costing ``usage``."""
    return ScriptedProvider(default=Step(tool_calls=[("ping", {})], usage=usage), model=model)


# --- per turn ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "name"),
    [
        (Limits(max_steps=2), "max_steps"),
        (Limits(max_input_tokens=200), "max_input_tokens"),
        (Limits(max_output_tokens=20), "max_output_tokens"),
        (Limits(max_cost_usd=0.2), "max_cost_usd"),
    ],
)
def test_a_turn_limit_ends_the_turn_after_the_step_that_reached_it(
    limits: Limits, name: str
) -> None:
    provider = looping()
    agent = create_agent(provider=provider, tools=[ping], limits=limits)
    session = agent.session()
    result = session.send("go")
    assert result.finish_reason == "limit"
    assert result.exceeded == name
    assert result.steps == 2 and provider.calls == 2
    assert usage_is(result.usage, 200, 20, 0.2)
    # the work done so far is kept, tool calls with their results
    assert roles(result.messages) == ["user", "assistant", "tool", "assistant", "tool"]
    tool_texts = [m.text for m in result.messages if m.role == "tool"]
    assert tool_texts[0] == "pong"
    if name == "max_steps":  # only model calls are bounded: the second ping ran
        assert tool_texts[1] == "pong"
    else:  # a usage limit is also checked before each tool call: the second ping did not run
        assert tool_texts[1] == f"not run: the turn reached its limit {name}"
    assert session.messages == result.messages
    assert session.pending() is None


def test_a_turn_limit_counts_each_turn_afresh() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(100, 10)))
    session = create_agent(provider=provider, limits=Limits(max_input_tokens=150)).session()
    for _ in range(3):  # each turn uses 100 < 150: never refused although the sum grows
        assert session.send("x").finish_reason == "stop"
    assert provider.calls == 3


def test_max_tool_calls_per_turn_reports_calls_not_run_and_keeps_the_work() -> None:
    CALLS.clear()
    provider = ScriptedProvider(
        [Step(tool_calls=[("ping", {}), ("ping", {}), ("ping", {})])], default="done"
    )
    session = create_agent(provider=provider, tools=[ping],
                           limits=Limits(max_tool_calls=2)).session()
    result = session.send("go")
    assert (result.finish_reason, result.exceeded) == ("limit", "max_tool_calls")
    assert CALLS == ["ping", "ping"]
    results = [m for m in result.messages if m.role == "tool"]
    assert [m.is_error for m in results] == [False, False, True]
    assert "max_tool_calls" in results[2].text
    assert session.messages == result.messages
    assert provider.calls == 1


def test_an_agent_send_with_a_turn_limit() -> None:
    result = create_agent(provider=looping(), tools=[ping],
                          limits=Limits(max_steps=1)).send("go")
    assert (result.finish_reason, result.exceeded, result.steps) == ("limit", "max_steps", 1)
    assert roles(result.messages) == ["user", "assistant", "tool"]


# --- per session ---------------------------------------------------------------------------------
def one_round_provider() -> ScriptedProvider:
    """Each turn: a ping call then an answer; 2 steps, 1 tool call, 200/20 tokens, $0.2."""
    return ScriptedProvider(
        default=lambda request: (
            Step(text="answer", usage=Usage(100, 10, 0.1))
            if list(request.messages)[-1].role == "tool"
            else Step(tool_calls=[("ping", {})], usage=Usage(100, 10, 0.1))
        )
    )


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        (Limits(max_steps=2), "max_steps"),
        (Limits(max_input_tokens=200), "max_input_tokens"),
        (Limits(max_output_tokens=20), "max_output_tokens"),
        (Limits(max_cost_usd=0.2), "max_cost_usd"),
    ],
)
def test_a_session_limit_refuses_the_next_turn_before_its_first_model_call(
    limits: Limits, name: str
) -> None:
    provider = one_round_provider()
    agent = create_agent(provider=provider, tools=[ping])
    session = agent.session(limits=limits)
    first = session.send("one")
    assert first.finish_reason == "stop" and first.text == "answer"
    before = session.messages
    stored = session.store.load(session.id)

    second = session.send("two")
    assert (second.finish_reason, second.exceeded) == ("limit", name)
    assert second.steps == 0 and second.usage == Usage()
    assert provider.calls == 2  # no model call for the refused turn
    # a turn refused before its first model call stores nothing
    assert session.messages == before
    assert session.store.load(session.id) == stored
    assert session.pending() is None


def test_a_session_limit_bounds_the_sum_over_turns() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(100, 10)))
    session = create_agent(provider=provider).session(limits=Limits(max_input_tokens=250))
    assert [session.send(str(i)).finish_reason for i in range(4)] == [
        "stop", "stop", "stop", "limit"
    ]
    assert provider.calls == 3


def test_a_session_tool_call_limit_keeps_the_work_of_the_turn_it_stops() -> None:
    CALLS.clear()
    provider = one_round_provider()
    session = create_agent(provider=provider, tools=[ping]).session(
        limits=Limits(max_tool_calls=1)
    )
    session.send("one")
    result = session.send("two")
    assert (result.finish_reason, result.exceeded) == ("limit", "max_tool_calls")
    assert CALLS == ["ping"]
    assert roles(result.messages) == ["user", "assistant", "tool"]
    assert result.messages[-1].is_error
    assert session.messages[-3:] == result.messages
    assert len(session.messages) == 7


def test_turn_and_session_limits_together_the_first_reached_wins() -> None:
    provider = looping(Usage(100, 10, 0.1))
    agent = create_agent(provider=provider, tools=[ping], limits=Limits(max_steps=3))
    session = agent.session(limits=Limits(max_cost_usd=0.5))
    first = session.send("a")
    assert (first.finish_reason, first.exceeded) == ("limit", "max_steps")
    second = session.send("b")  # 0.3 spent: two more steps reach 0.5
    assert (second.finish_reason, second.exceeded, second.steps) == ("limit", "max_cost_usd", 2)


def test_clear_starts_the_session_count_again() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(10, 1)))
    session = create_agent(provider=provider).session(limits=Limits(max_steps=1))
    assert session.send("a").finish_reason == "stop"
    assert session.send("b").exceeded == "max_steps"
    session.clear()
    assert session.send("c").finish_reason == "stop"
    assert [m.text for m in session.messages] == ["c", "hi"]


# --- budgets survive a restart ------------------------------------------------------------------
def spend(provider: ScriptedProvider, store: object, turns: int) -> list[str]:
    agent = create_agent(provider=provider, store=store)
    session = agent.session("user-42", limits=Limits(max_cost_usd=1.0))
    return [session.send(f"turn {i}").finish_reason for i in range(turns)]


def test_a_session_budget_survives_a_restart_with_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    with SqliteStore(path) as store:
        assert spend(ScriptedProvider(default=Step(text="hi", usage=Usage(5, 5, 0.6))),
                     store, 2) == ["stop", "stop"]
    later = ScriptedProvider(default="should not be called")
    with SqliteStore(path) as store:  # a new process would open the file the same way
        agent = create_agent(provider=later, store=store)
        session = agent.session("user-42", limits=Limits(max_cost_usd=1.0))
        result = session.send("again")
        assert (result.finish_reason, result.exceeded) == ("limit", "max_cost_usd")
        assert later.calls == 0
        assert len(session.messages) == 4


def test_a_session_budget_survives_a_restart_with_file_sessions(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    priced = ScriptedProvider(default=Step(text="hi", usage=Usage(400_000, 0)), model="gpt-4o")
    # cost from the price table: 400k input tokens of gpt-4o = $1.00 each turn
    assert spend(priced, FileSessionStore(directory), 1) == ["stop"]
    later = ScriptedProvider(default="should not be called", model="gpt-4o")
    result = create_agent(provider=later, store=FileSessionStore(directory)).session(
        "user-42", limits=Limits(max_cost_usd=1.0)
    ).send("again")
    assert (result.finish_reason, result.exceeded) == ("limit", "max_cost_usd")
    assert later.calls == 0
    stored = FileSessionStore(directory).load("user-42") or []
    assert usage_is(stored[1].usage, 400_000, 0, 1.0)


# --- cost ----------------------------------------------------------------------------------------
def test_a_cost_reported_by_the_provider_wins_over_the_price_table() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(1_000_000, 0, 0.01)),
                                model="gpt-4o")
    result = create_agent(provider=provider).send("x")
    assert result.usage.cost_usd == pytest.approx(0.01)  # the table would say 2.50


def test_cost_from_the_shipped_price_table() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(1_000_000, 1_000_000)),
                                model="gpt-4o")
    result = create_agent(provider=provider).send("x")
    assert result.usage.cost_usd == pytest.approx(12.5)
    assert result.messages[-1].usage == result.usage


def test_prices_override_the_table_and_add_models() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(2_000_000, 1_000_000)),
                                model="gpt-4o")
    cheap = create_agent(provider=provider, prices={"gpt-4o": Price(1.0, 2.0)}).send("x")
    assert cheap.usage.cost_usd == pytest.approx(4.0)
    own = ScriptedProvider(default=Step(text="hi", usage=Usage(1_000_000, 0)), model="my-llm")
    agent = create_agent(provider=own, prices={"my-llm": Price(0.5, 0.0)},
                         limits=Limits(max_cost_usd=1.0))
    result = agent.send("x")
    assert result.finish_reason == "stop" and result.usage.cost_usd == pytest.approx(0.5)


def test_an_unknown_price_without_a_cost_limit_leaves_the_cost_unknown() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(10, 10)), model="mystery-1")
    result = create_agent(provider=provider).send("x")
    assert result.finish_reason == "stop" and result.usage.cost_usd is None


def test_a_cost_limit_with_no_known_price_is_a_config_error_naming_the_model() -> None:
    provider = ScriptedProvider(default=Step(text="hi", usage=Usage(10, 10)), model="mystery-1")
    agent = create_agent(provider=provider, limits=Limits(max_cost_usd=1.0))
    with pytest.raises(ConfigError, match="mystery-1") as info:
        agent.send("x")
    assert info.value.code == "LOUSHO_CONFIG"

    session = create_agent(provider=provider).session(limits=Limits(max_cost_usd=1.0))
    with pytest.raises(ConfigError, match="mystery-1"):
        session.send("x")
    assert session.messages == ()  # the failed turn stored nothing
    assert session.store.load(session.id) in (None, [])


# --- project instructions ----------------------------------------------------------------------
def system_of(**options: object) -> str | None:
    provider = ScriptedProvider(default="ok")
    create_agent(provider=provider, **options).send("x")  # type: ignore[arg-type]
    return provider.requests[0].system


def test_project_instructions_true_reads_agents_md_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "AGENTS.md").write_text("Use tabs.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert system_of(instructions="Be brief.", project_instructions=True) == (
        "Be brief.\n\nUse tabs.\n"
    )
    assert system_of(project_instructions=True) == "Use tabs.\n"
    assert system_of(instructions="Be brief.") == "Be brief."  # default False


def test_project_instructions_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "rules" / "TEAM.md"
    path.parent.mkdir()
    path.write_text("Answer in French.", encoding="utf-8")
    assert system_of(instructions="Be brief.", project_instructions=path) == (
        "Be brief.\n\nAnswer in French."
    )
    assert system_of(project_instructions=str(path)) == "Answer in French."


def test_a_missing_project_instructions_file_adds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert system_of(instructions="Be brief.", project_instructions=True) == "Be brief."
    assert system_of(project_instructions=tmp_path / "nope.md") is None
