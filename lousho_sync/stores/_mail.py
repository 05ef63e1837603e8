"""The session mailbox's storage primitives: what a store keeps of input (or an abort) that
a process puts in for the turn another process owns.

A mail is ``(seq, mail_id, session_id, kind, data, posted_at, poster)``: ``seq`` grows in
arrival order, ``kind`` is ``"queue"``, ``"steer"`` or ``"abort"``, ``data`` JSON the store
never reads, ``poster`` the lease owner string of the process that posted it (whose death
is told from it). A mail stays in the store, taken or not, until dropped: the session's
*line* of posters waiting for the lease. A backend writes :class:`MailOps` (each call one
transaction), and where it can push (a Redis stream read with ``XREAD BLOCK``, PostgreSQL
``LISTEN``/``NOTIFY``, the memory store at once) :class:`MailPush`, the owner's wake-up;
the rules — who posts, who drains, what a drained mail does, how the poster learns what
became of it — are written once above the stores (:mod:`lousho_sync._mailbox`). A store
that has no mailbox (:func:`mail_ops_of` answers None) keeps the cross-process fallback of
the turn policies (``"wait"``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from .base import capabilities_of

__all__ = ["MAIL_TTL_S", "HasMailbox", "Mail", "MailOps", "MailPush", "Wake", "mail_ops_of",
           "prune_mail"]

MAIL_TTL_S = 600.0
"""How long a store keeps a mail at most: ``prune()`` drops older ones (seconds). Nothing
waits for mail that old: an abort is only applied to a turn that started before it was
posted (within a second), a poster that waited 60 s no longer holds the line, and a poster
whose mail is gone reads what became of its input from the transcript as before."""

Wake = Callable[[str | None], None]
"""Called with the session id of a mail just posted (None: mail may have been missed, look
at every session)."""


@attrs.frozen(slots=True)
class Mail:
    """One mail, as drained."""

    seq: int
    mail_id: str
    session_id: str
    kind: str
    data: str
    posted_at: float
    poster: str = ""


class MailOps(Protocol):
    """A backend's mailbox primitives. Thread-safe; every call may raise StoreError."""

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        """Add one mail to ``session_id``'s mailbox (after every mail posted before)."""
        ...

    def line(self, session_id: str) -> list[Mail]:
        """The mail of ``session_id`` not dropped yet, taken or not, in arrival order."""
        ...

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        """The untaken mail of ``session_ids`` in arrival order, marked taken in the same
        transaction (exactly one caller gets each mail)."""
        ...

    def drop(self, mail_id: str, session_id: str) -> None:
        """Forget one mail of ``session_id`` (taken or not; no error when absent)."""
        ...

    def version(self) -> int:
        """A number that changes once another connection's post is visible to
        :meth:`take`: the check a polling owner makes at its wake-ups, nearly free."""
        ...

    def prune(self, before: float) -> int:
        """Drop every mail posted before ``before`` (a Unix time), taken or not; how many
        (optional for a custom mailbox: :func:`prune_mail` skips one without it)."""
        ...


@runtime_checkable
class MailPush(Protocol):
    """Mailbox primitives that tell an owner about new mail (instead of being polled)."""

    def subscribe(self, wake: Wake) -> Callable[[], None]:
        """Call ``wake(session_id)`` soon after a mail of ``session_id`` is posted by any
        process, and ``wake(None)`` when some may have been missed (first when listening
        starts, then after a lost connection); returns the function that stops it.
        Best effort: a wake-up lost anyway (a server restart) is made up for by the owner's
        fallback poll."""
        ...


@runtime_checkable
class HasMailbox(Protocol):
    """A store with a session mailbox of its own."""

    def mail_ops(self) -> MailOps:
        """The store's mailbox primitives."""
        ...


def prune_mail(ops: MailOps | None, ttl_s: float = MAIL_TTL_S) -> int:
    """Drop the mail of ``ops`` posted more than ``ttl_s`` ago (what every store's
    ``prune()`` does); how many."""
    prune = getattr(ops, "prune", None)
    if prune is None:
        return 0
    count: int = prune(time.time() - ttl_s)
    return count


def mail_ops_of(store: object) -> MailOps | None:
    """The mailbox of ``store`` (``capabilities.mailbox``), or None when it has none (the
    policies fall back)."""
    if not capabilities_of(store).mailbox:
        return None
    ops: MailOps = store.mail_ops()  # type: ignore[attr-defined]
    return ops
