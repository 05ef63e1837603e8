"""Reading a transcript from a possibly damaged SQLite file (for :mod:`.sqlite`).

SQLite keeps no checksums. A load compares the rows it finds with the session's recorded
length and positions, decodes the rows itself (as bytes: so text that is not UTF-8 never
reaches an error message), and on a miss reads the neighbouring entries of the session-id
index, where a damaged entry shows. Problems are described without any stored content.
"""

from __future__ import annotations

import sqlite3

from ..codec import loads_message
from ..errors import StoreCorruptError
from ..messages import Message

__all__ = ["Rows", "decode_transcript", "load_rows", "quotes_stored_text"]

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


def quotes_stored_text(exc: BaseException) -> bool:
    """Whether the driver's error text quotes a stored value: Python's sqlite3 reports a
    column that is not valid UTF-8 with the column's text."""
    return str(exc).startswith("Could not decode to UTF-8")
