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
from functools import partial
from typing import Any

from ._mail import Mail, Wake
from ._redis_conn import Conn, as_str

__all__ = ["RedisMailOps"]

_log = logging.getLogger("lousho_sync.stores")

BLOCK_MS = 500
"""How long one ``XREAD BLOCK`` waits (a stopped subscription ends within it)."""
_WAKE_LEN = 1000  # entries kept in the wake stream (about)
_RETRY_S = 0.5


# KEYS: list, line, entries, version, wake. ARGV: entry, mail id, session id, wake length.
_POST = """
local v = redis.call('INCR', KEYS[4])
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], v, ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 's', ARGV[3])
"""

# KEYS: list, line, entries. ARGV: mail id.
_DROP = """
local e = redis.call('HGET', KEYS[3], ARGV[1])
if e then redis.call('LREM', KEYS[1], 1, e) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
"""


class RedisMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a Redis store's client: a session's
    untaken mail is the list ``mail:<session>``; every mail not dropped yet is in the line
    ``mail-line:<session>`` (a sorted set by arrival) with its entry in the hash
    ``mail-entries:<session>``."""

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self._post = conn.client.register_script(_POST)
        self._drop = conn.client.register_script(_DROP)

    def _keys(self, session_id: str) -> list[str]:
        c = self._c
        return [c.key("mail:", session_id), c.key("mail-line:", session_id),
                c.key("mail-entries:", session_id)]

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        entry = json.dumps({"mail_id": mail_id, "session_id": session_id, "kind": kind,
                            "data": data, "posted_at": posted_at, "poster": poster})
        keys = [*self._keys(session_id), self._c.key("mail-version"), self._c.key("mail-wake")]
        self._c.run("post to a session's mailbox", lambda r: self._post(
            keys, [entry, mail_id, session_id, _WAKE_LEN], r), session_id)

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
        raws = [raw for entries in replies[0::2] for raw in entries]
        return [_mail(raw, i) for i, raw in enumerate(raws)]  # each session's in arrival order

    def line(self, session_id: str) -> list[Mail]:
        _, line, entries = self._keys(session_id)

        def fn(r: Any) -> list[Any]:
            ids = [as_str(i) for i in r.zrange(line, 0, -1)]
            return list(r.hmget(entries, ids)) if ids else []

        raws = self._c.run("read a session's mailbox", fn, session_id)
        return [_mail(raw, i) for i, raw in enumerate(raws) if raw is not None]

    def drop(self, mail_id: str, session_id: str) -> None:
        keys = self._keys(session_id)
        self._c.run("drop a mail", lambda r: self._drop(keys, [mail_id], r), session_id)

    def prune(self, before: float) -> int:
        c = self._c
        pattern = c.key("mail-line:") + "*"
        lines: Any = c.run("list the mailboxes", lambda r: list(r.scan_iter(match=pattern,
                                                                             count=500)))
        count = 0
        start = len(c.key("mail-line:"))
        for line in lines:
            sid = as_str(line)[start:]
            key = c.key("mail-entries:", sid)
            entries: Any = c.run("read a session's mailbox", partial(_hgetall, key), sid)
            for mail_id, raw in entries.items():
                try:
                    old = float(json.loads(as_str(raw))["posted_at"]) < before
                except (ValueError, KeyError, TypeError):
                    old = True  # unreadable: nothing can use it
                if old:
                    self.drop(as_str(mail_id), sid)
                    count += 1
        return count

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


def _hgetall(key: str, r: Any) -> Any:
    return r.hgetall(key)


def _mail(raw: Any, seq: int) -> Mail:
    d = json.loads(as_str(raw))
    return Mail(seq, str(d["mail_id"]), str(d["session_id"]), str(d["kind"]), str(d["data"]),
                float(d["posted_at"]), str(d.get("poster", "")))
