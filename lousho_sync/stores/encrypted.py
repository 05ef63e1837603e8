"""EncryptedStore: any store, with every message, checkpoint, approval and session metadata
encrypted (AES-GCM, 256-bit keys) before it reaches the store. The ``crypto`` extra:
``pip install 'lousho[crypto]'``.

What is encrypted: the codec's JSON (:mod:`lousho_sync.codec`) of each message, checkpoint
and approval record, each approval's ``reason`` and each session's metadata. What stays
plain, so lookups, listing, resolve-once, leases, fencing and prune keep working in the
inner store: ids (session ids, checkpoint keys, run ids, approval ids, tool-call ids),
timestamps, counts and sizes, a message's ``role``, a checkpoint's ``status`` and
``turn_index``, an approval's ``status``.

The envelopes the inner store keeps (it needs no change):

* a message: ``Message(role, "", metadata={"lousho_encrypted": TOKEN})``;
* a checkpoint: its ids, status, turn index and times, everything else empty, and
  ``extra={"lousho_encrypted": TOKEN}``;
* an approval: its ids, status and times, ``call=ToolCall(call.id, "encrypted")``, the
  reason a TOKEN (also when None), ``extra={"lousho_encrypted": TOKEN}``;
* metadata: ``{"lousho_encrypted": TOKEN}`` (``{}`` stays ``{}``).

A TOKEN is base64 of ``version (1 byte) | key id (8) | nonce (12, random) | ciphertext+tag``.
The key id is the first 8 bytes of SHA-256 of ``b"lousho-key-id\\0" + key``. The additional
authenticated data binds each ciphertext to its record: ``["lousho-encrypted/1", kind,
...]`` as JSON, with kind ``message`` (session id, position), ``history`` (session id,
position in the history; records of earlier releases, without it, are still read),
``metadata`` (session id), ``checkpoint`` (key), ``approval`` (approval id) and
``approval-reason`` (approval id, status: so an approval's status changed in the inner
store is detected). A record changed, moved to another record or position, or written with
a key not given raises :class:`~lousho_sync.errors.StoreDecryptError` naming the store and
the record; never garbage. An approval a paused turn waits on but the inner store
no longer lists as pending (its plain status changed) makes ``list_pending`` raise too.
What cannot be detected: a record replaced by an older version
of itself (a rollback), or a transcript cut short at its end.

The store is marked as written through EncryptedStore (the built-in stores' ``mark_encrypted``:
SQLite's ``application_id``, a PostgreSQL table, a Redis key, a file): a plain store object
then refuses every read and write of it with
:class:`~lousho_sync.errors.StoreEncryptedError`.

Keys: ``keys[0]`` encrypts, every key decrypts (rotation: put the new key first, keep the
old ones while records written under them exist; each write re-encrypts what it writes).

An EncryptedStore offers exactly the capabilities the inner store declares
(``inner.capabilities``, :class:`~lousho_sync.stores.base.StoreCapabilities`): a method of
one it lacks raises :class:`~lousho_sync.errors.UnsupportedCapabilityError` (an
AttributeError too, so ``hasattr`` says it is not there). The event log's rows and the
mailbox's mail (``kind`` ``mail``: session id, mail id, kind) are sealed like messages.
The sealing itself is :mod:`lousho_sync.stores._sealing`.
"""


from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import attrs

from ..catalog import SessionInfo, SessionPage
from ..errors import ConfigError, UnsupportedCapabilityError
from ..messages import Message
from ..records import ApprovalRecord, Checkpoint, Fence
from ..results import PruneResult
from ._common import check_older_than
from ._events import event_ops_of
from ._expiry import expire_due
from ._key_expiry import DEFAULT_KEY_TTL_S, check_key_ttl, drop_expired_keys
from ._mail import mail_ops_of
from ._sealed_events import SealedEventOps
from ._sealed_mail import SealedMailOps, sealed_mail
from ._sealing import MARK, MAX_PLAIN_METADATA, Keyring, Sealer, generate_key, key_id, record_aad
from .base import StoreCapabilities, capabilities_of, turn_committer

__all__ = [
    "MARK",
    "MAX_PLAIN_METADATA",
    "EncryptedApprovalStore",
    "EncryptedCheckpointStore",
    "EncryptedSessionStore",
    "EncryptedStore",
    "Keyring",
    "generate_key",
    "key_id",
    "record_aad",
]


def _fence_kw(fence: Fence | None) -> dict[str, Fence]:
    return {} if fence is None else {"fence": fence}


# --- offering exactly what the inner store offers -----------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


class _Offered:
    """A method there only when its object offers ``capability``; reading it otherwise
    raises UnsupportedCapabilityError (an AttributeError: ``hasattr`` is False)."""

    def __init__(self, capability: str, func: Callable[..., Any]) -> None:
        self._capability = capability
        self._func = func
        self._name = func.__name__
        self.__doc__ = func.__doc__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self._func
        if not obj._offers(self._capability):
            raise obj._lacks(self._capability, self._name)
        return self._func.__get__(obj, owner)


def _offered(capability: str) -> Callable[[_F], _F]:
    """Decorate a method that works only when the object offers ``capability`` (a field of
    StoreCapabilities, or the name of an optional method of the inner object)."""

    def wrap(func: _F) -> _F:
        return cast(_F, _Offered(capability, func))

    return wrap


class _Forwarding:
    """What the wrappers share: the inner object, its declared capabilities, the sealer."""

    _inner: Any
    _sealer: Sealer
    _caps: StoreCapabilities
    _methods: frozenset[str] = frozenset()  # optional methods (not capabilities) inner has

    @property
    def capabilities(self) -> StoreCapabilities:
        """Exactly the inner store's (``inner.capabilities``)."""
        return self._caps

    def _offers(self, capability: str) -> bool:
        return capability in self._methods or getattr(self._caps, capability, False) is True

    def _lacks(self, capability: str, name: str) -> UnsupportedCapabilityError:
        offered = ", ".join(self._caps.names()) or "none"
        what = (f"the capability {capability!r}" if hasattr(self._caps, capability)
                else f"a {capability}() method")
        return UnsupportedCapabilityError(
            f"{type(self).__name__}.{name}() is not offered: the inner store "
            f"{type(self._inner).__name__} has no {what} (its capabilities: {offered})",
            capability=capability,
        )


def _optional(inner: object, *names: str) -> frozenset[str]:
    return frozenset(n for n in names if callable(getattr(inner, n, None)))


class EncryptedSessionStore(_Forwarding):
    """Transcripts encrypted message by message over an inner session store; offers what
    the inner one offers (its capabilities; ``ids`` when it has one)."""

    def __init__(self, inner: Any, sealer: Sealer, combined: object) -> None:
        self._inner = inner
        self._sealer = sealer
        caps = capabilities_of(inner)  # commit_turn: through the EncryptedStore, when it does
        self._caps = attrs.evolve(caps, commit_turn=caps.commit_turn and combined is not None)
        self._methods = _optional(inner, "ids", "fence_token")
        self.fenced = self._caps.fencing
        self.combined = combined
        self._events: SealedEventOps | None = None
        self._mail: SealedMailOps | None = None

    @property
    def inner(self) -> Any:
        """The session store holding the envelopes."""
        return self._inner

    def load(self, id: str) -> builtins.list[Message] | None:
        """The decrypted transcript, or None; StoreDecryptError naming the message when one
        does not decrypt."""
        envs = self._inner.load(id)
        return None if envs is None else self._sealer.open_transcript(id, envs)

    def save(self, id: str, messages: Sequence[Message], *, fence: Fence | None = None) -> None:
        """Encrypt and replace the transcript."""
        self._inner.save(id, self._sealer.seal_transcript(id, messages, 0), **_fence_kw(fence))

    def delete(self, id: str) -> None:
        """The inner delete."""
        self._inner.delete(id)

    @_offered("append")
    def append(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        fence: Fence | None = None,
    ) -> None:
        """Encrypt the turn's messages and append them (StoreConflictError as the inner)."""
        sealed = self._sealer.seal_transcript(id, messages, expected_length)
        self._inner.append(id, sealed, expected_length=expected_length, **_fence_kw(fence))

    @_offered("revision")
    def revision(self, id: str) -> object:
        """The inner store's revision of ``id``."""
        return self._inner.revision(id)

    @_offered("ids")
    def ids(self) -> builtins.list[str]:
        """The inner store's session ids."""
        return builtins.list(self._inner.ids())

    @_offered("lease")
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """The inner store's lease (and fence token)."""
        token: int | None = self._inner.acquire_lease(id, owner=owner, ttl_s=ttl_s,
                                                      wait_s=wait_s)
        return token

    @_offered("lease")
    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """The inner store's renew."""
        return bool(self._inner.renew_lease(id, owner=owner, ttl_s=ttl_s))

    @_offered("lease")
    def release_lease(self, id: str, *, owner: str) -> None:
        """The inner store's release."""
        self._inner.release_lease(id, owner=owner)

    @_offered("fence_token")
    def fence_token(self, id: str) -> int:
        """The inner store's newest fence token."""
        return int(self._inner.fence_token(id))

    @_offered("lease_query")
    def lease_held(self, id: str) -> bool:
        """The inner store's ``lease_held``."""
        return bool(self._inner.lease_held(id))

    @_offered("events")
    def event_ops(self) -> SealedEventOps:
        """The inner store's event log with every event encrypted like a message."""
        if self._events is None:
            sealer = self._sealer
            self._events = SealedEventOps(
                event_ops_of(self._inner), sealer.seal,
                lambda token, aad, what: sealer.open(token, aad, what, None))
        return self._events

    @_offered("mailbox")
    def mail_ops(self) -> SealedMailOps:
        """The inner store's session mailbox with every mail's input encrypted."""
        if self._mail is None:
            ops = mail_ops_of(self._inner)
            assert ops is not None  # the inner store declares its mailbox
            self._mail = sealed_mail(ops, MARK, self._sealer.seal, self._sealer.open)
        return self._mail

    @_offered("catalog")
    def info(self, id: str) -> SessionInfo | None:
        """The inner catalog entry, its metadata decrypted."""
        info: SessionInfo | None = self._inner.info(id)
        return None if info is None else self._sealer.open_info(info)

    @_offered("catalog")
    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Encrypt and replace the metadata ({} removes it); InvalidMetadataError also when
        the encrypted form would not fit the limit."""
        self._inner.set_metadata(id, self._sealer.seal_metadata(id, metadata))

    @_offered("catalog")
    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced, decrypted."""
        return self._sealer.open_history(id, self._inner.history(id))

    @_offered("catalog")
    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """The inner compact of the encrypted messages (one transaction there)."""
        start = len(self._inner.history(id)) if replaced else 0  # appended after those
        self._inner.compact(
            id, self._sealer.seal_transcript(id, messages, 0),
            replaced=self._sealer.seal_history(id, replaced, start), **_fence_kw(fence),
        )

    @_offered("catalog")
    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """The inner create of the encrypted session (SessionExistsError as the inner)."""
        envelope = self._sealer.seal_metadata(id, metadata or {})
        self._inner.create(
            id, self._sealer.seal_transcript(id, messages, 0), metadata=envelope or None,
            history=self._sealer.seal_history(id, history, 0),
        )

    def __repr__(self) -> str:
        return f"EncryptedSessionStore({self._inner!r})"

    @_offered("catalog")
    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """The inner store's page, each entry's metadata decrypted. (Defined last: it
        shadows ``list`` in the class body.)"""
        page: SessionPage = self._inner.list(prefix=prefix, limit=limit, after=after)
        return SessionPage(tuple(map(self._sealer.open_info, page.items)), page.next)


class EncryptedCheckpointStore(_Forwarding):
    """Checkpoints encrypted over an inner checkpoint store (key, ids, status and times
    plain)."""

    def __init__(self, inner: Any, sealer: Sealer) -> None:
        self._inner = inner
        self._sealer = sealer
        self._caps = capabilities_of(inner)
        self.fenced = self._caps.fencing

    def load(self, key: str) -> Checkpoint | None:
        """The decrypted checkpoint, or None."""
        env = self._inner.load(key)
        return None if env is None else self._sealer.open_checkpoint(key, env)

    def save(self, key: str, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        """Encrypt and write the checkpoint."""
        self._inner.save(key, self._sealer.seal_checkpoint(key, checkpoint), **_fence_kw(fence))

    def delete(self, key: str, *, fence: Fence | None = None) -> None:
        """The inner delete."""
        self._inner.delete(key, **_fence_kw(fence))

    def keys(self, prefix: str) -> list[str]:
        """The inner keys."""
        return list(self._inner.keys(prefix))


class EncryptedApprovalStore(_Forwarding):
    """Approval records encrypted over an inner approval store; ``resolve`` is the inner
    one's (resolve-once holds), its reason encrypted and bound to the status."""

    def __init__(self, inner: Any, sealer: Sealer,
                 checkpoints: EncryptedCheckpointStore | None = None) -> None:
        self._inner = inner
        self._sealer = sealer
        self._checkpoints = checkpoints  # the paused turns, to find hidden approvals
        self._caps = capabilities_of(inner)
        self.fenced = self._caps.fencing

    def create(self, record: ApprovalRecord, *, fence: Fence | None = None) -> None:
        """Encrypt and store the record."""
        self._inner.create(self._sealer.seal_approval(record), **_fence_kw(fence))

    def get(self, id: str) -> ApprovalRecord | None:
        """The decrypted record, or None."""
        env = self._inner.get(id)
        return None if env is None else self._sealer.open_approval(id, env)

    def resolve(
        self, id: str, *, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ApprovalRecord:
        """Resolve once in the inner store (its errors as they are); ``by`` is sealed with
        the reason."""
        status = "approved" if approved else "denied"
        env = self._inner.resolve(id, approved=approved,
                                  reason=self._sealer.seal_reason(id, status, reason, by))
        return self._sealer.open_approval(id, env)

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records, decrypted, oldest first. An approval a paused turn waits on that
        the inner store does not list as pending (its plain status was changed there) is read
        too, so its damage raises here as in ``get``/``resolve`` instead of hiding it."""
        records = [self._sealer.open_approval(e.id, e)
                   for e in self._inner.list_pending(session_id)]
        if self._checkpoints is not None:
            self._check_hidden({r.id for r in records}, session_id)
        return records

    def _check_hidden(self, listed: set[str], session_id: str | None) -> None:
        checkpoints = self._checkpoints
        assert checkpoints is not None
        inner = checkpoints._inner
        for key in inner.keys(""):
            env = inner.load(key)  # the envelope: status and session id are plain
            if env is None or env.status != "awaiting-approval":
                continue
            if session_id is not None and env.session_id != session_id:
                continue
            checkpoint = checkpoints.load(key)
            for id in () if checkpoint is None else checkpoint.pending_approval_ids:
                if id not in listed:
                    self.get(id)  # StoreDecryptError when its plain status was changed


class EncryptedStore(_Forwarding):
    """``EncryptedStore(inner, keys=[...])``: ``inner`` (an AgentStore, SqliteStore,
    RedisStore, …) with every message, checkpoint, approval and metadata encrypted
    (AES-GCM; see the module). ``keys``: 32-byte keys or their urlsafe base64 strs
    (:meth:`generate_key`), the one that encrypts first. Offers exactly what ``inner``
    declares (``capabilities``): ``sessions``/``checkpoints``/``approvals``, leases and
    fencing, ``commit_turn``, ``prune``, the event log and the mailbox; ``close`` and
    ``with``. ConfigError without the ``crypto`` extra.
    """

    sessions: EncryptedSessionStore | None
    checkpoints: EncryptedCheckpointStore | None
    approvals: EncryptedApprovalStore | None

    generate_key = staticmethod(generate_key)

    def __init__(self, inner: object, *, keys: Sequence[bytes | str]) -> None:
        if not any(hasattr(inner, n) for n in ("sessions", "checkpoints", "approvals")):
            raise ConfigError(
                f"EncryptedStore wraps a store with sessions/checkpoints/approvals (an "
                f"AgentStore, SqliteStore, …), got {type(inner).__name__}"
            )
        self.keyring = Keyring(keys)
        self._inner = inner
        mark = getattr(inner, "mark_encrypted", None)
        if callable(mark):  # the built-in stores: plain access to them is refused from now
            mark()
        self._sealer = sealer = Sealer(self.keyring, inner)
        self._caps = capabilities_of(inner)
        sessions = getattr(inner, "sessions", None)
        checkpoints = getattr(inner, "checkpoints", None)
        approvals = getattr(inner, "approvals", None)
        self._methods = _optional(inner, "close") | _optional(sessions, "fence_token")
        self._committer: Any = turn_committer(inner) if self._caps.commit_turn else None
        self.sessions = (None if sessions is None else EncryptedSessionStore(
            sessions, sealer, self if self._committer is not None else None))
        self.checkpoints = (None if checkpoints is None
                            else EncryptedCheckpointStore(checkpoints, sealer))
        self.approvals = (None if approvals is None
                          else EncryptedApprovalStore(approvals, sealer, self.checkpoints))

    @property
    def inner(self) -> Any:
        """The store holding the envelopes."""
        return self._inner

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the keys (never the keys), the encrypting one first."""
        return self.keyring.key_ids

    @_offered("lease")
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Same as ``sessions.acquire_lease``."""
        assert self.sessions is not None
        return self.sessions.acquire_lease(id, owner=owner, ttl_s=ttl_s, wait_s=wait_s)

    @_offered("lease")
    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Same as ``sessions.renew_lease``."""
        assert self.sessions is not None
        return self.sessions.renew_lease(id, owner=owner, ttl_s=ttl_s)

    @_offered("lease")
    def release_lease(self, id: str, *, owner: str) -> None:
        """Same as ``sessions.release_lease``."""
        assert self.sessions is not None
        self.sessions.release_lease(id, owner=owner)

    @_offered("fence_token")
    def fence_token(self, id: str) -> int:
        """Same as ``sessions.fence_token``."""
        assert self.sessions is not None
        return self.sessions.fence_token(id)

    @_offered("lease_query")
    def lease_held(self, id: str) -> bool:
        """Same as ``sessions.lease_held``."""
        assert self.sessions is not None
        return self.sessions.lease_held(id)

    @_offered("commit_turn")
    def commit_turn(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        checkpoint_key: str | None,
        fence: Fence | None = None,
        release: bool = False,
    ) -> object:
        """The inner store's ``commit_turn`` (one transaction) of the encrypted messages."""
        return self._committer.commit_turn(
            id, self._sealer.seal_transcript(id, messages, expected_length),
            expected_length=expected_length, checkpoint_key=checkpoint_key, fence=fence,
            release=release,
        )

    @_offered("prune")
    def prune(self, older_than_s: float, *,
              idempotency_ttl_s: float = DEFAULT_KEY_TTL_S) -> PruneResult:
        """Deny the expired approvals (their expiry is sealed), then the inner store's
        prune (it works on the plain times; it drops old mail), then remove the expired
        idempotency keys from the transcripts (they are sealed: read and written here)."""
        check_older_than(older_than_s)
        check_key_ttl(idempotency_ttl_s)
        if self.approvals is not None:
            expire_due(self.approvals)
        result: PruneResult = self._inner.prune(older_than_s,
                                                idempotency_ttl_s=idempotency_ttl_s)
        keys = drop_expired_keys(self.sessions, idempotency_ttl_s)
        return attrs.evolve(result, keys=result.keys + keys)

    @_offered("close")
    def close(self) -> None:
        """Close the inner store."""
        self._inner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._offers("close"):
            self.close()

    def __repr__(self) -> str:
        return f"EncryptedStore({self._inner!r}, key_ids={list(self.key_ids)})"
