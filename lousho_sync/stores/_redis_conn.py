"""The Redis connection of :mod:`lousho_sync.stores.redis`: the client, its address (never
the password), the key prefix, the registered scripts, the layout check, error translation
and the one-off tokens that make a retried script idempotent.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import uuid
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis import exceptions as redis_errors
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ..errors import (
    ConfigError,
    StoreCorruptError,
    StoreDurabilityWarning,
    StoreTooNewError,
    StoreUnavailableError,
)
from ..records import Fence
from . import _redis_scripts as lua
from ._common import encrypted_refusal, unstorable
from ._engine.backend import Backend, Translation

__all__ = [
    "CONNECT_TIMEOUT_S",
    "LAYOUT_VERSION",
    "SOCKET_TIMEOUT_S",
    "Conn",
    "as_str",
    "decoded",
    "ms",
    "op_token",
]

LAYOUT_VERSION = 3
"""The key layout this release writes (the ``<prefix>layout`` key)."""

CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 10.0

_T = TypeVar("_T")
_log = logging.getLogger("lousho_sync.stores.redis")


def ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def as_str(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _address(client: redis.Redis) -> tuple[str, str | None]:
    """``redis://host:port/db`` (never the password), and the password to scrub."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    db = kw.get("db", 0)
    if kw.get("path"):
        address = f"unix://{kw['path']}?db={db}"
    else:
        scheme = "rediss" if "SSL" in pool.connection_class.__name__ else "redis"
        address = f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{db}"
    password = kw.get("password")
    return address, password if isinstance(password, str) and password else None


class Conn(Backend):
    """The client, its address, the key prefix and the scripts. Thread-safe: ``lock``
    guards ``closed`` and ``layout_checked``."""

    kind = "Redis"
    store_class = "RedisStore"
    address: str

    def __init__(self, url_or_client: str | redis.Redis, prefix: str) -> None:
        if not isinstance(prefix, str):
            raise ConfigError(f"prefix must be a str, got {type(prefix).__name__}")
        if isinstance(url_or_client, str):
            try:
                self.client = redis.Redis.from_url(
                    url_or_client,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    socket_timeout=SOCKET_TIMEOUT_S,
                    retry=Retry(ExponentialBackoff(cap=0.25, base=0.01), 3),
                    health_check_interval=30,
                )
            except ValueError as exc:
                raise ConfigError(
                    f"not a Redis URL: {exc} (use redis://[[user]:password@]host:port/db, "
                    "rediss://… or unix://…)"
                ) from exc
            self.owns_client = True
        elif isinstance(url_or_client, redis.Redis):
            self.client = url_or_client
            self.owns_client = False
        else:
            raise ConfigError(
                "RedisStore needs a Redis URL or a redis.Redis client, got "
                f"{type(url_or_client).__name__}"
            )
        address, password = _address(self.client)
        super().__init__(f"in the Redis store at {address}", address=address, secret=password)
        self.prefix = prefix
        self.table = (
            Translation(
                (redis_errors.ConnectionError, redis_errors.TimeoutError,
                 redis_errors.ReadOnlyError),
                StoreUnavailableError, "is the server running and reachable?"),
            Translation(lambda exc: isinstance(exc, redis_errors.ResponseError)
                        and "WRONGTYPE" in str(exc), StoreCorruptError,
                        f"a key under the prefix {prefix!r} holds another kind of value; it "
                        "was left as it was: choose another prefix"),
            Translation(redis_errors.OutOfMemoryError, StoreUnavailableError,
                        "the server is out of memory"),
        )
        self.layout_checked = False
        self.wrapped = False  # used through EncryptedStore (mark_encrypted)
        self.mark_checked = False  # the encryption mark was checked (or written)
        reg = self.client.register_script
        self.save_script = reg(lua.SAVE)
        self.append_script = reg(lua.APPEND)
        self.revision_script = reg(lua.REVISION)
        self.ids_script = reg(lua.IDS)
        self.compact_script = reg(lua.COMPACT)
        self.create_script = reg(lua.CREATE)
        self.set_metadata_script = reg(lua.SET_METADATA)
        self.delete_script = reg(lua.DELETE)
        self.session_page_script = reg(lua.SESSION_PAGE)
        self.acquire_script = reg(lua.ACQUIRE)
        self.take_over_script = reg(lua.TAKE_OVER)
        self.renew_script = reg(lua.RENEW)
        self.release_script = reg(lua.RELEASE)
        self.resolve_script = reg(lua.RESOLVE)
        self.checkpoint_save_script = reg(lua.CHECKPOINT_SAVE)
        self.checkpoint_delete_script = reg(lua.CHECKPOINT_DELETE)
        self.approval_create_script = reg(lua.APPROVAL_CREATE)
        self.prune_sessions_script = reg(lua.PRUNE_SESSIONS)
        self.prune_checkpoints_script = reg(lua.PRUNE_CHECKPOINTS)
        self.prune_approvals_script = reg(lua.PRUNE_APPROVALS)
        self.layout_script = reg(lua.LAYOUT)

    def key(self, *parts: str) -> str:
        """The Redis key ``<prefix><parts joined>``."""
        return self.prefix + "".join(parts)

    def fence_key(self, fence: Fence | None) -> str:
        """The key of ``fence``'s session token (a placeholder for an unfenced write)."""
        return self.key("fence:", "" if fence is None else fence.session_id)

    @staticmethod
    def refused(out: Any) -> int:
        """The newest token when ``out``, the reply of a fenced script, says it refused
        the write (0: written)."""
        return int(out[1]) if out[0] == -1 else 0

    def run(self, what: str, fn: Callable[[redis.Redis], _T], session_id: str | None = None) -> _T:
        """Call ``fn(client)``; translate redis-py errors into StoreErrors."""
        with self.lock:
            self.check_open(session_id)
            check = not self.layout_checked
            mark = not self.mark_checked
        try:
            if check:
                self._check_layout()
            if mark:
                self._check_mark()
            return fn(self.client)
        except redis_errors.RedisError as exc:
            raise self.translate(exc, what, session_id) from exc
        except UnicodeEncodeError as exc:  # a surrogate in a key or argument
            raise unstorable(what, exc.object[exc.start], session_id) from None

    def _check_layout(self) -> None:
        stored = self.layout_script(keys=[self.key("layout")], args=[LAYOUT_VERSION])
        text = as_str(stored)
        if not text.isdigit():
            raise StoreCorruptError(
                f"the Redis store at {self.address} has {text!r} in {self.key('layout')!r}, "
                "not a layout version: choose another prefix",
                address=self.address,
            )
        if int(text) > LAYOUT_VERSION:
            raise StoreTooNewError(
                f"the Redis store at {self.address} (prefix {self.prefix!r}) has layout "
                f"version {text}, written by a newer lousho; this release reads up to version "
                f"{LAYOUT_VERSION}: upgrade lousho",
                address=self.address,
            )
        with self.lock:
            self.layout_checked = True
        _check_persistence(self.client, self.address)

    def mark_encrypted(self) -> None:
        """Write the encryption mark at the next call and accept this store's use."""
        with self.lock:
            self.wrapped = True
            self.mark_checked = False

    def _check_mark(self) -> None:
        key = self.key("encrypted")
        if self.wrapped:
            self.client.set(key, "1", nx=True)  # (no write when it is marked already)
        elif self.client.exists(key):
            raise encrypted_refusal(f"at {self.address} (prefix {self.prefix!r})",
                                    address=self.address)
        with self.lock:
            self.mark_checked = True

    def corrupt(
        self, exc: Exception, what: str, session_id: str | None = None
    ) -> StoreCorruptError:
        """A StoreCorruptError naming the key and address, for a codec error about ``what``."""
        return self.unreadable(what, exc, session_id)

    def shut(self) -> None:
        """Close the client when this store made it."""
        if self.owns_client:
            self.client.close()


_persistence_checked: set[str] = set()
_persistence_lock = threading.Lock()


def _config(client: redis.Redis, name: str) -> str:
    """A server setting as text ("" when the server does not report it)."""
    reply: dict[Any, Any] = client.config_get(name)
    return next((as_str(v) for k, v in reply.items() if as_str(k) == name), "")


def _check_persistence(client: redis.Redis, address: str) -> None:
    """Warn once per address when the server does not append every write to disk."""
    with _persistence_lock:
        if address in _persistence_checked:
            return
        _persistence_checked.add(address)
    try:
        aof, save = _config(client, "appendonly"), _config(client, "save")
    except redis_errors.ResponseError as exc:  # CONFIG disabled, renamed or not permitted
        _log.info("could not tell whether the Redis server at %s persists writes "
                  "(CONFIG GET failed: %s)", address, exc)
        return
    if aof.lower() == "yes":
        return
    if save.strip():
        loss = (f"only RDB snapshots (save {save!r}): a restart loses every turn written "
                "since the last snapshot")
    else:
        loss = "no persistence at all (appendonly no, save ''): a restart loses every session"
    text = (
        f"the Redis server at {address} has {loss}, silently. Turn on the append-only file "
        "(CONFIG SET appendonly yes, and in redis.conf: appendonly yes, appendfsync "
        "everysec or always) to keep acknowledged turns."
    )
    _log.warning("%s", text)
    warnings.warn(text, StoreDurabilityWarning, stacklevel=2)


class _Tokens:
    """One-off tokens: a random per-process base (renewed in a forked child) + a counter."""

    def __init__(self) -> None:
        self.renew()
        if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork
            os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.base = uuid.uuid4().hex
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.base}-{next(self.counter)}"


op_token = _Tokens()
"""A new one-off token (``op_token()``)."""


def decoded(value: object) -> str:
    """A stored value as str; UnicodeDecodeError (a ValueError) for bad bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


