"""Normalising what ``send()``/``stream()`` accept into user messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from .errors import InvalidInputError
from .ids import check_storable_text
from .messages import FilePart, ImagePart, Message, Part, TextPart

__all__ = ["InputLike", "to_messages"]

InputLike: TypeAlias = str | Sequence[Part] | Sequence[Message]

_PARTS = (TextPart, ImagePart, FilePart)


def to_messages(input: object) -> tuple[Message, ...]:
    """``input`` as a tuple of messages, or InvalidInputError naming what was given (also
    for text holding a surrogate code point, which no store keeps unchanged)."""
    if isinstance(input, str):
        check_storable_text(input, "the input text")
        return (Message("user", input),)
    if isinstance(input, Message):
        check_storable_text(input, "the input message")
        return (input,)
    if isinstance(input, (list, tuple)) and input:
        if all(isinstance(x, _PARTS) for x in input):
            check_storable_text(input, "the input parts")
            return (Message("user", tuple(input)),)
        if all(isinstance(x, Message) for x in input):
            check_storable_text(input, "the input messages")
            return _check_tool_pairs(tuple(input))
        kinds = sorted({type(x).__name__ for x in input})
        raise InvalidInputError(
            "input must be a str, a sequence of content parts (TextPart, ImagePart, FilePart) "
            f"or a sequence of Message, not a mix; got a sequence of {', '.join(kinds)}"
        )
    if isinstance(input, (list, tuple)):
        raise InvalidInputError("input must not be empty: give a str, parts or messages")
    raise InvalidInputError(
        "input must be a str, a sequence of content parts (TextPart, ImagePart, FilePart) or "
        f"a sequence of Message; got {type(input).__name__}"
    )


def _check_tool_pairs(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """``messages`` when every assistant tool call in them has its result after it and
    every tool result answers such a call; else InvalidInputError naming the call id (a
    transcript never holds one without the other)."""
    open_calls: dict[str, str] = {}
    answered: set[str] = set()
    for m in messages:
        if m.role == "assistant":
            for call in m.tool_calls:
                open_calls[call.id] = call.name
        elif m.role == "tool":
            cid = m.tool_call_id
            if cid is None or cid not in open_calls or cid in answered:
                raise InvalidInputError(
                    f"input holds a tool result for call id {cid!r} with no assistant tool "
                    "call of that id before it (or a second result for it): give each tool "
                    "result after the assistant message that calls it"
                )
            answered.add(cid)
    missing = [cid for cid in open_calls if cid not in answered]
    if missing:
        raise InvalidInputError(
            f"input holds an assistant tool call without its result (call id {missing[0]!r}, "
            f"tool {open_calls[missing[0]]!r}): add a role='tool' message with "
            f"tool_call_id={missing[0]!r} after it, or leave the call out"
        )
    return messages
