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

__all__ = [
    "HISTORY",
    "INFO_COLUMNS",
    "LOAD",
    "LOAD_LEAN",
    "decode_history",
    "decode_info",
    "decode_transcript",
]

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
HISTORY = ("SELECT h.seq, h.json FROM {s}.sessions s JOIN {s}.history h"
           " ON h.session_key = s.key WHERE s.id = %s ORDER BY h.seq")


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
    if problem is not None:
        raise db.corrupt(f"session {id!r} cannot be read: {problem};", id)
    return _messages(db, id, [(r[1], r[2]) for r in rows], "message {} is not a readable "
                     "message (not JSON of a message)")


def decode_history(db: Db, id: str, rows: Sequence[tuple[Any, Any]]) -> list[Message]:
    """The messages of ``HISTORY``'s ``(seq, json)`` rows, oldest first; StoreCorruptError
    naming no stored content when one is missing or unreadable."""
    for i, (seq, _) in enumerate(rows):
        if seq != i:
            raise db.corrupt(f"session {id!r} cannot be read: its history has no message {i} "
                             "(rows are missing or damaged);", id)
    return _messages(db, id, rows, "history message {} is not a readable message")


def _messages(db: Db, id: str, rows: Sequence[tuple[Any, Any]], problem: str
              ) -> list[Message]:
    """The messages of ``(seq, json)`` rows in order; ``problem`` (formatted with the seq)
    names a row that is not a message."""
    out: list[Message] = []
    bad = None
    for seq, text in rows:
        try:
            out.append(loads_message(text))
        except StoreCorruptError:
            bad = seq
            break
    if bad is not None:  # raised here, unchained: the codec's error may quote the text
        raise db.corrupt(f"session {id!r} cannot be read: {problem.format(bad)};", id)
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
