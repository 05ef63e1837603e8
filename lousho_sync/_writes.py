"""TurnWriter: every checkpoint and approval write one turn makes, carrying the turn's
lease fence to the stores that check it."""

from __future__ import annotations

from typing import Any

from ._lease_hold import LeaseHold
from .records import ApprovalRecord, Checkpoint
from .stores.base import ApprovalStore, CheckpointStore

__all__ = ["TurnWriter"]


def fenced(part: object) -> bool:
    """Whether a store part takes ``fence=`` on its writes."""
    return getattr(part, "fenced", False) is True


class TurnWriter:
    """Writes of one turn under ``key``; a no-op where there is no store (or no key).

    Each write first asks the lease hold (if any) for its fence, so a turn whose lease was
    lost stops before writing; stores that check fences also refuse a stale one atomically.
    """

    __slots__ = ("approvals", "checkpoints", "hold", "key")

    def __init__(
        self,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        key: str | None,
        hold: LeaseHold | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.approvals = approvals
        self.key = key
        self.hold = hold

    @property
    def durable(self) -> bool:
        """Whether this turn has somewhere to keep its checkpoint."""
        return self.checkpoints is not None and self.key is not None

    def _fence(self, part: object) -> dict[str, Any]:
        if self.hold is None:
            return {}
        fence = self.hold.fence()
        return {"fence": fence} if fence is not None and fenced(part) else {}

    def save(self, checkpoint: Checkpoint) -> None:
        """Write the turn's checkpoint."""
        store = self.checkpoints
        if store is not None and self.key is not None:
            store.save(self.key, checkpoint, **self._fence(store))

    def delete(self) -> None:
        """Delete the turn's checkpoint."""
        store = self.checkpoints
        if store is not None and self.key is not None:
            store.delete(self.key, **self._fence(store))

    def create_approval(self, record: ApprovalRecord) -> None:
        """Store a new pending approval record."""
        store = self.approvals
        assert store is not None
        store.create(record, **self._fence(store))
