"""The SQLite store's mailbox primitives: rows in ``lousho_mail`` (created on first use);
an owner in another process notices new mail by ``PRAGMA data_version``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._mail import Mail
from ._sqlite_db import Conn, Db

__all__ = ["SqliteMailOps"]

_T = TypeVar("_T")
_TABLE = (
    "CREATE TABLE IF NOT EXISTS lousho_mail (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "mail_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, kind TEXT NOT NULL, "
    "data TEXT NOT NULL, posted_at REAL NOT NULL, taken INTEGER NOT NULL DEFAULT 0, "
    "poster TEXT NOT NULL DEFAULT '')"
)
_COLS = "seq, mail_id, session_id, kind, data, posted_at, poster"
_INDEX = "CREATE INDEX IF NOT EXISTS lousho_mail_open ON lousho_mail (session_id, taken)"


class SqliteMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a SQLite store's connection."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._ready = False

    def _run(self, what: str, fn: Callable[[Conn], _T], write: bool = False) -> _T:
        def body(c: Conn) -> _T:
            if not self._ready:
                c.execute(_TABLE)
                c.execute(_INDEX)
                cols: Any = c.execute("PRAGMA table_info(lousho_mail)").fetchall()
                if "poster" not in {str(r[1]) for r in cols}:  # a table of an earlier build
                    c.execute("ALTER TABLE lousho_mail ADD COLUMN poster TEXT NOT NULL "
                              "DEFAULT ''")
                self._ready = True
            if not write:
                return fn(c)
            c.execute("BEGIN IMMEDIATE")
            try:
                out = fn(c)
            except BaseException:
                c.rollback()
                raise
            c.commit()
            return out

        return self._db.run(what, body, sync=False)

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        self._run("post to a session's mailbox", lambda c: c.execute(
            "INSERT INTO lousho_mail (mail_id, session_id, kind, data, posted_at, poster) "
            "VALUES (?, ?, ?, ?, ?, ?)", (mail_id, session_id, kind, data, posted_at, poster)),
            write=True)

    def line(self, session_id: str) -> list[Mail]:
        rows: Any = self._run("read a session's mailbox", lambda c: c.execute(
            f"SELECT {_COLS} FROM lousho_mail WHERE session_id = ? ORDER BY seq",
            (session_id,)).fetchall())
        return [_mail(r) for r in rows]

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        marks = ",".join("?" * len(session_ids))

        def fn(c: Conn) -> list[Mail]:
            rows: Any = c.execute(
                f"SELECT {_COLS} FROM lousho_mail "
                f"WHERE taken = 0 AND session_id IN ({marks}) ORDER BY seq",
                tuple(session_ids)).fetchall()
            if rows:
                c.executemany("UPDATE lousho_mail SET taken = 1 WHERE seq = ?",
                              [(r[0],) for r in rows])
            return [_mail(r) for r in rows]

        if not session_ids:
            return []
        any_open: Any = self._run("look at a session's mailbox", lambda c: c.execute(
            f"SELECT 1 FROM lousho_mail WHERE taken = 0 AND session_id IN ({marks}) LIMIT 1",
            tuple(session_ids)).fetchone())
        if any_open is None:  # the common case: no write transaction at all
            return []
        return self._run("drain a session's mailbox", fn, write=True)

    def drop(self, mail_id: str, session_id: str = "") -> None:
        self._run("drop a mail", lambda c: c.execute(
            "DELETE FROM lousho_mail WHERE mail_id = ?", (mail_id,)), write=True)

    def prune(self, before: float) -> int:
        cur: Any = self._run("prune the mailbox", lambda c: c.execute(
            "DELETE FROM lousho_mail WHERE posted_at < ?", (before,)), write=True)
        return int(cur.rowcount)

    def version(self) -> int:
        row: Any = self._db.run("poll the mailbox",
                                lambda c: c.execute("PRAGMA data_version").fetchone(),
                                sync=False)
        return int(row[0])


def _mail(r: Any) -> Mail:
    return Mail(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), float(r[5]), str(r[6]))
