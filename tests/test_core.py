"""agent.send / agent.stream: inputs, tool turns, errors, aborts, events, AgentRun."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from conftest import WAIT, wait

from lousho_sync import (
    AbortController,
    AbortedError,
    ExecutionResult,
    FilePart,
    ImagePart,
    InvalidInputError,
    Message,
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    PropagatingToolError,
    ProviderError,
    ScriptedProvider,
    Signal,
    Step,
    TextPart,
    ToolCall,
    Usage,
    create_agent,
    tool,
)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


@tool
def fatal() -> str:
    """Ends the turn."""
    raise PropagatingToolError("the ledger is locked")


# --- inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "given, expected",
    [
        ("hello", (Message("user", "hello"),)),
        ([TextPart("a"), ImagePart(data=b"\x89PNG\x00\xff")],
         (Message("user", (TextPart("a"), ImagePart(data=b"\x89PNG\x00\xff"))),)),
        ([FilePart(b"%PDF", "application/pdf", name="a.pdf")],
         (Message("user", (FilePart(b"%PDF", "application/pdf", name="a.pdf"),)),)),
        ([Message("user", "one"), Message("assistant", "two"), Message("user", "three")],
         (Message("user", "one"), Message("assistant", "two"), Message("user", "three"))),
    ],
    ids=["str", "parts", "file", "messages"],
)
def test_every_input_form_reaches_the_model(given: object, expected: tuple[Message, ...]) -> None:
    provider = ScriptedProvider(default="ok")
    result = create_agent(provider=provider).send(given)  # type: ignore[arg-type]
    assert tuple(provider.requests[0].messages) == expected
    assert result.messages[: len(expected)] == expected
    assert result.text == "ok"


@pytest.mark.parametrize("bad", [42, None, [], [1, 2], [TextPart("a"), Message("user", "b")],
                                 {"role": "user"}])
def test_bad_input_is_a_type_error_before_anything_happens(bad: object) -> None:
    provider = ScriptedProvider(default="ok")
    agent = create_agent(provider=provider)
    session = agent.session()
    with pytest.raises(InvalidInputError) as info:
        agent.send(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)
    assert info.value.code == "LOUSHO_INVALID_INPUT"
    with pytest.raises(TypeError):
        session.send(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        session.stream(bad)  # type: ignore[arg-type]
    assert provider.calls == 0
    assert session.messages == ()


# --- tool turns ------------------------------------------------------------------------------
def test_two_step_tool_turn() -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("add", {"a": 2, "b": 3})]), "The sum is 5."]
    )
    result = create_agent(provider=provider, tools=[add]).send("2+3?")
    assert result.text == "The sum is 5."
    assert result.finish_reason == "stop"
    assert result.steps == 2
    roles = [m.role for m in result.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_msg = result.messages[2]
    assert tool_msg.content == "5" and tool_msg.tool_call_id == "call_1_0"
    assert not tool_msg.is_error
    # the second model call saw the call and its result
    second = list(provider.requests[1].messages)
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert [s.name for s in provider.requests[0].tools] == ["add"]


def test_tools_of_one_step_run_in_the_models_order() -> None:
    order: list[str] = []

    @tool
    def note(label: str) -> str:
        """Remember a label."""
        order.append(label)
        return label

    calls = [("note", {"label": x}) for x in "abcde"]
    provider = ScriptedProvider([Step(tool_calls=calls), "done"])
    result = create_agent(provider=provider, tools=[note]).send("go")
    assert order == list("abcde")
    assert [m.text for m in result.messages if m.role == "tool"] == list("abcde")


def test_tool_errors_are_fed_back_to_the_model() -> None:
    provider = ScriptedProvider(
        [
            Step(tool_calls=[("explode", {"reason": "x"}), ("nope", {}),
                             ("add", {"a": "two", "b": 1})]),
            "I saw three errors.",
        ]
    )
    result = create_agent(provider=provider, tools=[add, explode]).send("go")
    results = [m for m in result.messages if m.role == "tool"]
    assert all(m.is_error for m in results)
    assert "boom: x" in results[0].text
    assert "unknown tool 'nope'" in results[1].text
    assert "'a'" in results[2].text
    assert result.text == "I saw three errors."
    seen = list(provider.requests[1].messages)
    assert [m.is_error for m in seen if m.role == "tool"] == [True, True, True]


def test_propagating_tool_error_reaches_the_caller() -> None:
    provider = ScriptedProvider([Step(tool_calls=[("fatal", {})]), "never"])
    agent = create_agent(provider=provider, tools=[fatal])
    with pytest.raises(PropagatingToolError, match="ledger is locked"):
        agent.send("go")
    assert provider.calls == 1


def test_provider_error_raises_from_send_and_fails_the_stream() -> None:
    provider = ScriptedProvider(default=Step(error=ProviderError("upstream 503", status=503)))
    agent = create_agent(provider=provider)
    with pytest.raises(ProviderError, match="upstream 503"):
        agent.send("hi")
    run = agent.stream("hi")
    events = list(run)
    assert [e.type for e in events] == ["run.start", "step.start", "error", "run.done"]
    assert events[-1].finish_reason == "error" and events[-1].result is None
    assert isinstance(events[2].error, ProviderError)
    with pytest.raises(ProviderError):
        run.result()


# --- a provider written against the protocol alone ------------------------------------------
class EchoProvider:
    """Not a ScriptedProvider: only the Provider protocol."""

    def __init__(self) -> None:
        self.seen: list[ModelRequest] = []

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "tool":
            return ModelResponse(Message("assistant", f"tool said {last.text}",
                                         usage=Usage(3, 4)), "stop", "echo-1")
        return ModelResponse(
            Message("assistant", "", tool_calls=(ToolCall("c1", "add", {"a": 20, "b": 22}),),
                    usage=Usage(1, 2)),
            "tool_calls",
            "echo-1",
        )

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        self.seen.append(request)
        response = self.complete(request, signal=signal)
        for word in response.message.text.split(" "):
            if word:
                yield ModelTextDelta(word + " ")
        yield ModelDone(response)


def test_a_provider_written_against_the_protocol_alone() -> None:
    provider = EchoProvider()
    agent = create_agent(provider=provider, tools=[add], instructions="sys")
    result = agent.send("hi")
    assert result.text == "tool said 42"
    assert result.usage == Usage(4, 6, 0.0) or result.usage.input_tokens == 4
    assert result.usage.output_tokens == 6
    assert provider.seen[0].system == "sys"
    deltas = [e.text for e in agent.stream("hi") if e.type == "text.delta"]
    assert "".join(deltas) == "tool said 42 "


# --- events and AgentRun -----------------------------------------------------------------
def test_event_order_and_fields() -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("add", {"a": 1, "b": 1})], usage=Usage(10, 2)),
         Step(chunks=["It ", "is ", "2."], usage=Usage(20, 3))]
    )
    run = create_agent(provider=provider, tools=[add]).stream("1+1?")
    events = list(run)
    assert [e.type for e in events] == [
        "run.start", "step.start", "usage", "tool.call", "tool.result", "step.start",
        "text.delta", "text.delta", "text.delta", "usage", "run.done",
    ]
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.run_id for e in events} == {run.run_id}
    assert events[0].input == (Message("user", "1+1?"),)
    assert [e.step for e in events if e.type == "step.start"] == [1, 2]
    assert events[-2].usage == Usage(20, 3, 0.0) and events[-2].total == Usage(30, 5, 0.0)
    done = events[-1]
    assert done.finish_reason == "stop"
    assert done.result is run.result()
    assert done.result.text == "It is 2."


def test_result_without_iterating() -> None:
    run = create_agent(provider=ScriptedProvider(default="hi")).stream("x")
    result = run.result(timeout=WAIT)
    assert isinstance(result, ExecutionResult) and result.text == "hi"
    assert run.result() is result


def test_result_from_another_thread_while_iterating() -> None:
    provider = ScriptedProvider([Step(chunks=["a", "b", "c"])])
    run = create_agent(provider=provider).stream("x")
    it = iter(run)
    first = next(it)
    got: list[ExecutionResult] = []
    waiter = threading.Thread(target=lambda: got.append(run.result(timeout=WAIT)))
    waiter.start()
    rest = list(it)
    waiter.join(WAIT)
    assert first.type == "run.start"
    assert [e.type for e in rest][-1] == "run.done"
    assert got and got[0].text == "abc"


def test_a_slow_consumer_loses_no_event_and_the_buffer_stays_bounded() -> None:
    chunks = [f"w{i} " for i in range(500)]
    produced = []

    def counting(request: ModelRequest) -> Step:
        return Step(chunks=chunks)

    class CountingProvider(ScriptedProvider):
        def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
            for event in super().stream(request, signal=signal):
                produced.append(event)
                yield event

    provider = CountingProvider([counting])
    run = create_agent(provider=provider).stream("x")
    received = []
    lead = []
    for event in run:
        received.append(event)
        if event.type == "text.delta":
            # the producer is never more than one event ahead of this slow consumer
            lead.append(len(produced) - sum(1 for e in received if e.type == "text.delta"))
    assert "".join(e.text for e in received if e.type == "text.delta") == "".join(chunks)
    assert max(lead) <= 1


def test_breaking_out_of_the_loop_aborts_the_run(gate: threading.Event) -> None:
    provider = ScriptedProvider([Step(chunks=["a", "b"]), Step(text="late", gate=gate)],
                                default="x")
    agent = create_agent(provider=provider, tools=[add])
    run = agent.stream("x")
    for event in run:
        if event.type == "text.delta":
            break
    result = run.result(timeout=WAIT)
    assert result.finish_reason == "aborted"


# --- aborts --------------------------------------------------------------------------------
def test_abort_before_the_turn_starts() -> None:
    controller = AbortController()
    controller.abort("user left")
    provider = ScriptedProvider(default="hi")
    result = create_agent(provider=provider).send("x", signal=controller.signal)
    assert result.finish_reason == "aborted"
    assert provider.calls == 0


def test_abort_during_a_provider_delay() -> None:
    controller = AbortController()
    provider = ScriptedProvider([Step(text="slow", delay_s=WAIT * 3)])
    agent = create_agent(provider=provider)
    started = threading.Event()
    run = agent.stream("x", signal=controller.signal)
    events = []

    def consume() -> None:
        for event in run:
            events.append(event)
            if event.type == "step.start":
                started.set()

    t = threading.Thread(target=consume)
    t.start()
    wait(started, "the model call")
    controller.abort("enough")
    t.join(WAIT)
    assert not t.is_alive()
    assert events[-1].type == "run.done" and events[-1].finish_reason == "aborted"
    assert run.result().finish_reason == "aborted"


def test_abort_between_steps() -> None:
    controller = AbortController()

    @tool
    def stop_here() -> str:
        """Aborts the run from inside a tool."""
        controller.abort("between steps")
        return "ok"

    provider = ScriptedProvider([Step(tool_calls=[("stop_here", {})]), "never"])
    result = create_agent(provider=provider, tools=[stop_here]).send(
        "x", signal=controller.signal
    )
    assert result.finish_reason == "aborted"
    assert provider.calls == 1


def test_run_abort_method(gate: threading.Event) -> None:
    provider = ScriptedProvider([Step(text="x", gate=gate)])
    run = create_agent(provider=provider).stream("x")
    it = iter(run)
    assert next(it).type == "run.start"
    assert next(it).type == "step.start"
    run.abort("stop")
    rest = list(it)
    assert rest[-1].finish_reason == "aborted"


def test_signal_members() -> None:
    controller = AbortController()
    signal = controller.signal
    seen: list[object] = []
    signal.add_callback(lambda: seen.append(signal.reason))
    assert not signal.aborted and not signal.wait(0)
    signal.raise_if_aborted()
    assert controller.abort("why") is True
    assert controller.abort("again") is False
    assert signal.aborted and signal.reason == "why" and signal.wait(0)
    assert seen == ["why"]
    with pytest.raises(AbortedError):
        signal.raise_if_aborted()
    late: list[int] = []
    signal.add_callback(lambda: late.append(1))
    assert late == [1]


# --- enqueue and steer on a standalone run ----------------------------------------------
def test_enqueue_on_a_standalone_run(gate: threading.Event) -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("add", {"a": 1, "b": 2})], gate=gate), "first answer",
         "after the queued input"]
    )
    run = create_agent(provider=provider, tools=[add]).stream("start")
    it = iter(run)
    assert next(it).type == "run.start"
    assert next(it).type == "step.start"
    assert run.enqueue("also this") is True
    gate.set()
    events = list(it)
    types = [e.type for e in events]
    assert "input.queued" in types and "input.applied" in types
    assert types.index("tool.result") < types.index("input.applied")
    result = run.result()
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert result.messages[3].text == "also this"
    second = list(provider.requests[1].messages)
    assert second[-1] == Message("user", "also this")
    assert run.enqueue("too late") is False


def test_steer_redoes_a_model_call_that_emitted_nothing(gate: threading.Event) -> None:
    provider = ScriptedProvider([Step(text="stale answer", gate=gate), "steered answer"])
    run = create_agent(provider=provider).stream("book a flight")
    it = iter(run)
    next(it)
    next(it)  # step.start: the model call is in flight and has emitted nothing
    assert run.steer("to Rome, not Paris") is True
    events = list(it)
    result = run.result()
    assert result.text == "steered answer"
    assert "stale answer" not in [e.text for e in events if e.type == "text.delta"]
    assert [m.text for m in result.messages] == ["book a flight", "to Rome, not Paris",
                                                  "steered answer"]
    assert provider.calls == 2
    assert list(provider.requests[1].messages)[-1].text == "to Rome, not Paris"


def test_steer_skips_tool_calls_not_yet_started() -> None:
    ran: list[str] = []
    holder: dict[str, object] = {}

    @tool
    def step_tool(label: str) -> str:
        """Records its label; the first one steers the run."""
        ran.append(label)
        if label == "a":
            holder["run"].steer("change of plan")  # type: ignore[attr-defined]
        return label

    provider = ScriptedProvider(
        [Step(tool_calls=[("step_tool", {"label": "a"}), ("step_tool", {"label": "b"})]),
         "replanned"]
    )
    run = create_agent(provider=provider, tools=[step_tool]).stream("go")
    holder["run"] = run
    result = run.result(timeout=WAIT)
    assert ran == ["a"]
    tool_results = [m for m in result.messages if m.role == "tool"]
    assert tool_results[0].text == "a" and not tool_results[0].is_error
    assert tool_results[1].is_error and "skipped" in tool_results[1].text
    assert result.messages[-2].text == "change of plan"
    assert result.text == "replanned"


# --- event loops -----------------------------------------------------------------------------
def test_send_from_inside_a_running_event_loop() -> None:
    agent = create_agent(provider=ScriptedProvider(default="from the loop"))

    async def main() -> str:
        return agent.send("hi").text  # a notebook cell calling the blocking API

    assert asyncio.run(main()) == "from the loop"


def test_limits_max_steps() -> None:
    from lousho_sync import Limits

    provider = ScriptedProvider(default=Step(tool_calls=[("add", {"a": 1, "b": 1})]))
    result = create_agent(provider=provider, tools=[add], limits=Limits(max_steps=3)).send("x")
    assert result.finish_reason == "limit" and result.exceeded == "max_steps"
    assert result.steps == 3
    assert provider.calls == 3


def test_tool_result_json_and_usage_cost_from_price_table() -> None:
    @tool
    def info() -> dict[str, int]:
        """Structured result."""
        return {"a": 1}

    provider = ScriptedProvider([Step(tool_calls=[("info", {})], usage=Usage(1_000_000, 0)),
                                 "ok"], model="gpt-4o-mini")
    result = create_agent(provider=provider, tools=[info]).send("x")
    assert json.loads(result.messages[2].text) == {"a": 1}
    assert result.usage.cost_usd == pytest.approx(0.15)
