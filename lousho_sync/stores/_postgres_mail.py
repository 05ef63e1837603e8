"""The PostgreSQL store's mailbox primitives: rows in the UNLOGGED table ``lousho_mail`` of
the store's schema (created on first use; never fsynced: what became of a mail is read from
the transcript, so an input whose mail a server crash loses is run by its waiting poster).
Taking is one ``UPDATE ... RETURNING`` (exactly one process gets each mail). A post ends
with ``NOTIFY`` on the schema's mail channel (the session id as payload), which wakes the
owner through the store's listening connection (:mod:`._postgres_listen`, shared with the
event log)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._mail import Mail, Wake
from ._postgres_db import Conn, Db
from ._postgres_listen import listener

__all__ = ["PostgresMailOps"]

_T = TypeVar("_T")
_TABLE = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.lousho_mail (seq BIGSERIAL PRIMARY KEY, "
    "mail_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, kind TEXT NOT NULL, "
    "data TEXT NOT NULL, posted_at DOUBLE PRECISION NOT NULL, taken BOOLEAN NOT NULL DEFAULT "
    "false, poster TEXT NOT NULL DEFAULT '')"
)
_POSTER = "ALTER TABLE {s}.lousho_mail ADD COLUMN IF NOT EXISTS poster TEXT NOT NULL DEFAULT ''"
_COLS = "seq, mail_id, session_id, kind, data, posted_at, poster"


class PostgresMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a PostgreSQL store's pool."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._ready = False
        self._channel = f"lousho_mail_{db.schema}"

    def _run(self, what: str, fn: Callable[[Conn], _T]) -> _T:
        def body(c: Conn) -> _T:
            if not self._ready:
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                              (f"lousho mail {self._db.schema}",))
                    c.execute(self._db.q(_TABLE))
                    c.execute(self._db.q(_POSTER))  # a table of an earlier build
                self._ready = True
            with c.transaction():
                return fn(c)

        return self._db.run(what, body)

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        def fn(c: Conn) -> None:
            c.execute(self._db.q(
                "INSERT INTO {s}.lousho_mail (mail_id, session_id, kind, data, posted_at, "
                "poster) VALUES (%s, %s, %s, %s, %s, %s)"),
                (mail_id, session_id, kind, data, posted_at, poster))
            c.execute("SELECT pg_notify(%s, %s)", (self._channel, session_id))

        self._run("post to a session's mailbox", fn)

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        if not session_ids:
            return []

        def fn(c: Conn) -> list[Any]:
            return list(c.execute(self._db.q(
                "UPDATE {s}.lousho_mail SET taken = true WHERE taken = false AND "
                f"session_id = ANY(%s) RETURNING {_COLS}"), (list(session_ids),)).fetchall())

        rows = self._run("drain a session's mailbox", fn)
        return sorted((_mail(r) for r in rows), key=lambda m: m.seq)

    def line(self, session_id: str) -> list[Mail]:
        rows: Any = self._run("read a session's mailbox", lambda c: c.execute(self._db.q(
            f"SELECT {_COLS} FROM {{s}}.lousho_mail WHERE session_id = %s ORDER BY seq"),
            (session_id,)).fetchall())
        return [_mail(r) for r in rows]

    def drop(self, mail_id: str, session_id: str = "") -> None:
        self._run("drop a mail", lambda c: c.execute(self._db.q(
            "DELETE FROM {s}.lousho_mail WHERE mail_id = %s"), (mail_id,)))

    def prune(self, before: float) -> int:
        cur: Any = self._run("prune the mailbox", lambda c: c.execute(self._db.q(
            "DELETE FROM {s}.lousho_mail WHERE posted_at < %s"), (before,)))
        return int(cur.rowcount)

    def version(self) -> int:
        # the newest committed mail (the sequence would move before its row is visible)
        row: Any = self._run("poll the mailbox", lambda c: c.execute(self._db.q(
            "SELECT coalesce(max(seq), 0) FROM {s}.lousho_mail")).fetchone())
        return int(row[0])

    def subscribe(self, wake: Wake) -> Callable[[], None]:
        return listener(self._db).subscribe(self._channel, wake)


def _mail(r: Any) -> Mail:
    return Mail(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), float(r[5]), str(r[6]))
