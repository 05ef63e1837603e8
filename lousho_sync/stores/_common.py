"""What the built-in stores share: argument checks, the errors they raise for a conflict or
a lost lease, the approval-record overlay, lease forwarding and the context manager."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Literal, Protocol, Self, cast

import attrs

from ..errors import (
    ConfigError,
    InvalidInputError,
    StoreConflictError,
    StoreEncryptedError,
)
from ..ids import validate_session_id
from ..records import ApprovalRecord
from .base import FencedLease, LeaseQuery, StoreCapabilities

__all__ = [
    "Closing",
    "LeaseForwarding",
    "check_length",
    "check_older_than",
    "encrypted_refusal",
    "unstorable",
    "overlay",
    "resolved_at",
    "validate_session_id",
]


def check_older_than(older_than_s: float) -> None:
    """ConfigError unless prune's ``older_than_s`` is >= 0."""
    if not older_than_s >= 0:
        raise ConfigError(f"older_than_s must be >= 0, got {older_than_s!r}")


def check_length(
    id: str,
    expected: int,
    actual: int,
    where: str,
    *,
    path: str | None = None,
    address: str | None = None,
) -> None:
    """StoreConflictError when session ``id`` (kept ``where``: "in the SQLite store at …")
    holds ``actual`` messages instead of ``expected``."""
    if actual != expected:
        raise StoreConflictError(
            f"session {id!r} {where} holds {actual} messages, expected {expected}: another "
            "writer appended first; reload and append again",
            expected_length=expected,
            actual_length=actual,
            path=path,
            address=address,
            session_id=id,
        )


_Status = Literal["pending", "approved", "denied"]


def resolved_at(record: ApprovalRecord) -> float | None:
    """When ``record`` was resolved: its own time, or now for a resolved record without."""
    if record.status != "pending" and record.resolved_at is None:
        return time.time()
    return record.resolved_at


def overlay(
    record: ApprovalRecord, status: str, reason: str | None, resolved: float | None
) -> ApprovalRecord:
    """``record`` (as created) with the stored ``status``, ``reason`` and resolution time,
    which are the truth."""
    if (record.status, record.reason, record.resolved_at) == (status, reason, resolved):
        return record
    return attrs.evolve(
        record, status=cast(_Status, status), reason=reason, resolved_at=resolved
    )


SHARED_STORE = StoreCapabilities(lease=True, lease_query=True, fencing=True, append=True,
                                 revision=True, commit_turn=True, catalog=True, prune=True,
                                 events=True, mailbox=True)
"""What SqliteStore, RedisStore and PostgresStore offer."""
SHARED_SESSIONS = attrs.evolve(SHARED_STORE, prune=False)
"""What their session stores offer."""
FENCED_PART = StoreCapabilities(fencing=True)
"""What their checkpoint and approval stores offer."""


class _WithLeasedSessions(Protocol):
    @property
    def sessions(self) -> FencedLease: ...


class LeaseForwarding:
    """A combined store's lease methods, forwarded to its ``sessions``."""

    def acquire_lease(
        self: _WithLeasedSessions, id: str, *, owner: str, ttl_s: float, wait_s: float
    ) -> int | None:
        """Same as ``sessions.acquire_lease``."""
        return self.sessions.acquire_lease(id, owner=owner, ttl_s=ttl_s, wait_s=wait_s)

    def renew_lease(self: _WithLeasedSessions, id: str, *, owner: str, ttl_s: float) -> bool:
        """Same as ``sessions.renew_lease``."""
        return self.sessions.renew_lease(id, owner=owner, ttl_s=ttl_s)

    def release_lease(self: _WithLeasedSessions, id: str, *, owner: str) -> None:
        """Same as ``sessions.release_lease``."""
        self.sessions.release_lease(id, owner=owner)

    def fence_token(self: _WithLeasedSessions, id: str) -> int:
        """Same as ``sessions.fence_token``."""
        return self.sessions.fence_token(id)

    def lease_held(self: _WithLeasedSessions, id: str) -> bool:
        """Same as ``sessions.lease_held``."""
        sessions = self.sessions
        assert isinstance(sessions, LeaseQuery)
        return sessions.lease_held(id)


class Closing:
    """``with store: ...`` closes the store at the end of the block."""

    def close(self) -> None:
        """Release what the store holds (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def encrypted_refusal(where: str, *, path: str | None = None,
                      address: str | None = None) -> StoreEncryptedError:
    """The error of a plain use of a store marked as written through EncryptedStore."""
    return StoreEncryptedError(
        f"the store {where} was written through EncryptedStore (it is marked so): open it "
        "as EncryptedStore(store, keys=[...]) (the lousho command takes the keys from "
        "LOUSHO_ENCRYPTION_KEYS); plain access would show empty texts and mix plaintext into "
        "encrypted sessions, so it is refused",
        path=path,
        address=address,
    )


def unstorable(what: str, char: str, session_id: str | None = None) -> InvalidInputError:
    """The error for a str a store cannot keep or look up (``char``: its NUL or surrogate
    code point), raised before anything was written."""
    name = "NUL" if char == "\x00" else f"the surrogate code point U+{ord(char):04X}"
    text = f"could not {what}: a str given holds {name}, which a store cannot keep"
    if session_id is not None:
        text += f" (session {session_id!r})"
    return InvalidInputError(text + "; nothing was written")
