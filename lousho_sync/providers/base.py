"""The provider protocol and its data: what the executor asks a model and gets back."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ..messages import Message
from ..signal import Signal

__all__ = [
    "ModelDone",
    "ModelEvent",
    "ModelRequest",
    "ModelResponse",
    "ModelTextDelta",
    "ModelToolCallDelta",
    "Provider",
    "ToolSpec",
]


@attrs.frozen(slots=True)
class ToolSpec:
    """A tool as the model sees it: name, description and JSON Schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@attrs.frozen(slots=True)
class ModelRequest:
    """One model call: system prompt, messages, tools and settings (passed through)."""

    system: str | None
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(slots=True)
class ModelResponse:
    """The whole answer: the assistant ``message`` (with ``usage``), why it stopped, the model."""

    message: Message
    finish_reason: Literal["stop", "length", "tool_calls"] | str
    model: str | None = None


@attrs.frozen(slots=True)
class ModelTextDelta:
    """Streamed text."""

    text: str


@attrs.frozen(slots=True)
class ModelToolCallDelta:
    """A streamed fragment of tool call ``index`` (id and name arrive with the first)."""

    index: int
    id: str | None
    name: str | None
    arguments_fragment: str


@attrs.frozen(slots=True)
class ModelDone:
    """Last event of every stream: the whole response."""

    response: ModelResponse


ModelEvent: TypeAlias = ModelTextDelta | ModelToolCallDelta | ModelDone


@runtime_checkable
class Provider(Protocol):
    """A model. Raise :class:`~lousho_sync.ProviderError` on failure; stop promptly on abort.

    Implementations must be safe to call from many threads at once.
    """

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        """Answer ``request`` in one piece."""
        ...

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        """Answer ``request`` as deltas, ending with :class:`ModelDone`."""
        ...
