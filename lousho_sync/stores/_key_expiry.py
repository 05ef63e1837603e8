"""Idempotency keys past their TTL, the rule every store's ``prune()`` applies to the
transcripts it keeps: a key lives on its turn's messages (see
:mod:`lousho_sync._idempotency`), and one past its TTL counts as free already; this removes
it, under each session's lease (a session whose turn runs keeps its keys until the next
``prune()``). Here, below the stores, so that the stores need nothing from above them."""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs

from .. import _idempotency as idem
from .._lease_hold import LeaseHold
from ..errors import ConfigError, SessionBusyError, StoreCorruptError
from ..results import PruneResult
from ._lease import make_owner
from ._mail import mail_ops_of, prune_mail
from .base import capabilities_of

__all__ = ["DEFAULT_KEY_TTL_S", "KEY_LEASE_TTL_S", "check_key_ttl", "drop_expired_keys", "tidy"]

_log = logging.getLogger("lousho_sync.stores")

DEFAULT_KEY_TTL_S = idem.DEFAULT_TTL_S
"""The TTL of the keys ``prune()`` removes unless told (seconds: 24 h)."""

KEY_LEASE_TTL_S = 30.0
"""The lease a transcript's rewrite holds (seconds)."""


def drop_expired_keys(sessions: Any, ttl_s: float = idem.DEFAULT_TTL_S, *,
                      now: float | None = None) -> int:
    """Remove the idempotency keys older than ``ttl_s`` from every transcript of the session
    store ``sessions`` (it needs a catalog to list them); returns how many transcripts were
    rewritten. Each is read, then rewritten whole under the session's lease (taken without
    waiting: a session whose turn runs is left as it is) with the lease's fence."""
    caps = capabilities_of(sessions)
    if not caps.catalog:
        return 0
    moment = time.time() if now is None else now
    rewritten = 0
    for sid in list(sessions.ids()):
        try:
            if idem.expire(sessions.load(sid) or [], ttl_s, now=moment) is None:
                continue  # the common case: nothing to rewrite, no lease taken
        except StoreCorruptError as exc:
            _log.warning("prune skipped the keys of session %r: %s", sid, exc)
            continue
        hold = LeaseHold(sessions, sid, make_owner(), KEY_LEASE_TTL_S) if caps.lease else None
        try:
            if hold is not None and not hold.acquire(wait=False):
                continue
        except SessionBusyError:
            continue  # a turn runs: the next prune() removes them
        try:
            stripped = idem.expire(sessions.load(sid) or [], ttl_s, now=moment)
            if stripped is not None:
                fence = hold.fence() if hold is not None and caps.fencing else None
                if fence is not None:
                    sessions.save(sid, stripped, fence=fence)
                else:
                    sessions.save(sid, stripped)
                rewritten += 1
        finally:
            if hold is not None:
                hold.release()
    return rewritten


def check_key_ttl(idempotency_ttl_s: object) -> None:
    """ConfigError unless ``idempotency_ttl_s`` is a number of seconds > 0 (checked before
    ``prune()`` deletes anything)."""
    if isinstance(idempotency_ttl_s, bool) or not isinstance(idempotency_ttl_s, int | float) \
            or not idempotency_ttl_s > 0:
        raise ConfigError(
            f"prune(): idempotency_ttl_s must be a number of seconds > 0; got "
            f"{idempotency_ttl_s!r:.80}")


def tidy(result: PruneResult, sessions: Any, idempotency_ttl_s: float) -> PruneResult:
    """What every store's ``prune()`` does last: ``result`` with the mail past
    :data:`~lousho_sync.stores._mail.MAIL_TTL_S` dropped (``mails``) and the keys past
    ``idempotency_ttl_s`` removed from the transcripts (``keys``)."""
    check_key_ttl(idempotency_ttl_s)
    mails = prune_mail(mail_ops_of(sessions))
    keys = drop_expired_keys(sessions, float(idempotency_ttl_s))
    return attrs.evolve(result, mails=mails, keys=keys)
