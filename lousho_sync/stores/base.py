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

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from ..errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError
from ..messages import Message, ToolCall, Usage

__all__ = [
    "AgentStore",
    "ApprovalRecord",
    "ApprovalStore",
    "Checkpoint",
    "CheckpointStore",
    "SessionStore",
    "StorageService",
    "now",
    "resolved",
]

CHECKPOINT_VERSION = 1


def now() -> float:
    """Wall-clock seconds since the epoch (what stores record)."""
    return time.time()


def _map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return {} if value is None else dict(value)


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return value if type(value) is tuple else tuple(value)


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return value if type(value) is tuple else tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class Checkpoint:
    """The state of an unfinished turn, written after every model response and tool result
    and before every tool starts.

    ``turn_index`` is the transcript length when the turn started; ``input`` the turn's user
    messages; ``recorded`` its messages so far (assistant responses, tool results, applied
    queued input) in order; ``started_call_ids`` tool calls started and not yet recorded;
    ``queued_inputs`` input queued into the turn and not yet applied; ``extra`` fields this
    release does not know, kept.
    """

    version: int = CHECKPOINT_VERSION
    key: str
    session_id: str | None
    run_id: str
    turn_index: int = 0
    input: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    recorded: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    started_call_ids: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    queued_inputs: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    pending_approval_ids: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    usage: Usage = Usage()
    status: Literal["running", "interrupted", "awaiting-approval"] = "running"
    created_at: float = attrs.field(factory=now)
    updated_at: float = attrs.field(factory=now)
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_map)


@attrs.frozen(slots=True, kw_only=True)
class ApprovalRecord:
    """One ``needs_approval`` tool call waiting for (or given) a human decision."""

    id: str
    session_id: str | None
    checkpoint_key: str
    call: ToolCall
    status: Literal["pending", "approved", "denied"] = "pending"
    reason: str | None = None
    created_at: float = attrs.field(factory=now)
    resolved_at: float | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_map)


def resolved(
    record: ApprovalRecord | None, id: str, *, approved: bool, reason: str | None
) -> ApprovalRecord:
    """``record`` (the stored approval ``id``, or None) resolved now as approved or denied
    with ``reason``, for a store that resolves under its own lock and writes the result.

    Raises ApprovalNotFoundError when ``record`` is None and ApprovalAlreadyResolvedError
    when it is no longer pending.
    """
    if record is None:
        raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
    if record.status != "pending":
        raise ApprovalAlreadyResolvedError(
            f"approval {id!r} was already {record.status}", approval_id=id
        )
    return attrs.evolve(
        record,
        status="approved" if approved else "denied",
        reason=reason,
        resolved_at=now(),
    )


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

