"""A deterministic provider for tests, demos and benchmarks."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from ..errors import AbortedError, ProviderError
from ..messages import Message, ToolCall, Usage
from ..signal import Signal
from .base import (
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
)

__all__ = ["ScriptItem", "ScriptedProvider", "Step"]

_GATE_POLL_S = 0.005
_FREE = Usage(0, 0, 0.0)
"""A scripted answer costs nothing (unless its Step says otherwise)."""


def _tool_calls(value: Iterable[ToolCall | tuple[str, Mapping[str, Any]]]) -> tuple[Any, ...]:
    return tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class Step:
    """One scripted answer.

    ``chunks`` splits the streamed text (default: ``text`` in one delta); ``tool_calls`` are
    :class:`ToolCall` objects or ``(name, arguments)`` pairs; ``error`` is raised instead of
    answering; ``delay_s`` and ``gate`` (a ``threading.Event`` to wait for) hold the answer
    back and end early on abort; ``finish_reason`` overrides the computed one.
    """

    text: str = ""
    chunks: Sequence[str] | None = None
    tool_calls: tuple[ToolCall | tuple[str, Mapping[str, Any]], ...] = attrs.field(
        default=(), converter=_tool_calls
    )
    usage: Usage | None = None
    error: BaseException | type[BaseException] | None = None
    delay_s: float = 0.0
    gate: threading.Event | None = None
    finish_reason: str | None = None


ScriptItem: TypeAlias = Step | str | Callable[[ModelRequest], "Step | str"]


class ScriptedProvider:
    """Answers from a script: each call takes the next item, then ``default`` forever.

    Thread-safe (one lock guards the script position and ``requests``). Every request is
    recorded in ``requests``; ``calls`` counts them. An exhausted script with no default
    raises :class:`ProviderError`.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        default: ScriptItem | None = None,
        model: str = "scripted",
    ) -> None:
        self._script = list(script)
        self._pos = 0
        self._default = default
        self.model = model
        self._lock = threading.Lock()
        self.requests: list[ModelRequest] = []
        self._text_steps: dict[str, Step] = {}  # a str answer's Step, made once

    @property
    def calls(self) -> int:
        """How many calls were made."""
        return len(self.requests)

    def _next(self, request: ModelRequest) -> tuple[Step, int]:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
            if self._pos < len(self._script):
                item: ScriptItem | None = self._script[self._pos]
                self._pos += 1
            else:
                item = self._default
        if item is None:
            raise ProviderError(
                f"ScriptedProvider: the script is exhausted after {len(self._script)} item(s) "
                "and no default was given",
                provider="scripted",
            )
        if callable(item) and not isinstance(item, Step):
            item = item(request)
        if isinstance(item, str):
            step = self._text_steps.get(item)
            if step is None:
                step = self._text_steps[item] = Step(text=item)
            item = step
        if not isinstance(item, Step):
            raise ProviderError(
                f"ScriptedProvider: a script item must be a Step, a str or a callable "
                f"returning one, got {type(item).__name__}",
                provider="scripted",
            )
        return item, n

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        """Stream the next scripted answer."""
        step, n = self._next(request)
        _hold(step, signal)
        text = step.text if step.chunks is None else "".join(step.chunks)
        chunks = step.chunks if step.chunks is not None else ((text,) if text else ())
        for chunk in chunks:
            signal.raise_if_aborted()
            yield ModelTextDelta(chunk)
        signal.raise_if_aborted()
        calls = []
        for i, tc in enumerate(step.tool_calls):
            call = tc if isinstance(tc, ToolCall) else ToolCall(f"call_{n}_{i}", tc[0], tc[1])
            calls.append(call)
            yield ModelToolCallDelta(i, call.id, call.name, json.dumps(dict(call.arguments)))
        finish = step.finish_reason or ("tool_calls" if calls else "stop")
        message = Message(
            "assistant", text, tool_calls=tuple(calls), usage=step.usage or _FREE
        )
        yield ModelDone(ModelResponse(message, finish, self.model))

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        """Return the next scripted answer in one piece."""
        for event in self.stream(request, signal=signal):
            if isinstance(event, ModelDone):
                return event.response
        raise ProviderError("ScriptedProvider: stream ended without ModelDone")  # pragma: no cover

    def __repr__(self) -> str:
        return f"ScriptedProvider(model={self.model!r}, calls={self.calls})"


def _hold(step: Step, signal: Signal) -> None:
    if step.gate is not None:
        while not step.gate.wait(_GATE_POLL_S):
            signal.raise_if_aborted()
    if step.delay_s > 0 and signal.wait(step.delay_s):
        raise AbortedError("aborted during a scripted delay", reason=signal.reason)
    signal.raise_if_aborted()
    if step.error is not None:
        raise step.error
