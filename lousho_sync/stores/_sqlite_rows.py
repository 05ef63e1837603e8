"""Reading a transcript from a possibly damaged SQLite file (for :mod:`.sqlite`).

SQLite keeps no checksums. A load compares the rows it finds with the session's recorded
length and positions, decodes the rows itself (as bytes: so text that is not UTF-8 never
reaches an error message), and on a miss reads the neighbouring entries of the session-id
index, where a damaged entry shows. Problems are described without any stored content.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..catalog import SessionInfo, metadata_from_json
from ..codec import loads_message
from ..errors import StoreCorruptError
from ..messages import Message

__all__ = [
    "INFO_COLUMNS",
    "Rows",
    "decode_history",
    "decode_info",
    "decode_transcript",
    "load_rows",
    "quotes_stored_text",
]

INFO_COLUMNS = "id, length, created_at, updated_at, CAST(metadata AS BLOB)"
"""The ``sessions`` columns :func:`decode_info` reads (the metadata as bytes)."""

_LOAD = (
    "SELECT s.length, m.id & 4294967295, CAST(m.json AS BLOB) FROM sessions s LEFT JOIN"
    " messages m ON m.id >= s.key * ?2 AND m.id < (s.key + 1) * ?2 WHERE s.id = ?1"
    " ORDER BY m.id"
)
"""A session's recorded length and its rows, as bytes (so text that is not UTF-8 reaches
:func:`decode_transcript` instead of an error quoting it)."""


_NEIGHBOURS = (
    "SELECT id, key FROM sessions WHERE id > ?1 ORDER BY id LIMIT 1",
    "SELECT id, key FROM sessions WHERE id < ?1 ORDER BY id DESC LIMIT 1",
)


_ANY_ROW = "SELECT key FROM sessions NOT INDEXED LIMIT 1"
Rows = list[tuple[int, int | None, bytes | None]]


def load_rows(c: sqlite3.Connection, id: str, span: int) -> Rows | None:
    """``_LOAD``'s rows; None when the sessions index is seen damaged."""
    rows: Rows = c.execute(_LOAD, (id, span)).fetchall()
    if rows:
        return rows
    # A damaged index entry reads as "absent". Reading the entries next to it makes SQLite
    # report the damage (SQLITE_CORRUPT) or shows an impossible entry; an index with no
    # entry at all over a table with rows is damaged too. A few seeks, on a miss only, all
    # in one read snapshot: another process may create the session between two statements.
    own = not c.in_transaction
    if own:
        c.execute("BEGIN")
    try:
        rows = c.execute(_LOAD, (id, span)).fetchall()
        if rows:
            return rows
        found = 0
        for sql in _NEIGHBOURS:
            for other, key in c.execute(sql, (id,)).fetchall():
                found += 1
                if type(other) is not str or type(key) is not int:
                    return None
        if not found and c.execute(_ANY_ROW).fetchone() is not None:
            return None
        return rows
    finally:
        if own:
            c.execute("COMMIT")


def decode_transcript(rows: Rows) -> tuple[list[Message], str | None]:
    """The messages of ``_LOAD``'s rows, or a problem that names no stored content: rows
    missing or out of place for the recorded length, or a row that is not a message."""
    length = rows[0][0]
    if type(length) is not int or length < 0:
        return [], "its recorded length is damaged"
    if rows[0][1] is None:
        return [], f"it records {length} messages but none is stored"
    if len(rows) != length or any(seq != i for i, (_, seq, _) in enumerate(rows)):
        found = sum(1 for i, (_, seq, _) in enumerate(rows) if seq == i)
        return [], (
            f"it records {length} messages but {len(rows)} rows are stored, {found} of them "
            "in place (rows are missing or damaged)"
        )
    out: list[Message] = []
    problem = None
    for seq, raw in ((r[1], r[2]) for r in rows):
        try:
            text = raw.decode("utf-8") if type(raw) is bytes else None
        except UnicodeDecodeError as exc:
            problem = f"message {seq} is not valid UTF-8 (byte {exc.start} of the row)"
            break
        try:
            if text is None:
                raise StoreCorruptError("no text")
            out.append(loads_message(text))
        except StoreCorruptError:
            problem = f"message {seq} is not a readable message (not JSON of a message)"
            break
    return ([], problem) if problem is not None else (out, None)


def decode_info(row: Sequence[Any], path: str) -> SessionInfo:
    """The catalog entry of an ``INFO_COLUMNS`` row; StoreCorruptError naming the path and
    the session (never the stored content) when the row is damaged."""
    id, length, created_at, updated_at, raw = row
    if type(id) is not str:
        raise StoreCorruptError(
            f"a session id in the SQLite store at {path} is damaged (the file is damaged; "
            "it was left as it was)",
            path=path,
        )
    where = f"session {id!r} in the SQLite store at {path}"
    problem = None
    if type(length) is not int or length < 0:
        problem = "its recorded length is damaged"
    elif not all(type(t) in (int, float) for t in (created_at, updated_at)):
        problem = "its recorded times are damaged"
    elif raw is not None and type(raw) is not bytes:
        problem = "its metadata is damaged"
    text = None
    if problem is None and raw is not None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"its metadata is not valid UTF-8 (byte {exc.start})"
    if problem is not None:
        raise StoreCorruptError(
            f"{where} cannot be read: {problem} (the file is damaged; it was left as it was; "
            "stored content is not shown)",
            path=path,
            session_id=id,
        )
    try:
        metadata = metadata_from_json(text, where)
    except StoreCorruptError as exc:
        raise StoreCorruptError(str(exc), path=path, session_id=id) from None
    return SessionInfo(id=id, messages=length, created_at=float(created_at),
                       updated_at=float(updated_at), metadata=metadata)


def decode_history(rows: Sequence[tuple[Any, Any]]) -> tuple[list[Message], str | None]:
    """The messages of ``(position, json bytes)`` history rows, oldest first, or a problem
    that names no stored content."""
    out: list[Message] = []
    for i, (seq, raw) in enumerate(rows):
        if seq != i:
            return [], f"its history has {len(rows)} rows but row {i} is out of place"
        try:
            if type(raw) is not bytes:
                raise StoreCorruptError("no text")
            out.append(loads_message(raw.decode("utf-8")))
        except (StoreCorruptError, UnicodeDecodeError):
            return [], f"history message {i} is not a readable message"
    return out, None


def quotes_stored_text(exc: BaseException) -> bool:
    """Whether the driver's error text quotes a stored value: Python's sqlite3 reports a
    column that is not valid UTF-8 with the column's text."""
    return str(exc).startswith("Could not decode to UTF-8")
