"""Anthropic Messages API (``POST {base_url}/v1/messages``).

Wire format: the Anthropic API reference (Messages: create; streaming messages; errors)
and the request/response shapes of the official SDK. Streaming events: ``message_start``,
``content_block_start``/``_delta``/``_stop`` (``text_delta``, ``input_json_delta``),
``message_delta`` (stop reason, usage), ``message_stop``, ``ping`` and ``error``.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ProviderError
from ..messages import FilePart, ImagePart, Message, Part, TextPart
from ._builder import ResponseBuilder
from ._wire import HttpProvider
from .base import ModelDone, ModelEvent, ModelRequest

if TYPE_CHECKING:  # requests is imported when a provider is made (see _wire)
    from ._http import Body

__all__ = ["AnthropicProvider"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_NAME = "anthropic"
_PLAIN = frozenset(("end_turn", "max_tokens", "tool_use"))
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}
_RETRYABLE_TYPES = frozenset(("overloaded_error", "api_error", "rate_limit_error"))
_USAGE_INPUT = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class AnthropicProvider(HttpProvider):
    """A Claude model behind the Anthropic Messages API.

    ``api_key`` defaults to ``ANTHROPIC_API_KEY``; ``base_url`` is the host (default
    ``ANTHROPIC_BASE_URL``, then ``https://api.anthropic.com``), the provider adds
    ``/v1/messages``. ``max_tokens`` (required by the API) comes from the request
    settings, else 4096. Input tokens in ``Usage`` include cache reads and writes.
    Same keywords and thread safety as :class:`~lousho_sync.OpenAIProvider`.
    """

    NAME = _NAME
    HEADERS = {"anthropic-version": API_VERSION}

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
    ) -> None:
        base = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        super().__init__(
            model,
            api_key=api_key,
            key_env="ANTHROPIC_API_KEY",
            auth_header="x-api-key",
            base_url=base.removesuffix("/v1"),  # tolerate a base URL given with /v1
            path="/v1/messages",
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )

    # --- request --------------------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {k: v for k, v in request.settings.items() if v is not None}
        body["model"] = self.model
        body["max_tokens"] = body.get("max_tokens") or DEFAULT_MAX_TOKENS
        body["messages"] = _messages(request.messages)
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                for t in request.tools
            ]
        if stream:
            body["stream"] = True
        else:
            body.pop("stream", None)
        return body

    # --- response -------------------------------------------------------------------

    def _whole(self, body: Body) -> Iterator[ModelEvent]:
        builder = ResponseBuilder(_NAME, self._secret)
        data = _check(body.json(), builder)
        builder.model = data.get("model") if isinstance(data.get("model"), str) else None
        _apply_usage(data.get("usage"), builder, {})
        events: list[Any] = []
        n_calls = 0
        for block in data.get("content") or ():
            block = _obj(block)
            if block.get("type") == "text":
                events.append(builder.text(block.get("text")))
            elif block.get("type") == "tool_use":
                args = json.dumps(block.get("input") or {})
                events.append(builder.tool_call(n_calls, block.get("id"), block.get("name"), args))
                n_calls += 1
        builder.finish_reason = data.get("stop_reason")
        response = builder.build(_FINISH, _PLAIN)
        yield from (e for e in events if e is not None)
        yield ModelDone(response)

    def _streamed(self, body: Body) -> Iterator[ModelEvent]:
        if body.is_json:
            yield from self._whole(body)
            return
        builder = ResponseBuilder(_NAME, self._secret)
        usage: dict[str, int] = {}
        tools: dict[int, int] = {}  # content block index -> tool call index
        for event in body.sse():
            data = _check(body.parse(event.data), builder)
            kind = data.get("type") or event.event
            if kind == "message_start":
                message = _obj(data.get("message"))
                if isinstance(message.get("model"), str):
                    builder.model = message["model"]
                _apply_usage(message.get("usage"), builder, usage)
            elif kind == "content_block_start":
                delta = _block_start(data, builder, tools)
                if delta is not None:
                    yield delta
            elif kind == "content_block_delta":
                delta = _block_delta(data, builder, tools)
                if delta is not None:
                    yield delta
            elif kind == "message_delta":
                stop = _obj(data.get("delta")).get("stop_reason")
                if stop:
                    builder.finish_reason = stop
                _apply_usage(data.get("usage"), builder, usage)
            elif kind == "message_stop":
                body.drain()
                yield ModelDone(builder.build(_FINISH, _PLAIN))
                return
            # ping, content_block_stop and unknown events carry nothing for us
        raise ProviderError(
            f"{_NAME}: the stream ended before message_stop (truncated answer)",
            error_type="truncated_stream",
            retryable=True,
            provider=_NAME,
        )


def _block_start(data: dict[str, Any], builder: ResponseBuilder, tools: dict[int, int]) -> Any:
    block = _obj(data.get("content_block"))
    if block.get("type") == "text":
        return builder.text(block.get("text"))
    if block.get("type") == "tool_use":
        index = len(tools)
        tools[_index(data)] = index
        initial = block.get("input")
        args = json.dumps(initial) if initial else ""
        return builder.tool_call(index, block.get("id"), block.get("name"), args)
    return None  # thinking, server tools...: not part of a lousho message


def _block_delta(data: dict[str, Any], builder: ResponseBuilder, tools: dict[int, int]) -> Any:
    delta = _obj(data.get("delta"))
    if delta.get("type") == "text_delta":
        return builder.text(delta.get("text"))
    if delta.get("type") == "input_json_delta":
        block = _index(data)
        if block not in tools:
            raise ProviderError(
                f"{_NAME}: input_json_delta for content block {block}, which is not a tool_use",
                error_type="invalid_response",
                provider=_NAME,
            )
        return builder.tool_call(tools[block], None, None, delta.get("partial_json"))
    return None


def _index(data: dict[str, Any]) -> int:
    index = data.get("index")
    return index if isinstance(index, int) else -1


def _apply_usage(value: object, builder: ResponseBuilder, seen: dict[str, int]) -> None:
    """Usage fields are cumulative: later values replace earlier ones."""
    usage = _obj(value)
    for key in (*_USAGE_INPUT, "output_tokens"):
        if isinstance(usage.get(key), int):
            seen[key] = usage[key]
    builder.input_tokens = sum(seen.get(k, 0) for k in _USAGE_INPUT)
    builder.output_tokens = seen.get("output_tokens", 0)
    builder.cache_read_tokens = seen.get("cache_read_input_tokens", 0)
    builder.cache_write_tokens = seen.get("cache_creation_input_tokens", 0)


def _check(data: object, builder: ResponseBuilder) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProviderError(
            f"{_NAME}: expected a JSON object, got {type(data).__name__}",
            error_type="invalid_response",
            provider=_NAME,
        )
    if data.get("type") == "error":
        err = _obj(data.get("error"))
        etype = err.get("type")
        raise ProviderError(
            builder.redact(f"{_NAME} reported an error ({etype}): {err.get('message')}"),
            error_type=str(etype) if etype else None,
            retryable=etype in _RETRYABLE_TYPES,
            provider=_NAME,
        )
    return data


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --- lousho messages -> Messages API -------------------------------------------------


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Convert the transcript; consecutive tool results join one user message."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
            content = _blocks(m.content, m.role) if not isinstance(m.content, str) else m.content
            if content:
                block["content"] = content
            if m.is_error:
                block["is_error"] = True
            last = out[-1] if out else None
            if last is not None and last.get("_tool_results"):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block], "_tool_results": True})
        elif m.role == "user":
            content = m.content if isinstance(m.content, str) else _blocks(m.content, m.role)
            out.append({"role": "user", "content": content})
        else:
            out.append({"role": "assistant", "content": _assistant(m)})
    for entry in out:
        entry.pop("_tool_results", None)
    return out


def _assistant(m: Message) -> str | list[dict[str, Any]]:
    if not m.tool_calls and isinstance(m.content, str):
        return m.content
    blocks = (
        _blocks((TextPart(m.content),), m.role)
        if isinstance(m.content, str)
        else (_blocks(m.content, m.role))
    )
    blocks = [b for b in blocks if not (b["type"] == "text" and not b["text"])]
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.arguments)}
        for c in m.tool_calls
    )
    return blocks


def _blocks(parts: Sequence[Part], role: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            source = (
                {"type": "url", "url": part.url}
                if part.url is not None
                else {"type": "base64", "media_type": part.media_type, "data": _b64(part.data)}
            )
            out.append({"type": "image", "source": source})
        elif isinstance(part, FilePart):
            out.append({"type": "document", "source": _document_source(part)})
        else:  # pragma: no cover - Message validates parts
            raise _unsupported(type(part).__name__, role)
    return out


def _document_source(part: FilePart) -> dict[str, Any]:
    if part.media_type == "application/pdf":
        return {"type": "base64", "media_type": "application/pdf", "data": _b64(part.data)}
    if part.media_type == "text/plain":
        text = part.data.decode("utf-8", errors="replace")
        return {"type": "text", "media_type": "text/plain", "data": text}
    raise ProviderError(
        f"{_NAME}: the Messages API accepts files as application/pdf or text/plain "
        f"documents, not {part.media_type!r} (file {part.name or '<unnamed>'})",
        error_type="unsupported_content",
        provider=_NAME,
    )


def _unsupported(part: str, role: str) -> ProviderError:
    return ProviderError(
        f"{_NAME}: cannot send a {part} in a {role!r} message",
        error_type="unsupported_content",
        provider=_NAME,
    )


def _b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode("ascii")
