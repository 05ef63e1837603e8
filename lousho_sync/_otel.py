"""OpenTelemetry spans for turns, model calls, tool calls, checkpoint writes and compaction,
following the GenAI semantic conventions. Install the ``otel`` extra (``opentelemetry-api``)
and configure a tracer provider (the SDK, an exporter) to see them.

Off costs nothing measurable: without ``opentelemetry`` installed, or while no tracer
provider is set, :func:`turn` returns the shared :data:`OFF` object whose hooks hand back
their argument (or a shared no-op context manager) without building anything.

Spans (``gen_ai.conversation.id`` is the session id on each):

- ``invoke_agent lousho`` — one turn (``gen_ai.operation.name = "invoke_agent"``,
  ``lousho.run_id``, ``lousho.finish_reason``, the turn's ``gen_ai.usage.*``).
- ``chat <model>`` — one model call (``gen_ai.operation.name = "chat"``,
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.response.finish_reasons``).
- ``execute_tool <name>`` — one tool call (``gen_ai.tool.name``, ``gen_ai.tool.call.id``);
  current while the tool runs, so the tool's own spans are its children.
- ``lousho.checkpoint.save`` and ``lousho.compaction``.

A turn's span is a child of the span current when the turn starts; in ``lousho_aio`` the
worker thread runs in a copy of the caller's context, so it is the caller's span. The turn's
span is never made current across a yield (the run is pulled by its consumer): its children
name it as their parent explicitly. Errors are recorded on the span (status ERROR and an
exception event).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the otel extra is not installed
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .events import RunEvent
    from .messages import ToolCall, Usage
    from .providers.base import ModelResponse
    from .results import ExecutionResult

__all__ = ["OFF", "Hooks", "Off", "ToolSpan", "TurnTrace", "compaction", "turn"]

AVAILABLE = _trace is not None
"""Whether ``opentelemetry-api`` is importable (checked once, at import)."""

_SCOPE = "lousho_sync"
_VERSION = "0.1.0"

E = TypeVar("E")


class _NoSpan:
    """The shared do-nothing span: a context manager whose setters do nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def tool_result(self, is_error: bool, text: str) -> None:
        """Nothing to record."""


_NO_SPAN = _NoSpan()


class Off:
    """Tracing off: every hook hands its argument back or returns the no-op span."""

    __slots__ = ()

    def model_call(
        self, body: Generator[RunEvent, None, ModelResponse | None], step: int
    ) -> Generator[RunEvent, None, ModelResponse | None]:
        return body

    def tool_call(self, call: ToolCall) -> _NoSpan:
        return _NO_SPAN

    def checkpoint(self, status: str) -> _NoSpan:
        return _NO_SPAN


OFF = Off()
"""The hooks when tracing is off (a turn's ``TurnControl.otel`` until :func:`turn`)."""

_cache: tuple[object, Any] | None = None


# ``get_tracer_provider()`` looks up an environment variable on every call while no
# provider is set (about 1 µs); the API's global is read first to skip it. Should a future
# API drop that global, the public call is made.
_ENV_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_MISSING = object()


def _tracer() -> Any:
    """The lousho tracer of the global provider, or None when no provider is set."""
    global _cache
    if _trace is None:
        return None
    if not _ENV_PROVIDER and getattr(_trace, "_TRACER_PROVIDER", _MISSING) is None:
        return None
    provider = _trace.get_tracer_provider()
    if isinstance(provider, (ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None
    cache = _cache
    if cache is not None and cache[0] is provider:
        return cache[1]
    tracer = provider.get_tracer(_SCOPE, _VERSION)
    _cache = (provider, tracer)
    return tracer


def provider_name(provider: object) -> str:
    """``gen_ai.provider.name`` of a provider object: its ``provider_name`` attribute, or
    its class name without ``Provider`` in lower case (``OpenAIProvider`` -> ``openai``)."""
    name = getattr(provider, "provider_name", None)
    if isinstance(name, str) and name:
        return name
    cls = type(provider).__name__
    return (cls[: -len("Provider")] if cls.endswith("Provider") and cls != "Provider"
            else cls).lower()


def _record_error(span: Any, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__qualname__)


def _usage_attrs(span: Any, usage: Usage | None) -> None:
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


class _ToolSpan:
    __slots__ = ("_cm", "_span")

    def __init__(self, cm: Any) -> None:
        self._cm = cm
        self._span: Any = None

    def __enter__(self) -> _ToolSpan:
        self._span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def tool_result(self, is_error: bool, text: str) -> None:
        """Mark the span failed when the tool's result is an error."""
        if is_error:
            self._span.set_status(Status(StatusCode.ERROR, text[:200]))
            self._span.set_attribute("error.type", "tool_error")


class TurnTrace:
    """The spans of one traced turn. Made by :func:`turn`; use it as a generator wrapper
    (:meth:`run`) and through its hooks."""

    __slots__ = ("_attrs", "_ctx", "_model", "_provider", "_span", "_tracer")

    def __init__(self, tracer: Any, provider: object, session_id: str | None, run_id: str
                 ) -> None:
        self._tracer = tracer
        self._provider = provider_name(provider)
        model = getattr(provider, "model", None)
        self._model = model if isinstance(model, str) else None
        self._attrs: dict[str, Any] = {}
        if session_id is not None:
            self._attrs["gen_ai.conversation.id"] = session_id
        self._span = tracer.start_span(
            "invoke_agent lousho",
            kind=SpanKind.INTERNAL,
            attributes={
                **self._attrs,
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "lousho",
                "gen_ai.provider.name": self._provider,
                "lousho.run_id": run_id,
                **({"gen_ai.request.model": self._model} if self._model else {}),
            },
        )
        self._ctx = _trace.set_span_in_context(self._span)

    def run(self, body: Generator[E, None, ExecutionResult], *,
            aborted: type[BaseException] | None = None
            ) -> Generator[E, None, ExecutionResult]:
        """Drive the turn ``body``, ending the turn's span with its outcome; ``aborted`` is
        the exception an aborted turn raises (not an error)."""
        span = self._span
        try:
            result = yield from body
        except GeneratorExit:
            span.set_attribute("lousho.finish_reason", "aborted")
            span.end()
            raise
        except BaseException as exc:
            if aborted is not None and isinstance(exc, aborted):
                span.set_attribute("lousho.finish_reason", "aborted")
            else:
                span.set_attribute("lousho.finish_reason", "error")
                _record_error(span, exc)
            span.end()
            raise
        span.set_attribute("lousho.finish_reason", result.finish_reason)
        _usage_attrs(span, result.usage)
        span.end()
        return result

    def model_call(
        self, body: Generator[RunEvent, None, ModelResponse | None], step: int
    ) -> Generator[RunEvent, None, ModelResponse | None]:
        """Drive one model call ``body`` inside a ``chat`` span."""
        attributes: dict[str, Any] = {
            **self._attrs,
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider,
            "lousho.step": step,
        }
        if self._model:
            attributes["gen_ai.request.model"] = self._model
        span = self._tracer.start_span(
            f"chat {self._model}" if self._model else "chat",
            context=self._ctx, kind=SpanKind.CLIENT, attributes=attributes,
        )
        try:
            response = yield from body
        except GeneratorExit:
            span.end()
            raise
        except BaseException as exc:
            _record_error(span, exc)
            span.end()
            raise
        if response is None:
            span.set_attribute("lousho.steered", True)
        else:
            if response.model:
                span.set_attribute("gen_ai.response.model", response.model)
            span.set_attribute("gen_ai.response.finish_reasons", (str(response.finish_reason),))
            _usage_attrs(span, response.message.usage)
        span.end()
        return response

    def tool_call(self, call: ToolCall) -> _ToolSpan:
        """The ``execute_tool`` span of ``call``, current while the tool runs."""
        return _ToolSpan(
            self._tracer.start_as_current_span(
                f"execute_tool {call.name}",
                context=self._ctx,
                kind=SpanKind.INTERNAL,
                attributes={
                    **self._attrs,
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.type": "function",
                },
                record_exception=True,
                set_status_on_exception=True,
            )
        )

    @contextmanager
    def checkpoint(self, status: str) -> Iterator[None]:
        """A ``lousho.checkpoint.save`` span around one checkpoint write."""
        with self._tracer.start_as_current_span(
            "lousho.checkpoint.save", context=self._ctx, kind=SpanKind.INTERNAL,
            attributes={**self._attrs, "lousho.checkpoint.status": status},
        ):
            yield


class ToolSpan(Protocol):
    """What a tool-call hook returns: a context manager told the tool's result."""

    def __enter__(self) -> ToolSpan: ...

    def __exit__(self, *exc: Any) -> None: ...

    def tool_result(self, is_error: bool, text: str) -> None: ...


class Hooks(Protocol):
    """What a turn's ``TurnControl.otel`` holds: :data:`OFF`, a :class:`TurnTrace`, or the
    DEBUG logging hooks of :mod:`lousho_sync._turnlog` (which wrap one of the first two)."""

    def model_call(
        self, body: Generator[RunEvent, None, ModelResponse | None], step: int
    ) -> Generator[RunEvent, None, ModelResponse | None]: ...

    def tool_call(self, call: ToolCall) -> ToolSpan: ...

    def checkpoint(self, status: str) -> AbstractContextManager[Any]: ...


def turn(provider: object, session_id: str | None, run_id: str) -> TurnTrace | None:
    """The spans of a turn starting now, or None when tracing is off."""
    if _trace is None:
        return None
    tracer = _tracer()
    if tracer is None:
        return None
    return TurnTrace(tracer, provider, session_id, run_id)


@contextmanager
def _compaction_span(tracer: Any, session_id: str, messages_before: int) -> Iterator[None]:
    with tracer.start_as_current_span(
        "lousho.compaction", kind=SpanKind.INTERNAL,
        attributes={"gen_ai.conversation.id": session_id,
                    "lousho.compaction.messages_before": messages_before},
    ):
        yield


def compaction(session_id: str, messages_before: int) -> Any:
    """A ``lousho.compaction`` span (a context manager; the no-op one when off)."""
    if _trace is None:
        return _NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    return _compaction_span(tracer, session_id, messages_before)
