"""The Redis store's live tail of the event log (:class:`~._events.LiveOps`): rows sent
with ``PUBLISH`` on ``<prefix>live:<turn>`` as ``"<seq> <row>"`` by a script that checks
the head's owner and records the seq in the head (field ``live_seq``); a write of the log
publishes ``w`` there while the turn is watched. A reader subscribes on a connection of
its own and marks the turn watched with ``<prefix>turn-watch:<turn>`` (a key that expires,
renewed while it reads)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as redis_errors

from ._events import LIVE_LOG, WATCH_TTL_S, WatchCache, WatchMark
from ._redis_conn import Conn, as_str, ms

__all__ = ["RedisLive", "RedisTail"]

_log = logging.getLogger("lousho_sync.stores")

_SUBSCRIBE_S = 5.0
"""How long a reader waits for its subscription to be confirmed."""

# KEYS: head. ARGV: owner, channel, last seq, then the payloads. Published only while
# ``owner`` holds the head (a takeover's begin replaced it: nothing); the seq kept.
_SEND = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'live_seq', ARGV[3])
for i = 4, #ARGV do redis.call('PUBLISH', ARGV[2], ARGV[i]) end
return 1
"""


class RedisLive(WatchCache):
    """:class:`~._events.LiveOps` on a Redis store's client."""

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self._send = conn.client.register_script(_SEND)
        super().__init__()

    def channel(self, turn_id: str) -> str:
        """The turn's channel."""
        return self._c.key("live:", turn_id)

    def watch_key(self, turn_id: str) -> str:
        """The key of the readers' mark."""
        return self._c.key("turn-watch:", turn_id)

    def head_key(self, turn_id: str) -> str:
        return self._c.key("turn-head:", turn_id)

    def _ask(self, turn_id: str) -> bool:
        key = self.watch_key(turn_id)
        return bool(self._c.run("look for readers of a turn", lambda r: r.exists(key)))

    def send(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str) -> None:
        if not rows:
            return
        keys = [self.head_key(turn_id)]
        args: list[str | int] = [owner, self.channel(turn_id), rows[-1][0],
                                 *(f"{s} {r}" for s, r in rows)]
        self._c.run("send events live", lambda r: self._send(keys=keys, args=args, client=r))

    def sent(self, turn_id: str) -> int:
        key = self.head_key(turn_id)
        value = self._c.run("read a turn's event log", lambda r: r.hget(key, "live_seq"))
        return -1 if value is None else int(as_str(value))

    def tail(self, turn_id: str) -> RedisTail:
        return RedisTail(self, self._c, turn_id)

    def mark(self, turn_id: str) -> None:
        """Mark the turn watched for :data:`WATCH_TTL_S`."""
        key = self.watch_key(turn_id)
        self._c.run("mark a turn watched", lambda r: r.set(key, "1", px=ms(WATCH_TTL_S)))


class RedisTail:
    """A reader's subscription (:class:`~._events.LiveTail`) on a pub/sub connection of
    its own. Should the connection fail, it falls back to waiting on the log
    (``XREAD BLOCK``) and says so with None each time."""

    def __init__(self, live: RedisLive, conn: Conn, turn_id: str) -> None:
        self._live = live
        self._c = conn
        self._turn = turn_id
        self._lock = threading.Lock()
        channel = live.channel(turn_id)

        def subscribe(r: Any) -> Any:
            pubsub = r.pubsub()
            try:
                pubsub.subscribe(channel)
                deadline = time.monotonic() + _SUBSCRIBE_S
                while True:  # confirmed: what is published from now on comes
                    left = deadline - time.monotonic()
                    message = pubsub.get_message(timeout=max(0.0, left))
                    if message is not None and message["type"] == "subscribe":
                        return pubsub
                    if left <= 0:
                        raise redis_errors.TimeoutError(
                            f"the subscription to {channel!r} was not confirmed in time")
            except BaseException:
                pubsub.close()
                raise

        self._pubsub: Any = conn.run("follow a turn live", subscribe)
        self._watch = WatchMark(live.mark, turn_id)
        self._watch.renew()

    def get(self, after: int, timeout: float) -> list[tuple[int, str] | None]:
        out: list[tuple[int, str] | None] = []
        if self._watch.renew():
            out.append(LIVE_LOG)
        timeout = self._watch.wait_at_most(timeout)
        with self._lock:
            pubsub = self._pubsub
        if pubsub is None:  # the pub/sub connection failed: the log's own wait
            self._live_wait(after, timeout)
            return [LIVE_LOG]
        try:
            message = pubsub.get_message(timeout=timeout)
            while message is not None:
                if message["type"] == "message":
                    out.append(_row(message["data"]))
                message = pubsub.get_message(timeout=0.0)
        except (redis_errors.RedisError, OSError, ValueError):
            _log.debug("the live tail of turn %s failed; reading the log", self._turn,
                       exc_info=True)
            self.close()
            out.append(LIVE_LOG)
        return out

    def _live_wait(self, after: int, timeout: float) -> None:
        rows_key = self._c.key("events:", self._turn)
        block = max(1, int(timeout * 1000))
        wait: Callable[[Any], Any] = lambda r: r.xread(  # noqa: E731
            {rows_key: f"0-{after + 1}"}, count=1, block=block)
        self._c.run("wait for events", wait)

    def close(self) -> None:
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # pragma: no cover - closing a broken connection
                pass


def _row(data: Any) -> tuple[int, str] | None:
    """A live message's row; None for ``w`` (a log write) or what is not a row."""
    text = as_str(data)
    seq, _, row = text.partition(" ")
    if not row or not seq.lstrip("-").isdigit():
        return LIVE_LOG
    return int(seq), row
