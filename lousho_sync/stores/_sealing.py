"""EncryptedStore's sealing: the AES-GCM keyring, the TOKEN format, the additional
authenticated data binding a ciphertext to its record, and the envelopes of messages,
metadata, checkpoints and approvals (the format is described in
:mod:`lousho_sync.stores.encrypted`)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..catalog import (
    MAX_METADATA_BYTES,
    SessionInfo,
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
from ..records import ApprovalRecord, Checkpoint

__all__ = [
    "MARK",
    "MAX_PLAIN_METADATA",
    "Keyring",
    "Sealer",
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


class Sealer:
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
