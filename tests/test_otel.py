"""OpenTelemetry spans, read back with the SDK's in-memory exporter: a tool turn, a failed
turn, an aio turn (parent/child across the worker thread), compaction; and tracing off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

import lousho_aio
from lousho_sync import (
    Compaction,
    ProviderError,
    ScriptedProvider,
    Step,
    ToolCall,
    Usage,
    _otel,
    create_agent,
    tool,
)
from lousho_sync.stores.memory import MemorySessionStore


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    inner = trace.get_tracer("a-tool").start_span("inside the tool")
    inner.end()
    return a + b


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("boom")


def _set_provider(provider: Any) -> None:
    # The API lets a process set its provider once; tests reset the globals around each use.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_provider(provider)
    try:
        yield exporter
    finally:
        _set_provider(None)


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def tool_turn_agent() -> Any:
    provider = ScriptedProvider(
        [
            Step(tool_calls=[ToolCall("call-1", "add", {"a": 2, "b": 3})],
                 usage=Usage(10, 4)),
            Step(text="5", usage=Usage(20, 1)),
        ],
        model="scripted-1",
    )
    return create_agent(provider=provider, tools=[add, explode])


def test_a_tool_turn_makes_turn_chat_tool_and_checkpoint_spans(
    spans: InMemorySpanExporter,
) -> None:
    session = tool_turn_agent().session("sess-1")
    result = session.send("add 2 and 3")
    assert result.text == "5"
    named = by_name(spans)
    (turn,) = named["invoke_agent lousho"]
    assert turn.attributes is not None
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.conversation.id"] == "sess-1"
    assert turn.attributes["gen_ai.provider.name"] == "scripted"
    assert turn.attributes["lousho.run_id"] == result.run_id
    assert turn.attributes["lousho.finish_reason"] == "stop"
    assert turn.attributes["gen_ai.usage.input_tokens"] == 30
    assert turn.attributes["gen_ai.usage.output_tokens"] == 5
    assert turn.status.status_code is StatusCode.UNSET

    chats = named["chat scripted-1"]
    assert len(chats) == 2
    for chat, (inp, out) in zip(chats, [(10, 4), (20, 1)], strict=True):
        a = chat.attributes
        assert a is not None
        assert chat.kind is trace.SpanKind.CLIENT
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "scripted"
        assert a["gen_ai.request.model"] == "scripted-1"
        assert a["gen_ai.response.model"] == "scripted-1"
        assert a["gen_ai.conversation.id"] == "sess-1"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (inp, out)
        assert chat.parent is not None and chat.parent.span_id == turn.context.span_id
    assert chats[0].attributes is not None
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)

    (tool_span,) = named["execute_tool add"]
    assert tool_span.attributes is not None
    assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool_span.attributes["gen_ai.tool.name"] == "add"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool_span.parent is not None and tool_span.parent.span_id == turn.context.span_id
    (inner,) = named["inside the tool"]  # the tool's own span is the tool span's child
    assert inner.parent is not None and inner.parent.span_id == tool_span.context.span_id

    saves = named["lousho.checkpoint.save"]
    assert saves and all(s.parent and s.parent.span_id == turn.context.span_id for s in saves)
    assert {s.attributes["lousho.checkpoint.status"] for s in saves if s.attributes} == {
        "running"
    }
    assert all(s.context.trace_id == turn.context.trace_id for s in spans.get_finished_spans())


def test_a_failed_tool_is_recorded_on_its_span(spans: InMemorySpanExporter) -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[ToolCall("c-9", "explode", {})]), Step(text="sorry")]
    )
    create_agent(provider=provider, tools=[explode]).session("s-2").send("go")
    (span,) = by_name(spans)["execute_tool explode"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description and "boom" in span.status.description


def test_a_failed_turn_records_the_error_on_the_turn_and_the_model_call(
    spans: InMemorySpanExporter,
) -> None:
    provider = ScriptedProvider([Step(error=ProviderError("upstream down", status=503))])
    session = create_agent(provider=provider).session("sess-f")
    with pytest.raises(ProviderError, match="upstream down"):
        session.send("hi")
    named = by_name(spans)
    (turn,) = named["invoke_agent lousho"]
    (chat,) = named["chat scripted"]
    for span in (turn, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description and "upstream down" in span.status.description
        assert span.attributes is not None
        assert span.attributes["error.type"] == "LOUSHO_PROVIDER_ERROR"
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"].endswith("ProviderError")
    assert turn.attributes is not None and turn.attributes["lousho.finish_reason"] == "error"
    # Every span of the turn is in its trace.
    assert all(s.context.trace_id == turn.context.trace_id for s in spans.get_finished_spans())


def test_an_aio_turn_is_a_child_of_the_callers_span(spans: InMemorySpanExporter) -> None:
    agent = lousho_aio.create_agent(
        provider=ScriptedProvider([Step(tool_calls=[("add", {"a": 1, "b": 1})]),
                                   Step(text="2"), Step(text="yes")]),
        tools=[add],
    )
    tracer = trace.get_tracer("the-app")

    async def main() -> list[str]:
        with tracer.start_as_current_span("handle request"):
            session = agent.session("aio-1")
            types = [event.type async for event in session.stream("1+1")]
            await session.send("again?")
        return types

    types = asyncio.run(main())
    assert types[0] == "run.start" and types[-1] == "run.done"
    named = by_name(spans)
    (request,) = named["handle request"]
    turns = named["invoke_agent lousho"]
    assert len(turns) == 2
    for turn in turns:
        assert turn.parent is not None and turn.parent.span_id == request.context.span_id
        assert turn.context.trace_id == request.context.trace_id
    (tool_span,) = named["execute_tool add"]
    assert tool_span.parent is not None
    assert tool_span.parent.span_id == turns[0].context.span_id
    (inner,) = named["inside the tool"]
    assert inner.parent is not None and inner.parent.span_id == tool_span.context.span_id


def test_compaction_has_its_span(spans: InMemorySpanExporter) -> None:
    provider = ScriptedProvider(default="a summary")
    agent = create_agent(provider=provider, store=MemorySessionStore(),
                         compaction=Compaction(max_input_tokens=10**9, keep_last=2))
    session = agent.session("comp-1")
    for i in range(3):
        session.send(f"message {i}")
    spans.clear()
    session.compact(keep_last=2)
    (span,) = by_name(spans)["lousho.compaction"]
    assert span.attributes is not None
    assert span.attributes["gen_ai.conversation.id"] == "comp-1"
    assert span.attributes["lousho.compaction.messages_before"] == 6
    assert session.messages[0].metadata.get("lousho") == "summary"


def test_with_no_tracer_provider_nothing_is_traced() -> None:
    _set_provider(None)
    assert _otel.turn(ScriptedProvider(), "s", "r") is None
    with _otel.compaction("s", 3) as span:
        assert span is not None
    result = tool_turn_agent().session("quiet").send("add")
    assert result.text == "5"


def test_without_opentelemetry_installed_turns_run_untraced(tmp_path: Any) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from lousho_sync import ScriptedProvider, Step, ToolCall, create_agent, tool
        from lousho_sync import _otel

        @tool
        def add(a: int, b: int) -> int:
            "Add."
            return a + b

        assert _otel.AVAILABLE is False
        assert _otel.turn(object(), "s", "r") is None
        provider = ScriptedProvider([Step(tool_calls=[ToolCall("c", "add", {"a": 1, "b": 2})]),
                                     Step(text="3")])
        print(create_agent(provider=provider, tools=[add]).session("x").send("go").text)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


def test_provider_names_follow_the_conventions() -> None:
    from lousho_sync.providers.anthropic import AnthropicProvider
    from lousho_sync.providers.openai import OpenAIProvider

    assert _otel.provider_name(OpenAIProvider.__new__(OpenAIProvider)) == "openai"
    assert _otel.provider_name(AnthropicProvider.__new__(AnthropicProvider)) == "anthropic"


def test_debug_logging_and_tracing_together(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with caplog.at_level(logging.DEBUG, logger="lousho_sync"):
        result = tool_turn_agent().session("both").send("add")
    named = by_name(spans)
    assert len(named["invoke_agent lousho"]) == 1 and len(named["execute_tool add"]) == 1
    (inner,) = named["inside the tool"]
    assert inner.parent is not None
    assert inner.parent.span_id == named["execute_tool add"][0].context.span_id
    logged = [r.getMessage() for r in caplog.records if r.name == "lousho_sync.executor"]
    assert f"run {result.run_id}: tool add (call call-1) returned" in logged


def test_an_aborted_turn_is_not_an_error(spans: InMemorySpanExporter) -> None:
    session = create_agent(provider=ScriptedProvider(default="ok")).session("ab-1")
    run = session.stream("hi")
    events = iter(run)
    assert next(events).type == "run.start"
    run.abort("user left")
    rest = [e.type for e in events]
    assert rest[-1] == "run.done"
    (turn,) = by_name(spans)["invoke_agent lousho"]
    assert turn.attributes is not None
    assert turn.attributes["lousho.finish_reason"] == "aborted"
    assert turn.status.status_code is StatusCode.UNSET
