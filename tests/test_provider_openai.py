"""OpenAIProvider against a real HTTP server serving the OpenAI API reference payloads."""

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
from lousho_sync.providers.base import (
    ModelDone,
    ModelRequest,
    ModelTextDelta,
    ModelToolCallDelta,
    ToolSpec,
)
from lousho_sync.providers.openai import OpenAIProvider
from lousho_sync.signal import AbortController, Signal

KEY = "sk-test-SECRET-0123456789abcdefXYZ"
WEATHER = ToolSpec(
    "get_weather",
    "Get the weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
def provider(server: FakeServer) -> Iterator[OpenAIProvider]:
    with OpenAIProvider(
        "gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1/", backoff_s=0.001
    ) as p:
        yield p


def signal() -> Signal:
    return AbortController().signal


def ask(text: str = "Hello!", **kw: Any) -> ModelRequest:
    return ModelRequest(
        system="You are a helpful assistant.", messages=[Message("user", text)], **kw
    )


def test_complete_text(server: FakeServer, provider: OpenAIProvider) -> None:
    server.push(fixture_reply("openai_text.json"))
    response = provider.complete(ask(settings={"temperature": 0.2}), signal=signal())
    assert response.message == Message(
        "assistant", "\n\nHello there, how may I assist you today?", usage=Usage(9, 12)
    )
    assert (response.finish_reason, response.model) == ("stop", "gpt-4o-mini")
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json() == {
        "model": "gpt-4o-mini",
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"},
        ],
    }


def test_complete_tool_call(server: FakeServer, provider: OpenAIProvider) -> None:
    server.push(fixture_reply("openai_tool_call.json"))
    response = provider.complete(ask(tools=[WEATHER]), signal=signal())
    assert response.finish_reason == "tool_calls"
    assert response.message.tool_calls == (
        ToolCall("call_abc123", "get_current_weather", {"location": "Boston, MA"}),
    )
    assert response.message.text == "" and response.message.usage == Usage(82, 17)
    assert server.requests[0].json()["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather in a city.",
                "parameters": dict(WEATHER.parameters),
            },
        }
    ]


def test_stream_text_with_usage_in_the_last_chunk(
    server: FakeServer, provider: OpenAIProvider
) -> None:
    server.push(fixture_reply("openai_text_stream.sse"))
    events = list(provider.stream(ask(), signal=signal()))
    assert events[:-1] == [
        ModelTextDelta("Hello"),
        ModelTextDelta(" there"),
        ModelTextDelta(", how may I assist you today?"),
    ]
    done = events[-1]
    assert isinstance(done, ModelDone)
    assert done.response.message == Message(
        "assistant", "Hello there, how may I assist you today?", usage=Usage(9, 12)
    )
    assert done.response.finish_reason == "stop"
    body = server.requests[0].json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.requests[0].headers["accept"] == "text/event-stream"


def test_stream_parallel_tool_calls_in_fragments(
    server: FakeServer, provider: OpenAIProvider
) -> None:
    server.push(fixture_reply("openai_parallel_tools_stream.sse"))
    events = list(provider.stream(ask("Weather in Edinburgh and NYC?"), signal=signal()))
    deltas = [e for e in events if isinstance(e, ModelToolCallDelta)]
    assert deltas == [
        ModelToolCallDelta(0, "call_9Dd6Nh3vzBsqXo8Fdr4ZkiGn", "get_weather", ""),
        ModelToolCallDelta(0, None, None, '{"ci'),
        ModelToolCallDelta(0, None, None, 'ty": "Edinb'),
        ModelToolCallDelta(0, None, None, 'urgh", "country": "UK"}'),
        ModelToolCallDelta(1, "call_lQnnsFAwJxZ8tBpv1jWgJN3t", "get_weather", ""),
        ModelToolCallDelta(1, None, None, '{"city"'),
        ModelToolCallDelta(1, None, None, ': "New York City", '),
        ModelToolCallDelta(1, None, None, '"country": "US"}'),
    ]
    response = events[-1].response  # type: ignore[union-attr]
    assert response.finish_reason == "tool_calls"
    assert response.model == "gpt-4o-2024-08-06"
    assert response.message.tool_calls == (
        ToolCall(
            "call_9Dd6Nh3vzBsqXo8Fdr4ZkiGn", "get_weather", {"city": "Edinburgh", "country": "UK"}
        ),
        ToolCall(
            "call_lQnnsFAwJxZ8tBpv1jWgJN3t",
            "get_weather",
            {"city": "New York City", "country": "US"},
        ),
    )
    assert response.message.usage == Usage(81, 55)


def test_stream_and_complete_give_the_same_response(
    server: FakeServer, provider: OpenAIProvider
) -> None:
    """A whole answer and the same answer streamed end as equal ModelResponses."""
    body = fixture_body("openai_tool_call.json")
    call = body["choices"][0]["message"]["tool_calls"][0]
    args = call["function"]["arguments"]
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            dict(
                                call,
                                index=0,
                                function={"name": call["function"]["name"], "arguments": args[:5]},
                            )
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args[5:]}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": body["usage"], "model": body["model"]},
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    server.push(json_reply(body), sse_reply(sse))
    whole = provider.complete(ask(), signal=signal())
    streamed = list(provider.stream(ask(), signal=signal()))[-1].response  # type: ignore[union-attr]
    assert streamed == whole


def test_image_and_file_inputs_and_the_conversation(
    server: FakeServer, provider: OpenAIProvider
) -> None:
    png = b"\x89PNG\r\n\x1a\n-fake-image-bytes"
    pdf = b"%PDF-1.4 fake"
    history = [
        Message(
            "user",
            (
                TextPart("What's in these?"),
                ImagePart(url="https://example.com/cat.jpg", media_type="image/jpeg"),
                ImagePart(data=png, media_type="image/png"),
                FilePart(pdf, "application/pdf", name="report.pdf"),
            ),
        ),
        Message(
            "assistant",
            "Checking.",
            tool_calls=(
                ToolCall("call_1", "get_weather", {"city": "Paris"}),
                ToolCall("call_2", "get_weather", {"city": "Oslo"}),
            ),
        ),
        Message("tool", "18C", tool_call_id="call_1"),
        Message("tool", "no such city", tool_call_id="call_2", is_error=True),
    ]
    server.push(fixture_reply("openai_text.json"))
    provider.complete(
        ModelRequest(
            None,
            history,
            [WEATHER],
            {"max_tokens": 50, "top_p": 0.5, "temperature": None, "user": "u-1"},
        ),
        signal=signal(),
    )
    body = server.requests[0].json()
    assert body["max_tokens"] == 50 and body["top_p"] == 0.5 and body["user"] == "u-1"
    assert "temperature" not in body  # None means "not set"
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What's in these?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
                },
                {
                    "type": "file",
                    "file": {
                        "filename": "report.pdf",
                        "file_data": "data:application/pdf;base64,"
                        + base64.b64encode(pdf).decode(),
                    },
                },
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "no such city"},
    ]


def test_images_outside_user_messages_are_refused_before_sending(
    server: FakeServer, provider: OpenAIProvider
) -> None:
    bad = Message("tool", (ImagePart(url="https://x/y.png"),), tool_call_id="c")
    with pytest.raises(ProviderError, match="only text") as info:
        provider.complete(ModelRequest(None, [bad]), signal=signal())
    assert info.value.error_type == "unsupported_content"
    assert server.requests == []


def test_tool_round_trip(server: FakeServer, provider: OpenAIProvider) -> None:
    server.push(fixture_reply("openai_tool_call.json"), fixture_reply("openai_text.json"))
    first = provider.complete(ask("Weather in Boston?", tools=[WEATHER]), signal=signal())
    call = first.message.tool_calls[0]
    history = [
        Message("user", "Weather in Boston?"),
        first.message,
        Message("tool", "22C and sunny", tool_call_id=call.id),
    ]
    second = provider.complete(ModelRequest("sys", history, [WEATHER]), signal=signal())
    assert second.finish_reason == "stop"
    sent = server.requests[1].json()["messages"]
    assert sent[2]["tool_calls"][0]["function"] == {
        "name": "get_current_weather",
        "arguments": '{"location": "Boston, MA"}',
    }
    assert sent[3] == {"role": "tool", "tool_call_id": "call_abc123", "content": "22C and sunny"}


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [("length", "length"), ("content_filter", "stop"), ("stop", "stop")],
)
def test_finish_reasons(
    server: FakeServer, provider: OpenAIProvider, raw: str, mapped: str
) -> None:
    body = fixture_body("openai_text.json")
    body["choices"][0]["finish_reason"] = raw
    server.push(json_reply(body))
    response = provider.complete(ask(), signal=signal())
    assert response.finish_reason == mapped
    assert response.message.metadata == ({} if raw == mapped else {"finish_reason": raw})


def test_compatible_server_quirks(server: FakeServer, provider: OpenAIProvider) -> None:
    """Tool calls under finish_reason "stop", no [DONE], and a cost in usage (OpenRouter)."""
    chunks = [
        {
            "model": "llama3.2",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_x",
                                "index": 0,
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                            }
                        ],
                    },
                }
            ],
        },
        {
            "model": "llama3.2",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "cost": 0.00042},
        },
    ]
    server.push(sse_reply("".join(f"data: {json.dumps(c)}\n\n" for c in chunks)))
    response = list(provider.stream(ask(), signal=signal()))[-1].response  # type: ignore[union-attr]
    assert response.finish_reason == "tool_calls"
    assert response.message.tool_calls == (ToolCall("call_x", "get_weather", {"city": "Rome"}),)
    assert response.message.usage == Usage(5, 7, 0.00042)


def test_error_object_inside_a_stream(server: FakeServer, provider: OpenAIProvider) -> None:
    server.push(
        sse_reply('data: {"error": {"message": "model crashed", "type": "server_error"}}\n\n')
    )
    server.default = fixture_reply("openai_text_stream.sse")
    events = list(provider.stream(ask(), signal=signal()))  # server_error: retried
    assert isinstance(events[-1], ModelDone)
    assert len(server.requests) == 2


def test_base_url_keeps_a_path_prefix(server: FakeServer) -> None:
    def echo(rec: Recorded) -> Reply:
        return fixture_reply("openai_text.json")

    server.push(echo)
    with OpenAIProvider("m", api_key="unused", base_url=server.url + "/openai/v1") as p:
        assert p.complete(ask(), signal=signal()).message.text
        assert server.requests[0].headers["authorization"] == "Bearer unused"
        assert repr(p) == f"OpenAIProvider(model='m', base_url='{server.url}/openai/v1')"
    assert server.requests[0].path == "/openai/v1/chat/completions"


def test_fixtures_cite_their_source() -> None:
    for path in sorted(Path(FIXTURES).glob("openai_*")):
        text = path.read_text()
        assert ("source: " in text) if path.suffix == ".sse" else json.loads(text)["source"]


def _no_key_on_disk(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_session_turn_with_parallel_tool_calls(server: FakeServer, tmp_path: Path) -> None:
    """A whole session turn through OpenAIProvider with two parallel tool calls; the final
    answer echoes the key, which is in no stored transcript or checkpoint."""
    sqlite = pytest.importorskip("lousho_sync.sqlite")
    from lousho_sync import create_agent, tool

    ran: list[str] = []

    @tool
    def get_weather(city: str, country: str) -> str:
        """Get the weather in a city."""
        _no_key_on_disk(tmp_path)
        ran.append(city)
        return f"{city}: 12C"

    answer = (FIXTURES / "openai_text_stream.sse").read_text().replace("Hello", f"Hello {KEY}")
    echo = fixture_body("openai_text.json")
    echo["choices"][0]["message"]["content"] = f"Hello {KEY}"
    tools_json = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_9Dd6Nh3vzBsqXo8Fdr4ZkiGn",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "Edinburgh", "country": "UK"}',
                            },
                        },
                        {
                            "id": "call_lQnnsFAwJxZ8tBpv1jWgJN3t",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "New York City", "country": "US"}',
                            },
                        },
                    ],
                },
            }
        ],
    }

    def first(rec: Recorded) -> Reply:
        if rec.json().get("stream"):
            return fixture_reply("openai_parallel_tools_stream.sse")
        return json_reply(tools_json)

    def second(rec: Recorded) -> Reply:
        return sse_reply(answer) if rec.json().get("stream") else json_reply(echo)

    server.push(first, second)
    store = sqlite.SqliteStore(tmp_path / "lousho.sqlite")
    with OpenAIProvider("gpt-4o", api_key=KEY, base_url=server.url + "/v1") as provider, store:
        agent = create_agent(provider=provider, tools=[get_weather], store=store)
        result = agent.session(id="s1").send("Weather in Edinburgh and New York?")
        stored = store.sessions.load("s1")
    assert sorted(ran) == ["Edinburgh", "New York City"]
    assert result.text.startswith("Hello ***")
    assert stored is not None
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    sent = server.requests[1].json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert {m["tool_call_id"]: m["content"] for m in sent[2:]} == {
        "call_9Dd6Nh3vzBsqXo8Fdr4ZkiGn": "Edinburgh: 12C",
        "call_lQnnsFAwJxZ8tBpv1jWgJN3t": "New York City: 12C",
    }
    _no_key_on_disk(tmp_path)
    assert KEY not in repr(stored) and KEY not in repr(result)
