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
path). Output is ASCII (``ensure_ascii``), so any str of Unicode characters round-trips
through every store; a str holding a surrogate code point (U+D800 to U+DFFF) is refused on
dump (InvalidInputError), since JSON would give a surrogate pair back as one character.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import cattrs

from ._message_form import (
    FORMAT_VERSION,
    add_extra,
    as_float,
    as_int,
    as_mapping,
    as_opt_str,
    as_str,
    check_version,
    corrupt,
    decode,
    dump_file,
    dump_image,
    dump_message,
    dump_text,
    dump_tool_call,
    dump_usage,
    encode,
    field_of,
    load_message,
    load_message_list,
    load_part,
    load_tool_call,
    load_usage,
    seq,
    str_tuple,
)
from .errors import InvalidInputError
from .messages import FilePart, ImagePart, Message, TextPart, ToolCall, Usage
from .records import ApprovalRecord, Checkpoint
from .results import ExecutionResult

__all__ = [
    "FORMAT_VERSION",
    "approval_from_dict",
    "approval_json_resolved_by",
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
    "loads_message_texts",
    "loads_messages",
    "message_from_dict",
    "message_to_dict",
    "result_from_dict",
    "result_to_dict",
]


_CHECKPOINT_STATUSES = frozenset(("running", "interrupted", "awaiting-approval"))
_APPROVAL_STATUSES = frozenset(("pending", "approved", "denied"))


def _status(value: object, allowed: frozenset[str], what: str) -> Any:
    if type(value) is str and value in allowed:
        return value
    raise corrupt(f"{what} must be one of {sorted(allowed)}, got {value!r}")


# --- records (checkpoints, approval records): each field written once ------------------

_REQUIRED: Any = object()


@attrs.frozen(slots=True)
class _Field:
    """One field of a record: its JSON key (the attribute's name), how it is written, how
    it is read back (value, what -> value; raising StoreCorruptError), and the default for
    a missing key (_REQUIRED: the key must be there)."""

    name: str
    dump: Callable[[Any], Any]
    load: Callable[[Any, str], Any]
    default: Any = _REQUIRED
    omit_none: bool = False  # not written when None (fields added later: old form unchanged)


def _same(value: Any) -> Any:
    return value


def _dump_messages(value: Sequence[Message]) -> list[dict[str, Any]]:
    return [dump_message(m) for m in value]


def _load_messages(value: object, what: str) -> Any:
    return seq(load_message_list(value, what))


def _load_strs(value: object, what: str) -> Any:
    return seq(str_tuple(value, what))


def _load_usage(value: object, what: str) -> Usage:
    return load_usage(value)


def _load_opt_float(value: object, what: str) -> float | None:
    return None if value is None else as_float(value, what)


def _load_call(value: object, what: str) -> ToolCall:
    return load_tool_call(value)


def _statuses(allowed: frozenset[str]) -> Callable[[Any, str], Any]:
    return lambda value, what: _status(value, allowed, what)


_CHECKPOINT_FIELDS = (
    _Field("key", _same, as_str),
    _Field("session_id", _same, as_opt_str, None),
    _Field("run_id", _same, as_str),
    _Field("turn_index", _same, as_int, 0),
    _Field("input", _dump_messages, _load_messages, ()),
    _Field("recorded", _dump_messages, _load_messages, ()),
    _Field("started_call_ids", list, _load_strs, ()),
    _Field("queued_inputs", _dump_messages, _load_messages, ()),
    _Field("pending_approval_ids", list, _load_strs, ()),
    _Field("usage", dump_usage, _load_usage, Usage()),
    _Field("status", _same, _statuses(_CHECKPOINT_STATUSES), "running"),
    _Field("created_at", _same, as_float),
    _Field("updated_at", _same, as_float),
)
_APPROVAL_FIELDS = (
    _Field("id", _same, as_str),
    _Field("session_id", _same, as_opt_str, None),
    _Field("checkpoint_key", _same, as_str),
    _Field("call", dump_tool_call, _load_call),
    _Field("status", _same, _statuses(_APPROVAL_STATUSES), "pending"),
    _Field("reason", _same, as_opt_str, None),
    _Field("created_at", _same, as_float),
    _Field("resolved_at", _same, _load_opt_float, None),
    _Field("expires_at", _same, _load_opt_float, None, omit_none=True),
    _Field("resolved_by", _same, as_opt_str, None, omit_none=True),
)
_CHECKPOINT_KEYS = frozenset(("v", *(f.name for f in _CHECKPOINT_FIELDS)))
_APPROVAL_KEYS = frozenset(("v", *(f.name for f in _APPROVAL_FIELDS)))


def _dump_record(
    record: Checkpoint | ApprovalRecord, fields: tuple[_Field, ...], known: frozenset[str]
) -> dict[str, Any]:
    d: dict[str, Any] = {"v": FORMAT_VERSION}
    for f in fields:
        value = getattr(record, f.name)
        if value is None and f.omit_none:
            continue
        d[f.name] = f.dump(value)
    if record.extra:
        add_extra(d, record.extra, known)
    return d


def _load_record(
    value: object, fields: tuple[_Field, ...], known: frozenset[str], record: str, short: str
) -> dict[str, Any]:
    """The keyword arguments of a record read from ``value`` (``version`` and ``extra``
    included); every bad field is named (``checkpoint 'run_id' must be a string``)."""
    d = as_mapping(value, f"a {record}" if record[0] not in "aeiou" else f"an {record}")
    kwargs: dict[str, Any] = {"version": check_version(d, f"the {record}")}
    for f in fields:
        if f.name in d:
            kwargs[f.name] = f.load(d[f.name], f"{short} {f.name!r}")
        elif f.default is _REQUIRED:
            raise corrupt(f"{record} has no {f.name!r}")
        else:
            kwargs[f.name] = f.default
    kwargs["extra"] = {k: v for k, v in d.items() if k not in known}
    return kwargs


def _unstructure_checkpoint(c: Checkpoint) -> dict[str, Any]:
    return _dump_record(c, _CHECKPOINT_FIELDS, _CHECKPOINT_KEYS)


def _unstructure_approval(r: ApprovalRecord) -> dict[str, Any]:
    return _dump_record(r, _APPROVAL_FIELDS, _APPROVAL_KEYS)


def _structure_checkpoint(value: object, _cl: object = Checkpoint) -> Checkpoint:
    kwargs = _load_record(value, _CHECKPOINT_FIELDS, _CHECKPOINT_KEYS, "checkpoint",
                          "checkpoint")
    return Checkpoint(**kwargs)


def _structure_approval(value: object, _cl: object = ApprovalRecord) -> ApprovalRecord:
    kwargs = _load_record(value, _APPROVAL_FIELDS, _APPROVAL_KEYS, "approval record",
                          "approval")
    del kwargs["version"]  # approval records keep no version of their own
    return ApprovalRecord(**kwargs)


# --- the converter ----------------------------------------------------------------------

_converter = cattrs.Converter()
_converter.register_unstructure_hook(TextPart, dump_text)
_converter.register_unstructure_hook(ImagePart, dump_image)
_converter.register_unstructure_hook(FilePart, dump_file)
_converter.register_unstructure_hook(ToolCall, dump_tool_call)
_converter.register_unstructure_hook(Usage, dump_usage)
_converter.register_unstructure_hook(Message, dump_message)
_converter.register_unstructure_hook(Checkpoint, _unstructure_checkpoint)
_converter.register_unstructure_hook(ApprovalRecord, _unstructure_approval)
_converter.register_structure_hook(TextPart, lambda d, _: load_part(d))
_converter.register_structure_hook(ImagePart, lambda d, _: load_part(d))
_converter.register_structure_hook(FilePart, lambda d, _: load_part(d))
_converter.register_structure_hook(ToolCall, lambda d, _: load_tool_call(d))
_converter.register_structure_hook(Usage, lambda d, _: load_usage(d))
_converter.register_structure_hook(Message, load_message)
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
        "messages": [dump_message(m) for m in r.messages],
        "usage": dump_usage(r.usage),
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
    d = as_mapping(d, "a result")
    check_version(d, "the result")
    what = "result"
    return ExecutionResult(
        text=as_str(field_of(d, "text", what), "result 'text'"),
        finish_reason=as_str(field_of(d, "finish_reason", what), "result 'finish_reason'"),
        messages=load_message_list(d.get("messages", []), "result 'messages'"),
        usage=load_usage(d.get("usage", {})),
        steps=as_int(d.get("steps", 0), "result 'steps'"),
        run_id=as_str(field_of(d, "run_id", what), "result 'run_id'"),
        approval_id=as_opt_str(d.get("approval_id"), "result 'approval_id'"),
        approval_ids=str_tuple(d.get("approval_ids", []), "result 'approval_ids'"),
        exceeded=as_opt_str(d.get("exceeded"), "result 'exceeded'"),
    )


def _dumps(value: object, what: str) -> str:
    try:
        return encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{what} cannot be written as JSON: {exc}") from exc


def _loads(s: str | bytes, what: str) -> Any:
    try:
        return decode(s)
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise corrupt(f"{what} is not valid JSON: {exc}") from exc


def dumps_message(m: Message) -> str:
    """One message as compact JSON (for stores that keep one row per message)."""
    try:
        return encode(_message_to_dict(m))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"a message cannot be written as JSON: {exc}") from exc


def loads_message(s: str | bytes) -> Message:
    """The message of :func:`dumps_message`'s JSON; StoreCorruptError when unreadable."""
    return _message_from_dict(_loads(s, "the stored message"), Message)


def loads_message_texts(texts: Iterable[str | bytes]) -> list[Message]:
    """The messages of many :func:`dumps_message` texts, in order (a store's load path:
    one loop, no per-message call overhead); StoreCorruptError when any is unreadable
    (find which by loading them one by one with :func:`loads_message`)."""
    try:
        return [load_message(decode(s)) for s in texts]
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise corrupt(f"a stored message is not valid JSON: {exc}") from exc


def dumps_messages(msgs: Sequence[Message]) -> str:
    """A transcript as the document ``{"v": 1, "messages": [...]}``."""
    return _dumps(
        {"v": FORMAT_VERSION, "messages": [_message_to_dict(m) for m in msgs]}, "a transcript"
    )


def loads_messages(s: str | bytes) -> list[Message]:
    """The messages of a :func:`dumps_messages` document; StoreCorruptError when unreadable
    or written by a newer release."""
    d = as_mapping(_loads(s, "the transcript"), "the transcript document")
    check_version(d, "the transcript")
    return list(load_message_list(field_of(d, "messages", "the transcript"), "messages"))


def dumps_checkpoint(c: Checkpoint) -> str:
    """A checkpoint as compact JSON with ``"v"``."""
    return _dumps(_unstructure_checkpoint(c), "a checkpoint")


def loads_checkpoint(s: str | bytes) -> Checkpoint:
    """The checkpoint of :func:`dumps_checkpoint`'s JSON; StoreCorruptError when unreadable."""
    return _structure_checkpoint(_loads(s, "the checkpoint"))


def dumps_approval(r: ApprovalRecord) -> str:
    """An approval record as compact JSON with ``"v"``."""
    return _dumps(_unstructure_approval(r), "an approval record")


def approval_json_resolved_by(s: str | bytes, by: str) -> str:
    """The stored JSON ``s`` of an approval record with ``resolved_by`` set to ``by`` (every
    other key as it was): what a store that keeps the created record's JSON writes when it
    resolves the record. StoreCorruptError when ``s`` is not a JSON object."""
    d = dict(as_mapping(_loads(s, "the approval record"), "an approval record"))
    d["resolved_by"] = by
    return _dumps(d, "an approval record")


def loads_approval(s: str | bytes) -> ApprovalRecord:
    """The record of :func:`dumps_approval`'s JSON; StoreCorruptError when unreadable."""
    return _structure_approval(_loads(s, "the approval record"))
