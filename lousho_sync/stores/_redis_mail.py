"""The Redis store's mailbox primitives: a session's mail is a list
(``<prefix>mail:<session>``) of JSON entries in arrival order; every post increments
``<prefix>mail-version`` and adds the session id to the stream ``<prefix>mail-wake``, which
an owner's thread reads with ``XREAD BLOCK`` from the last entry it saw (a wake-up is never
lost while the server keeps the stream). Taking is ``LRANGE`` + ``DEL`` in one transaction,
so exactly one process gets each mail."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._mail import Mail, Wake
from ._redis_conn import Conn, as_str

__all__ = ["RedisMailOps"]

_log = logging.getLogger("lousho_sync.stores")

BLOCK_MS = 500
"""How long one ``XREAD BLOCK`` waits (a stopped subscription ends within it)."""
_WAKE_LEN = 1000  # entries kept in the wake stream (about)
_RETRY_S = 0.5


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
            pipe.xadd(self._c.key("mail-wake"), {"s": session_id}, maxlen=_WAKE_LEN,
                      approximate=True)
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

    def subscribe(self, wake: Wake) -> Callable[[], None]:
        stop = threading.Event()
        threading.Thread(target=self._listen, args=(wake, stop), daemon=True,
                         name="lousho-mail-wake").start()
        return stop.set

    @staticmethod
    def _reader(key: str, since: str) -> Callable[[Any], Any]:
        return lambda r: r.xread({key: since}, count=100, block=BLOCK_MS)

    def _listen(self, wake: Wake, stop: threading.Event) -> None:
        key = self._c.key("mail-wake")
        last: str | None = None
        while not stop.is_set():
            try:
                if last is None:  # (re)start from the newest entry: earlier ones are seen
                    newest: Any = self._c.run("read the mail wake-ups",
                                              lambda r: r.xrevrange(key, count=1))
                    last = as_str(newest[0][0]) if newest else "0-0"
                    wake(None)
                reply: Any = self._c.run("wait for mail", self._reader(key, last))
            except Exception:
                _log.debug("the mail wake-up reader lost its connection; reading again",
                           exc_info=True)
                last = None
                stop.wait(_RETRY_S)
                continue
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = as_str(entry_id)
                    sid = fields.get(b"s", fields.get("s"))
                    wake(None if sid is None else as_str(sid))
