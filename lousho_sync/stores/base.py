"""Store protocols, the checkpoint and approval records, and capability detection.

Required protocols: :class:`SessionStore`, :class:`CheckpointStore`, :class:`ApprovalStore`.
Optional capabilities, detected on the store object:

* ``append(id, messages, *, expected_length)`` — add a turn's messages; raise
  :class:`~lousho_sync.StoreConflictError` when the stored length is not ``expected_length``.
* ``acquire_lease(id, *, owner, ttl_s, wait_s) -> bool``, ``renew_lease(id, *, owner, ttl_s)
  -> bool``, ``release_lease(id, *, owner)`` — a per-session lease across processes.
* ``revision(id) -> object`` — a token that changes whenever the stored transcript changes,
  so a session can skip reloading an unchanged transcript.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import attrs

from ..messages import Message
from ..records import CHECKPOINT_VERSION, ApprovalRecord, Checkpoint, Fence, now, resolved

__all__ = [
    "CHECKPOINT_VERSION",
    "AgentStore",
    "ApprovalRecord",
    "ApprovalStore",
    "Checkpoint",
    "CheckpointStore",
    "Fence",
    "SessionStore",
    "StorageService",
    "now",
    "resolved",
]

@runtime_checkable
class SessionStore(Protocol):
    """Keeps transcripts by session id."""

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript, or None when the id has none."""
        ...

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the stored transcript (an empty sequence stores nothing)."""
        ...

    def delete(self, id: str) -> None:
        """Forget the id (no error when absent)."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps checkpoints of unfinished turns by key."""

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        ...

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write (replace) the checkpoint."""
        ...

    def delete(self, key: str) -> None:
        """Delete the checkpoint (no error when absent)."""
        ...

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        ...


@runtime_checkable
class ApprovalStore(Protocol):
    """Keeps approval records; ``resolve`` is atomic across threads and processes."""

    def create(self, record: ApprovalRecord) -> None:
        """Store a new pending record."""
        ...

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        ...

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once: exactly one caller wins; the others get
        ``ApprovalAlreadyResolvedError``; an unknown id raises ``ApprovalNotFoundError``."""
        ...

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        ...


@runtime_checkable
class StorageService(Protocol):
    """Bytes by key, with atomic puts and a cross-process lock per key."""

    def get(self, key: str) -> bytes | None:
        """The value, or None."""
        ...

    def put(self, key: str, value: bytes) -> None:
        """Write atomically."""
        ...

    def delete(self, key: str) -> None:
        """Delete (no error when absent)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        ...

    def lock(self, key: str) -> AbstractContextManager[None]:
        """A lock held across threads and processes while the block runs."""
        ...


@attrs.define(slots=True, kw_only=True)
class AgentStore:
    """Bundles a session store, a checkpoint store and an approval store (each optional)."""

    sessions: SessionStore | None = None
    checkpoints: CheckpointStore | None = None
    approvals: ApprovalStore | None = None

