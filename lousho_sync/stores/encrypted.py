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
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import json
import secrets
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import attrs

from ..catalog import (
    MAX_METADATA_BYTES,
    SessionInfo,
    SessionPage,
    check_metadata,
    metadata_from_json,
)
from ..codec import (
    dumps_approval,
    dumps_checkpoint,
    dumps_message,
    loads_approval,
    loads_checkpoint,
    loads_message,
)
from ..errors import (
    ConfigError,
    InvalidMetadataError,
    StoreCorruptError,
    StoreDecryptError,
)
from ..messages import Message, ToolCall
from ..records import ApprovalRecord, Checkpoint, Fence
from ..results import PruneResult
from ._common import check_older_than
from ._events import event_ops_of
from ._expiry import expire_due
from ._sealed_events import SealedEventOps
from .base import turn_committer

__all__ = [
    "MARK",
    "EncryptedApprovalStore",
    "EncryptedCheckpointStore",
    "EncryptedSessionStore",
    "EncryptedStore",
    "Keyring",
    "generate_key",
    "key_id",
    "record_aad",
]

MARK = "lousho_encrypted"
"""The key under which an envelope holds its TOKEN."""

_VERSION = 1
_KEY_ID_BYTES = 8
_NONCE_BYTES = 12
_TAG_BYTES = 16
_HEADER = 1 + _KEY_ID_BYTES + _NONCE_BYTES
_INSTALL = "pip install 'lousho[crypto]'"


def generate_key() -> str:
    """A new random 256-bit key as urlsafe base64 (keep it secret: an env var, a vault)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii")


def _key_bytes(key: object, index: int) -> bytes:
    if isinstance(key, (bytes, bytearray)):
        raw = bytes(key)
    elif isinstance(key, str):
        try:
            raw = base64.urlsafe_b64decode(key.strip() + "=" * (-len(key.strip()) % 4))
        except (ValueError, binascii.Error):
            raise ConfigError(
                f"keys[{index}] is not urlsafe base64 (the key is not shown): use "
                "EncryptedStore.generate_key()"
            ) from None
    else:
        raise ConfigError(
            f"keys[{index}] must be 32 bytes or their urlsafe base64 str, got "
            f"{type(key).__name__}"
        )
    if len(raw) != 32:
        raise ConfigError(
            f"keys[{index}] is {len(raw)} bytes; an AES-256 key is 32 bytes (the key is not "
            "shown): use EncryptedStore.generate_key()"
        )
    return raw


def _key_id_bytes(raw: bytes) -> bytes:
    return hashlib.sha256(b"lousho-key-id\0" + raw).digest()[:_KEY_ID_BYTES]


def key_id(key: bytes | str) -> str:
    """The public id (16 hex digits) a TOKEN written with ``key`` carries."""
    return _key_id_bytes(_key_bytes(key, 0)).hex()


def record_aad(kind: str, *parts: str | int) -> bytes:
    """The additional authenticated data binding a ciphertext to its record."""
    return json.dumps(["lousho-encrypted/1", kind, *parts]).encode("ascii")


class _Unreadable(Exception):
    """A TOKEN did not open (the reason, for the store's error)."""


class Keyring:
    """AES-GCM keys: :meth:`seal` with the first, :meth:`open` with any (by key id).
    Thread-safe. ConfigError when the ``cryptography`` package is missing or a key is bad."""

    def __init__(self, keys: Sequence[bytes | str]) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise ConfigError(
                f"EncryptedStore needs the cryptography package ({exc}): {_INSTALL}"
            ) from None
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise ConfigError("keys must be a list of keys (bytes or base64 str), newest first")
        raws = [_key_bytes(k, i) for i, k in enumerate(keys)]
        if not raws:
            raise ConfigError(
                "EncryptedStore needs at least one key: keys=[EncryptedStore.generate_key()]"
            )
        self._ciphers: dict[bytes, Any] = {}
        for raw in raws:
            self._ciphers.setdefault(_key_id_bytes(raw), AESGCM(raw))
        self._first = _key_id_bytes(raws[0])
        self.key_ids: tuple[str, ...] = tuple(k.hex() for k in self._ciphers)
        """The ids of the keys, the encrypting one first."""

    def seal(self, plaintext: bytes, aad: bytes) -> str:
        """A TOKEN of ``plaintext`` under the first key, bound to ``aad``."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._ciphers[self._first].encrypt(nonce, plaintext, aad)
        raw = bytes((_VERSION,)) + self._first + nonce + sealed
        return base64.b64encode(raw).decode("ascii")

    def open(self, token: object, aad: bytes) -> bytes:
        """The plaintext of ``token``; _Unreadable saying why when it does not open."""
        from cryptography.exceptions import InvalidTag

        if not isinstance(token, str):
            raise _Unreadable(f"its ciphertext is a {type(token).__name__}, not a str")
        try:
            raw = base64.b64decode(token, validate=True)
        except (ValueError, binascii.Error):
            raise _Unreadable("its ciphertext is not base64 (it was changed)") from None
        if len(raw) < _HEADER + _TAG_BYTES or raw[0] != _VERSION:
            raise _Unreadable("its ciphertext is not of this format (it was changed)")
        kid = raw[1:_HEADER - _NONCE_BYTES]
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise _Unreadable(
                f"it was encrypted with key {kid.hex()}, which is not among this store's keys "
                f"({', '.join(self.key_ids)}): pass that key too, in keys=[...]"
            )
        try:
            return bytes(cipher.decrypt(raw[_HEADER - _NONCE_BYTES:_HEADER], raw[_HEADER:], aad))
        except InvalidTag:
            raise _Unreadable(
                f"it fails authentication under key {kid.hex()}: it was changed, or moved here "
                "from another record"
            ) from None


def _describe(inner: object) -> str:
    for attr in ("path", "address"):
        where = getattr(inner, attr, None)
        if isinstance(where, str):
            return f"{type(inner).__name__} at {where}"
    return type(inner).__name__


class _Sealer:
    """The keyring plus how errors name the store and the record."""

    def __init__(self, keyring: Keyring, inner: object) -> None:
        self.keyring = keyring
        self.name = f"the encrypted store over {_describe(inner)}"
        path, address = getattr(inner, "path", None), getattr(inner, "address", None)
        self.path = path if isinstance(path, str) else None
        self.address = address if isinstance(address, str) else None

    def seal(self, text: str, aad: bytes) -> str:
        return self.keyring.seal(text.encode("utf-8", "surrogatepass"), aad)

    def decrypt_error(self, what: str, reason: str, session_id: str | None) -> StoreDecryptError:
        return StoreDecryptError(
            f"cannot decrypt {what} in {self.name}: {reason} (it was left as it was)",
            path=self.path, address=self.address, session_id=session_id, record=what,
        )

    def open(self, token: object, aad: bytes, what: str, session_id: str | None) -> str:
        try:
            return self.keyring.open(token, aad).decode("utf-8", "surrogatepass")
        except _Unreadable as exc:
            error = self.decrypt_error(what, str(exc), session_id)
        raise error

    def token_of(self, holder: Mapping[str, Any], what: str, session_id: str | None) -> object:
        if MARK not in holder:
            raise self.decrypt_error(
                what, "it is not encrypted (written without EncryptedStore, or replaced)",
                session_id)
        return holder[MARK]

    def corrupt(self, exc: StoreCorruptError, what: str, session_id: str | None) -> Exception:
        return StoreCorruptError(
            f"{what} in {self.name} decrypts but is not readable: {exc}",
            path=self.path, address=self.address, session_id=session_id,
        )

    # --- messages -----------------------------------------------------------------------

    def seal_message(self, m: Message, aad: bytes) -> Message:
        return Message(m.role, "", metadata={MARK: self.seal(dumps_message(m), aad)})

    def open_message(self, env: Message, aad: bytes, what: str, id: str) -> Message:
        text = self.open(self.token_of(env.metadata, what, id), aad, what, id)
        try:
            m = loads_message(text)
        except StoreCorruptError as exc:
            error = self.corrupt(exc, what, id)
        else:
            if m.role != env.role:
                raise self.decrypt_error(what, "its plain role was changed", id)
            return m
        raise error

    def seal_transcript(self, id: str, messages: Sequence[Message], start: int) -> list[Message]:
        return [self.seal_message(m, record_aad("message", id, start + i))
                for i, m in enumerate(messages)]

    def open_transcript(self, id: str, envs: Sequence[Message]) -> list[Message]:
        return [self.open_message(e, record_aad("message", id, i),
                                  f"message {i} of session {id!r}", id)
                for i, e in enumerate(envs)]

    def seal_history(self, id: str, messages: Sequence[Message], start: int) -> list[Message]:
        return [self.seal_message(m, record_aad("history", id, start + i))
                for i, m in enumerate(messages)]

    def open_history(self, id: str, envs: Sequence[Message]) -> list[Message]:
        out = []
        for i, e in enumerate(envs):
            what = f"history message {i} of session {id!r}"
            try:
                out.append(self.open_message(e, record_aad("history", id, i), what, id))
            except StoreDecryptError as exc:
                try:  # written before history positions were bound (any position)
                    out.append(self.open_message(e, record_aad("history", id), what, id))
                except StoreDecryptError:
                    raise exc from None
        return out

    # --- metadata -----------------------------------------------------------------------

    def seal_metadata(self, id: str, metadata: Mapping[str, Any]) -> dict[str, str]:
        text = check_metadata(metadata, id)
        if text == "{}":
            return {}
        envelope = {MARK: self.seal(text, record_aad("metadata", id))}
        size = len(json.dumps(envelope, separators=(",", ":")))
        if size > MAX_METADATA_BYTES:
            raise InvalidMetadataError(
                f"the metadata of session {id!r} is {len(text.encode())} bytes as JSON; "
                f"encrypted it takes {size} bytes, over the limit of {MAX_METADATA_BYTES} "
                f"bytes: in an EncryptedStore metadata may be at most {MAX_PLAIN_METADATA} "
                "bytes as JSON",
                session_id=id,
            )
        return envelope

    def open_metadata(self, id: str, stored: Mapping[str, Any]) -> dict[str, Any]:
        if not stored:
            return {}
        what = f"the metadata of session {id!r}"
        text = self.open(self.token_of(stored, what, id), record_aad("metadata", id), what, id)
        return metadata_from_json(text or "null", f"session {id!r} in {self.name}")

    def open_info(self, info: SessionInfo) -> SessionInfo:
        if not info.metadata:
            return info
        return attrs.evolve(info, metadata=self.open_metadata(info.id, info.metadata))

    # --- checkpoints --------------------------------------------------------------------

    def seal_checkpoint(self, key: str, c: Checkpoint) -> Checkpoint:
        token = self.seal(dumps_checkpoint(c), record_aad("checkpoint", key))
        return Checkpoint(
            key=c.key, session_id=c.session_id, run_id=c.run_id, turn_index=c.turn_index,
            started_call_ids=c.started_call_ids, pending_approval_ids=c.pending_approval_ids,
            status=c.status, created_at=c.created_at, updated_at=c.updated_at,
            extra={MARK: token},
        )

    def open_checkpoint(self, key: str, env: Checkpoint) -> Checkpoint:
        what = f"checkpoint {key!r}"
        sid = env.session_id
        text = self.open(self.token_of(env.extra, what, sid), record_aad("checkpoint", key),
                         what, sid)
        try:
            return loads_checkpoint(text)
        except StoreCorruptError as exc:
            error = self.corrupt(exc, what, sid)
        raise error

    # --- approvals ----------------------------------------------------------------------

    def seal_reason(self, id: str, status: str, reason: str | None, by: str | None = None) -> str:
        sealed: dict[str, str | None] = {"reason": reason}
        if by is not None:
            sealed["by"] = by
        return self.seal(json.dumps(sealed), record_aad("approval-reason", id, status))

    def seal_approval(self, r: ApprovalRecord) -> ApprovalRecord:
        token = self.seal(dumps_approval(r), record_aad("approval", r.id))
        return ApprovalRecord(
            id=r.id, session_id=r.session_id, checkpoint_key=r.checkpoint_key,
            call=ToolCall(r.call.id, "encrypted"), status=r.status,
            reason=self.seal_reason(r.id, r.status, r.reason), created_at=r.created_at,
            resolved_at=r.resolved_at, extra={MARK: token},
        )

    def open_approval(self, id: str, env: ApprovalRecord) -> ApprovalRecord:
        what, sid = f"approval {id!r}", env.session_id
        text = self.open(self.token_of(env.extra, what, sid), record_aad("approval", id),
                         what, sid)
        try:
            record = loads_approval(text)
        except StoreCorruptError as exc:
            error = self.corrupt(exc, what, sid)
            record = None
        if record is None:
            raise error
        reason_what = f"the reason of approval {id!r} (status {env.status!r})"
        text = self.open(env.reason, record_aad("approval-reason", id, env.status),
                         reason_what, sid)
        try:
            reason = json.loads(text)
        except ValueError:
            reason = None
        if not isinstance(reason, dict) or not isinstance(reason.get("reason"), (str, type(None))):
            raise StoreCorruptError(f"{reason_what} in {self.name} is not readable",
                                    path=self.path, address=self.address, session_id=sid)
        by = reason.get("by")
        return attrs.evolve(record, status=env.status, reason=reason["reason"],
                            resolved_at=env.resolved_at,
                            resolved_by=by if isinstance(by, str) else None)


def _max_plain_metadata() -> int:
    """The longest metadata JSON whose envelope still fits :data:`MAX_METADATA_BYTES`."""
    overhead = len(json.dumps({MARK: ""}, separators=(",", ":")))
    room = (MAX_METADATA_BYTES - overhead) // 4 * 3  # base64: 4 characters per 3 bytes
    return room - _HEADER - _TAG_BYTES


MAX_PLAIN_METADATA = _max_plain_metadata()
"""The largest session metadata (compact JSON, bytes) an EncryptedStore keeps."""


def _fence_kw(fence: Fence | None) -> dict[str, Fence]:
    return {} if fence is None else {"fence": fence}


# --- composing a wrapper with the inner store's capabilities ------------------------------

_T = TypeVar("_T")
_variants: dict[tuple[type, tuple[type, ...]], type] = {}
_variants_lock = threading.Lock()


def _variant(base: type[_T], mixins: Sequence[tuple[type, bool]]) -> type[_T]:
    """``base`` with the mixins whose condition holds (one class per combination), so the
    wrapper offers exactly the capabilities of the store it wraps."""
    chosen = tuple(m for m, on in mixins if on)
    if not chosen:
        return base
    with _variants_lock:
        cls = _variants.get((base, chosen))
        if cls is None:
            cls = type(base.__name__, (*chosen, base),
                       {"__module__": base.__module__, "__qualname__": base.__qualname__})
            _variants[(base, chosen)] = cls
        return cls


def _has(obj: object, *names: str) -> bool:
    return all(callable(getattr(obj, n, None)) for n in names)


_LEASE_METHODS = ("acquire_lease", "renew_lease", "release_lease", "fence_token")
_CATALOG_METHODS = ("info", "set_metadata", "history", "compact", "create", "list")


class _Part:
    _inner: Any
    _sealer: _Sealer


class _SessionAppend(_Part):
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


class _SessionRevision(_Part):
    def revision(self, id: str) -> object:
        """The inner store's revision of ``id``."""
        return self._inner.revision(id)


class _SessionIds(_Part):
    def ids(self) -> list[str]:
        """The inner store's session ids."""
        return list(self._inner.ids())


class _SessionLease(_Part):
    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """The inner store's lease (and fence token)."""
        token: int | None = self._inner.acquire_lease(id, owner=owner, ttl_s=ttl_s,
                                                      wait_s=wait_s)
        return token

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """The inner store's renew."""
        return bool(self._inner.renew_lease(id, owner=owner, ttl_s=ttl_s))

    def release_lease(self, id: str, *, owner: str) -> None:
        """The inner store's release."""
        self._inner.release_lease(id, owner=owner)

    def fence_token(self, id: str) -> int:
        """The inner store's newest fence token."""
        return int(self._inner.fence_token(id))


class _SessionCatalog(_Part):
    def info(self, id: str) -> SessionInfo | None:
        """The inner catalog entry, its metadata decrypted."""
        info: SessionInfo | None = self._inner.info(id)
        return None if info is None else self._sealer.open_info(info)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Encrypt and replace the metadata ({} removes it); InvalidMetadataError also when
        the encrypted form would not fit the limit."""
        self._inner.set_metadata(id, self._sealer.seal_metadata(id, metadata))

    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced, decrypted."""
        return self._sealer.open_history(id, self._inner.history(id))

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

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """The inner store's page, each entry's metadata decrypted."""
        page: SessionPage = self._inner.list(prefix=prefix, limit=limit, after=after)
        return SessionPage(tuple(map(self._sealer.open_info, page.items)), page.next)


class EncryptedSessionStore(_Part):
    """Transcripts encrypted message by message over an inner session store; offers what
    the inner one offers (append, revision, ids, lease, fencing, the catalog)."""

    def __init__(self, inner: Any, sealer: _Sealer, combined: object) -> None:
        self._inner = inner
        self._sealer = sealer
        self.fenced = getattr(inner, "fenced", False) is True
        self.combined = combined
        self._events: SealedEventOps | None = None

    def event_ops(self) -> SealedEventOps:
        """The inner store's event log with every event encrypted like a message."""
        if self._events is None:
            sealer = self._sealer
            self._events = SealedEventOps(
                event_ops_of(self._inner), sealer.seal,
                lambda token, aad, what: sealer.open(token, aad, what, None))
        return self._events

    @property
    def inner(self) -> Any:
        """The session store holding the envelopes."""
        return self._inner

    def load(self, id: str) -> list[Message] | None:
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

    def __repr__(self) -> str:
        return f"EncryptedSessionStore({self._inner!r})"


class EncryptedCheckpointStore(_Part):
    """Checkpoints encrypted over an inner checkpoint store (key, ids, status and times
    plain)."""

    def __init__(self, inner: Any, sealer: _Sealer) -> None:
        self._inner = inner
        self._sealer = sealer
        self.fenced = getattr(inner, "fenced", False) is True

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


class EncryptedApprovalStore(_Part):
    """Approval records encrypted over an inner approval store; ``resolve`` is the inner
    one's (resolve-once holds), its reason encrypted and bound to the status."""

    def __init__(self, inner: Any, sealer: _Sealer,
                 checkpoints: EncryptedCheckpointStore | None = None) -> None:
        self._inner = inner
        self._sealer = sealer
        self._checkpoints = checkpoints  # the paused turns, to find hidden approvals
        self.fenced = getattr(inner, "fenced", False) is True

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


class _StoreLease:
    sessions: Any

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Same as ``sessions.acquire_lease``."""
        token: int | None = self.sessions.acquire_lease(id, owner=owner, ttl_s=ttl_s,
                                                        wait_s=wait_s)
        return token

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Same as ``sessions.renew_lease``."""
        return bool(self.sessions.renew_lease(id, owner=owner, ttl_s=ttl_s))

    def release_lease(self, id: str, *, owner: str) -> None:
        """Same as ``sessions.release_lease``."""
        self.sessions.release_lease(id, owner=owner)

    def fence_token(self, id: str) -> int:
        """Same as ``sessions.fence_token``."""
        return int(self.sessions.fence_token(id))


class _StoreCommit:
    _committer: Any
    _sealer: _Sealer

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


class _StorePrune:
    _inner: Any
    approvals: Any

    def prune(self, older_than_s: float) -> PruneResult:
        """Deny the expired approvals (their expiry is sealed), then the inner store's
        prune (it works on the plain times)."""
        check_older_than(older_than_s)
        expire_due(self.approvals)
        result: PruneResult = self._inner.prune(older_than_s)
        return result


class _StoreClose:
    _inner: Any

    def close(self) -> None:
        """Close the inner store."""
        self._inner.close()


class EncryptedStore:
    """``EncryptedStore(inner, keys=[...])``: ``inner`` (an AgentStore, SqliteStore,
    RedisStore, …) with every message, checkpoint, approval and metadata encrypted
    (AES-GCM; see the module). ``keys``: 32-byte keys or their urlsafe base64 strs
    (:meth:`generate_key`), the one that encrypts first. Offers exactly what ``inner``
    offers: ``sessions``/``checkpoints``/``approvals``, leases and fencing, ``commit_turn``,
    ``prune``, ``close`` and ``with``. ConfigError without the ``crypto`` extra.
    """

    sessions: EncryptedSessionStore | None
    checkpoints: EncryptedCheckpointStore | None
    approvals: EncryptedApprovalStore | None

    generate_key = staticmethod(generate_key)

    def __new__(cls, inner: object, *, keys: Sequence[bytes | str]) -> Self:
        parts = getattr(inner, "sessions", None)
        variant = _variant(cls, [
            (_StoreLease, _has(inner, *_LEASE_METHODS) and _has(parts, *_LEASE_METHODS)),
            (_StoreCommit, turn_committer(parts) is not None),
            (_StorePrune, _has(inner, "prune")),
            (_StoreClose, _has(inner, "close")),
        ])
        return object.__new__(variant)

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
        self._sealer = sealer = _Sealer(self.keyring, inner)
        sessions = getattr(inner, "sessions", None)
        checkpoints = getattr(inner, "checkpoints", None)
        approvals = getattr(inner, "approvals", None)
        self._committer = turn_committer(sessions)
        if sessions is None:
            self.sessions = None
        else:
            self.sessions = _variant(EncryptedSessionStore, [
                (_SessionAppend, _has(sessions, "append")),
                (_SessionRevision, _has(sessions, "revision")),
                (_SessionIds, _has(sessions, "ids")),
                (_SessionLease, _has(sessions, *_LEASE_METHODS)),
                (_SessionCatalog, _has(sessions, *_CATALOG_METHODS)),
            ])(sessions, sealer, self if self._committer is not None else None)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        close = getattr(self, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"EncryptedStore({self._inner!r}, key_ids={list(self.key_ids)})"
