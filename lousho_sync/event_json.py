"""The stable JSON form of run events (:func:`event_to_dict`).

Every run event becomes a flat JSON object: ``"v"`` (this form's version), ``"type"`` (the
event's permanent ``type`` string), then each of the event's fields under its own name, in
the class's field order. Values are written by kind, so a field added to an event class is
covered without a change here:

* a str, int, float, bool or None as it is;
* a message, or a tuple of them, as :func:`~lousho_sync.codec.message_to_dict` writes it;
* a :class:`~lousho_sync.messages.ToolCall` as ``{"id", "name", "arguments"}``;
* a :class:`~lousho_sync.messages.Usage` as the codec writes it (zero counts left out);
* an :class:`~lousho_sync.results.ExecutionResult` as
  :func:`~lousho_sync.codec.result_to_dict` writes it;
* an exception as ``{"type": class name, "code": its LoushoError code or None,
  "message": str(error)}`` (never a traceback);
* a tuple of any of these as a list, another attrs record as a dict of its fields.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._message_form import dump_tool_call, dump_usage
from .codec import message_to_dict, result_to_dict
from .errors import InvalidInputError
from .events import RunEvent, SessionEvent
from .messages import Message, ToolCall, Usage
from .results import ExecutionResult

__all__ = ["EVENT_JSON_VERSION", "event_to_dict"]

EVENT_JSON_VERSION = 1
"""The ``"v"`` of :func:`event_to_dict`'s output; it grows only when a field changes meaning."""

_PLAIN = (str, int, float, bool, type(None))


def _value(value: object, what: str) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, Message):
        return message_to_dict(value)
    if isinstance(value, ToolCall):
        return dump_tool_call(value)
    if isinstance(value, Usage):
        return dump_usage(value)
    if isinstance(value, ExecutionResult):
        return result_to_dict(value)
    if isinstance(value, BaseException):
        return {
            "type": type(value).__name__,
            "code": getattr(value, "code", None),
            "message": str(value),
        }
    if isinstance(value, (tuple, list)):
        return [_value(item, what) for item in value]
    if attrs.has(type(value)):
        return {
            f.name: _value(getattr(value, f.name), f"{what}.{f.name}")
            for f in attrs.fields(type(value))  # type: ignore[arg-type]
        }
    raise InvalidInputError(
        f"{what} holds a {type(value).__name__}, which event_to_dict cannot write as JSON"
    )


def event_to_dict(event: RunEvent | SessionEvent) -> dict[str, Any]:
    """The JSON-ready dict of a run (or session listener) event: ``"v"``, ``"type"`` and each
    field by name (see the module docstring for how values are written). Anything else
    raises :class:`~lousho_sync.errors.InvalidInputError`."""
    if not isinstance(event, (RunEvent, SessionEvent)):
        raise InvalidInputError(
            f"event_to_dict takes a lousho event, not a {type(event).__name__}"
        )
    d: dict[str, Any] = {"v": EVENT_JSON_VERSION, "type": event.type}
    for f in attrs.fields(type(event)):
        d[f.name] = _value(getattr(event, f.name), f"{event.type} '{f.name}'")
    return d
