"""The JSON form of messages, checkpoints and approval records.

One private :class:`cattrs.Converter` with hand-written hooks (the generic paths are too
slow for the per-message hot path). The form is compact JSON:

* a message is ``{"role": ..., "content": ...}`` plus only the fields that differ from
  their defaults (``tool_calls``, ``tool_call_id``, ``is_error``, ``usage``, ``metadata``);
  ``content`` is a str or a list of ``{"type": "text" | "image" | "file", ...}`` parts,
  bytes as base64;
* a transcript is the document ``{"v": 1, "messages": [...]}``;
* checkpoints and approval records carry ``"v": 1``.

Keys this release does not know (written by a newer release) go into the record's
``extra`` on load and are written back unchanged on dump. A newer ``"v"``, invalid JSON or
a wrong shape raises :class:`~lousho_sync.errors.StoreCorruptError` (the store adds the
path). Output is ASCII (``ensure_ascii``), so any Python str, even a lone surrogate,
round-trips through every store.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cattrs

from .errors import InvalidInputError, StoreCorruptError
from .messages import FilePart, ImagePart, Message, Part, TextPart, ToolCall, Usage
from .records import ApprovalRecord, Checkpoint
from .results import ExecutionResult

__all__ = [
    "FORMAT_VERSION",
    "approval_from_dict",
    "approval_to_dict",
    "checkpoint_from_dict",
    "checkpoint_to_dict",
    "dumps_approval",
    "dumps_checkpoint",
    "dumps_message",
    "dumps_messages",
    "loads_approval",
    "loads_checkpoint",
    "loads_message",
    "loads_messages",
    "message_from_dict",
    "message_to_dict",
    "result_from_dict",
    "result_to_dict",
]

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


_scan_once: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009 - not in typeshed


def _decode(s: str | bytes) -> Any:
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


def _corrupt(what: str) -> StoreCorruptError:
    return StoreCorruptError(what)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- unstructure (record -> dict) -------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unstructure_text(p: TextPart) -> dict[str, Any]:
    return {"type": "text", "text": p.text}


def _unstructure_image(p: ImagePart) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "image"}
    if p.data is not None:
        d["data"] = _b64(p.data)
    if p.url is not None:
        d["url"] = p.url
    d["media_type"] = p.media_type
    return d


def _unstructure_file(p: FilePart) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "file", "data": _b64(p.data), "media_type": p.media_type}
    if p.name is not None:
        d["name"] = p.name
    return d


_PART_TO_DICT: dict[type, Callable[[Any], dict[str, Any]]] = {
    TextPart: _unstructure_text,
    ImagePart: _unstructure_image,
    FilePart: _unstructure_file,
}


def _unstructure_part(p: Part) -> dict[str, Any]:
    return _PART_TO_DICT[type(p)](p)


def _unstructure_tool_call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}


def _unstructure_usage(u: Usage) -> dict[str, Any]:
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


_MESSAGE_KEYS = frozenset(
    ("role", "content", "tool_calls", "tool_call_id", "is_error", "usage", "metadata")
)


def _unstructure_message(m: Message) -> dict[str, Any]:
    content = m.content
    d: dict[str, Any] = {"role": m.role}
    if type(content) is str:
        if content:
            d["content"] = content
    else:
        d["content"] = [_PART_TO_DICT[type(p)](p) for p in content]
    if m.tool_calls:
        d["tool_calls"] = [_unstructure_tool_call(c) for c in m.tool_calls]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.is_error:
        d["is_error"] = True
    if m.usage is not None:
        d["usage"] = _unstructure_usage(m.usage)
    if m.metadata:
        d["metadata"] = dict(m.metadata)
    if m.extra:
        _add_extra(d, m.extra, _MESSAGE_KEYS)
    return d


def _add_extra(d: dict[str, Any], extra: Mapping[str, Any], known: frozenset[str]) -> None:
    for key, value in extra.items():
        if key not in known:
            d[key] = value


_CHECKPOINT_KEYS = frozenset(
    (
        "v",
        "key",
        "session_id",
        "run_id",
        "turn_index",
        "input",
        "recorded",
        "started_call_ids",
        "queued_inputs",
        "pending_approval_ids",
        "usage",
        "status",
        "created_at",
        "updated_at",
    )
)


def _unstructure_checkpoint(c: Checkpoint) -> dict[str, Any]:
    d: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "key": c.key,
        "session_id": c.session_id,
        "run_id": c.run_id,
        "turn_index": c.turn_index,
        "input": [_unstructure_message(m) for m in c.input],
        "recorded": [_unstructure_message(m) for m in c.recorded],
        "started_call_ids": list(c.started_call_ids),
        "queued_inputs": [_unstructure_message(m) for m in c.queued_inputs],
        "pending_approval_ids": list(c.pending_approval_ids),
        "usage": _unstructure_usage(c.usage),
        "status": c.status,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
    }
    if c.extra:
        _add_extra(d, c.extra, _CHECKPOINT_KEYS)
    return d


_APPROVAL_KEYS = frozenset(
    (
        "v",
        "id",
        "session_id",
        "checkpoint_key",
        "call",
        "status",
        "reason",
        "created_at",
        "resolved_at",
    )
)


def _unstructure_approval(r: ApprovalRecord) -> dict[str, Any]:
    d: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "id": r.id,
        "session_id": r.session_id,
        "checkpoint_key": r.checkpoint_key,
        "call": _unstructure_tool_call(r.call),
        "status": r.status,
        "reason": r.reason,
        "created_at": r.created_at,
        "resolved_at": r.resolved_at,
    }
    if r.extra:
        _add_extra(d, r.extra, _APPROVAL_KEYS)
    return d


# --- structure (dict -> record) ---------------------------------------------------------


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    raise _corrupt(f"{what} must be an object, got {_type_name(value)}")


def _list(value: object, what: str) -> list[Any]:
    if type(value) is list:
        return value
    raise _corrupt(f"{what} must be a list, got {_type_name(value)}")


def _str(value: object, what: str) -> str:
    if type(value) is str:
        return value
    raise _corrupt(f"{what} must be a string, got {_type_name(value)}")


def _opt_str(value: object, what: str) -> str | None:
    if value is None or type(value) is str:
        return value
    raise _corrupt(f"{what} must be a string or null, got {_type_name(value)}")


def _int(value: object, what: str) -> int:
    if type(value) is int:
        return value
    raise _corrupt(f"{what} must be an integer, got {_type_name(value)}")


def _float(value: object, what: str) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise _corrupt(f"{what} must be a number, got {_type_name(value)}")


def _bytes(value: object, what: str) -> bytes:
    text = _str(value, what)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _corrupt(f"{what} is not valid base64: {exc}") from exc


def _field(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except KeyError:
        raise _corrupt(f"{what} has no {key!r}") from None


def _structure_text(d: Mapping[str, Any]) -> TextPart:
    return TextPart(_str(_field(d, "text", "text part"), "text part 'text'"))


def _structure_image(d: Mapping[str, Any]) -> ImagePart:
    data = d.get("data")
    url = d.get("url")
    media_type = _str(d.get("media_type", "image/png"), "image part 'media_type'")
    try:
        return ImagePart(
            data=None if data is None else _bytes(data, "image part 'data'"),
            url=_opt_str(url, "image part 'url'"),
            media_type=media_type,
        )
    except InvalidInputError as exc:
        raise _corrupt(str(exc)) from exc


def _structure_file(d: Mapping[str, Any]) -> FilePart:
    return FilePart(
        data=_bytes(_field(d, "data", "file part"), "file part 'data'"),
        media_type=_str(_field(d, "media_type", "file part"), "file part 'media_type'"),
        name=_opt_str(d.get("name"), "file part 'name'"),
    )


_PART_FROM_DICT: dict[str, Callable[[Mapping[str, Any]], Part]] = {
    "text": _structure_text,
    "image": _structure_image,
    "file": _structure_file,
}


def _structure_part(value: object) -> Part:
    d = _mapping(value, "a content part")
    kind = d.get("type")
    fn = _PART_FROM_DICT.get(kind) if type(kind) is str else None
    if fn is None:
        raise _corrupt(
            f"unknown content part type {kind!r} (this release knows 'text', 'image', 'file')"
        )
    return fn(d)


def _structure_tool_call(value: object) -> ToolCall:
    d = _mapping(value, "a tool call")
    arguments = d.get("arguments", {})
    return ToolCall(
        id=_str(_field(d, "id", "a tool call"), "tool call 'id'"),
        name=_str(_field(d, "name", "a tool call"), "tool call 'name'"),
        arguments=_mapping(arguments, "tool call 'arguments'"),
    )


def _structure_usage(value: object) -> Usage:
    d = _mapping(value, "'usage'")
    cost = d.get("cost_usd")
    return Usage(
        input_tokens=_int(d.get("input_tokens", 0), "usage 'input_tokens'"),
        output_tokens=_int(d.get("output_tokens", 0), "usage 'output_tokens'"),
        cost_usd=None if cost is None else _float(cost, "usage 'cost_usd'"),
        cache_read_tokens=_int(d.get("cache_read_tokens", 0), "usage 'cache_read_tokens'"),
        cache_write_tokens=_int(d.get("cache_write_tokens", 0), "usage 'cache_write_tokens'"),
    )


def _structure_message(value: object, _cl: object = Message) -> Message:
    d = value if type(value) is dict else _mapping(value, "a message")
    role = _field(d, "role", "a message")
    content = d.get("content", "")
    if type(content) is not str:
        content = tuple(_structure_part(p) for p in _list(content, "message 'content'"))
    tool_calls = d.get("tool_calls")
    calls = (
        tuple(_structure_tool_call(c) for c in _list(tool_calls, "message 'tool_calls'"))
        if tool_calls
        else ()
    )
    is_error = d.get("is_error", False)
    if type(is_error) is not bool:
        raise _corrupt(f"message 'is_error' must be a boolean, got {_type_name(is_error)}")
    usage = d.get("usage")
    metadata = d.get("metadata")
    extra = (
        None
        if d.keys() <= _MESSAGE_KEYS
        else {k: v for k, v in d.items() if k not in _MESSAGE_KEYS}
    )
    try:
        return Message(
            role,
            content,
            _seq(calls),
            _opt_str(d.get("tool_call_id"), "message 'tool_call_id'"),
            is_error,
            None if usage is None else _structure_usage(usage),
            None if metadata is None else _mapping(metadata, "message 'metadata'"),
            extra=extra,
        )
    except InvalidInputError as exc:
        raise _corrupt(str(exc)) from exc


def _structure_messages(value: object, what: str) -> tuple[Message, ...]:
    items = _list(value, what)
    out = []
    for i, item in enumerate(items):
        try:
            out.append(_structure_message(item))
        except StoreCorruptError as exc:
            raise _corrupt(f"{what}[{i}]: {exc}") from exc
    return tuple(out)


def _check_version(d: Mapping[str, Any], what: str) -> int:
    v = _field(d, "v", what)
    if type(v) is not int or v < 1:
        raise _corrupt(f"{what} has an invalid format version {v!r}")
    if v > FORMAT_VERSION:
        raise _corrupt(
            f"{what} was written by a newer lousho (format v{v}; this release reads up to "
            f"v{FORMAT_VERSION}): upgrade lousho to read it"
        )
    return v


def _seq(value: tuple[Any, ...]) -> Any:
    # The attrs plugin types ``converter=tuple`` fields as an unbound Iterable[_T_co].
    return value


def _str_tuple(value: object, what: str) -> tuple[str, ...]:
    return tuple(_str(x, f"an item of {what}") for x in _list(value, what))


_CHECKPOINT_STATUSES = frozenset(("running", "interrupted", "awaiting-approval"))
_APPROVAL_STATUSES = frozenset(("pending", "approved", "denied"))


def _status(value: object, allowed: frozenset[str], what: str) -> Any:
    if type(value) is str and value in allowed:
        return value
    raise _corrupt(f"{what} 'status' must be one of {sorted(allowed)}, got {value!r}")


def _structure_checkpoint(value: object, _cl: object = Checkpoint) -> Checkpoint:
    d = _mapping(value, "a checkpoint")
    version = _check_version(d, "the checkpoint")
    what = "checkpoint"
    return Checkpoint(
        version=version,
        key=_str(_field(d, "key", what), "checkpoint 'key'"),
        session_id=_opt_str(d.get("session_id"), "checkpoint 'session_id'"),
        run_id=_str(_field(d, "run_id", what), "checkpoint 'run_id'"),
        turn_index=_int(d.get("turn_index", 0), "checkpoint 'turn_index'"),
        input=_seq(_structure_messages(d.get("input", []), "checkpoint 'input'")),
        recorded=_seq(_structure_messages(d.get("recorded", []), "checkpoint 'recorded'")),
        started_call_ids=_seq(_str_tuple(d.get("started_call_ids", []), "'started_call_ids'")),
        queued_inputs=_seq(
            _structure_messages(d.get("queued_inputs", []), "checkpoint 'queued_inputs'")
        ),
        pending_approval_ids=_seq(
            _str_tuple(d.get("pending_approval_ids", []), "'pending_approval_ids'")
        ),
        usage=_structure_usage(d.get("usage", {})),
        status=_status(d.get("status", "running"), _CHECKPOINT_STATUSES, what),
        created_at=_float(_field(d, "created_at", what), "checkpoint 'created_at'"),
        updated_at=_float(_field(d, "updated_at", what), "checkpoint 'updated_at'"),
        extra={k: v for k, v in d.items() if k not in _CHECKPOINT_KEYS},
    )


def _structure_approval(value: object, _cl: object = ApprovalRecord) -> ApprovalRecord:
    d = _mapping(value, "an approval record")
    _check_version(d, "the approval record")
    what = "approval record"
    resolved_at = d.get("resolved_at")
    return ApprovalRecord(
        id=_str(_field(d, "id", what), "approval 'id'"),
        session_id=_opt_str(d.get("session_id"), "approval 'session_id'"),
        checkpoint_key=_str(_field(d, "checkpoint_key", what), "approval 'checkpoint_key'"),
        call=_structure_tool_call(_field(d, "call", what)),
        status=_status(d.get("status", "pending"), _APPROVAL_STATUSES, what),
        reason=_opt_str(d.get("reason"), "approval 'reason'"),
        created_at=_float(_field(d, "created_at", what), "approval 'created_at'"),
        resolved_at=None if resolved_at is None else _float(resolved_at, "approval 'resolved_at'"),
        extra={k: v for k, v in d.items() if k not in _APPROVAL_KEYS},
    )


# --- the converter ----------------------------------------------------------------------

_converter = cattrs.Converter()
_converter.register_unstructure_hook(TextPart, _unstructure_text)
_converter.register_unstructure_hook(ImagePart, _unstructure_image)
_converter.register_unstructure_hook(FilePart, _unstructure_file)
_converter.register_unstructure_hook(ToolCall, _unstructure_tool_call)
_converter.register_unstructure_hook(Usage, _unstructure_usage)
_converter.register_unstructure_hook(Message, _unstructure_message)
_converter.register_unstructure_hook(Checkpoint, _unstructure_checkpoint)
_converter.register_unstructure_hook(ApprovalRecord, _unstructure_approval)
_converter.register_structure_hook(TextPart, lambda d, _: _structure_part(d))
_converter.register_structure_hook(ImagePart, lambda d, _: _structure_part(d))
_converter.register_structure_hook(FilePart, lambda d, _: _structure_part(d))
_converter.register_structure_hook(ToolCall, lambda d, _: _structure_tool_call(d))
_converter.register_structure_hook(Usage, lambda d, _: _structure_usage(d))
_converter.register_structure_hook(Message, _structure_message)
_converter.register_structure_hook(Checkpoint, _structure_checkpoint)
_converter.register_structure_hook(ApprovalRecord, _structure_approval)

# Looked up once: the hot path calls the hooks without the converter's dispatch.
_message_to_dict: Callable[[Message], dict[str, Any]] = _converter.get_unstructure_hook(Message)
_message_from_dict: Callable[[Any, Any], Message] = _converter.get_structure_hook(Message)


# --- public functions -------------------------------------------------------------------


def message_to_dict(m: Message) -> dict[str, Any]:
    """The JSON-ready dict of one message (defaults omitted, unknown fields kept)."""
    return _message_to_dict(m)


def message_from_dict(d: Mapping[str, Any]) -> Message:
    """The message of a dict made by :func:`message_to_dict` (or by a newer release)."""
    return _message_from_dict(d, Message)


def checkpoint_to_dict(c: Checkpoint) -> dict[str, Any]:
    """The JSON-ready dict of a checkpoint (with ``"v"``)."""
    return _unstructure_checkpoint(c)


def checkpoint_from_dict(d: Mapping[str, Any]) -> Checkpoint:
    """The checkpoint of a dict made by :func:`checkpoint_to_dict`."""
    return _converter.structure(d, Checkpoint)


def approval_to_dict(r: ApprovalRecord) -> dict[str, Any]:
    """The JSON-ready dict of an approval record (with ``"v"``)."""
    return _unstructure_approval(r)


def approval_from_dict(d: Mapping[str, Any]) -> ApprovalRecord:
    """The approval record of a dict made by :func:`approval_to_dict`."""
    return _converter.structure(d, ApprovalRecord)


_RESULT_KEYS = frozenset(
    ("v", "text", "finish_reason", "messages", "usage", "steps", "run_id", "approval_id",
     "approval_ids", "exceeded")
)


def result_to_dict(r: ExecutionResult) -> dict[str, Any]:
    """The JSON-ready dict of a turn's result (with ``"v"``; its messages as
    :func:`message_to_dict` writes them; ``None``/empty fields left out)."""
    d: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "text": r.text,
        "finish_reason": r.finish_reason,
        "messages": [_unstructure_message(m) for m in r.messages],
        "usage": _unstructure_usage(r.usage),
        "steps": r.steps,
        "run_id": r.run_id,
    }
    if r.approval_id is not None:
        d["approval_id"] = r.approval_id
    if r.approval_ids:
        d["approval_ids"] = list(r.approval_ids)
    if r.exceeded is not None:
        d["exceeded"] = r.exceeded
    return d


def result_from_dict(d: Mapping[str, Any]) -> ExecutionResult:
    """The result of a dict made by :func:`result_to_dict`; a malformed dict raises
    ``StoreCorruptError`` naming the field."""
    d = _mapping(d, "a result")
    _check_version(d, "the result")
    what = "result"
    return ExecutionResult(
        text=_str(_field(d, "text", what), "result 'text'"),
        finish_reason=_str(_field(d, "finish_reason", what), "result 'finish_reason'"),
        messages=_structure_messages(d.get("messages", []), "result 'messages'"),
        usage=_structure_usage(d.get("usage", {})),
        steps=_int(d.get("steps", 0), "result 'steps'"),
        run_id=_str(_field(d, "run_id", what), "result 'run_id'"),
        approval_id=_opt_str(d.get("approval_id"), "result 'approval_id'"),
        approval_ids=_str_tuple(d.get("approval_ids", []), "result 'approval_ids'"),
        exceeded=_opt_str(d.get("exceeded"), "result 'exceeded'"),
    )


def _dumps(value: object, what: str) -> str:
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{what} cannot be written as JSON: {exc}") from exc


def _loads(s: str | bytes, what: str) -> Any:
    try:
        return _decode(s)
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise _corrupt(f"{what} is not valid JSON: {exc}") from exc


def dumps_message(m: Message) -> str:
    """One message as compact JSON (for stores that keep one row per message)."""
    try:
        return _encode(_message_to_dict(m))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"a message cannot be written as JSON: {exc}") from exc


def loads_message(s: str | bytes) -> Message:
    """The message of :func:`dumps_message`'s JSON; StoreCorruptError when unreadable."""
    return _message_from_dict(_loads(s, "the stored message"), Message)


def dumps_messages(msgs: Sequence[Message]) -> str:
    """A transcript as the document ``{"v": 1, "messages": [...]}``."""
    return _dumps(
        {"v": FORMAT_VERSION, "messages": [_message_to_dict(m) for m in msgs]}, "a transcript"
    )


def loads_messages(s: str | bytes) -> list[Message]:
    """The messages of a :func:`dumps_messages` document; StoreCorruptError when unreadable
    or written by a newer release."""
    d = _mapping(_loads(s, "the transcript"), "the transcript document")
    _check_version(d, "the transcript")
    return list(_structure_messages(_field(d, "messages", "the transcript"), "messages"))


def dumps_checkpoint(c: Checkpoint) -> str:
    """A checkpoint as compact JSON with ``"v"``."""
    return _dumps(_unstructure_checkpoint(c), "a checkpoint")


def loads_checkpoint(s: str | bytes) -> Checkpoint:
    """The checkpoint of :func:`dumps_checkpoint`'s JSON; StoreCorruptError when unreadable."""
    return _structure_checkpoint(_loads(s, "the checkpoint"))


def dumps_approval(r: ApprovalRecord) -> str:
    """An approval record as compact JSON with ``"v"``."""
    return _dumps(_unstructure_approval(r), "an approval record")


def loads_approval(s: str | bytes) -> ApprovalRecord:
    """The record of :func:`dumps_approval`'s JSON; StoreCorruptError when unreadable."""
    return _structure_approval(_loads(s, "the approval record"))
