"""In-memory stores: for tests, scripts and the default agent."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from ..errors import StoreConflictError
from ..messages import Message
from .base import AgentStore, ApprovalRecord, Checkpoint, resolved

__all__ = [
    "InMemoryApprovalStore",
    "MemoryCheckpointStore",
    "MemorySessionStore",
    "memory_store",
]


class MemorySessionStore:
    """Transcripts in a dict. Thread-safe (one lock guards the dict).

    ``append`` is O(turn): the stored list grows in place.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, list[Message]] = {}
        self._revisions: dict[str, int] = {}
        self._counter = itertools.count(1)

    def load(self, id: str) -> list[Message] | None:
        """A copy of the stored transcript, or None."""
        with self._lock:
            messages = self._data.get(id)
            return None if messages is None else list(messages)

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript (empty: forget the id)."""
        with self._lock:
            if messages:
                self._data[id] = list(messages)
                self._revisions[id] = next(self._counter)
            else:
                self._data.pop(id, None)
                self._revisions.pop(id, None)

    def delete(self, id: str) -> None:
        """Forget the id."""
        self.save(id, ())

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add a turn's messages; StoreConflictError when the length is not expected."""
        with self._lock:
            stored = self._data.get(id)
            length = 0 if stored is None else len(stored)
            if length != expected_length:
                raise StoreConflictError(
                    f"session {id!r} holds {length} messages, expected {expected_length}: "
                    "another writer appended first",
                    expected_length=expected_length,
                    actual_length=length,
                    session_id=id,
                )
            if not messages:
                return
            if stored is None:
                stored = self._data[id] = []
            stored.extend(messages)
            self._revisions[id] = next(self._counter)

    def revision(self, id: str) -> object:
        """Changes whenever the transcript of ``id`` changes."""
        return self._revisions.get(id)

    def ids(self) -> list[str]:
        """Stored session ids, sorted."""
        with self._lock:
            return sorted(self._data)


class MemoryCheckpointStore:
    """Checkpoints in a dict (kept as the immutable objects). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Checkpoint] = {}

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        return self._data.get(key)

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write the checkpoint."""
        with self._lock:
            self._data[key] = checkpoint

    def delete(self, key: str) -> None:
        """Delete the checkpoint."""
        with self._lock:
            self._data.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        with self._lock:
            return sorted(k for k in self._data if k.startswith(prefix))


class InMemoryApprovalStore:
    """Approval records in a dict; ``resolve`` is atomic under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, ApprovalRecord] = {}

    def create(self, record: ApprovalRecord) -> None:
        """Store a record."""
        with self._lock:
            self._data[record.id] = record

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        return self._data.get(id)

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once; later calls raise ApprovalAlreadyResolvedError."""
        with self._lock:
            record = resolved(self._data.get(id), id, approved=approved, reason=reason)
            self._data[id] = record
            return record

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records, oldest first."""
        with self._lock:
            records = [
                r
                for r in self._data.values()
                if r.status == "pending" and (session_id is None or r.session_id == session_id)
            ]
        return sorted(records, key=lambda r: r.created_at)


def memory_store() -> AgentStore:
    """A fresh in-memory AgentStore (sessions, checkpoints, approvals)."""
    return AgentStore(
        sessions=MemorySessionStore(),
        checkpoints=MemoryCheckpointStore(),
        approvals=InMemoryApprovalStore(),
    )
