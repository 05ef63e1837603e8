"""What a store's catalog of sessions holds: :class:`SessionInfo` (one session, read without
its transcript), :class:`SessionPage` (one page of ``store.sessions.list()``), the
metadata rule (a JSON object of at most :data:`MAX_METADATA_BYTES` bytes) and the list
cursor.

``list()`` orders sessions by ``updated_at``, newest first, then by id; a page's ``next``
is an opaque cursor for the page after it (None on the last page). The cursor is keyset
pagination: a session written while a caller pages may move to the front (and be seen
again, or not at all, by that caller); no other session is skipped or repeated.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from .errors import ConfigError, InvalidMetadataError, StoreCorruptError
from .ids import validate_session_id
from .messages import frozen_map, reduce_frozen

__all__ = [
    "LIST_LIMIT_MAX",
    "MAX_METADATA_BYTES",
    "Cursor",
    "SessionInfo",
    "SessionPage",
    "after_cursor",
    "check_list_args",
    "check_metadata",
    "cursor_of",
    "metadata_from_json",
    "page_from",
    "page_of",
]

MAX_METADATA_BYTES = 16_384
"""The largest session metadata: its compact JSON, UTF-8 encoded."""

LIST_LIMIT_MAX = 1_000
"""The most sessions one ``list()`` page holds."""

Cursor = tuple[float, str]
"""A decoded list cursor: the (updated_at, id) of the last session of the page before."""


@attrs.frozen(slots=True, kw_only=True)
class SessionInfo:
    """One session as a store's catalog keeps it (its transcript is not loaded).

    ``messages`` counts the current transcript (not what compaction replaced);
    ``created_at``/``updated_at`` are Unix times (seconds) of the first write and of the
    last change of the transcript or the metadata. ``metadata`` is a read-only mapping
    (``dict(info.metadata)`` for a copy to change).
    """

    id: str
    messages: int
    created_at: float
    updated_at: float
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_map, hash=False)

    __reduce__ = reduce_frozen

    @property
    def title(self) -> str | None:
        """``metadata["title"]`` when it is a str, else None."""
        title = self.metadata.get("title")
        return title if isinstance(title, str) else None


@attrs.frozen(slots=True)
class SessionPage:
    """One page of ``store.sessions.list()``: ``items`` newest first, and ``next``, the
    cursor to pass as ``after=`` for the next page (None: this is the last page)."""

    items: tuple[SessionInfo, ...]
    next: str | None = None

    def __iter__(self) -> Iterator[SessionInfo]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _check_json(value: object, path: str, depth: int) -> None:
    if depth > 32:
        raise ValueError(f"{path} nests deeper than 32 levels")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}, which JSON cannot hold")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path} has the key {key!r}: keys must be str")
            _check_json(item, f"{path}[{key!r}]", depth + 1)
        return
    raise ValueError(f"{path} is a {type(value).__name__}: only JSON values (str, int, "
                     "float, bool, None, lists and dicts) are kept")


def check_metadata(metadata: object, session_id: str | None = None) -> str:
    """The compact JSON text of ``metadata`` for session ``session_id``, or
    InvalidMetadataError: it must be a mapping with str keys holding JSON values, at most
    :data:`MAX_METADATA_BYTES` bytes as compact JSON."""
    where = f"the metadata of session {session_id!r}" if session_id else "session metadata"
    if not isinstance(metadata, Mapping):
        raise InvalidMetadataError(
            f"{where} must be a JSON object (a dict), got {type(metadata).__name__}",
            session_id=session_id,
        )
    try:
        _check_json(metadata, "metadata", 0)
    except ValueError as exc:
        raise InvalidMetadataError(f"{where} is not JSON: {exc}", session_id=session_id) from None
    text = json.dumps(dict(metadata), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        char = exc.object[exc.start]
        raise InvalidMetadataError(
            f"{where} holds the surrogate code point U+{ord(char):04X} (in a key or a "
            "value), which no store keeps: give Unicode characters only",
            session_id=session_id,
        ) from None
    if size > MAX_METADATA_BYTES:
        raise InvalidMetadataError(
            f"{where} is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} bytes "
            "(keep titles, owners and tags there, not documents)",
            session_id=session_id,
        )
    return text


def metadata_from_json(text: str | bytes | None, where: str) -> dict[str, Any]:
    """Stored metadata ``text`` as a dict ({} for None or empty); StoreCorruptError naming
    ``where`` ("session 'a' in the SQLite store at …") when it is not a JSON object."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreCorruptError(f"the metadata of {where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise StoreCorruptError(f"the metadata of {where} is not a JSON object")
    return value


def cursor_of(info: SessionInfo) -> str:
    """The cursor that continues a list after ``info``."""
    raw = json.dumps([info.updated_at, info.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(after: str) -> Cursor:
    try:
        raw = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4))
        updated_at, id = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        updated_at = id = None
    if (not isinstance(updated_at, (int, float)) or isinstance(updated_at, bool)
            or not isinstance(id, str)):
        raise ConfigError(
            f"after={after!r} is not a list cursor: pass the `next` of the page before "
            "(None for the first page)"
        )
    validate_session_id(id)
    return float(updated_at), id


def check_list_args(
    prefix: str | None, limit: int, after: str | None
) -> tuple[str, int, Cursor | None]:
    """The checked arguments of ``list()``: the prefix ('' for none), the limit
    (1..:data:`LIST_LIMIT_MAX`) and the decoded cursor; ConfigError naming the rule."""
    if prefix is not None and not isinstance(prefix, str):
        raise ConfigError(f"prefix must be a str or None, got {prefix!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
        raise ConfigError(f"limit must be an int from 1 to {LIST_LIMIT_MAX}, got {limit!r}")
    if after is not None and not isinstance(after, str):
        raise ConfigError(f"after must be a cursor str (a page's `next`) or None, got {after!r}")
    return prefix or "", limit, None if after is None else _decode_cursor(after)


def after_cursor(info: SessionInfo, cursor: Cursor | None) -> bool:
    """Whether ``info`` comes after ``cursor`` in list order (newest first, then id)."""
    if cursor is None:
        return True
    updated_at, id = cursor
    return info.updated_at < updated_at or (info.updated_at == updated_at and info.id > id)


def page_of(
    infos: Iterable[SessionInfo], prefix: str | None, limit: int, after: str | None
) -> SessionPage:
    """One page of ``infos`` (in any order) for ``list(prefix=, limit=, after=)``: for
    stores that sort their catalog in Python."""
    prefix, limit, cursor = check_list_args(prefix, limit, after)
    chosen = sorted(
        (i for i in infos if i.id.startswith(prefix) and after_cursor(i, cursor)),
        key=lambda i: (-i.updated_at, i.id),
    )
    return page_from(chosen, limit)


def page_from(ordered: list[SessionInfo], limit: int) -> SessionPage:
    """The page of the first ``limit`` of ``ordered`` (fetch ``limit + 1`` to know whether
    another page follows)."""
    items = tuple(ordered[:limit])
    more = len(ordered) > limit
    return SessionPage(items, cursor_of(items[-1]) if more and items else None)
