"""RedisStore: sessions, checkpoints, approvals and leases in Redis, shared by many machines.

Keys, all under ``prefix`` (default ``"lousho:"``)::

    layout                    "1": the key layout this release writes (newer is refused)
    revision                  a store-wide counter; every transcript write takes a value
    session:<id>              list, one codec JSON string per message (RPUSH per turn)
    session-meta:<id>         hash {rev, op}: the transcript's revision, the last append's token
    sessions                  sorted set id -> updated_at (for ids() and prune)
    lease:<id>                the lease holder's owner string, with a PX expiry
    checkpoint:<key>          codec JSON string
    checkpoints               sorted set key -> updated_at (prune)
    checkpoint-keys           sorted set key -> 0 (lexicographic range for keys(prefix))
    approval:<id>             hash {json, status, reason, resolved_at, op}
    approvals-pending         sorted set id -> created_at
    approvals-resolved        sorted set id -> resolved_at (prune)

Every write that must be atomic is one Lua script (in ``_redis_scripts``: ``append`` checks
``LLEN`` and ``RPUSH``es; ``save`` is ``DEL`` + ``RPUSH``; ``resolve`` changes a pending
record only) or one ``MULTI`` transaction; nothing reads and rewrites a whole transcript.
``append`` and ``resolve`` carry a one-off token, so when redis-py retries a call whose reply
was lost, the retry sees its own write and succeeds instead of reporting a conflict (or the
loss of a race it won). An approval's ``json`` is the record as created; the ``status``, ``reason``
and ``resolved_at`` fields are the truth and are laid over it on read.

Times (``updated_at``, ``resolved_at``) come from the client's clock, as in SqliteStore:
machines sharing a store should keep their clocks in sync (NTP) to well within a prune
window. Lease expiry is Redis's own (``PX``). The store assumes one Redis server (or a
primary with replicas), not Redis Cluster: scripts touch keys of several sessions.

Durability: a turn acknowledged by the store survives a redis-server restart only when the
server persists it: ``appendonly yes`` (with ``appendfsync everysec``, a crash of the server's
machine can lose the last second; ``always`` loses nothing). RDB snapshots alone (``save``)
lose what was written since the last snapshot, and a server with neither keeps nothing. On
first use the store asks the server (``CONFIG GET appendonly`` and ``save``) and, when
appendonly is off, logs a WARNING and issues a
:class:`~lousho_sync.errors.StoreDurabilityWarning`, once per server address and process. A
server where CONFIG is disabled or renamed (as on many managed services) is not warned about;
the store logs that it could not tell, at INFO.

Thread safety: redis-py clients are thread-safe (a connection pool); the store's own state
(``closed`` and the layout check) is guarded by one lock. A store used in a forked child
gets fresh connections there (redis-py resets its pool on fork).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

import attrs

try:
    import redis
    from redis import exceptions as redis_errors
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry
    from redis.typing import EncodableT, FieldT
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("RedisStore needs the redis package: pip install 'lousho[redis]'") from exc

from ..codec import (
    dumps_approval,
    dumps_checkpoint,
    dumps_message,
    loads_approval,
    loads_checkpoint,
    loads_message,
)
from ..errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidSessionIdError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreDurabilityWarning,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from ..messages import Message
from ..results import PruneResult
from . import _redis_scripts as lua
from ._lease import owner_is_dead, poll_until
from .base import ApprovalRecord, Checkpoint

__all__ = [
    "LAYOUT_VERSION",
    "RedisApprovalStore",
    "RedisCheckpointStore",
    "RedisSessionStore",
    "RedisStore",
]

_log = logging.getLogger(__name__)

LAYOUT_VERSION = 1
"""The key layout this release writes (the ``<prefix>layout`` key)."""

CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 10.0
_ID_RULE = "^[A-Za-z0-9_-]{1,128}$"
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_BATCH = 500

_T = TypeVar("_T")
_Status = Literal["pending", "approved", "denied"]


def _check_id(id: str) -> None:
    if type(id) is not str or _ID_RE.fullmatch(id) is None:
        raise InvalidSessionIdError(
            f"invalid session id {id!r}: it must match {_ID_RULE}", session_id=id
        )


def _check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ConfigError(f"a lease's ttl_s must be > 0 seconds, got {ttl_s!r}")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _str(value: object) -> str:
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


class _Conn:
    """The client, its address, the key prefix and the scripts. Thread-safe: ``lock``
    guards ``closed`` and ``layout_checked``."""

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
        self.address, self._password = _address(self.client)
        self.prefix = prefix
        self.lock = threading.Lock()
        self.closed = False
        self.layout_checked = False
        reg = self.client.register_script
        self.save_script = reg(lua.SAVE)
        self.append_script = reg(lua.APPEND)
        self.revision_script = reg(lua.REVISION)
        self.ids_script = reg(lua.IDS)
        self.acquire_script = reg(lua.ACQUIRE)
        self.take_over_script = reg(lua.TAKE_OVER)
        self.renew_script = reg(lua.RENEW)
        self.release_script = reg(lua.RELEASE)
        self.resolve_script = reg(lua.RESOLVE)
        self.prune_sessions_script = reg(lua.PRUNE_SESSIONS)
        self.prune_checkpoints_script = reg(lua.PRUNE_CHECKPOINTS)
        self.prune_approvals_script = reg(lua.PRUNE_APPROVALS)
        self.layout_script = reg(lua.LAYOUT)

    def key(self, *parts: str) -> str:
        """The Redis key ``<prefix><parts joined>``."""
        return self.prefix + "".join(parts)

    def run(self, what: str, fn: Callable[[redis.Redis], _T], session_id: str | None = None) -> _T:
        """Call ``fn(client)``; translate redis-py errors into StoreErrors."""
        with self.lock:
            if self.closed:
                raise StoreClosedError(
                    f"the Redis store at {self.address} is closed: open a new RedisStore",
                    address=self.address,
                    session_id=session_id,
                )
            check = not self.layout_checked
        try:
            if check:
                self._check_layout()
            return fn(self.client)
        except redis_errors.RedisError as exc:
            raise self.translate(exc, what, session_id) from exc

    def _check_layout(self) -> None:
        stored = self.layout_script(keys=[self.key("layout")], args=[LAYOUT_VERSION])
        text = _str(stored)
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

    def translate(
        self, exc: redis_errors.RedisError, what: str, session_id: str | None = None
    ) -> StoreError:
        """The lousho error for a redis-py error (the caller chains it)."""
        detail = str(exc)
        if self._password:
            detail = detail.replace(self._password, "***")
        text = f"could not {what} in the Redis store at {self.address}: {detail}"
        kw: dict[str, Any] = {"address": self.address, "session_id": session_id}
        if isinstance(
            exc,
            redis_errors.ConnectionError | redis_errors.TimeoutError | redis_errors.ReadOnlyError,
        ):
            return StoreUnavailableError(f"{text} (is the server running and reachable?)", **kw)
        if isinstance(exc, redis_errors.ResponseError) and "WRONGTYPE" in detail:
            return StoreCorruptError(
                f"{text} (a key under the prefix {self.prefix!r} holds another kind of value; "
                "it was left as it was: choose another prefix)",
                **kw,
            )
        if isinstance(exc, redis_errors.OutOfMemoryError):
            return StoreUnavailableError(f"{text} (the server is out of memory)", **kw)
        return StoreError(text, **kw)

    def corrupt(
        self, exc: Exception, what: str, session_id: str | None = None
    ) -> StoreCorruptError:
        """A StoreCorruptError naming the key and address, for a codec error about ``what``."""
        return StoreCorruptError(
            f"{what} in the Redis store at {self.address} cannot be read (it was left as it "
            f"was): {exc}",
            address=self.address,
            session_id=session_id,
        )

    def close(self) -> None:
        """Mark closed; close the client when this store made it (idempotent)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if self.owns_client:
            self.client.close()


_persistence_checked: set[str] = set()
_persistence_lock = threading.Lock()


def _config(client: redis.Redis, name: str) -> str:
    """A server setting as text ("" when the server does not report it)."""
    reply: dict[Any, Any] = client.config_get(name)
    return next((_str(v) for k, v in reply.items() if _str(k) == name), "")


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
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.base = uuid.uuid4().hex
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.base}-{next(self.counter)}"


_token = _Tokens()


def _text(value: object) -> str:
    """A stored value as str; UnicodeDecodeError (a ValueError) for bad bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisSessionStore:
    """Transcripts as Redis lists; ``append`` is one script (LLEN check + RPUSH).

    Also the per-session lease (SPEC §5), ``revision`` and ``ids``. Thread- and
    process-safe.
    """

    def __init__(self, conn: _Conn, ttl_s: float | None) -> None:
        self._c = conn
        self._ttl_ms = 0 if ttl_s is None else _ms(ttl_s)

    def _keys(self, id: str) -> list[str]:
        c = self._c
        return [
            c.key("session:", id),
            c.key("session-meta:", id),
            c.key("revision"),
            c.key("sessions"),
        ]

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript (one LRANGE), or None when the id has none."""
        _check_id(id)
        key = self._c.key("session:", id)
        raw: list[Any] = self._c.run("load a session", lambda r: r.lrange(key, 0, -1), id)
        if not raw:
            return None
        out = []
        for i, value in enumerate(raw):
            try:
                out.append(loads_message(_text(value)))
            except (StoreCorruptError, ValueError) as exc:
                raise self._c.corrupt(exc, f"message {i} of session {id!r} ({key!r})", id) from exc
        return out

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript atomically; an empty sequence deletes the session."""
        _check_id(id)
        args: list[Any] = [repr(time.time()), self._ttl_ms, id]
        args.extend(dumps_message(m) for m in messages)
        keys = self._keys(id)
        self._c.run("save a session", lambda r: self._c.save_script(keys, args, r), id)

    def delete(self, id: str) -> None:
        """Forget the id and its messages (no error when absent)."""
        self.save(id, ())

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add a turn's messages in one atomic script.

        Raises StoreConflictError when the stored transcript does not hold exactly
        ``expected_length`` messages (another writer appended first).
        """
        _check_id(id)
        if not messages:
            key = self._c.key("session:", id)
            length = int(self._c.run("read a session's length", lambda r: r.llen(key), id))
            self._check_length(id, expected_length, length)
            return
        self._append(id, messages, expected_length, None, None)

    def commit_turn(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        checkpoints: object,
        checkpoint_key: str | None,
        release_owner: str | None,
    ) -> object:
        """Append a finished turn, delete its checkpoint and release the session's lease in
        ONE script (one round trip instead of four); returns the new ``revision(id)``.

        Returns None, doing nothing, when ``checkpoints`` is not this store's checkpoint
        store or there is nothing to append. Raises StoreConflictError like ``append``.
        """
        if checkpoint_key is not None and getattr(checkpoints, "_c", None) is not self._c:
            return None
        if not messages:
            return None
        _check_id(id)
        return self._append(id, messages, expected_length, checkpoint_key, release_owner)

    def _append(
        self,
        id: str,
        messages: Sequence[Message],
        expected_length: int,
        checkpoint_key: str | None,
        release_owner: str | None,
    ) -> int:
        c = self._c
        cp = "" if checkpoint_key is None else checkpoint_key
        keys = [
            *self._keys(id),
            c.key("checkpoint:", cp),
            c.key("checkpoints"),
            c.key("checkpoint-keys"),
            c.key("lease:", id),
        ]
        args: list[Any] = [
            repr(time.time()),
            self._ttl_ms,
            id,
            expected_length,
            _token(),
            "0" if checkpoint_key is None else "1",
            cp,
            release_owner or "",
        ]
        args.extend(dumps_message(m) for m in messages)
        out = c.run("append to a session", lambda r: c.append_script(keys, args, r), id)
        if not out[0]:
            self._check_length(id, expected_length, int(out[1]))
        return int(out[2])

    def _check_length(self, id: str, expected: int, actual: int) -> None:
        if actual != expected:
            raise StoreConflictError(
                f"session {id!r} in the Redis store at {self._c.address} holds {actual} "
                f"messages, expected {expected}: another writer appended first; reload and "
                "append again",
                expected_length=expected,
                actual_length=actual,
                address=self._c.address,
                session_id=id,
            )

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript (a store-wide
        counter, so it never repeats); None when absent."""
        _check_id(id)
        keys = self._keys(id)[:2]
        value = self._c.run(
            "read a session's revision", lambda r: self._c.revision_script(keys, [], r), id
        )
        return None if value is None else int(value)

    def ids(self) -> list[str]:
        """Stored session ids, sorted (ids whose transcript expired are dropped)."""
        index = self._c.key("sessions")
        members = self._c.run("list sessions", lambda r: r.zrange(index, 0, -1))

        def check(r: redis.Redis) -> list[str]:
            out: list[str] = []
            for start in range(0, len(members), _BATCH):
                batch = [_str(m) for m in members[start : start + _BATCH]]
                keys = [index] + [self._c.key("session:", id) for id in batch]
                out.extend(_str(m) for m in self._c.ids_script(keys, batch, r))
            return out

        return sorted(self._c.run("list sessions", check))

    # --- lease --------------------------------------------------------------------------
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> bool:
        """Take the session's lease for ``ttl_s`` seconds; True when taken.

        Taken when free (``SET NX PX``), already ``owner``'s, or held by a dead process on
        this host; otherwise polled until ``wait_s`` seconds pass.
        """
        _check_id(id)
        _check_ttl(ttl_s)
        return poll_until(lambda: self._try_acquire(id, owner, ttl_s), wait_s)

    def _try_acquire(self, id: str, owner: str, ttl_s: float) -> bool:
        key = [self._c.key("lease:", id)]
        got = self._c.run(
            "acquire a lease", lambda r: self._c.acquire_script(key, [owner, _ms(ttl_s)], r), id
        )
        if got == 1:
            return True
        if not isinstance(got, bytes | str):
            return False
        holder = _str(got)
        if not owner_is_dead(holder):
            return False
        taken = self._c.run(
            "take over a lease",
            lambda r: self._c.take_over_script(key, [holder, owner, _ms(ttl_s)], r),
            id,
        )
        if taken == 1:
            _log.info("session %s: took over the lease of dead owner %s", id, holder)
        return bool(taken == 1)

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        _check_id(id)
        _check_ttl(ttl_s)
        key = [self._c.key("lease:", id)]
        done = self._c.run(
            "renew a lease", lambda r: self._c.renew_script(key, [owner, _ms(ttl_s)], r), id
        )
        return bool(done == 1)

    def release_lease(self, id: str, *, owner: str) -> None:
        """Release the lease if ``owner`` holds it (otherwise do nothing)."""
        _check_id(id)
        key = [self._c.key("lease:", id)]
        self._c.run("release a lease", lambda r: self._c.release_script(key, [owner], r), id)


class RedisCheckpointStore:
    """Checkpoints as codec JSON strings by key (unknown fields round-trip). Thread-safe."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        rkey = self._c.key("checkpoint:", key)
        value = self._c.run("load a checkpoint", lambda r: r.get(rkey))
        if value is None:
            return None
        try:
            return loads_checkpoint(_text(value))
        except (StoreCorruptError, ValueError) as exc:
            raise self._c.corrupt(exc, f"checkpoint {key!r} ({rkey!r})") from exc

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write (replace) the checkpoint (one MULTI transaction with its index entries)."""
        text = dumps_checkpoint(checkpoint)
        now = time.time()

        def write(r: redis.Redis) -> None:
            with r.pipeline(transaction=True) as p:
                p.set(self._c.key("checkpoint:", key), text)
                p.zadd(self._c.key("checkpoints"), {key: now})
                p.zadd(self._c.key("checkpoint-keys"), {key: 0})
                p.execute()

        self._c.run("save a checkpoint", write, checkpoint.session_id)

    def delete(self, key: str) -> None:
        """Delete the checkpoint (no error when absent)."""

        def remove(r: redis.Redis) -> None:
            with r.pipeline(transaction=True) as p:
                p.delete(self._c.key("checkpoint:", key))
                p.zrem(self._c.key("checkpoints"), key)
                p.zrem(self._c.key("checkpoint-keys"), key)
                p.execute()

        self._c.run("delete a checkpoint", remove)

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted (a lexicographic range of the key index)."""
        if prefix:
            raw = prefix.encode("utf-8", "surrogatepass")
            low, high = b"[" + raw, b"(" + raw + b"\xff"  # 0xff never occurs in UTF-8
        else:
            low, high = b"-", b"+"
        index = self._c.key("checkpoint-keys")
        found = self._c.run("list checkpoints", lambda r: r.zrangebylex(index, low, high))
        return [_str(k) for k in found]


class RedisApprovalStore:
    """Approval records as hashes; ``resolve`` is one script that changes a pending record
    only, so exactly one caller across threads, processes and machines wins. Thread-safe."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    def create(self, record: ApprovalRecord) -> None:
        """Store a record (replacing one with the same id)."""
        text = dumps_approval(record)
        resolved_at = record.resolved_at
        if record.status != "pending" and resolved_at is None:
            resolved_at = time.time()
        fields: dict[FieldT, EncodableT] = {"json": text, "status": record.status}
        if record.reason is not None:
            fields["reason"] = record.reason
        if resolved_at is not None:
            fields["resolved_at"] = repr(resolved_at)
        pending, resolved = self._c.key("approvals-pending"), self._c.key("approvals-resolved")

        def write(r: redis.Redis) -> None:
            with r.pipeline(transaction=True) as p:
                p.delete(self._c.key("approval:", record.id))
                p.hset(self._c.key("approval:", record.id), mapping=fields)
                if record.status == "pending":
                    p.zadd(pending, {record.id: record.created_at})
                    p.zrem(resolved, record.id)
                else:
                    p.zrem(pending, record.id)
                    p.zadd(resolved, {record.id: resolved_at or 0.0})
                p.execute()

        self._c.run("create an approval", write, record.session_id)

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        rkey = self._c.key("approval:", id)
        row = self._c.run(
            "read an approval", lambda r: r.hmget(rkey, ["json", "status", "reason", "resolved_at"])
        )
        return None if row[0] is None else self._record(id, row)

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once: one caller wins; the others get ApprovalAlreadyResolvedError;
        an unknown id raises ApprovalNotFoundError."""
        status = "approved" if approved else "denied"
        resolved_at = time.time()
        keys = [
            self._c.key("approval:", id),
            self._c.key("approvals-pending"),
            self._c.key("approvals-resolved"),
        ]
        args = [
            status,
            "0" if reason is None else "1",
            reason or "",
            repr(resolved_at),
            id,
            _token(),
        ]
        out = self._c.run("resolve an approval", lambda r: self._c.resolve_script(keys, args, r))
        if out[0] == 0:
            raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
        if out[0] == 2:
            raise ApprovalAlreadyResolvedError(
                f"approval {id!r} was already {_str(out[1])}", approval_id=id
            )
        return self._record(id, (out[1], status, reason, resolved_at))

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        index = self._c.key("approvals-pending")

        def read(r: redis.Redis) -> tuple[list[Any], list[Any]]:
            ids = r.zrange(index, 0, -1)
            with r.pipeline(transaction=False) as p:
                for m in ids:
                    p.hmget(
                        self._c.key("approval:", _str(m)),
                        ["json", "status", "reason", "resolved_at"],
                    )
                return ids, p.execute()

        ids, rows = self._c.run("list approvals", read)
        out = []
        for m, row in zip(ids, rows, strict=True):
            if row[0] is None or _str(row[1]) != "pending":
                continue  # resolved or deleted between the two reads
            record = self._record(_str(m), row)
            if session_id is None or record.session_id == session_id:
                out.append(record)
        return out

    def _record(self, id: str, row: Sequence[Any]) -> ApprovalRecord:
        text, status, reason, resolved_at = row
        try:
            record = loads_approval(_text(text))
            status = _text(status)
            reason = None if reason is None else _text(reason)
            resolved_at = None if resolved_at is None else float(_text(resolved_at))
        except (StoreCorruptError, ValueError) as exc:
            raise self._c.corrupt(exc, f"approval {id!r}") from exc
        if status not in ("pending", "approved", "denied"):
            raise self._c.corrupt(ValueError(f"unknown status {status!r}"), f"approval {id!r}")
        if (record.status, record.reason, record.resolved_at) != (status, reason, resolved_at):
            record = attrs.evolve(
                record, status=cast(_Status, status), reason=reason, resolved_at=resolved_at
            )
        return record


class RedisStore:
    """Sessions, checkpoints, approvals and leases in one Redis database shared by many
    processes and machines; usable directly as an agent's ``store``.

    ``url_or_client`` is a URL (``redis://[[user]:password@]host:port/db``, ``rediss://``,
    ``unix://``) or a ``redis.Redis`` client (``decode_responses`` either way; the store
    does not close a client it was given). ``prefix`` starts every key, so several
    deployments or tests can share a database. ``ttl_s`` (optional) expires a session's
    transcript that many seconds after its last write. Nothing is sent to Redis until the
    first call; then connection failures raise StoreUnavailableError naming the address
    (never the password). Thread-safe; ``close()`` is idempotent and any use after it raises
    StoreClosedError; a context manager.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "lousho:",
        ttl_s: float | None = None,
    ) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ConfigError(f"ttl_s must be None or > 0 seconds, got {ttl_s!r}")
        self._c = _Conn(url_or_client, prefix)
        self.ttl_s = ttl_s
        self.sessions = RedisSessionStore(self._c, ttl_s)
        self.checkpoints = RedisCheckpointStore(self._c)
        self.approvals = RedisApprovalStore(self._c)

    @property
    def address(self) -> str:
        """The server's address, without any password."""
        return self._c.address

    @property
    def prefix(self) -> str:
        """The prefix of every key this store writes."""
        return self._c.prefix

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> bool:
        """Same as ``sessions.acquire_lease``."""
        return self.sessions.acquire_lease(id, owner=owner, ttl_s=ttl_s, wait_s=wait_s)

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Same as ``sessions.renew_lease``."""
        return self.sessions.renew_lease(id, owner=owner, ttl_s=ttl_s)

    def release_lease(self, id: str, *, owner: str) -> None:
        """Same as ``sessions.release_lease``."""
        self.sessions.release_lease(id, owner=owner)

    def prune(self, older_than_s: float) -> PruneResult:
        """Delete sessions and checkpoints not updated for ``older_than_s`` seconds and
        approvals resolved that long ago; pending approvals and sessions under a live lease
        are kept. Returns the counts. Each batch re-checks its entries atomically, so a
        session written meanwhile is kept."""
        if not older_than_s >= 0:
            raise ConfigError(f"older_than_s must be >= 0, got {older_than_s!r}")
        cutoff = time.time() - older_than_s
        c = self._c

        def session_keys(id: str) -> list[str]:
            return [c.key("session:", id), c.key("session-meta:", id), c.key("lease:", id)]

        sessions = self._prune(
            "sessions",
            c.prune_sessions_script,
            cutoff,
            [],
            lambda ids: [k for id in ids for k in session_keys(id)],
        )
        checkpoints = self._prune(
            "checkpoints",
            c.prune_checkpoints_script,
            cutoff,
            [c.key("checkpoint-keys")],
            lambda keys: [c.key("checkpoint:", k) for k in keys],
        )
        approvals = self._prune(
            "approvals-resolved",
            c.prune_approvals_script,
            cutoff,
            [],
            lambda ids: [c.key("approval:", id) for id in ids],
        )
        return PruneResult(sessions, checkpoints, approvals)

    def _prune(
        self,
        index_name: str,
        script: Any,
        cutoff: float,
        extra_keys: list[str],
        member_keys: Callable[[list[str]], list[str]],
    ) -> int:
        index = self._c.key(index_name)
        old = self._c.run("prune", lambda r: r.zrangebyscore(index, "-inf", f"({cutoff!r}"))
        members = [_str(m) for m in old]

        def remove(r: redis.Redis) -> int:
            removed = 0
            for start in range(0, len(members), _BATCH):
                batch = members[start : start + _BATCH]
                keys = [index, *extra_keys, *member_keys(batch)]
                removed += int(script(keys, [repr(cutoff), *batch], r))
            return removed

        return self._c.run("prune", remove)

    def close(self) -> None:
        """Close the store (idempotent); a client passed in stays open."""
        self._c.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisStore({self._c.address!r}, prefix={self._c.prefix!r})"
