"""The PostgreSQL store's mailbox primitives: rows in ``lousho_mail`` of the store's schema
(created on first use); taking is one ``UPDATE ... RETURNING`` (exactly one process gets
each mail); an owner in another process notices new mail by the table's sequence."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._mail import Mail
from ._postgres_db import Conn, Db

__all__ = ["PostgresMailOps"]

_T = TypeVar("_T")
_TABLE = (
    "CREATE TABLE IF NOT EXISTS {s}.lousho_mail (seq BIGSERIAL PRIMARY KEY, mail_id TEXT NOT "
    "NULL UNIQUE, session_id TEXT NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL, "
    "posted_at DOUBLE PRECISION NOT NULL, taken BOOLEAN NOT NULL DEFAULT false)"
)


class PostgresMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a PostgreSQL store's pool."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._ready = False

    def _run(self, what: str, fn: Callable[[Conn], _T]) -> _T:
        def body(c: Conn) -> _T:
            if not self._ready:
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                              (f"lousho mail {self._db.schema}",))
                    c.execute(self._db.q(_TABLE))
                self._ready = True
            with c.transaction():
                return fn(c)

        return self._db.run(what, body)

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float) -> None:
        self._run("post to a session's mailbox", lambda c: c.execute(self._db.q(
            "INSERT INTO {s}.lousho_mail (mail_id, session_id, kind, data, posted_at) "
            "VALUES (%s, %s, %s, %s, %s)"), (mail_id, session_id, kind, data, posted_at)))

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        if not session_ids:
            return []

        def fn(c: Conn) -> list[Any]:
            return list(c.execute(self._db.q(
                "UPDATE {s}.lousho_mail SET taken = true WHERE taken = false AND "
                "session_id = ANY(%s) RETURNING seq, mail_id, session_id, kind, data, "
                "posted_at"), (list(session_ids),)).fetchall())

        rows = self._run("drain a session's mailbox", fn)
        return sorted((Mail(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]),
                            float(r[5])) for r in rows), key=lambda m: m.seq)

    def drop(self, mail_id: str) -> None:
        self._run("drop a mail", lambda c: c.execute(self._db.q(
            "DELETE FROM {s}.lousho_mail WHERE mail_id = %s"), (mail_id,)))

    def version(self) -> int:
        row: Any = self._run("poll the mailbox", lambda c: c.execute(self._db.q(
            "SELECT last_value + (CASE WHEN is_called THEN 1 ELSE 0 END) FROM "
            "{s}.lousho_mail_seq_seq")).fetchone())
        return int(row[0])
