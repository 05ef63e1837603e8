"""Session ids: the one rule (``^[A-Za-z0-9_-]{1,128}$``), its check, new ids, and the
mapping from any user key to an id (:func:`session_id_for`)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid

from .errors import InvalidInputError, InvalidSessionIdError

__all__ = ["SESSION_ID_RULE", "new_session_id", "session_id_for", "validate_session_id"]

SESSION_ID_RULE = "^[A-Za-z0-9_-]{1,128}$"
"""What every session id must match: it becomes a file name, a key or a row id."""

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def is_session_id(id: object) -> bool:
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
    assert isinstance(id, str)
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
