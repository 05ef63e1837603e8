"""The Redis store's mailbox primitives: a session's mail is a list
(``<prefix>mail:<session>``) of JSON entries in arrival order; every post increments
``<prefix>mail-version``, which an owner in another process reads at its wake-ups. Taking
is ``LRANGE`` + ``DEL`` in one transaction, so exactly one process gets each mail."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from ._mail import Mail
from ._redis_conn import Conn, as_str

__all__ = ["RedisMailOps"]


class RedisMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a Redis store's client."""

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self._lock = threading.Lock()
        self._posted: dict[str, tuple[str, str]] = {}  # mail id -> (key, entry), to drop

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float) -> None:
        key = self._c.key("mail:", session_id)
        entry = json.dumps({"mail_id": mail_id, "session_id": session_id, "kind": kind,
                            "data": data, "posted_at": posted_at})

        def fn(r: Any) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.rpush(key, entry)
            pipe.incr(self._c.key("mail-version"))
            pipe.execute()

        self._c.run("post to a session's mailbox", fn, session_id)
        with self._lock:
            self._posted[mail_id] = (key, entry)

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        keys = [self._c.key("mail:", sid) for sid in session_ids]

        def fn(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=True)
            for key in keys:
                pipe.lrange(key, 0, -1)
                pipe.delete(key)
            return list(pipe.execute())

        if not keys:
            return []
        replies = self._c.run("drain a session's mailbox", fn)
        out: list[Mail] = []
        for entries in replies[0::2]:
            for raw in entries:
                d = json.loads(as_str(raw))
                out.append(Mail(len(out), str(d["mail_id"]), str(d["session_id"]),
                                str(d["kind"]), str(d["data"]), float(d["posted_at"])))
        out.sort(key=lambda m: m.posted_at)
        return out

    def drop(self, mail_id: str) -> None:
        with self._lock:
            found = self._posted.pop(mail_id, None)
        if found is not None:
            key, entry = found
            self._c.run("drop a mail", lambda r: r.lrem(key, 1, entry))

    def version(self) -> int:
        raw = self._c.run("poll the mailbox", lambda r: r.get(self._c.key("mail-version")))
        return 0 if raw is None else int(as_str(raw))
