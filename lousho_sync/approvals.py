"""Approvals above the stores, written once over the :class:`~lousho_sync.stores.base.
ApprovalStore` protocol: expiry (an undecided request past its ``expires_at`` is denied
with the reason ``"expired"`` by whoever reads or resolves it first — resolve-once decides
who), who decided (``by``), and :func:`page`, the pending approvals of every session,
newest first, by an opaque cursor.

``page`` reads ``list_pending()`` and pages it in Python (keyset on ``(created_at, id)``):
no store offers a faster listing across sessions yet, and every store can do this.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterator
from typing import Any, Literal

import attrs

from .catalog import LIST_LIMIT_MAX
from .errors import ConfigError
from .records import ApprovalRecord, is_expired
from .stores._expiry import EXPIRED_REASON, expire_due, settle
from .stores.base import ApprovalStore

__all__ = [
    "EXPIRED_REASON",
    "MAX_BY_LENGTH",
    "ApprovalPage",
    "check_by",
    "check_ttl",
    "current",
    "expire_due",
    "page",
    "pending",
    "resolve_record",
    "settle",
]

MAX_BY_LENGTH = 200


@attrs.frozen(slots=True)
class ApprovalPage:
    """One page of ``agent.approvals.page()``: ``items`` newest first, and
    ``next_cursor``, to pass as ``cursor=`` for the next page (None: the last page)."""

    items: tuple[ApprovalRecord, ...]
    next_cursor: str | None = None

    def __iter__(self) -> Iterator[ApprovalRecord]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def check_ttl(ttl_s: object, where: str) -> float | None:
    """``approval_ttl_s`` checked: None, or a finite number of seconds > 0 (ConfigError)."""
    if ttl_s is None:
        return None
    if (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
            or not math.isfinite(ttl_s) or ttl_s <= 0):
        raise ConfigError(
            f"{where}: approval_ttl_s must be a number of seconds > 0 or None, got {ttl_s!r}"
        )
    return float(ttl_s)


def check_by(by: object) -> str | None:
    """``by`` checked: None or a str of 1 to :data:`MAX_BY_LENGTH` characters."""
    if by is None:
        return None
    if not isinstance(by, str) or not 1 <= len(by) <= MAX_BY_LENGTH:
        raise ConfigError(
            f"by must be None or a str of 1 to {MAX_BY_LENGTH} characters (who decides), "
            f"got {by!r}"
        )
    return by


def resolve_record(
    store: ApprovalStore, id: str, *, approved: bool, reason: str | None, by: str | None
) -> ApprovalRecord:
    """``store.resolve`` with ``by`` (passed only when given: a store of another library
    need not take it)."""
    if by is None:
        return store.resolve(id, approved=approved, reason=reason)
    resolve: Any = store.resolve
    try:
        record: ApprovalRecord = resolve(id, approved=approved, reason=reason, by=by)
    except TypeError as exc:
        if "by" not in str(exc):
            raise
        raise ConfigError(
            f"the approval store {type(store).__name__} does not record who decided: its "
            "resolve() takes no by= (resolve without by=, or add it to the store)"
        ) from exc
    return record


def current(store: ApprovalStore, id: str) -> ApprovalRecord | None:
    """The record ``id`` as it stands now (expired ones denied), or None."""
    record = store.get(id)
    return None if record is None else settle(store, record)


def pending(store: ApprovalStore, session_id: str | None = None) -> list[ApprovalRecord]:
    """``store.list_pending(session_id)`` without the expired records (denied on the way)."""
    out = []
    for record in store.list_pending(session_id):
        if is_expired(record):
            settle(store, record)
        else:
            out.append(record)
    return out


def _cursor_of(record: ApprovalRecord) -> str:
    raw = json.dumps([record.created_at, record.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, id = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        created_at = id = None
    if (not isinstance(created_at, (int, float)) or isinstance(created_at, bool)
            or not isinstance(id, str)):
        raise ConfigError(
            f"cursor={cursor!r} is not an approvals cursor: pass the next_cursor of the page "
            "before (None for the first page)"
        )
    return float(created_at), id


def page(
    store: ApprovalStore,
    status: Literal["pending"] = "pending",
    *,
    session_prefix: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> ApprovalPage:
    """One page of the pending approvals of every session whose id starts with
    ``session_prefix``, newest first (then by id); expired ones are denied, not listed."""
    if status != "pending":
        raise ConfigError(f"status must be 'pending' (the only status paged), got {status!r}")
    if session_prefix is not None and not isinstance(session_prefix, str):
        raise ConfigError(f"session_prefix must be a str or None, got {session_prefix!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
        raise ConfigError(f"limit must be an int from 1 to {LIST_LIMIT_MAX}, got {limit!r}")
    if cursor is not None and not isinstance(cursor, str):
        raise ConfigError(f"cursor must be a str (a page's next_cursor) or None, got {cursor!r}")
    after = None if cursor is None else _decode(cursor)
    prefix = session_prefix or ""
    chosen = []
    for record in pending(store):
        if prefix and not (record.session_id or "").startswith(prefix):
            continue
        key = (record.created_at, record.id)
        # newest first, then by id: what comes after the cursor is older, or as old with a
        # greater id
        if after is not None and not (key[0] < after[0] or (key[0] == after[0]
                                                            and key[1] > after[1])):
            continue
        chosen.append(record)
    chosen.sort(key=lambda r: (-r.created_at, r.id))
    items = tuple(chosen[:limit])
    more = len(chosen) > limit
    return ApprovalPage(items, _cursor_of(items[-1]) if more else None)
