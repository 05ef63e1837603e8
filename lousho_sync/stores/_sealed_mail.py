"""EncryptedStore's session mailbox: the inner store's primitives with each mail's data
sealed like a message, bound to its session, mail id and kind (so a mail moved to another
session, or a queued input turned into an abort, does not open). A mail that does not open
is dropped with a warning, as the mailbox drops an unreadable one: its poster then runs its
input as the next turn."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import attrs

from ..errors import StoreDecryptError
from ._mail import Mail, MailOps
from ._sealing import record_aad

__all__ = ["SealedMailOps"]

_log = logging.getLogger("lousho_sync.stores.encrypted")

Seal = Callable[[str, bytes], str]
Open = Callable[[object, bytes, str, str], str]


def _aad(session_id: str, mail_id: str, kind: str) -> bytes:
    return record_aad("mail", session_id, mail_id, kind)


class SealedMailOps:
    """``inner`` with each mail's data sealed by ``seal(text, aad)`` under the envelope
    field ``mark`` and opened by ``open(token, aad, what, session_id)``; the mail's ids,
    kind and time stay plain."""

    def __init__(self, inner: MailOps, mark: str, seal: Seal, open: Open) -> None:
        self._inner = inner
        self._mark = mark
        self._seal = seal
        self._open = open

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float) -> None:
        token = self._seal(data, _aad(session_id, mail_id, kind))
        self._inner.post(session_id, mail_id, kind, json.dumps({self._mark: token}), posted_at)

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        out = []
        for m in self._inner.take(session_ids):
            what = f"mail {m.mail_id!r} of session {m.session_id!r}"
            try:
                envelope = json.loads(m.data)
                token = envelope.get(self._mark) if isinstance(envelope, dict) else None
                text = self._open(token, _aad(m.session_id, m.mail_id, m.kind), what,
                                  m.session_id)
            except (StoreDecryptError, ValueError) as exc:
                _log.warning("dropped %s: %s", what, exc)
                continue
            out.append(attrs.evolve(m, data=text))
        return out

    def drop(self, mail_id: str) -> None:
        self._inner.drop(mail_id)

    def version(self) -> int:
        return self._inner.version()
