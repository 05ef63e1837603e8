"""The approval rules, once: the record as created with the stored status, reason and
resolution time laid over it, resolve-once and its errors, the fenced create. A backend
writes :class:`ApprovalOps`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from ...codec import dumps_approval, loads_approval
from ...errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, StoreCorruptError
from ...records import ApprovalRecord, Fence
from .._common import overlay, resolved_at
from .backend import Backend, text_of
from .leases import check_newest, fence_token_of

__all__ = ["ApprovalOps", "ApprovalRules", "Row"]

Row = Sequence[Any]
"""A stored approval: (json, status, reason, resolved_at), str or bytes each."""


class ApprovalOps(Protocol):
    """A backend's approval primitives."""

    @property
    def backend(self) -> Backend:
        """The connection the primitives run on."""
        ...

    def put(self, record: ApprovalRecord, text: str, resolved: float | None,
            fenced_id: str | None, token: int) -> int:
        """Store ``record`` (``text`` its JSON), replacing one with its id; with ``token``
        refused, atomically, when a newer token exists for ``fenced_id``: then that token
        (0: written)."""
        ...

    def row(self, id: str) -> Row | None:
        """The stored row of ``id``, or None."""
        ...

    def resolve(self, id: str, status: str, reason: str | None, at: float, by: str | None
                ) -> Row | str | None:
        """Resolve ``id`` if pending (one statement or script; with ``by``, the record's
        JSON stamped by :func:`~lousho_sync.codec.approval_json_resolved_by` in the same
        write): its row as resolved; the status it had when it was not pending; None when
        there is no ``id``."""
        ...

    def pending(self, session_id: str | None) -> list[tuple[str, Row]]:
        """(id, row) of the pending records, oldest first: those of ``session_id`` (a
        backend may return others too), or all."""
        ...


class ApprovalRules:
    """A fenced approval store over the primitives in ``_ops``; ``resolve`` is atomic, so
    exactly one caller across threads and processes wins."""

    fenced = True
    _ops: ApprovalOps

    def create(self, record: ApprovalRecord, *, fence: Fence | None = None) -> None:
        """Store a record (replacing one with the same id). With ``fence``, LeaseLostError
        (nothing written) when a newer lease token exists for the fence's session."""
        token = fence_token_of(fence, record.session_id)
        fenced_id = None if fence is None else fence.session_id
        newest = self._ops.put(record, dumps_approval(record), resolved_at(record), fenced_id,
                               token)
        if fenced_id is not None:
            check_newest(self._ops.backend, fenced_id, newest, token)

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        row = self._ops.row(id)
        return None if row is None else self._record(id, row)

    def resolve(
        self, id: str, *, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ApprovalRecord:
        """Resolve once (by ``by``, written into the record's JSON in the same write): one
        caller wins; the others get ApprovalAlreadyResolvedError; an unknown id raises
        ApprovalNotFoundError."""
        status = "approved" if approved else "denied"
        out = self._ops.resolve(id, status, reason, time.time(), by)
        if out is None:
            raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
        if isinstance(out, str):
            raise ApprovalAlreadyResolvedError(f"approval {id!r} was already {out}",
                                               approval_id=id)
        return self._record(id, out)

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        records = [self._record(id, row) for id, row in self._ops.pending(session_id)]
        if session_id is None:
            return records
        return [r for r in records if r.session_id == session_id]

    def _record(self, id: str, row: Row) -> ApprovalRecord:
        raw, status, reason, resolved = row
        try:
            record = loads_approval(text_of(raw))
            status = text_of(status)
            reason = None if reason is None else text_of(reason)
            if resolved is not None and not isinstance(resolved, float):
                resolved = float(text_of(resolved))
            if status not in ("pending", "approved", "denied"):
                raise ValueError(f"unknown status {status!r}")
        except (StoreCorruptError, ValueError) as exc:
            error = self._ops.backend.unreadable(f"approval {id!r}", exc)
        else:
            return overlay(record, status, reason, resolved)
        raise error  # unchained: the codec's cause holds the stored text
