"""AnthropicProvider against a real HTTP server serving Anthropic's published payloads."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _http_server import (
    FIXTURES,
    FakeServer,
    Recorded,
    Reply,
    fixture_body,
    fixture_reply,
    json_reply,
    sse_reply,
)

from lousho_sync.errors import ProviderError
from lousho_sync.messages import FilePart, ImagePart, Message, TextPart, ToolCall, Usage
from lousho_sync.providers.anthropic import AnthropicProvider
from lousho_sync.providers.base import (
    ModelDone,
    ModelRequest,
    ModelTextDelta,
    ModelToolCallDelta,
    ToolSpec,
)
from lousho_sync.signal import AbortController, Signal

KEY = "sk-ant-test-SECRET-0123456789abcdef"
WEATHER = ToolSpec(
    "get_weather",
    "Get the current weather in a given location",
    {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
)


@pytest.fixture
def provider(server: FakeServer) -> Iterator[AnthropicProvider]:
    with AnthropicProvider(
        "claude-sonnet-4-5", api_key=KEY, base_url=server.url, backoff_s=0.001
    ) as p:
        yield p


def signal() -> Signal:
    return AbortController().signal


def ask(text: str = "Hello, world", **kw: Any) -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[Message("user", text)], **kw)


def test_complete_text(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_text.json"))
    response = provider.complete(ask(), signal=signal())
    assert response.message == Message(
        "assistant", "Hi! My name is Claude.", usage=Usage(2095, 503)
    )
    assert (response.finish_reason, response.model) == ("stop", "claude-3-7-sonnet-20250219")
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json() == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello, world"}],
    }


def test_settings_pass_through_and_max_tokens(
    server: FakeServer, provider: AnthropicProvider
) -> None:
    server.push(fixture_reply("anthropic_text.json"))
    settings = {"max_tokens": 256, "temperature": 0.5, "stop_sequences": ["END"], "top_k": None}
    provider.complete(ask(settings=settings), signal=signal())
    body = server.requests[0].json()
    assert body["max_tokens"] == 256 and body["temperature"] == 0.5
    assert body["stop_sequences"] == ["END"] and "top_k" not in body


def test_complete_tool_use(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_tool_use.json"))
    response = provider.complete(ask(tools=[WEATHER]), signal=signal())
    assert response.finish_reason == "tool_calls"
    assert response.message.text == "I'll check the current weather in San Francisco for you."
    assert response.message.tool_calls == (
        ToolCall(
            "toolu_01A09q90qw90lq917835lq9",
            "get_weather",
            {"location": "San Francisco, CA", "unit": "celsius"},
        ),
    )
    assert server.requests[0].json()["tools"] == [
        {
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "input_schema": dict(WEATHER.parameters),
        }
    ]


def test_stream_text_and_usage(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_text_stream.sse"))
    events = list(provider.stream(ask(), signal=signal()))
    assert events[:-1] == [ModelTextDelta("Hello"), ModelTextDelta(" there"), ModelTextDelta("!")]
    response = events[-1].response  # type: ignore[union-attr]
    assert response.message == Message("assistant", "Hello there!", usage=Usage(11, 6))
    assert (response.finish_reason, response.model) == ("stop", "claude-3-opus-latest")
    assert server.requests[0].json()["stream"] is True


def test_stream_tool_use_input_in_fragments(
    server: FakeServer, provider: AnthropicProvider
) -> None:
    server.push(fixture_reply("anthropic_tool_stream.sse"))
    events = list(provider.stream(ask("Weather in Paris?", tools=[WEATHER]), signal=signal()))
    assert [e for e in events if isinstance(e, ModelToolCallDelta)] == [
        ModelToolCallDelta(0, "toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", ""),
        ModelToolCallDelta(0, None, None, '{"locati'),
        ModelToolCallDelta(0, None, None, 'on": "P'),
        ModelToolCallDelta(0, None, None, "ar"),
        ModelToolCallDelta(0, None, None, 'is"}'),
    ]
    response = events[-1].response  # type: ignore[union-attr]
    assert response.finish_reason == "tool_calls"
    assert response.message.text == "I'll check the current weather in Paris for you."
    assert response.message.tool_calls == (
        ToolCall("toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", {"location": "Paris"}),
    )
    assert response.message.usage == Usage(377, 65)


def test_stream_parallel_tool_use(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_parallel_tools_stream.sse"))
    events = list(provider.stream(ask(tools=[WEATHER]), signal=signal()))
    starts = [e for e in events if isinstance(e, ModelToolCallDelta) and e.id]
    assert [(e.index, e.name) for e in starts] == [(0, "get_weather"), (1, "get_time")]
    response = events[-1].response  # type: ignore[union-attr]
    assert [c.arguments for c in response.message.tool_calls] == [
        {"location": "Paris"},
        {"timezone": "Europe/Paris"},
    ]
    assert response.message.usage == Usage(377, 98)


def test_usage_counts_cache_tokens_and_later_input(
    server: FakeServer, provider: AnthropicProvider
) -> None:
    text = (FIXTURES / "anthropic_text_stream.sse").read_text()
    text = text.replace(
        '"usage":{"input_tokens":11,"output_tokens":1}',
        '"usage":{"input_tokens":11,"cache_creation_input_tokens":100,'
        '"cache_read_input_tokens":1000,"output_tokens":1}',
    ).replace('"usage":{"output_tokens":6}', '"usage":{"input_tokens":12,"output_tokens":6}')
    server.push(sse_reply(text))
    response = list(provider.stream(ask(), signal=signal()))[-1].response  # type: ignore[union-attr]
    assert response.message.usage == Usage(1112, 6, cache_read_tokens=1000, cache_write_tokens=100)


def test_stream_error_event(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_stream_error.sse"))
    server.push(fixture_reply("anthropic_text_stream.sse"))
    events = list(provider.stream(ask(), signal=signal()))  # overloaded before any text: retried
    assert isinstance(events[-1], ModelDone) and len(server.requests) == 2

    server.default = fixture_reply("anthropic_stream_error.sse")
    p = AnthropicProvider("m", api_key=KEY, base_url=server.url, max_retries=0)
    with p, pytest.raises(ProviderError, match="Overloaded") as info:
        list(p.stream(ask(), signal=signal()))
    assert (info.value.error_type, info.value.retryable) == ("overloaded_error", True)


def test_529_overloaded_is_retried(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_error_529.json"), fixture_reply("anthropic_text.json"))
    assert provider.complete(ask(), signal=signal()).message.text == "Hi! My name is Claude."
    assert len(server.requests) == 2


def test_images_documents_and_grouped_tool_results(
    server: FakeServer, provider: AnthropicProvider
) -> None:
    jpeg = b"\xff\xd8\xff\xe0-fake-jpeg"
    pdf = b"%PDF-1.7 fake"
    history = [
        Message(
            "user",
            (
                TextPart("Describe these."),
                ImagePart(data=jpeg, media_type="image/jpeg"),
                ImagePart(url="https://example.com/a.png"),
                FilePart(pdf, "application/pdf", name="a.pdf"),
                FilePart(b"plain notes", "text/plain"),
            ),
        ),
        Message(
            "assistant",
            "",
            tool_calls=(
                ToolCall("toolu_1", "get_weather", {"location": "Paris"}),
                ToolCall("toolu_2", "get_weather", {"location": "Nowhere"}),
            ),
        ),
        Message("tool", "18C", tool_call_id="toolu_1"),
        Message("tool", "unknown place", tool_call_id="toolu_2", is_error=True),
        Message("user", "Thanks"),
    ]
    server.push(fixture_reply("anthropic_text.json"))
    provider.complete(ModelRequest(None, history, [WEATHER]), signal=signal())
    body = server.requests[0].json()
    assert "system" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe these."},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/jpeg",
                        "data": base64.b64encode(jpeg).decode(),
                    },
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": base64.b64encode(pdf).decode(),
                    },
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"location": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"location": "Nowhere"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "unknown place",
                    "is_error": True,
                },
            ],
        },
        {"role": "user", "content": "Thanks"},
    ]


def test_unsupported_file_type_is_refused_before_sending(
    server: FakeServer, provider: AnthropicProvider
) -> None:
    msg = Message("user", (FilePart(b"PK..", "application/zip", name="a.zip"),))
    with pytest.raises(ProviderError, match="application/zip") as info:
        provider.complete(ModelRequest(None, [msg]), signal=signal())
    assert info.value.error_type == "unsupported_content" and server.requests == []


def test_tool_round_trip(server: FakeServer, provider: AnthropicProvider) -> None:
    server.push(fixture_reply("anthropic_tool_use.json"), fixture_reply("anthropic_text.json"))
    first = provider.complete(ask("Weather in SF?", tools=[WEATHER]), signal=signal())
    history = [
        Message("user", "Weather in SF?"),
        first.message,
        Message("tool", "15 degrees", tool_call_id=first.message.tool_calls[0].id),
    ]
    second = provider.complete(ModelRequest("sys", history, [WEATHER]), signal=signal())
    assert second.finish_reason == "stop"
    sent = server.requests[1].json()["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I'll check the current weather in San Francisco for you."},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA", "unit": "celsius"},
            },
        ],
    }
    assert sent[2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                "content": "15 degrees",
            }
        ],
    }


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "stop"),
    ],
)
def test_stop_reasons(
    server: FakeServer, provider: AnthropicProvider, raw: str, mapped: str
) -> None:
    body = fixture_body("anthropic_text.json")
    body["stop_reason"] = raw
    server.push(json_reply(body))
    response = provider.complete(ask(), signal=signal())
    assert response.finish_reason == mapped
    plain = raw in ("end_turn", "max_tokens")
    assert response.message.metadata == ({} if plain else {"finish_reason": raw})


def test_base_url_is_the_host(server: FakeServer) -> None:
    def reply(rec: Recorded) -> Reply:
        return fixture_reply("anthropic_text.json")

    server.default = reply
    for base in (server.url, server.url + "/", server.url + "/v1"):
        with AnthropicProvider("m", api_key=KEY, base_url=base) as p:
            p.complete(ask(), signal=signal())
            assert repr(p) == f"AnthropicProvider(model='m', base_url='{server.url}')"
    assert {r.path for r in server.requests} == {"/v1/messages"}


def test_fixtures_cite_their_source() -> None:
    for path in sorted(Path(FIXTURES).glob("anthropic_*")):
        text = path.read_text()
        assert ("source: " in text) if path.suffix == ".sse" else json.loads(text)["source"]


def _no_key_on_disk(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_session_turn_with_a_tool_round_trip(server: FakeServer, tmp_path: Path) -> None:
    """A whole session turn through AnthropicProvider: tool call, tool result, answer; the
    answer echoes the key, which is in no stored transcript or checkpoint."""
    sqlite = pytest.importorskip("lousho_sync.sqlite")
    from lousho_sync import create_agent, tool

    db = tmp_path / "lousho.sqlite"
    ran: list[str] = []

    @tool
    def get_weather(location: str) -> str:
        """Get the current weather in a given location."""
        _no_key_on_disk(tmp_path)  # the checkpoint written so far
        ran.append(location)
        return f"15 degrees in {location}"

    echo = fixture_body("anthropic_text.json")
    echo["content"][0]["text"] = f"Hello {KEY} there!"
    answer_sse = (FIXTURES / "anthropic_text_stream.sse").read_text()
    answer_sse = answer_sse.replace('"text":"Hello"', f'"text":"Hello {KEY}"')

    def first(rec: Recorded) -> Reply:
        if rec.json().get("stream"):
            return fixture_reply("anthropic_tool_stream.sse")
        return json_reply(fixture_body("anthropic_tool_use.json"))

    def second(rec: Recorded) -> Reply:
        return sse_reply(answer_sse) if rec.json().get("stream") else json_reply(echo)

    server.push(first, second)
    store = sqlite.SqliteStore(db)
    provider = AnthropicProvider("claude-sonnet-4-5", api_key=KEY, base_url=server.url)
    with provider, store:
        agent = create_agent(
            instructions="Be brief.", provider=provider, tools=[get_weather], store=store
        )
        result = agent.session(id="user-42").send("Weather in Paris?")
        stored = store.sessions.load("user-42")
    assert ran == ["Paris"]
    assert result.text == "Hello *** there!"
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert stored is not None and [m.role for m in stored] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    sent = server.requests[1].json()
    assert sent["system"].startswith("Be brief.")
    assert sent["messages"][-1]["role"] == "user"
    assert sent["messages"][-1]["content"][0]["type"] == "tool_result"
    assert sent["messages"][-1]["content"][0]["tool_use_id"] == "toolu_01NRLabsLyVHZPKxbKvkfSMn"
    assert "15 degrees in Paris" in json.dumps(sent["messages"][-1])
    _no_key_on_disk(tmp_path)
    assert KEY not in repr(stored) and KEY not in repr(result)
