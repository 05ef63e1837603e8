"""Approval expiry, the rule every store's ``prune()`` applies first: a pending approval past
its ``expires_at`` is denied with the reason ``"expired"`` (one caller does it; the others
read it). Here, below the stores, so that the stores need nothing from above them."""

from __future__ import annotations

from ..errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError
from ..records import ApprovalRecord, is_expired
from .base import ApprovalStore

__all__ = ["EXPIRED_REASON", "expire_due", "settle"]

EXPIRED_REASON = "expired"
"""The reason an expired approval is denied with."""


def settle(store: ApprovalStore, record: ApprovalRecord) -> ApprovalRecord:
    """``record`` as it stands now: a pending one past its ``expires_at`` is first denied in
    ``store`` with the reason ``"expired"`` (one caller does it; the others read it)."""
    if not is_expired(record):
        return record
    try:
        return store.resolve(record.id, approved=False, reason=EXPIRED_REASON)
    except (ApprovalAlreadyResolvedError, ApprovalNotFoundError):
        again = store.get(record.id)
        return record if again is None else again


def expire_due(store: ApprovalStore) -> int:
    """Deny every pending approval of ``store`` past its ``expires_at`` (what ``prune()``
    does first); returns how many this call denied."""
    count = 0
    for record in store.list_pending(None):
        if is_expired(record):
            done = settle(store, record)
            count += done.reason == EXPIRED_REASON and done.status == "denied"
    return count
