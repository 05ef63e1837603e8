"""Reading PostgresStore's rows (for :mod:`.postgres`): a transcript checked against the
session's recorded length and positions, and a catalog row; problems are described without
any stored content."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..catalog import SessionInfo, metadata_from_json
from ..codec import loads_message
from ..errors import StoreCorruptError
from ..messages import Message
from ._postgres_db import Db

__all__ = ["INFO_COLUMNS", "LOAD", "LOAD_LEAN", "decode_info", "decode_transcript"]

LOAD = (
    "SELECT s.length, m.seq, m.json FROM {s}.sessions s LEFT JOIN {s}.messages m"
    " ON m.session_key = s.key WHERE s.id = %s ORDER BY m.seq"
)
# The same rows with the length on the first message's row only (the others NULL: less
# to fetch and convert); when they do not add up, ``LOAD`` reads again to say what is wrong.
LOAD_LEAN = (
    "SELECT CASE WHEN m.seq IS NULL OR m.seq = 0 THEN s.length END, m.seq, m.json"
    " FROM {s}.sessions s LEFT JOIN {s}.messages m ON m.session_key = s.key WHERE s.id = %s"
    " ORDER BY m.seq"
)
INFO_COLUMNS = "id, length, created_at, updated_at, metadata"


def decode_transcript(db: Db, id: str, rows: list[Any]) -> list[Message] | None:
    """The transcript of ``LOAD``'s rows; StoreCorruptError naming no stored content."""
    if not rows or (rows[0][0] == 0 and rows[0][1] is None and len(rows) == 1):
        return None  # absent, or metadata only
    length = rows[0][0]
    problem = None
    if rows[0][1] is None:
        problem = f"it records {length} messages but none is stored"
    elif len(rows) != length or any(r[1] != i for i, r in enumerate(rows)):
        found = sum(1 for i, r in enumerate(rows) if r[1] == i)
        problem = (f"it records {length} messages but {len(rows)} rows are stored, {found} "
                   "of them in place (rows are missing or damaged)")
    out: list[Message] = []
    if problem is None:
        for seq, text in ((r[1], r[2]) for r in rows):
            try:
                out.append(loads_message(text))
            except StoreCorruptError:
                problem = f"message {seq} is not a readable message (not JSON of a message)"
                break
    if problem is not None:
        raise db.corrupt(f"session {id!r} cannot be read: {problem};", id)
    return out


def decode_info(db: Db, row: Sequence[Any]) -> SessionInfo:
    """The SessionInfo of a row of ``INFO_COLUMNS``; StoreCorruptError for bad metadata."""
    id, length, created_at, updated_at, text = row
    try:
        metadata = metadata_from_json(text, f"session {id!r}")
    except StoreCorruptError:
        metadata = None
    if metadata is None:
        raise db.corrupt(f"session {id!r} cannot be read: its metadata is not a JSON object;",
                         id)  # unchained: the JSON error may quote the stored text
    return SessionInfo(id=id, messages=int(length), created_at=float(created_at),
                       updated_at=float(updated_at), metadata=metadata)
