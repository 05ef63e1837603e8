"""Session ids: the one rule (``^[A-Za-z0-9_-]{1,128}$``), its check, new ids, and the
mapping from any user key to an id (:func:`session_id_for`); the strings a store can keep
(:func:`check_storable_id`, :func:`check_storable_text`)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping
from itertools import chain
from operator import attrgetter
from types import MappingProxyType
from typing import TypeGuard

import attrs

from .errors import InvalidInputError, InvalidSessionIdError

__all__ = [
    "SESSION_ID_RULE",
    "check_storable_id",
    "check_storable_text",
    "new_session_id",
    "session_id_for",
    "validate_session_id",
]

SESSION_ID_RULE = "^[A-Za-z0-9_-]{1,128}$"
"""What every session id must match: it becomes a file name, a key or a row id."""

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def is_session_id(id: object) -> TypeGuard[str]:
    """Whether ``id`` is a str that matches :data:`SESSION_ID_RULE`."""
    return isinstance(id, str) and _ID_RE.fullmatch(id) is not None


def validate_session_id(id: object) -> str:
    """``id`` if it matches ``^[A-Za-z0-9_-]{1,128}$``, else InvalidSessionIdError."""
    if not is_session_id(id):
        raise InvalidSessionIdError(
            f"invalid session id {id!r}: it must match {SESSION_ID_RULE} (letters, digits, "
            "'_' and '-', 1 to 128 characters), because it becomes a file name or a key",
            session_id=id,
        )
    return id


def new_session_id() -> str:
    """A fresh session id (a UUID4 string)."""
    return str(uuid.uuid4())


_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_]+")
_PREFIX_MAX = 64
_HASH_HEX = 24


def session_id_for(key: str) -> str:
    """A valid session id for any user key (an e-mail, ``"tenant:42"``, unicode, any length).

    The id is ``<readable prefix>-<hash>``: the prefix is the key with accents dropped and
    every run of characters outside ``[A-Za-z0-9_]`` turned into one ``-`` (at most 64
    characters, left out when nothing is left); the hash is the first 24 hex digits of the
    SHA-256 of the exact key's UTF-8 bytes. So ``"ali@example.com"`` becomes
    ``"ali-example-com-"`` followed by 24 hex digits. Stable across processes, machines and
    versions (changing it would orphan stored sessions); two different keys get two different
    ids (the hash decides, so no key can be chosen to land on another key's session). Raises
    InvalidInputError for a non-str and InvalidSessionIdError for an empty key.
    """
    if not isinstance(key, str):
        raise InvalidInputError(
            f"session_id_for() takes a str key, got {type(key).__name__}: {key!r}")
    if not key:
        raise InvalidSessionIdError(
            "session_id_for() needs a non-empty key (an empty user key is almost always a bug)",
            session_id=key,
        )
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    ascii_text = unicodedata.normalize("NFKD", key).encode("ascii", "ignore").decode("ascii")
    prefix = _UNSAFE_RUN.sub("-", ascii_text).strip("-")[:_PREFIX_MAX].rstrip("-")
    return f"{prefix}-{digest}" if prefix else digest


_UNSTORABLE_ID = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_DEPTH = 200


def _code_point(char: str) -> str:
    return "NUL" if char == "\x00" else f"the surrogate code point U+{ord(char):04X}"


def check_storable_id(value: object, what: str) -> str:
    """``value`` when it is a str a store can keep as a key (no NUL, no surrogate code
    point: a store encodes keys as UTF-8, PostgreSQL refuses NUL), else InvalidInputError
    naming ``what`` ("approval id") and the rule."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a str, got {type(value).__name__}")
    if value.isascii() and "\0" not in value:  # the common case, in C
        return value
    found = _UNSTORABLE_ID.search(value)
    if found is not None:
        raise InvalidInputError(
            f"{what} {value!r} holds {_code_point(found.group())} at index {found.start()}: "
            "a store cannot keep it (ids hold neither NUL nor surrogate code points)"
        )
    return value


_LEAVES = (bytes, int, float)  # (bool is an int)
_EMPTY_OK = (tuple, list, dict, MappingProxyType)  # an empty one holds no str: not entered
_FIELDS: dict[type, Callable[[object], tuple[object, ...]]] = {}
"""Each attrs class scanned: its field values in order (the getter made once per class)."""


def _fields_of(cls: type) -> Callable[[object], tuple[object, ...]] | None:
    getter = _FIELDS.get(cls)
    if getter is None and attrs.has(cls):
        names = [f.name for f in attrs.fields(cls)]
        many = attrgetter(*names) if len(names) > 1 else None
        getter = _FIELDS[cls] = many if many is not None else (
            lambda value: tuple(getattr(value, n) for n in names))
    return getter


def _surrogate(value: object, depth: int) -> str | None:
    """The first surrogate code point in any str inside ``value`` (strs, mapping keys and
    values, lists, tuples, attrs records), or None."""
    if isinstance(value, str):
        if value.isascii():  # the common case, in C: no surrogate possible
            return None
        found = _SURROGATE.search(value)
        return None if found is None else found.group()
    if depth > _MAX_DEPTH or value is None or isinstance(value, _LEAVES):
        return None
    children: Iterable[object]
    getter = _FIELDS.get(type(value))  # a record seen before (a message): no ABC check
    if getter is not None:
        children = getter(value)
    elif isinstance(value, Mapping):
        children = chain.from_iterable(value.items())
    elif isinstance(value, (list, tuple)):
        children = value
    else:
        getter = _fields_of(type(value))
        if getter is None:
            return None
        children = getter(value)
    for child in children:
        # an ASCII str, a number, None or an empty container is answered here, without a
        # call (most of a message)
        cls = type(child)
        if cls is str:
            if child.isascii():  # type: ignore[union-attr]
                continue
        elif (child is None or cls is int or cls is bool or cls is float
              or (cls in _EMPTY_OK and not child)):
            continue
        hit = _surrogate(child, depth + 1)
        if hit:
            return hit
    return None


def check_storable_text(value: object, what: str) -> None:
    """InvalidInputError naming ``what`` when any str inside ``value`` (a str, a message, a
    mapping, ...) holds a surrogate code point (U+D800 to U+DFFF): a store would refuse it
    or give back a changed text (a surrogate pair read back as one character)."""
    hit = _surrogate(value, 0)
    if hit is not None:
        raise InvalidInputError(
            f"{what} holds {_code_point(hit)}, which no store keeps unchanged: give text of "
            "Unicode characters only (a pair of surrogates as one character: "
            "s.encode('utf-16', 'surrogatepass').decode('utf-16'); undecodable bytes: "
            "decode them with errors='replace')"
        )
