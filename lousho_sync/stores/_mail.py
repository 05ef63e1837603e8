"""The session mailbox's storage primitives: what a store keeps of input (or an abort) that
a process puts in for the turn another process owns.

A mail is ``(seq, mail_id, session_id, kind, data, posted_at)``: ``seq`` grows in arrival
order, ``kind`` is ``"queue"``, ``"steer"`` or ``"abort"``, ``data`` JSON the store never
reads. A backend writes :class:`MailOps` (each call one transaction); the rules — who
posts, who drains, what a drained mail does, how the poster learns what became of it —
are written once above the stores (:mod:`lousho_sync._mailbox`). A store that has no
mailbox (:func:`mail_ops_of` answers None) keeps the cross-process fallback of the turn
policies (``"wait"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from .base import capabilities_of

__all__ = ["HasMailbox", "Mail", "MailOps", "mail_ops_of"]


@attrs.frozen(slots=True)
class Mail:
    """One mail, as drained."""

    seq: int
    mail_id: str
    session_id: str
    kind: str
    data: str
    posted_at: float


class MailOps(Protocol):
    """A backend's mailbox primitives. Thread-safe; every call may raise StoreError."""

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float) -> None:
        """Add one mail to ``session_id``'s mailbox (after every mail posted before)."""
        ...

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        """The untaken mail of ``session_ids`` in arrival order, marked taken in the same
        transaction (exactly one caller gets each mail)."""
        ...

    def drop(self, mail_id: str) -> None:
        """Forget one mail (taken or not; no error when absent)."""
        ...

    def version(self) -> int:
        """A number that changes when another connection may have posted: the check an
        owner makes at its wake-ups, nearly free."""
        ...


@runtime_checkable
class HasMailbox(Protocol):
    """A store with a session mailbox of its own."""

    def mail_ops(self) -> MailOps:
        """The store's mailbox primitives."""
        ...


def mail_ops_of(store: object) -> MailOps | None:
    """The mailbox of ``store`` (``capabilities.mailbox``), or None when it has none (the
    policies fall back)."""
    if not capabilities_of(store).mailbox:
        return None
    ops: MailOps = store.mail_ops()  # type: ignore[attr-defined]
    return ops
