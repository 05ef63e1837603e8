"""EncryptedStore's session mailbox: the inner store's primitives with each mail's data
sealed like a message, bound to its session, mail id and kind (so a mail moved to another
session, or a queued input turned into an abort, does not open). A mail that does not open
is dropped with a warning, as the mailbox drops an unreadable one: its poster then runs its
input as the next turn."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..errors import StoreDecryptError
from ._mail import Mail, MailOps, MailPush, Wake
from ._sealing import record_aad

__all__ = ["SealedMailOps", "SealedPushMailOps", "sealed_mail"]

_log = logging.getLogger("lousho_sync.stores.encrypted")

Seal = Callable[[str, bytes], str]
Open = Callable[[object, bytes, str, str], str]


def _aad(session_id: str, mail_id: str, kind: str) -> bytes:
    return record_aad("mail", session_id, mail_id, kind)


class SealedMailOps:
    """``inner`` with each mail's data sealed by ``seal(text, aad)`` under the envelope
    field ``mark`` and opened by ``open(token, aad, what, session_id)``; the mail's ids,
    kind, poster and time stay plain."""

    def __init__(self, inner: MailOps, mark: str, seal: Seal, open: Open) -> None:
        self._inner = inner
        self._mark = mark
        self._seal = seal
        self._open = open

    def _opened(self, m: Mail) -> Mail | None:
        what = f"mail {m.mail_id!r} of session {m.session_id!r}"
        try:
            envelope = json.loads(m.data)
            token = envelope.get(self._mark) if isinstance(envelope, dict) else None
            text = self._open(token, _aad(m.session_id, m.mail_id, m.kind), what,
                              m.session_id)
        except (StoreDecryptError, ValueError) as exc:
            _log.warning("dropped %s: %s", what, exc)
            return None
        return attrs.evolve(m, data=text)

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        token = self._seal(data, _aad(session_id, mail_id, kind))
        self._inner.post(session_id, mail_id, kind, json.dumps({self._mark: token}),
                         posted_at, poster)

    def line(self, session_id: str) -> list[Mail]:
        return self._inner.line(session_id)  # the order of the posters: its data unread

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        return [m for m in map(self._opened, self._inner.take(session_ids)) if m is not None]

    def drop(self, mail_id: str, session_id: str) -> None:
        self._inner.drop(mail_id, session_id)

    def version(self) -> int:
        return self._inner.version()

    def prune(self, before: float) -> int:
        prune = getattr(self._inner, "prune", None)
        return 0 if prune is None else int(prune(before))


class SealedPushMailOps(SealedMailOps):
    """:class:`SealedMailOps` over primitives that wake the owner (``MailPush``)."""

    _inner: Any

    def subscribe(self, wake: Wake) -> Callable[[], None]:
        stop: Callable[[], None] = self._inner.subscribe(wake)
        return stop


def sealed_mail(inner: MailOps, mark: str, seal: Seal, open: Open) -> SealedMailOps:
    """The sealed mailbox over ``inner``, waking the owner when ``inner`` does."""
    cls = SealedPushMailOps if isinstance(inner, MailPush) else SealedMailOps
    return cls(inner, mark, seal, open)
