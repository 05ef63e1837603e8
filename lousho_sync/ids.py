"""Session ids: the one rule (``^[A-Za-z0-9_-]{1,128}$``), its check, and new ids."""

from __future__ import annotations

import re
import uuid

from .errors import InvalidSessionIdError

__all__ = ["SESSION_ID_RULE", "new_session_id", "validate_session_id"]

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
