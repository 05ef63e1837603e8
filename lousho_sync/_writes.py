"""TurnWriter: every checkpoint and approval write one turn makes, carrying the turn's
lease fence to the stores that check it."""

from __future__ import annotations

from typing import Any

from ._lease_hold import LeaseHold
from .records import ApprovalRecord, Checkpoint
from .stores.base import ApprovalStore, CheckpointStore, supports_fencing

__all__ = ["TurnWriter"]


class TurnWriter:
    """The checkpoint and approval writes of turns; a no-op where there is no store.

    Each write first asks the lease hold (if any) for its fence, so a turn whose lease was
    lost stops before writing; stores that check fences also refuse a stale one atomically.
    """

    __slots__ = ("approvals", "checkpoints", "hold", "wrote")

    def __init__(
        self,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        hold: LeaseHold | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.approvals = approvals
        self.hold = hold
        self.wrote = False  # a checkpoint write was attempted (it may have landed)

    @property
    def durable(self) -> bool:
        """Whether there is somewhere to keep a checkpoint."""
        return self.checkpoints is not None

    def _fence(self, part: object) -> dict[str, Any]:
        if self.hold is None:
            return {}
        fence = self.hold.fence()
        return {"fence": fence} if fence is not None and supports_fencing(part) else {}

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` under its key."""
        store = self.checkpoints
        if store is not None:
            fence = self._fence(store)
            self.wrote = True
            store.save(checkpoint.key, checkpoint, **fence)

    def delete(self, key: str | None) -> None:
        """Delete the checkpoint ``key`` (nothing when None)."""
        store = self.checkpoints
        if store is not None and key is not None:
            store.delete(key, **self._fence(store))

    def create_approval(self, record: ApprovalRecord) -> None:
        """Store a new pending approval record."""
        store = self.approvals
        assert store is not None
        store.create(record, **self._fence(store))
