"""Normalising what ``send()``/``stream()`` accept into user messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from .errors import InvalidInputError
from .messages import FilePart, ImagePart, Message, Part, TextPart

__all__ = ["InputLike", "to_messages"]

InputLike: TypeAlias = str | Sequence[Part] | Sequence[Message]

_PARTS = (TextPart, ImagePart, FilePart)


def to_messages(input: object) -> tuple[Message, ...]:
    """``input`` as a tuple of messages, or InvalidInputError naming what was given."""
    if isinstance(input, str):
        return (Message("user", input),)
    if isinstance(input, Message):
        return (input,)
    if isinstance(input, (list, tuple)) and input:
        if all(isinstance(x, _PARTS) for x in input):
            return (Message("user", tuple(input)),)
        if all(isinstance(x, Message) for x in input):
            return tuple(input)
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
