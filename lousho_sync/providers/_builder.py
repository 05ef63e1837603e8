"""One answer, from streamed deltas or from a whole response, built into a ModelResponse.

Both paths of a provider feed the same :class:`ResponseBuilder`, so a streamed and a
complete answer end as the same :class:`~lousho_sync.providers.base.ModelResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import attrs

from ..errors import ProviderError
from ..messages import Message, ToolCall, Usage
from ._secret import Secret, clip
from .base import ModelResponse, ModelTextDelta, ModelToolCallDelta

__all__ = ["ResponseBuilder"]


@attrs.define
class _CallSlot:
    id: str | None = None
    name: str | None = None
    fragments: list[str] = attrs.Factory(list)


class ResponseBuilder:
    """Collects one answer, streamed (deltas) or complete (whole parts), into a response.

    Both paths of a provider feed the same builder, so a streamed and a complete answer
    end as the same :class:`ModelResponse`. Not thread-safe (one per call).
    """

    def __init__(self, provider: str, secret: Secret) -> None:
        self.provider = provider
        self._secret = secret
        self._text: list[str] = []
        self._calls: dict[int, _CallSlot] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd: float | None = None
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0

    def redact(self, text: str) -> str:
        """``text`` without the API key."""
        return self._secret.redact(text)

    def text(self, piece: object) -> ModelTextDelta | None:
        """Add text; returns the delta to stream (None for nothing)."""
        if not isinstance(piece, str) or not piece:
            return None
        self._text.append(piece)
        return ModelTextDelta(self._secret.redact(piece))

    def tool_call(
        self, index: int, id: object, name: object, fragment: object
    ) -> ModelToolCallDelta | None:
        """Add a piece of tool call ``index``; returns the delta to stream (None for nothing)."""
        slot = self._calls.setdefault(index, _CallSlot())
        new_id = id if isinstance(id, str) and id and slot.id is None else None
        new_name = name if isinstance(name, str) and name and slot.name is None else None
        if new_id is not None:
            slot.id = new_id
        if new_name is not None:
            slot.name = new_name
        piece = fragment if isinstance(fragment, str) else ""
        if piece:
            slot.fragments.append(piece)
        if new_id is None and new_name is None and not piece:
            return None
        return ModelToolCallDelta(index, new_id, new_name, self._secret.redact(piece))

    def build(
        self, finish_map: Mapping[str, str], plain: frozenset[str] = frozenset()
    ) -> ModelResponse:
        """The whole answer; ``finish_map`` maps the provider's reasons to lousho's.

        A provider reason not in ``plain`` is kept in ``message.metadata["finish_reason"]``
        (e.g. ``content_filter``, ``refusal``), since the mapping loses it.
        """
        raw = self.finish_reason
        mapped = finish_map.get(raw, "stop") if raw is not None else "stop"
        calls = tuple(self._call(i, mapped) for i in sorted(self._calls))
        if calls and mapped == "stop":
            mapped = "tool_calls"
        elif not calls and mapped == "tool_calls":
            mapped = "stop"
        usage = Usage(self.input_tokens, self.output_tokens, self.cost_usd,
                      self.cache_read_tokens, self.cache_write_tokens)
        metadata = {"finish_reason": raw} if raw is not None and raw not in plain else {}
        text = self._secret.redact("".join(self._text))
        message = Message(
            "assistant", text, tool_calls=cast(Any, calls), usage=usage, metadata=metadata
        )
        return ModelResponse(message, mapped, self.model)

    def _call(self, index: int, finish: str) -> ToolCall:
        slot = self._calls[index]
        if not slot.name:
            raise ProviderError(
                f"{self.provider}: tool call {index} arrived without a name",
                error_type="invalid_response",
                provider=self.provider,
            )
        raw = self._secret.redact("".join(slot.fragments)).strip()
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError as exc:
            cut = " (the answer was cut at max_tokens)" if finish == "length" else ""
            raise ProviderError(
                f"{self.provider}: the model sent invalid JSON arguments for tool "
                f"{slot.name!r}{cut}: {clip(raw, 200)!r}",
                error_type="invalid_tool_arguments",
                provider=self.provider,
            ) from exc
        if not isinstance(arguments, dict):
            raise ProviderError(
                f"{self.provider}: the arguments of tool {slot.name!r} are not a JSON "
                f"object: {clip(raw, 200)!r}",
                error_type="invalid_tool_arguments",
                provider=self.provider,
            )
        return ToolCall(slot.id or f"call_{index}", slot.name, arguments)
