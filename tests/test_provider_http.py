"""Shared HTTP machinery of the real providers, exercised through both wire APIs.

Real HTTP servers on 127.0.0.1 (tests/_http_server.py) serve payloads from
tests/provider_fixtures/ (each file names its published source).
"""

from __future__ import annotations

import email.utils
import json
import logging
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _http_server import (
    FIXTURES,
    FakeServer,
    Recorded,
    Reply,
    fixture_reply,
    sse_reply,
)
from conftest import free_port

from lousho_sync.errors import AbortedError, ConfigError, ProviderError, RateLimitedError
from lousho_sync.messages import Message
from lousho_sync.providers._http import (
    ResponseBuilder,
    Secret,
    SseEvent,
    iter_sse,
    retry_after_s,
    safe_url,
)
from lousho_sync.providers.anthropic import AnthropicProvider
from lousho_sync.providers.base import (
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelTextDelta,
)
from lousho_sync.providers.openai import OpenAIProvider
from lousho_sync.providers.registry import register_provider, resolve_model
from lousho_sync.providers.scripted import ScriptedProvider
from lousho_sync.signal import AbortController, Signal

KEY = "sk-test-SECRET-0123456789abcdefXYZ"
WAIT = 10.0  # every wait in these tests is bounded by this


@dataclass(frozen=True)
class Api:
    name: str
    cls: type[Any]
    key_env: str
    base_env: str
    path: str
    text_json: str
    text_sse: str
    text: str
    stream_text: str
    deltas_before_first_text: int  # stream events before the first text delta
    errors: dict[int, str]

    def make(self, server: FakeServer, **kw: Any) -> Any:
        base = server.url + ("/v1" if self.name == "openai" else "")
        options: dict[str, Any] = {"api_key": KEY, "base_url": base, "backoff_s": 0.001}
        options.update(kw)
        return self.cls("test-model", **options)

    def sse_events(self) -> list[str]:
        """The fixture stream's events (comment block dropped), without separators."""
        text = (FIXTURES / self.text_sse).read_text()
        blocks = [b for b in text.split("\n\n") if b.strip()]
        return [b for b in blocks if not all(line.startswith(":") for line in b.splitlines())]


OPENAI = Api(
    "openai",
    OpenAIProvider,
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "/v1/chat/completions",
    "openai_text.json",
    "openai_text_stream.sse",
    "\n\nHello there, how may I assist you today?",
    "Hello there, how may I assist you today?",
    1,
    {
        400: "openai_error_400.json",
        401: "openai_error_401.json",
        429: "openai_error_429.json",
        500: "openai_error_500.json",
    },
)
ANTHROPIC = Api(
    "anthropic",
    AnthropicProvider,
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "/v1/messages",
    "anthropic_text.json",
    "anthropic_text_stream.sse",
    "Hi! My name is Claude.",
    "Hello there!",
    3,
    {
        400: "anthropic_error_400.json",
        401: "anthropic_error_401.json",
        429: "anthropic_error_429.json",
        500: "anthropic_error_500.json",
    },
)


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda a: a.name)
def api(request: pytest.FixtureRequest) -> Api:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def providers() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for p in made:
        p.close()


def make(api: Api, server: FakeServer, providers: list[Any], **kw: Any) -> Any:
    provider = api.make(server, **kw)
    providers.append(provider)
    return provider


def request(text: str = "Hello") -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[Message("user", text)])


def signal() -> Signal:
    return AbortController().signal


def collect(events: Iterator[ModelEvent], into: list[ModelEvent]) -> None:
    for event in events:
        into.append(event)


def run_in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


# --- SSE reader -------------------------------------------------------------------


def test_sse_fields_comments_multiline_data_and_done() -> None:
    stream = (
        b": keep-alive comment\n"
        b"event: message_start\n"
        b"id: 7\n"
        b'data: {"a":\n'
        b"data:1}\n"
        b"\n"
        b"data: [DONE]\n\n"
    )
    assert list(iter_sse([stream])) == [
        SseEvent("message_start", '{"a":\n1}', "7"),
        SseEvent("message", "[DONE]", "7"),
    ]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_sse_any_line_ending_split_byte_by_byte(eol: bytes) -> None:
    stream = b"\xef\xbb\xbfevent: x" + eol + b"data: caf\xc3\xa9" + eol + eol
    stream += b"data: 2" + eol + eol
    chunks = [stream[i : i + 1] for i in range(len(stream))]
    assert list(iter_sse(chunks)) == [SseEvent("x", "café"), SseEvent("message", "2")]


def test_sse_last_event_without_blank_line_is_kept_but_a_cut_line_is_dropped() -> None:
    assert list(iter_sse([b"data: whole\n"])) == [SseEvent("message", "whole")]
    assert list(iter_sse([b'data: whole\n\ndata: {"cut'])) == [SseEvent("message", "whole")]


def test_sse_event_without_data_is_not_dispatched() -> None:
    assert list(iter_sse([b"event: ping\n\n: c\n\n"])) == []


# --- small helpers ---------------------------------------------------------------


def test_retry_after_seconds_date_and_ms() -> None:
    assert retry_after_s({"Retry-After": "3"}) == 3.0
    assert retry_after_s({"retry-after": "1.5"}) == 1.5
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert retry_after_s({"Retry-After": past}) == 0.0
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 20.0 < (retry_after_s({"Retry-After": future}) or 0.0) <= 30.0
    assert retry_after_s({"Retry-After": "soon"}) is None
    assert retry_after_s({}) is None


def test_secret_redacts_and_hides_itself() -> None:
    secret = Secret(KEY)
    assert KEY not in repr(secret) and KEY not in str(secret)
    assert secret.redact(f"bad key {KEY}!") == "bad key ***!"
    assert Secret("unused").redact("unused text") == "unused text"  # placeholders stay


def test_safe_url_hides_a_password() -> None:
    assert safe_url("http://u:pw@h:8/v1") == "http://u:***@h:8/v1"
    assert safe_url("https://api.openai.com/v1") == "https://api.openai.com/v1"


def test_builder_rejects_invalid_tool_arguments() -> None:
    builder = ResponseBuilder("openai", Secret(KEY))
    builder.tool_call(0, "call_1", "get_weather", '{"city": ')
    builder.finish_reason = "length"
    with pytest.raises(ProviderError, match=r"invalid JSON arguments.*max_tokens") as info:
        builder.build({"length": "length"})
    assert info.value.error_type == "invalid_tool_arguments"


# --- registry ----------------------------------------------------------------------


def test_resolve_builtin_model_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    openai = resolve_model("openai/meta-llama/Llama-3.1-8B")
    assert isinstance(openai, OpenAIProvider)
    assert openai.model == "meta-llama/Llama-3.1-8B"
    anthropic = resolve_model("anthropic/claude-sonnet-4-5")
    assert isinstance(anthropic, AnthropicProvider)
    assert anthropic.model == "claude-sonnet-4-5"


@pytest.mark.parametrize("model", ["gpt-4o", "nope/x", "openai/", ""])
def test_resolve_rejects_bad_strings_naming_known_prefixes(model: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_model(model)
    assert repr(model) in str(info.value)
    assert "anthropic, openai" in str(info.value)


def test_resolve_without_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        resolve_model("openai/gpt-4o")


def test_register_provider() -> None:
    register_provider("scriptedtest", lambda model: ScriptedProvider(["hi"], model=model))
    provider = resolve_model("scriptedtest/m1")
    assert isinstance(provider, ScriptedProvider) and provider.model == "m1"
    with pytest.raises(ConfigError):
        register_provider("a/b", lambda model: ScriptedProvider())


# --- configuration ------------------------------------------------------------------


def test_missing_key_is_a_config_error(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(api.key_env, raising=False)
    with pytest.raises(ConfigError, match=api.key_env):
        api.cls("m")


def test_key_and_base_url_from_environment(
    api: Api, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(api.key_env, KEY)
    monkeypatch.setenv(api.base_env, server.url + ("/v1" if api.name == "openai" else ""))
    server.push(fixture_reply(api.text_json))
    with api.cls("m") as provider:
        assert provider.complete(request(), signal=signal()).message.text == api.text
    assert server.requests[0].path == api.path


@pytest.mark.parametrize("bad", [{"timeout": 0}, {"max_retries": -1}, {"backoff_s": -1}])
def test_bad_keywords_are_config_errors(api: Api, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        api.cls("m", api_key=KEY, **bad)


# --- retries ------------------------------------------------------------------------


def test_429_with_retry_after_then_success(
    api: Api, server: FakeServer, providers: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    server.push(fixture_reply(api.errors[429]), fixture_reply(api.text_json))
    provider = make(api, server, providers, backoff_s=60.0)  # Retry-After: 0 wins
    with caplog.at_level(logging.WARNING):
        response = provider.complete(request(), signal=signal())
    assert response.message.text == api.text
    assert len(server.requests) == 2
    assert any("(Retry-After)" in r.getMessage() for r in caplog.records)


def test_429_every_time_is_rate_limited(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.default = fixture_reply(api.errors[429])
    provider = make(api, server, providers, max_retries=2)
    with pytest.raises(RateLimitedError) as info:
        provider.complete(request(), signal=signal())
    err = info.value
    assert (err.status, err.retryable, err.provider) == (429, True, api.name)
    assert err.error_type in ("requests", "rate_limit_error")
    assert "gave up after 3 attempts" in str(err)
    assert len(server.requests) == 3


def test_500_twice_then_success(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.push(fixture_reply(api.errors[500]), fixture_reply(api.errors[500]))
    server.push(fixture_reply(api.text_sse))
    provider = make(api, server, providers, max_retries=2)
    events = list(provider.stream(request(), signal=signal()))
    assert isinstance(events[-1], ModelDone)
    assert events[-1].response.message.text == api.stream_text
    assert len(server.requests) == 3


def test_400_is_not_retried_and_carries_the_providers_message(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.default = fixture_reply(api.errors[400])
    provider = make(api, server, providers)
    with pytest.raises(ProviderError) as info:
        provider.complete(request(), signal=signal())
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (400, "invalid_request_error", False)
    assert "HTTP 400" in str(err) and ("temperature" in str(err) or "max_tokens" in str(err))
    assert len(server.requests) == 1


def test_connection_refused_is_retryable_provider_error(api: Api, providers: list[Any]) -> None:
    with FakeServer() as gone:
        url = gone.url
    provider = api.cls("m", api_key=KEY, base_url=url, max_retries=1, backoff_s=0.001)
    providers.append(provider)
    with pytest.raises(ProviderError) as info:
        provider.complete(request(), signal=signal())
    assert info.value.retryable and "could not reach" in str(info.value)


# --- broken streams -----------------------------------------------------------------


def test_stream_cut_midway_is_an_error_after_the_deltas(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    events = api.sse_events()[: api.deltas_before_first_text + 1]
    server.push(sse_reply("\n\n".join(events) + "\n\n", cut=True))
    server.default = fixture_reply(api.text_sse)
    provider = make(api, server, providers)
    got: list[ModelEvent] = []
    with pytest.raises(ProviderError) as info:
        collect(provider.stream(request(), signal=signal()), got)
    assert info.value.retryable
    assert [type(e) for e in got] == [ModelTextDelta]  # the delta arrived, no ModelDone
    assert len(server.requests) == 1  # no retry once a delta was delivered


def test_stream_cut_before_any_delta_is_retried(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    events = api.sse_events()[: api.deltas_before_first_text]
    server.push(sse_reply("\n\n".join(events) + "\n\n", cut=True))
    server.push(fixture_reply(api.text_sse))
    provider = make(api, server, providers)
    events_out = list(provider.stream(request(), signal=signal()))
    assert events_out[-1].response.message.text == api.stream_text
    assert len(server.requests) == 2


def test_stream_ending_without_terminal_event_is_an_error(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    # a clean end of body after two text deltas, but no finish, [DONE] or message_stop
    events = api.sse_events()[: api.deltas_before_first_text + 2]
    server.default = sse_reply("\n\n".join(events) + "\n\n")
    provider = make(api, server, providers, max_retries=0)
    with pytest.raises(ProviderError, match="stream ended before") as info:
        list(provider.stream(request(), signal=signal()))
    assert info.value.error_type == "truncated_stream"


def test_invalid_json_in_a_chunk(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.default = sse_reply('data: {"choices": [{"index": 0, "delta": \n\n')
    provider = make(api, server, providers)
    with pytest.raises(ProviderError, match="invalid JSON") as info:
        list(provider.stream(request(), signal=signal()))
    assert info.value.error_type == "invalid_response" and not info.value.retryable
    assert len(server.requests) == 1


def test_stream_split_into_tiny_pieces(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.push(fixture_reply(api.text_sse, split="bytes"))
    provider = make(api, server, providers)
    events = list(provider.stream(request(), signal=signal()))
    assert "".join(e.text for e in events if isinstance(e, ModelTextDelta)) == api.stream_text


def test_stream_delimited_by_connection_close(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.push(fixture_reply(api.text_sse, chunked=False))
    provider = make(api, server, providers)
    events = list(provider.stream(request(), signal=signal()))
    assert events[-1].response.message.text == api.stream_text


def test_stream_answered_with_plain_json(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.push(fixture_reply(api.text_json))
    provider = make(api, server, providers)
    events = list(provider.stream(request(), signal=signal()))
    assert [type(e) for e in events] == [ModelTextDelta, ModelDone]
    assert events[-1].response.message.text == api.text


# --- timeouts and abort -------------------------------------------------------------


def test_server_that_never_answers_times_out(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.default = Reply(hang=True)
    provider = make(api, server, providers, timeout=0.2, max_retries=0)
    with pytest.raises(ProviderError, match="read timeout") as info:
        provider.complete(request(), signal=signal())
    assert info.value.retryable and info.value.error_type == "timeout"
    assert server.client_gone.wait(WAIT)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_abort_during_a_stream_closes_the_connection(
    api: Api, server: FakeServer, providers: list[Any], chunked: bool
) -> None:
    # close-delimited: Connection: close and no length, as HTTP/1.0 and some local
    # OpenAI-compatible servers answer (the read must be cut there too, not time out)
    events = api.sse_events()[: api.deltas_before_first_text + 1]
    server.push(sse_reply("\n\n".join(events) + "\n\n", hold=True, chunked=chunked))
    provider = make(api, server, providers, timeout=30.0)
    controller = AbortController()
    first = threading.Event()
    got: list[ModelEvent] = []

    def consume() -> None:
        for event in provider.stream(request(), signal=controller.signal):
            got.append(event)
            first.set()  # then block in the next read

    thread, out = run_in_thread(consume)
    assert first.wait(WAIT)
    controller.abort("user pressed stop")
    thread.join(WAIT)
    assert not thread.is_alive()
    assert isinstance(out.get("error"), AbortedError)
    assert out["error"].reason == "user pressed stop"
    assert server.client_gone.wait(WAIT)  # the server saw the connection closed
    assert len(server.requests) == 1


def test_abort_while_waiting_for_the_response(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.default = Reply(hang=True)
    provider = make(api, server, providers, timeout=30.0)
    controller = AbortController()
    thread, out = run_in_thread(lambda: provider.complete(request(), signal=controller.signal))
    assert server.received.wait(WAIT)
    controller.abort()
    thread.join(WAIT)
    assert not thread.is_alive() and isinstance(out.get("error"), AbortedError)
    assert server.client_gone.wait(WAIT)


def test_abort_during_backoff(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.default = fixture_reply(api.errors[500])
    provider = make(api, server, providers, backoff_s=30.0, max_retries=5)
    controller = AbortController()
    thread, out = run_in_thread(lambda: provider.complete(request(), signal=controller.signal))
    assert server.answered.wait(WAIT)
    controller.abort()
    thread.join(WAIT)
    assert not thread.is_alive() and isinstance(out.get("error"), AbortedError)
    assert len(server.requests) == 1


def test_aborted_signal_sends_nothing(api: Api, server: FakeServer, providers: list[Any]) -> None:
    controller = AbortController()
    controller.abort()
    provider = make(api, server, providers)
    with pytest.raises(AbortedError):
        provider.complete(request(), signal=controller.signal)
    with pytest.raises(AbortedError):
        list(provider.stream(request(), signal=controller.signal))
    assert server.requests == []


# --- pooling and threads ------------------------------------------------------------


def test_connections_are_pooled(api: Api, server: FakeServer, providers: list[Any]) -> None:
    server.push(fixture_reply(api.text_json), fixture_reply(api.text_sse))
    server.push(fixture_reply(api.text_json), fixture_reply(api.text_sse))
    provider = make(api, server, providers)
    for _ in range(2):
        provider.complete(request(), signal=signal())
        list(provider.stream(request(), signal=signal()))
    assert len({r.client_port for r in server.requests}) == 1


def test_concurrent_calls_from_many_threads(
    api: Api, server: FakeServer, providers: list[Any]
) -> None:
    server.default = fixture_reply(api.text_sse)
    provider = make(api, server, providers)
    barrier = threading.Barrier(6, timeout=WAIT)

    def call() -> str:
        barrier.wait()
        events = list(provider.stream(request(), signal=signal()))
        return str(events[-1].response.message.text)

    runs = [run_in_thread(call) for _ in range(6)]
    for thread, _ in runs:
        thread.join(WAIT)
    assert [out.get("value") for _, out in runs] == [api.stream_text] * 6


# --- the API key never leaks --------------------------------------------------------


def _assert_no_key(*things: object) -> None:
    for thing in things:
        assert KEY not in str(thing)
        assert KEY not in repr(thing)


def test_key_echoed_in_an_error_body_never_leaks(
    api: Api, server: FakeServer, providers: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    echo = fixture_reply(api.errors[401], replace={"{API_KEY}": KEY})
    assert KEY.encode() in echo.body  # the server really echoes it
    server.default = echo
    provider = make(api, server, providers)
    caplog.set_level(logging.DEBUG)
    for call in (
        lambda: provider.complete(request(), signal=signal()),
        lambda: list(provider.stream(request(), signal=signal())),
    ):
        with pytest.raises(ProviderError) as info:
            call()
        err = info.value
        assert err.status == 401 and "***" in str(err) and api.key_env in str(err)
        _assert_no_key(err, err.args, "".join(traceback.format_exception(err)))
    _assert_no_key(provider, vars(provider))
    for record in caplog.records:
        _assert_no_key(record.getMessage(), record.args, record.exc_text)
    assert server.requests[0].headers.get("authorization", "").endswith(KEY) or (
        server.requests[0].headers.get("x-api-key") == KEY
    )


def test_key_echoed_in_an_answer_is_redacted(
    api: Api, server: FakeServer, providers: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    sse = (FIXTURES / api.text_sse).read_text().replace("Hello", f"Hello {KEY}")
    server.push(sse_reply(sse), sse_reply(sse, split="bytes"))
    provider = make(api, server, providers)
    caplog.set_level(logging.DEBUG)
    for _ in range(2):
        events = list(provider.stream(request(), signal=signal()))
        _assert_no_key(events, events[-1].response.message.text)
    for record in caplog.records:
        _assert_no_key(record.getMessage(), record.args)


def _reachable(root: object, limit: int = 5000) -> list[object]:
    """Every object reachable from ``root`` through exception links, args, attributes,
    slots, mappings and sequences (what a logger, a debugger or Sentry may show)."""
    seen: set[int] = set()
    out: list[object] = []
    todo = [root]
    while todo and len(out) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (int, float, bool, type(None), type)):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, (str, bytes)):
            continue
        if isinstance(obj, BaseException):
            todo += [obj.__cause__, obj.__context__, *obj.args]
        if isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif hasattr(obj, "items") and callable(obj.items):
            try:
                todo += [v for kv in obj.items() for v in kv]
            except Exception:
                pass
        if hasattr(obj, "__dict__") and not callable(obj):
            todo += list(vars(obj).values())
        for name in getattr(type(obj), "__slots__", ()):
            todo.append(getattr(obj, name, None))
    return out


def _assert_key_unreachable(err: BaseException) -> None:
    for obj in _reachable(err):
        if isinstance(obj, bytes):
            assert KEY.encode() not in obj, f"key in bytes reachable from {err!r}"
        elif isinstance(obj, str):
            assert KEY not in obj, f"key in a str reachable from {err!r}: {obj[:80]!r}"


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_non_json_body_echoing_the_key_leaves_it_nowhere_in_the_error(
    api: Api, server: FakeServer, providers: list[Any], stream: bool
) -> None:
    # a 200 answer that is not JSON and echoes the request's headers (a broken proxy)
    def echo(rec: Recorded) -> Reply:
        body = ("not json " + json.dumps(rec.headers)).encode()
        return Reply(200, {"Content-Type": "application/json"}, body)

    server.default = echo
    provider = make(api, server, providers, max_retries=0)
    with pytest.raises(ProviderError) as info:
        if stream:
            list(provider.stream(request(), signal=signal()))
        else:
            provider.complete(request(), signal=signal())
    assert "invalid JSON" in str(info.value)
    assert info.value.__cause__ is not None  # still chained, for debugging
    _assert_key_unreachable(info.value)


def test_a_refused_connection_leaves_the_key_nowhere_in_the_error(
    api: Api, providers: list[Any]
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}" + ("/v1" if api.name == "openai" else "")
    provider = api.cls("test-model", api_key=KEY, base_url=base, max_retries=0)
    providers.append(provider)
    with pytest.raises(ProviderError) as info:
        provider.complete(request(), signal=signal())
    assert info.value.retryable
    _assert_key_unreachable(info.value)


def test_requests_and_asyncio_are_imported_when_first_needed() -> None:
    """``import lousho_sync`` (and the CLI's module) does not import requests or asyncio: a
    process that never calls a model over HTTP or runs an async tool (a CLI command on a
    store, a worker on a scripted model) starts without them; making a provider imports
    requests."""
    code = (
        "import sys, lousho_sync, lousho_sync.cli\n"
        "print(sorted(m for m in ('requests', 'urllib3', 'asyncio', 'ssl') if m in sys.modules))\n"
        "lousho_sync.OpenAIProvider('gpt-4o-mini', api_key='sk-test-123456789')\n"
        "print('requests' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
