"""The message model: frozen attrs records, no behaviour and no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

import attrs

__all__ = [
    "Content",
    "FilePart",
    "ImagePart",
    "Message",
    "Part",
    "Role",
    "TextPart",
    "ToolCall",
    "Usage",
    "frozen_map",
    "reduce_frozen",
]

Role: TypeAlias = Literal["user", "assistant", "tool"]
_ROLES = frozenset(("user", "assistant", "tool"))


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``value`` as a read-only mapping (a shallow copy; the shared empty one for none)."""
    if not value:
        return _EMPTY
    if type(value) is MappingProxyType:
        return value
    return MappingProxyType(dict(value))


def _rebuild(cls: type[Any], fields: dict[str, Any]) -> Any:
    """Unpickle a record holding read-only mappings (see ``reduce_frozen``)."""
    return cls(**fields)


def reduce_frozen(self: Any) -> tuple[Any, ...]:
    """Pickle/deepcopy a record whose read-only mappings (``MappingProxyType``) cannot be
    pickled: rebuild it from its fields, the mappings as plain dicts."""
    fields = {}
    for a in attrs.fields(type(self)):
        value = getattr(self, a.name)
        fields[a.name] = dict(value) if type(value) is MappingProxyType else value
    return (_rebuild, (type(self), fields))


@attrs.frozen(slots=True)
class TextPart:
    """A piece of text."""

    text: str


@attrs.frozen(slots=True)
class ImagePart:
    """An image given by bytes (``data``) or by ``url``, with its media type."""

    data: bytes | None = None
    url: str | None = None
    media_type: str = "image/png"

    def __attrs_post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            from .errors import InvalidInputError

            raise InvalidInputError("ImagePart needs exactly one of data (bytes) or url (str)")


@attrs.frozen(slots=True)
class FilePart:
    """A file's bytes with its media type and an optional name."""

    data: bytes
    media_type: str
    name: str | None = None


Part: TypeAlias = TextPart | ImagePart | FilePart
Content: TypeAlias = str | tuple[Part, ...]


def _arguments(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is None or isinstance(value, Mapping):
        return frozen_map(value)
    from .errors import InvalidInputError

    raise InvalidInputError(
        f"ToolCall arguments must be a mapping of argument names to values (a dict), got "
        f"{type(value).__name__}: {value!r:.80}"
    )


@attrs.frozen(slots=True)
class ToolCall:
    """A model's request to call tool ``name`` with ``arguments``; ``id`` is stable.

    Records here are frozen, hashable (read-only mappings are left out of the hash),
    picklable and deep-copyable.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(
        default=_EMPTY, converter=_arguments, hash=False
    )

    __reduce__ = reduce_frozen


@attrs.frozen(slots=True)
class Usage:
    """Tokens and cost of one or more model calls. ``a + b`` sums them.

    ``input_tokens`` counts every input token; ``cache_read_tokens`` and
    ``cache_write_tokens`` are the parts of them read from / written to the provider's
    prompt cache (priced at their own rates). ``cost_usd`` is None when unknown; the sum of
    a known and an unknown cost is the known one.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        if self.cost_usd is None:
            cost = other.cost_usd
        elif other.cost_usd is None:
            cost = self.cost_usd
        else:
            cost = self.cost_usd + other.cost_usd
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            cost,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


def _content(value: object) -> Content:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        parts = tuple(value)
        for part in parts:
            if not isinstance(part, (TextPart, ImagePart, FilePart)):
                from .errors import InvalidInputError

                raise InvalidInputError(
                    f"message content parts must be TextPart, ImagePart or FilePart, "
                    f"got {type(part).__name__}"
                )
        return parts
    from .errors import InvalidInputError

    raise InvalidInputError(
        f"message content must be a str or a sequence of parts, got {type(value).__name__}"
    )


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return value if type(value) is tuple else tuple(value)


def _role(_inst: object, _attr: object, value: object) -> None:
    if value not in _ROLES:
        from .errors import InvalidInputError

        raise InvalidInputError(
            f"message role must be 'user', 'assistant' or 'tool', got {value!r}"
        )


@attrs.frozen(slots=True)
class Message:
    """One transcript entry.

    ``role`` is ``"user"``, ``"assistant"`` or ``"tool"``; ``content`` a str or a tuple of
    parts. Assistant messages carry ``tool_calls`` and the ``usage`` of the model call that
    made them; tool results carry ``tool_call_id`` and ``is_error``. ``extra`` keeps fields
    written by a newer release so they survive a load/save round trip.
    """

    role: Role = attrs.field(validator=_role)
    content: Content = attrs.field(default="", converter=_content)
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    tool_call_id: str | None = None
    is_error: bool = False
    usage: Usage | None = None
    metadata: Mapping[str, Any] = attrs.field(
        default=_EMPTY, converter=frozen_map, hash=False
    )
    extra: Mapping[str, Any] = attrs.field(
        default=_EMPTY, converter=frozen_map, repr=False, kw_only=True, hash=False
    )

    __reduce__ = reduce_frozen

    @property
    def text(self) -> str:
        """The message's text: the str content, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))
