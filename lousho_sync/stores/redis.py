"""RedisStore: sessions, checkpoints, approvals and leases in Redis, shared by many machines.

Keys, all under ``prefix`` (default ``"lousho:"``)::

    layout                    "3": the key layout this release writes (newer is refused;
                              layouts 1 and 2 are taken as 3, see below)
    encrypted                 "1" when the store was written through EncryptedStore (then a
                              plain RedisStore refuses it: StoreEncryptedError)
    revision                  a store-wide counter; every transcript write takes a value
    session:<id>              list, one codec JSON string per message (RPUSH per turn)
    session-meta:<id>         hash {rev, op}: the transcript's revision, the last append's token
    session-info:<id>         hash {created, md}: created_at, the metadata's compact JSON (absent:
                              none)
    session-history:<id>      list, the messages compaction replaced, oldest first
    sessions                  sorted set id -> updated_at of every session with a transcript or
                              metadata (ids(), list(), prune)
    lease:<id>                the lease holder's owner string, with a PX expiry
    fence:<id>                the newest fence token of the session (INCR per acquisition)
    checkpoint:<key>          codec JSON string
    checkpoints               sorted set key -> updated_at (prune)
    checkpoint-keys           sorted set key -> 0 (lexicographic range for keys(prefix))
    approval:<id>             hash {json, status, reason, resolved_at, op}
    approvals-pending         sorted set id -> created_at
    approvals-resolved        sorted set id -> resolved_at (prune)

A session's catalog is kept by the same script as the write: every transcript or metadata
write moves its score in ``sessions`` (updated_at, written with ``repr`` so the float
round-trips exactly) and sets ``created`` when absent. ``list()`` reads no transcript: one
script pages through ``sessions`` by score (the client orders equal scores by id; Redis
orders them by member, descending), then one MULTI reads each row's LLEN and
``session-info``. Layout 3 added ``session-info`` and ``session-history``: layout 1 had no
fence keys either, and a session of layout 1 or 2 has no ``session-info``, so its created_at
is its updated_at until its next write records that. Layout 3 is refused by earlier
releases, whose writes would drop metadata-only sessions from the index.

Every write that must be atomic is one Lua script (in ``_redis_scripts``: ``append`` checks
``LLEN`` and ``RPUSH``es; ``save`` is ``DEL`` + ``RPUSH``; ``resolve`` changes a pending
record only) or one ``MULTI`` transaction; nothing reads and rewrites a whole transcript.
``append`` and ``resolve`` carry a one-off token, so when redis-py retries a call whose reply
was lost, the retry sees its own write and succeeds instead of reporting a conflict (or the
loss of a race it won). Fencing: every acquisition of a lease INCRs ``fence:<id>``
(never deleted, so tokens only grow) and returns it; every write given ``fence=`` is a
script that compares the token first and refuses (LeaseLostError, nothing written) when a
newer one exists. An approval's ``json`` is the record as created; the ``status``, ``reason``
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

import builtins
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

try:
    import redis
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("RedisStore needs the redis package: pip install 'lousho[redis]'") from exc

from ..catalog import (
    Cursor,
    SessionInfo,
    SessionPage,
    check_list_args,
    check_metadata,
    metadata_from_json,
    page_from,
)
from ..codec import dumps_message, loads_message
from ..errors import ConfigError, SessionExistsError, StoreCorruptError
from ..messages import Message
from ..records import Fence
from ..results import PruneResult
from ._common import (
    FENCED_PART,
    SHARED_SESSIONS,
    SHARED_STORE,
    Closing,
    LeaseForwarding,
    check_older_than,
    validate_session_id,
)
from ._engine.approvals import ApprovalRules
from ._engine.checkpoints import CheckpointRules
from ._engine.commits import AppendRules, CommitRules
from ._engine.leases import LeaseRules, check_newest, fence_token_of
from ._events import prune_events
from ._expiry import expire_due
from ._key_expiry import DEFAULT_KEY_TTL_S, check_key_ttl, tidy
from ._redis_conn import LAYOUT_VERSION, Conn, as_str, decoded, ms
from ._redis_events import RedisEventOps
from ._redis_mail import RedisMailOps
from ._redis_ops import (
    RedisApprovals,
    RedisCheckpoints,
    RedisCommits,
    RedisLeases,
    catalog_keys,
    session_keys,
)
from .base import StoreCapabilities

__all__ = [
    "LAYOUT_VERSION",
    "RedisApprovalStore",
    "RedisCheckpointStore",
    "RedisSessionStore",
    "RedisStore",
]

_log = logging.getLogger(__name__)

_BATCH = 500


def _written(c: Conn, out: Any, fence: Fence | None) -> None:
    """LeaseLostError when the reply ``out`` of a fenced script says it refused."""
    if fence is not None:
        check_newest(c, fence.session_id, c.refused(out), fence.token)


class RedisSessionStore(LeaseRules, AppendRules):
    """Transcripts as Redis lists; ``append`` is one script (LLEN check + RPUSH).

    Also the per-session lease with fence tokens (SPEC §5), ``revision``, ``ids`` and the
    session catalog (:class:`~lousho_sync.stores.base.Catalogued`). Writes of the transcript
    take ``fence=`` (``fenced``). ``combined`` is the RedisStore this belongs to. Thread-
    and process-safe.
    """

    fenced = True

    @property
    def capabilities(self) -> StoreCapabilities:
        """All but ``prune`` (the store's): lease, fencing, append, revision,
        ``commit_turn`` through ``combined``, the catalog, the event log, the mailbox."""
        return SHARED_SESSIONS

    def __init__(self, conn: Conn, ttl_s: float | None, combined: RedisStore) -> None:
        self._c = conn
        self._ttl_ms = 0 if ttl_s is None else ms(ttl_s)
        self.combined = combined
        self._leases = RedisLeases(conn)
        self._commits = RedisCommits(conn, self._ttl_ms)
        self._events = RedisEventOps(conn)
        self._mail = RedisMailOps(conn)

    def event_ops(self) -> RedisEventOps:
        """The event log's primitives (``start()``/``attach()``)."""
        return self._events

    def mail_ops(self) -> RedisMailOps:
        """The session mailbox's primitives (turn policies across processes)."""
        return self._mail

    def _keys(self, id: str) -> builtins.list[str]:
        return session_keys(self._c, id)

    def _catalog_keys(self, id: str) -> builtins.list[str]:
        return catalog_keys(self._c, id)

    def load(self, id: str) -> builtins.list[Message] | None:
        """The stored transcript (one LRANGE), or None when the id has none."""
        validate_session_id(id)
        key = self._c.key("session:", id)
        raw: list[Any] = self._c.run("load a session", lambda r: r.lrange(key, 0, -1), id)
        if not raw:
            return None
        out = []
        for i, value in enumerate(raw):
            try:
                out.append(loads_message(decoded(value)))
            except (StoreCorruptError, ValueError) as exc:
                raise self._c.corrupt(exc, f"message {i} of session {id!r} ({key!r})", id) from exc
        return out

    def save(self, id: str, messages: Sequence[Message], *, fence: Fence | None = None) -> None:
        """Replace the transcript atomically; an empty sequence deletes the session. With
        ``fence``, LeaseLostError (nothing written) when a newer lease token exists."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        args: builtins.list[Any] = [repr(time.time()), self._ttl_ms, id, token]
        args.extend(dumps_message(m) for m in messages)
        keys = [*self._keys(id), self._c.fence_key(fence), *self._catalog_keys(id)]
        out = self._c.run("save a session", lambda r: self._c.save_script(keys, args, r), id)
        _written(self._c, out, fence)

    def delete(self, id: str) -> None:
        """Forget the id: its messages, history and metadata (no error when absent)."""
        validate_session_id(id)
        c = self._c
        list_key, meta, _, index = self._keys(id)
        keys = [list_key, meta, index, *self._catalog_keys(id)]
        c.run("delete a session", lambda r: c.delete_script(keys, [id], r), id)

    def revision(self, id: str) -> object:
        """A token that changes on every write of ``id``'s transcript (a store-wide
        counter, so it never repeats); None when absent."""
        validate_session_id(id)
        keys = self._keys(id)[:2]
        value = self._c.run(
            "read a session's revision", lambda r: self._c.revision_script(keys, [], r), id
        )
        return None if value is None else int(value)

    def ids(self) -> builtins.list[str]:
        """Stored session ids (with a transcript or metadata), sorted (ids whose keys
        expired are dropped)."""
        index = self._c.key("sessions")
        members = self._c.run("list sessions", lambda r: r.zrange(index, 0, -1))

        def check(r: redis.Redis) -> builtins.list[str]:
            out: builtins.list[str] = []
            for start in range(0, len(members), _BATCH):
                batch = [as_str(m) for m in members[start : start + _BATCH]]
                keys = [index]
                for id in batch:
                    keys += [self._c.key("session:", id), self._c.key("session-info:", id)]
                out.extend(as_str(m) for m in self._c.ids_script(keys, batch, r))
            return out

        return sorted(self._c.run("list sessions", check))


    # --- the catalog (Catalogued) -----------------------------------------------------
    def _where(self, id: str) -> str:
        return f"session {id!r} in the Redis store at {self._c.address}"

    def _info(
        self, id: str, updated: Any, length: Any, created: Any, md: Any
    ) -> SessionInfo | None:
        """The SessionInfo of one row (None: no transcript and no metadata)."""
        if int(length) == 0 and md is None:
            return None
        updated_at = float(updated)
        try:
            metadata = metadata_from_json(md, self._where(id))
        except StoreCorruptError as exc:
            raise StoreCorruptError(
                f"{exc} (it was left as it was)", address=self._c.address, session_id=id
            ) from None
        try:
            created_at = updated_at if created is None else float(decoded(created))
            if not math.isfinite(created_at):
                raise ValueError(f"{created_at!r} is not a time")
        except ValueError as exc:
            raise self._c.corrupt(exc, f"the created_at of {self._where(id)}", id) from exc
        return SessionInfo(id=id, messages=int(length), created_at=created_at,
                           updated_at=updated_at, metadata=metadata)

    def _read_infos(
        self, rows: Sequence[tuple[str, float]]
    ) -> builtins.list[SessionInfo]:
        """The SessionInfos of ``rows`` (id, updated_at) in one MULTI, without the rows
        deleted meanwhile."""
        c = self._c

        def read(r: redis.Redis) -> builtins.list[Any]:
            with r.pipeline(transaction=True) as p:
                for id, _ in rows:
                    p.llen(c.key("session:", id))
                    p.hmget(c.key("session-info:", id), ["created", "md"])
                return p.execute()

        replies = c.run("list sessions", read) if rows else []
        out = []
        for n, (id, updated) in enumerate(rows):
            length, (created, md) = replies[2 * n], replies[2 * n + 1]
            info = self._info(id, updated, length, created, md)
            if info is not None:
                out.append(info)
        return out

    def info(self, id: str) -> SessionInfo | None:
        """The catalog entry of ``id`` (one MULTI: its score, LLEN and ``session-info``;
        the transcript is not read), or None."""
        validate_session_id(id)
        c = self._c

        def read(r: redis.Redis) -> builtins.list[Any]:
            with r.pipeline(transaction=True) as p:
                p.zscore(c.key("sessions"), id)
                p.llen(c.key("session:", id))
                p.hmget(c.key("session-info:", id), ["created", "md"])
                return p.execute()

        updated, length, (created, md) = c.run("read a session's info", read, id)
        return None if updated is None else self._info(id, updated, length, created, md)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` ({} removes it) in one script; the transcript and
        its revision stay. Takes no fence."""
        validate_session_id(id)
        text = check_metadata(metadata, id)
        c = self._c
        list_key, meta, _, index = self._keys(id)
        keys = [list_key, meta, index, *self._catalog_keys(id)]
        md = "" if text == "{}" else text
        args: builtins.list[Any] = [repr(time.time()), self._ttl_ms, id, md]
        c.run("set a session's metadata", lambda r: c.set_metadata_script(keys, args, r), id)

    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced in ``id``, oldest first (one LRANGE)."""
        validate_session_id(id)
        key = self._c.key("session-history:", id)
        raw = self._c.run("read a session's history", lambda r: r.lrange(key, 0, -1), id)
        out = []
        for i, value in enumerate(raw):
            try:
                out.append(loads_message(decoded(value)))
            except (StoreCorruptError, ValueError) as exc:
                what = f"message {i} of the history of session {id!r} ({key!r})"
                raise self._c.corrupt(exc, what, id) from exc
        return out

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """In one script: add ``replaced`` to the history and replace the transcript with
        ``messages``. With ``fence``, LeaseLostError (nothing written) when a newer lease
        token exists."""
        validate_session_id(id)
        token = fence_token_of(fence, id)
        args: builtins.list[Any] = [repr(time.time()), self._ttl_ms, id, token, len(replaced)]
        args.extend(dumps_message(m) for m in replaced)
        args.extend(dumps_message(m) for m in messages)
        keys = [*self._keys(id), self._c.fence_key(fence), *self._catalog_keys(id)]
        out = self._c.run(
            "compact a session", lambda r: self._c.compact_script(keys, args, r), id
        )
        _written(self._c, out, fence)

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create ``id`` with its transcript, metadata and history in one script;
        SessionExistsError (nothing written) when it has messages or metadata."""
        validate_session_id(id)
        text = check_metadata(metadata or {}, id)
        c = self._c
        md = "" if text == "{}" else text
        args: builtins.list[Any] = [repr(time.time()), self._ttl_ms, id, md, len(history)]
        args.extend(dumps_message(m) for m in history)
        args.extend(dumps_message(m) for m in messages)
        keys = [*self._keys(id), *self._catalog_keys(id)]
        if not c.run("create a session", lambda r: c.create_script(keys, args, r), id):
            raise SessionExistsError(
                f"session {id!r} exists already in the Redis store at {c.address}",
                address=c.address,
                session_id=id,
            )

    def _page_rows(
        self, prefix: str, want: int, cursor: Cursor | None
    ) -> tuple[builtins.list[tuple[str, float]], bool]:
        """The first ``want`` (id, updated_at) after ``cursor`` in list order (one script),
        and whether the index holds none past them."""
        index = self._c.key("sessions")
        top = "+inf" if cursor is None else repr(cursor[0])
        chunk = max(want, _BATCH) if prefix else want
        args: builtins.list[Any] = [top, "0" if cursor is None else "1", want, prefix, chunk]
        done, first, rows, tail = self._c.run(
            "list sessions", lambda r: self._c.session_page_script([index], args, r)
        )

        def pairs(flat: Sequence[Any]) -> builtins.list[tuple[str, float]]:
            return [(as_str(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]

        head = [] if cursor is None else sorted(p for p in pairs(first) if p[0] > cursor[1])
        body = pairs(rows)
        if tail:  # the band at the lowest score may have been cut: take it whole
            band = pairs(tail)
            body = [p for p in body if p[1] != band[0][1]] + band
        body.sort(key=lambda p: (-p[1], p[0]))
        ordered = head + body
        return ordered[:want], bool(done) and len(ordered) <= want

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of the catalog, newest ``updated_at`` first, then by id (see
        :class:`~lousho_sync.stores.base.Catalogued`): a script pages through the
        ``sessions`` index, one MULTI reads the rows' counts and metadata; no transcript
        is read."""
        prefix, limit, cursor = check_list_args(prefix, limit, after)
        found: builtins.list[SessionInfo] = []
        while len(found) <= limit:
            rows, done = self._page_rows(prefix, limit + 1 - len(found), cursor)
            found.extend(self._read_infos(rows))
            if done or not rows:
                break
            cursor = (rows[-1][1], rows[-1][0])  # rows whose keys expired were dropped
        return page_from(found, limit)


class RedisCheckpointStore(CheckpointRules):
    """Checkpoints as codec JSON strings by key (unknown fields round-trip); writes take
    ``fence=`` (``fenced``). Thread-safe."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, conn: Conn) -> None:
        self._ops = RedisCheckpoints(conn)


class RedisApprovalStore(ApprovalRules):
    """Approval records as hashes; ``resolve`` is one script that changes a pending record
    only, so exactly one caller across threads, processes and machines wins; ``create``
    takes ``fence=`` (``fenced``). Thread-safe."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Fencing."""
        return FENCED_PART

    def __init__(self, conn: Conn) -> None:
        self._ops = RedisApprovals(conn)


class RedisStore(CommitRules, LeaseForwarding, Closing):
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

    @property
    def capabilities(self) -> StoreCapabilities:
        """Everything: lease, fencing, append, revision, ``commit_turn``, the catalog,
        ``prune``, the event log, the mailbox."""
        return SHARED_STORE

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "lousho:",
        ttl_s: float | None = None,
    ) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ConfigError(f"ttl_s must be None or > 0 seconds, got {ttl_s!r}")
        self._c = Conn(url_or_client, prefix)
        self.ttl_s = ttl_s
        self.sessions = RedisSessionStore(self._c, ttl_s, self)
        self.checkpoints = RedisCheckpointStore(self._c)
        self.approvals = RedisApprovalStore(self._c)
        self._commits = self.sessions._commits

    @property
    def address(self) -> str:
        """The server's address, without any password."""
        return self._c.address

    @property
    def prefix(self) -> str:
        """The prefix of every key this store writes."""
        return self._c.prefix

    def prune(self, older_than_s: float, *,
              idempotency_ttl_s: float = DEFAULT_KEY_TTL_S) -> PruneResult:
        """Delete sessions and checkpoints not updated for ``older_than_s`` seconds and
        approvals resolved that long ago; pending approvals (with their session and the
        checkpoint of the turn they paused) and sessions under a live lease
        are kept. Returns the counts. Each batch re-checks its entries atomically, so a
        session written meanwhile is kept.
        Then drops mail older than ``MAIL_TTL_S`` (600 s) from the session mailbox and the
        idempotency keys older than ``idempotency_ttl_s`` (default 24 h; pass the largest
        ``idempotency_ttl_s`` your sessions use) from the transcripts (``mails``,
        ``keys``: the transcripts rewritten, which counts as their update)."""
        check_older_than(older_than_s)
        check_key_ttl(idempotency_ttl_s)
        prune_events(self.sessions.event_ops())  # finished turns past event_ttl_s
        expire_due(self.approvals)
        cutoff = time.time() - older_than_s
        c = self._c
        # a pending approval keeps its session and the checkpoint of the turn it paused
        waiting = self.approvals.list_pending()
        keep_sessions = {r.session_id for r in waiting if r.session_id is not None}
        keep_checkpoints = {r.checkpoint_key for r in waiting}

        def session_keys(id: str) -> list[str]:
            return [
                c.key("session:", id),
                c.key("session-meta:", id),
                c.key("lease:", id),
                c.key("session-info:", id),
                c.key("session-history:", id),
            ]

        sessions = self._prune(
            "sessions",
            c.prune_sessions_script,
            cutoff,
            [],
            lambda ids: [k for id in ids for k in session_keys(id)],
            keep_sessions,
        )
        checkpoints = self._prune(
            "checkpoints",
            c.prune_checkpoints_script,
            cutoff,
            [c.key("checkpoint-keys")],
            lambda keys: [c.key("checkpoint:", k) for k in keys],
            keep_checkpoints,
        )
        approvals = self._prune(
            "approvals-resolved",
            c.prune_approvals_script,
            cutoff,
            [],
            lambda ids: [c.key("approval:", id) for id in ids],
        )
        return tidy(PruneResult(sessions, checkpoints, approvals), self.sessions,
                    idempotency_ttl_s)

    def _prune(
        self,
        index_name: str,
        script: Any,
        cutoff: float,
        extra_keys: list[str],
        member_keys: Callable[[list[str]], list[str]],
        keep: Collection[str] = (),
    ) -> int:
        index = self._c.key(index_name)
        old = self._c.run("prune", lambda r: r.zrangebyscore(index, "-inf", f"({cutoff!r}"))
        members = [m for m in map(as_str, old) if m not in keep]

        def remove(r: redis.Redis) -> int:
            removed = 0
            for start in range(0, len(members), _BATCH):
                batch = members[start : start + _BATCH]
                keys = [index, *extra_keys, *member_keys(batch)]
                removed += int(script(keys, [repr(cutoff), *batch], r))
            return removed

        return self._c.run("prune", remove)

    def mark_encrypted(self) -> None:
        """Called by EncryptedStore: mark the store (the ``encrypted`` key, at the next
        call) as written through it, and accept this object's use."""
        self._c.mark_encrypted()

    def close(self) -> None:
        """Close the store (idempotent); a client passed in stays open."""
        self._c.close()

    def __repr__(self) -> str:
        return f"RedisStore({self._c.address!r}, prefix={self._c.prefix!r})"
