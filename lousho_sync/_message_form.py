"""The JSON form of one message (and its parts, tool calls and usage), the fast JSON
encoder and decoder, and the checks that turn a bad stored value into
:class:`~lousho_sync.errors.StoreCorruptError`: what :mod:`lousho_sync.codec` builds its
records and documents from.

The message hooks are hand-written: the per-message path is the store's hot path.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, get_args

import attrs

from .errors import InvalidInputError, StoreCorruptError
from .messages import (
    Content,
    FilePart,
    ImagePart,
    Message,
    Part,
    Role,
    TextPart,
    ToolCall,
    Usage,
    frozen_map,
)

FORMAT_VERSION = 1
"""The version written in every document (``"v"``); newer documents are refused."""


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a value of type {type(value).__name__} is not JSON serializable")


# json.dumps builds a new C encoder on every call; the hot path keeps one (markers=None:
# stateless, so thread-safe; a cycle raises RecursionError instead of ValueError).
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    _c_encode = _c_make_encoder(
        None,
        _json_default,
        json.encoder.encode_basestring_ascii,
        None,
        ":",
        ",",
        False,
        False,
        True,
    )

    def _encode(value: object) -> str:
        return "".join(_c_encode(value, 0))

else:  # pragma: no cover - CPython always has the C encoder
    _PY_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_json_default)

    def _encode(value: object) -> str:
        return _PY_ENCODER.encode(value)


def encode(value: object) -> str:
    """``value`` as compact ASCII JSON. ValueError when a str in it holds a surrogate code
    point: JSON would give a surrogate pair back as one character, so no store keeps it
    unchanged (checked only when the output holds a ``\\ud…`` escape, as astral
    characters and surrogates do)."""
    text = _encode(value)
    if "\\ud" in text:
        try:
            json.dumps(value, ensure_ascii=False, default=_json_default).encode("utf-8")
        except UnicodeEncodeError as exc:
            char = exc.object[exc.start]
            raise ValueError(
                f"it holds the surrogate code point U+{ord(char):04X}, which no store keeps "
                "unchanged (give Unicode characters only)"
            ) from None
    return text


_scan_once: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009 - not in typeshed


def decode(s: str | bytes) -> Any:
    # The scanner directly when the text is exactly one value; json.loads (with its
    # precise error messages) for everything else.
    if type(s) is str:
        try:
            value, end = _scan_once(s, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(s) or not s[end:].strip(" \t\n\r"):
                return value
    return json.loads(s)


def corrupt(what: str) -> StoreCorruptError:
    return StoreCorruptError(what)


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- unstructure (record -> dict) -------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dump_text(p: TextPart) -> dict[str, Any]:
    return {"type": "text", "text": p.text}


def dump_image(p: ImagePart) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "image"}
    if p.data is not None:
        d["data"] = _b64(p.data)
    if p.url is not None:
        d["url"] = p.url
    d["media_type"] = p.media_type
    return d


def dump_file(p: FilePart) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "file", "data": _b64(p.data), "media_type": p.media_type}
    if p.name is not None:
        d["name"] = p.name
    return d


_PART_TO_DICT: dict[type, Callable[[Any], dict[str, Any]]] = {
    TextPart: dump_text,
    ImagePart: dump_image,
    FilePart: dump_file,
}


def _unstructure_part(p: Part) -> dict[str, Any]:
    return _PART_TO_DICT[type(p)](p)


def dump_tool_call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}


def dump_usage(u: Usage) -> dict[str, Any]:
    d: dict[str, Any] = {}  # zero counts are left out (they read back as 0)
    if u.input_tokens:
        d["input_tokens"] = u.input_tokens
    if u.output_tokens:
        d["output_tokens"] = u.output_tokens
    if u.cost_usd is not None:
        d["cost_usd"] = u.cost_usd
    if u.cache_read_tokens:
        d["cache_read_tokens"] = u.cache_read_tokens
    if u.cache_write_tokens:
        d["cache_write_tokens"] = u.cache_write_tokens
    return d


MESSAGE_KEYS = frozenset(
    ("role", "content", "tool_calls", "tool_call_id", "is_error", "usage", "metadata")
)


def dump_message(m: Message) -> dict[str, Any]:
    content = m.content
    d: dict[str, Any] = {"role": m.role}
    if type(content) is str:
        if content:
            d["content"] = content
    else:
        d["content"] = [_PART_TO_DICT[type(p)](p) for p in content]
    if m.tool_calls:
        d["tool_calls"] = [dump_tool_call(c) for c in m.tool_calls]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.is_error:
        d["is_error"] = True
    if m.usage is not None:
        d["usage"] = dump_usage(m.usage)
    if m.metadata:
        d["metadata"] = dict(m.metadata)
    if m.extra:
        add_extra(d, m.extra, MESSAGE_KEYS)
    return d


def add_extra(d: dict[str, Any], extra: Mapping[str, Any], known: frozenset[str]) -> None:
    for key, value in extra.items():
        if key not in known:
            d[key] = value


# --- structure (dict -> record) ---------------------------------------------------------


def as_mapping(value: object, what: str) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    raise corrupt(f"{what} must be an object, got {type_name(value)}")


def as_list(value: object, what: str) -> list[Any]:
    if type(value) is list:
        return value
    raise corrupt(f"{what} must be a list, got {type_name(value)}")


def as_str(value: object, what: str) -> str:
    if type(value) is str:
        return value
    raise corrupt(f"{what} must be a string, got {type_name(value)}")


def as_opt_str(value: object, what: str) -> str | None:
    if value is None or type(value) is str:
        return value
    raise corrupt(f"{what} must be a string or null, got {type_name(value)}")


def as_int(value: object, what: str) -> int:
    if type(value) is int:
        return value
    raise corrupt(f"{what} must be an integer, got {type_name(value)}")


def as_float(value: object, what: str) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise corrupt(f"{what} must be a number, got {type_name(value)}")


def as_bytes(value: object, what: str) -> bytes:
    text = as_str(value, what)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise corrupt(f"{what} is not valid base64: {exc}") from exc


def field_of(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except KeyError:
        raise corrupt(f"{what} has no {key!r}") from None


def load_text(d: Mapping[str, Any]) -> TextPart:
    return TextPart(as_str(field_of(d, "text", "text part"), "text part 'text'"))


def load_image(d: Mapping[str, Any]) -> ImagePart:
    data = d.get("data")
    url = d.get("url")
    media_type = as_str(d.get("media_type", "image/png"), "image part 'media_type'")
    try:
        return ImagePart(
            data=None if data is None else as_bytes(data, "image part 'data'"),
            url=as_opt_str(url, "image part 'url'"),
            media_type=media_type,
        )
    except InvalidInputError as exc:
        raise corrupt(str(exc)) from exc


def load_file(d: Mapping[str, Any]) -> FilePart:
    return FilePart(
        data=as_bytes(field_of(d, "data", "file part"), "file part 'data'"),
        media_type=as_str(field_of(d, "media_type", "file part"), "file part 'media_type'"),
        name=as_opt_str(d.get("name"), "file part 'name'"),
    )


_PART_FROM_DICT: dict[str, Callable[[Mapping[str, Any]], Part]] = {
    "text": load_text,
    "image": load_image,
    "file": load_file,
}


def load_part(value: object) -> Part:
    d = as_mapping(value, "a content part")
    kind = d.get("type")
    fn = _PART_FROM_DICT.get(kind) if type(kind) is str else None
    if fn is None:
        raise corrupt(
            f"unknown content part type {kind!r} (this release knows 'text', 'image', 'file')"
        )
    return fn(d)


def _slot_setters(cls: type[Any], names: tuple[str, ...]) -> tuple[Any, ...]:
    """The slot descriptors' setters of the frozen, slotted attrs class ``cls``, whose
    fields must be ``names`` in order (checked at import: a changed record fails loudly)."""
    fields = tuple(a.name for a in attrs.fields(cls))
    assert fields == names, (cls, fields)
    return tuple(vars(cls)[name].__set__ for name in fields)


# Loaded records are built without their __init__: the load functions below check every
# field the records' validators and converters would, then set the slots directly (the
# records are frozen and slotted). About twice as fast per record on the stores' load path;
# tests/test_codec.py checks that each loaded record equals, hashes, prints, pickles and
# refuses changes as the one its constructor makes, for every shape.
_new = object.__new__
_ROLES = frozenset(get_args(Role))
_NO_MAP: Mapping[str, Any] = frozen_map(None)
_set_call_id_, _set_call_name, _set_call_arguments = _slot_setters(
    ToolCall, ("id", "name", "arguments")
)
_set_input, _set_output, _set_cost, _set_cache_read, _set_cache_write = _slot_setters(
    Usage,
    ("input_tokens", "output_tokens", "cost_usd", "cache_read_tokens", "cache_write_tokens"),
)
(
    _set_role,
    _set_content,
    _set_calls,
    _set_call_id,
    _set_is_error,
    _set_usage,
    _set_metadata,
    _set_extra,
) = _slot_setters(
    Message,
    ("role", "content", "tool_calls", "tool_call_id", "is_error", "usage", "metadata",
     "extra"),
)


def _message(
    role: str,
    content: Content,
    calls: tuple[ToolCall, ...],
    call_id: str | None,
    is_error: bool,
    usage: Usage | None,
    metadata: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> Message:
    """A Message of checked fields (the mappings already read-only)."""
    m = _new(Message)
    _set_role(m, role)
    _set_content(m, content)
    _set_calls(m, calls)
    _set_call_id(m, call_id)
    _set_is_error(m, is_error)
    _set_usage(m, usage)
    _set_metadata(m, metadata)
    _set_extra(m, extra)
    return m


def _read_only(value: dict[str, Any]) -> Mapping[str, Any]:
    # frozen_map without its copy: the dict was just built here and nobody else holds it
    return MappingProxyType(value) if value else _NO_MAP


def load_tool_call(value: object) -> ToolCall:
    d = value if type(value) is dict else as_mapping(value, "a tool call")
    id = d.get("id")
    name = d.get("name")
    if type(id) is not str:
        id = as_str(field_of(d, "id", "a tool call"), "tool call 'id'")
    if type(name) is not str:
        name = as_str(field_of(d, "name", "a tool call"), "tool call 'name'")
    call = _new(ToolCall)
    _set_call_id_(call, id)
    _set_call_name(call, name)
    _set_call_arguments(
        call, frozen_map(as_mapping(d.get("arguments", _NO_MAP), "tool call 'arguments'"))
    )
    return call


def load_usage(value: object) -> Usage:
    d = value if type(value) is dict else as_mapping(value, "'usage'")
    input_tokens = d.get("input_tokens", 0)
    output_tokens = d.get("output_tokens", 0)
    cost = d.get("cost_usd")
    cache_read = d.get("cache_read_tokens", 0)
    cache_write = d.get("cache_write_tokens", 0)
    if type(input_tokens) is not int:
        as_int(input_tokens, "usage 'input_tokens'")  # raises
    if type(output_tokens) is not int:
        as_int(output_tokens, "usage 'output_tokens'")
    if type(cache_read) is not int:
        as_int(cache_read, "usage 'cache_read_tokens'")
    if type(cache_write) is not int:
        as_int(cache_write, "usage 'cache_write_tokens'")
    if cost is not None and type(cost) is not float:
        cost = as_float(cost, "usage 'cost_usd'")
    u = _new(Usage)
    _set_input(u, input_tokens)
    _set_output(u, output_tokens)
    _set_cost(u, cost)
    _set_cache_read(u, cache_read)
    _set_cache_write(u, cache_write)
    return u


def load_message(value: object, _cl: object = Message) -> Message:
    d = value if type(value) is dict else as_mapping(value, "a message")
    if len(d) == 2:  # most messages: a role and a text, nothing else
        role = d.get("role")
        content = d.get("content")
        if type(content) is str and type(role) is str and role in _ROLES:
            return _message(role, content, (), None, False, None, _NO_MAP, _NO_MAP)
    role = field_of(d, "role", "a message")
    if type(role) is not str or role not in _ROLES:
        raise corrupt(f"message role must be 'user', 'assistant' or 'tool', got {role!r}")
    content = d.get("content", "")
    if type(content) is not str:
        content = tuple([load_part(p) for p in as_list(content, "message 'content'")])
    tool_calls = d.get("tool_calls")
    calls = (
        tuple([load_tool_call(c) for c in as_list(tool_calls, "message 'tool_calls'")])
        if tool_calls
        else ()
    )
    is_error = d.get("is_error", False)
    if type(is_error) is not bool:
        raise corrupt(f"message 'is_error' must be a boolean, got {type_name(is_error)}")
    usage = d.get("usage")
    metadata = d.get("metadata")
    return _message(
        role,
        content,
        calls,
        as_opt_str(d.get("tool_call_id"), "message 'tool_call_id'"),
        is_error,
        None if usage is None else load_usage(usage),
        _NO_MAP if metadata is None else frozen_map(as_mapping(metadata, "message 'metadata'")),
        _NO_MAP
        if d.keys() <= MESSAGE_KEYS
        else _read_only({k: v for k, v in d.items() if k not in MESSAGE_KEYS}),
    )


def load_message_list(value: object, what: str) -> tuple[Message, ...]:
    items = as_list(value, what)
    out = []
    for i, item in enumerate(items):
        try:
            out.append(load_message(item))
        except StoreCorruptError as exc:
            raise corrupt(f"{what}[{i}]: {exc}") from exc
    return tuple(out)


def check_version(d: Mapping[str, Any], what: str) -> int:
    v = field_of(d, "v", what)
    if type(v) is not int or v < 1:
        raise corrupt(f"{what} has an invalid format version {v!r}")
    if v > FORMAT_VERSION:
        raise corrupt(
            f"{what} was written by a newer lousho (format v{v}; this release reads up to "
            f"v{FORMAT_VERSION}): upgrade lousho to read it"
        )
    return v


def seq(value: tuple[Any, ...]) -> Any:
    # The attrs plugin types ``converter=tuple`` fields as an unbound Iterable[_T_co].
    return value


def str_tuple(value: object, what: str) -> tuple[str, ...]:
    return tuple(as_str(x, f"an item of {what}") for x in as_list(value, what))


