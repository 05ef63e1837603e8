"""OpenAI Chat Completions (``POST {base_url}/chat/completions``) and compatible servers.

Wire format: the OpenAI API reference (Chat Completions: create, the chat completion
object, the chunk object, ``stream_options.include_usage``). Any server that speaks it —
Ollama, vLLM, LM Studio, OpenRouter — works through ``base_url``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ProviderError
from ..messages import FilePart, ImagePart, Message, TextPart
from ._builder import ResponseBuilder
from ._wire import HttpProvider
from .base import ModelDone, ModelEvent, ModelRequest

if TYPE_CHECKING:  # requests is imported when a provider is made (see _wire)
    from ._http import Body

__all__ = ["OpenAIProvider"]

_log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NAME = "openai"
_PLAIN = frozenset(("stop", "length", "tool_calls"))
_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "stop",
}


class OpenAIProvider(HttpProvider):
    """A model behind the OpenAI Chat Completions API (or any compatible server).

    ``api_key`` defaults to ``OPENAI_API_KEY``; ``base_url`` (including ``/v1``) to
    ``OPENAI_BASE_URL``, then ``https://api.openai.com/v1``. ``timeout`` is the read
    timeout (the longest wait for the next bytes), ``connect_timeout`` the connect one;
    failed calls are retried ``max_retries`` times with exponential backoff from
    ``backoff_s`` seconds. Thread-safe (a ``requests.Session`` per thread); ``close()``
    releases pooled connections.
    """

    NAME = _NAME

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
        base = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        super().__init__(
            model,
            api_key=api_key,
            key_env="OPENAI_API_KEY",
            key_hint=" (a local server that needs no key accepts any placeholder, e.g. 'unused')",
            auth_header="Authorization",
            auth_prefix="Bearer ",
            base_url=base.rstrip("/"),
            path="/chat/completions",
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )

    # --- request --------------------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(_message(m) for m in request.messages)
        body: dict[str, Any] = {k: v for k, v in request.settings.items() if v is not None}
        body["model"] = self.model
        body["messages"] = messages
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": dict(t.parameters),
                    },
                }
                for t in request.tools
            ]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        else:
            body.pop("stream", None)
            body.pop("stream_options", None)
        return body

    # --- response -------------------------------------------------------------------

    def _builder(self) -> ResponseBuilder:
        return ResponseBuilder(_NAME, self._secret)

    def _whole(self, body: Body) -> Iterator[ModelEvent]:
        builder = self._builder()
        data = body.json()
        events = [e for e in _apply_completion(data, builder) if e is not None]
        response = builder.build(_FINISH, _PLAIN)
        yield from events
        yield ModelDone(response)

    def _streamed(self, body: Body) -> Iterator[ModelEvent]:
        if body.is_json:  # a server that ignored "stream": the same parsing as complete()
            yield from self._whole(body)
            return
        builder = self._builder()
        for event in body.sse():
            if event.data.strip() == "[DONE]":
                body.drain()
                yield ModelDone(builder.build(_FINISH, _PLAIN))
                return
            for delta in _apply_chunk(body.parse(event.data), builder):
                if delta is not None:
                    yield delta
        if builder.finish_reason is not None:
            _log.debug("%s: stream ended after finish_reason without [DONE]", _NAME)
            yield ModelDone(builder.build(_FINISH, _PLAIN))
            return
        raise ProviderError(
            f"{_NAME}: the stream ended before [DONE] (truncated answer)",
            error_type="truncated_stream",
            retryable=True,
            provider=_NAME,
        )


def _message(m: Message) -> dict[str, Any]:
    if m.role == "user":
        return {"role": "user", "content": _content(m)}
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": _text_only(m)}
    out: dict[str, Any] = {"role": "assistant", "content": _text_only(m) or None}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
            }
            for c in m.tool_calls
        ]
    return out


def _content(m: Message) -> str | list[dict[str, Any]]:
    if isinstance(m.content, str):
        return m.content
    parts: list[dict[str, Any]] = []
    for part in m.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            url = part.url if part.url is not None else _data_url(part.media_type, part.data)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif isinstance(part, FilePart):
            parts.append(
                {
                    "type": "file",
                    "file": {
                        "filename": part.name or "file",
                        "file_data": _data_url(part.media_type, part.data),
                    },
                }
            )
        else:  # pragma: no cover - Message validates parts
            raise _unsupported(type(part).__name__, m.role)
    return parts


def _text_only(m: Message) -> str:
    if isinstance(m.content, str):
        return m.content
    for part in m.content:
        if not isinstance(part, TextPart):
            raise _unsupported(type(part).__name__, m.role)
    return m.text


def _unsupported(part: str, role: str) -> ProviderError:
    return ProviderError(
        f"{_NAME}: Chat Completions does not accept a {part} in a {role!r} message "
        "(only text there); send images and files in user messages",
        error_type="unsupported_content",
        provider=_NAME,
    )


def _data_url(media_type: str, data: bytes | None) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data or b'').decode('ascii')}"


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _check(data: object, builder: ResponseBuilder) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProviderError(
            f"{_NAME}: expected a JSON object, got {type(data).__name__}",
            error_type="invalid_response",
            provider=_NAME,
        )
    err = data.get("error")
    if err:
        detail = _obj(err)
        message = detail.get("message") if detail else err
        etype = detail.get("type") or detail.get("code")
        raise ProviderError(
            builder.redact(
                f"{_NAME}: the server reported an error"
                + (f" ({etype})" if etype else "")
                + f": {message}"
            ),
            error_type=str(etype) if etype else None,
            retryable=etype in ("server_error", "overloaded_error"),
            provider=_NAME,
        )
    return data


def _apply_usage(data: dict[str, Any], builder: ResponseBuilder) -> None:
    if isinstance(data.get("model"), str) and builder.model is None:
        builder.model = data["model"]
    usage = _obj(data.get("usage"))
    if usage:
        builder.input_tokens = int(usage.get("prompt_tokens") or 0)
        builder.output_tokens = int(usage.get("completion_tokens") or 0)
        cached = _obj(usage.get("prompt_tokens_details")).get("cached_tokens")
        builder.cache_read_tokens = cached if isinstance(cached, int) and cached > 0 else 0
        cost = usage.get("cost")  # OpenRouter reports the cost in USD
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            builder.cost_usd = float(cost)


def _apply_completion(data: object, builder: ResponseBuilder) -> Iterator[Any]:
    """Feed a whole ``chat.completion`` object to ``builder``; yields the deltas."""
    obj = _check(data, builder)
    _apply_usage(obj, builder)
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ProviderError(
            f"{_NAME}: the response has no choices",
            error_type="invalid_response",
            provider=_NAME,
        )
    choice = _obj(choices[0])
    message = _obj(choice.get("message"))
    content = message.get("content")
    if isinstance(content, list):  # some servers answer with content parts
        content = "".join(str(_obj(p).get("text") or "") for p in content)
    yield builder.text(content)
    yield builder.text(message.get("refusal"))
    for i, call in enumerate(message.get("tool_calls") or ()):
        call = _obj(call)
        fn = _obj(call.get("function"))
        args = fn.get("arguments")
        if isinstance(args, dict):
            args = json.dumps(args)
        yield builder.tool_call(i, call.get("id"), fn.get("name"), args or "")
    builder.finish_reason = choice.get("finish_reason") or builder.finish_reason


def _apply_chunk(data: object, builder: ResponseBuilder) -> Iterator[Any]:
    """Feed one ``chat.completion.chunk`` to ``builder``; yields the deltas."""
    obj = _check(data, builder)
    _apply_usage(obj, builder)
    for choice in obj.get("choices") or ():
        choice = _obj(choice)
        if choice.get("index", 0) != 0:
            continue
        delta = _obj(choice.get("delta"))
        yield builder.text(delta.get("content"))
        yield builder.text(delta.get("refusal"))
        for position, call in enumerate(delta.get("tool_calls") or ()):
            call = _obj(call)
            fn = _obj(call.get("function"))
            index = call.get("index")
            yield builder.tool_call(
                index if isinstance(index, int) else position,
                call.get("id"),
                fn.get("name"),
                fn.get("arguments"),
            )
        if choice.get("finish_reason"):
            builder.finish_reason = choice["finish_reason"]
