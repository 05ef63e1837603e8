"""Committing a finished session turn: the store's ``commit_turn`` (messages appended and
checkpoint dropped in one transaction), else ``append`` then a checkpoint delete, else
``save`` of the whole transcript — with the conflict retry of SPEC §5."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ._lease_hold import LeaseHold
from ._session_state import SessionState
from ._writes import TurnWriter
from .errors import StoreConflictError
from .messages import Message
from .stores.base import Appendable, TurnCommitter, supports_fencing

__all__ = ["commit_turn"]

_log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 100


def commit_turn(
    st: SessionState,
    new: tuple[Message, ...],
    *,
    writer: TurnWriter,
    key: str | None,
    committer: TurnCommitter | None,
    hold: LeaseHold | None,
    release: bool,
) -> None:
    """Store the turn ``new`` after the cached transcript and drop its checkpoint.

    ``key`` is the turn's checkpoint; ``committer`` is the combined store whose
    ``commit_turn`` does both at once (None to do them one after the other). With
    ``release`` the commit also gives the lease up (the caller's last write under it).
    """
    store = st.store
    history = st.messages
    fence = hold.fence() if hold is not None else None
    if st.repaired:  # the transcript with its repair, then the turn: one whole write
        kw = {"fence": fence} if fence is not None and supports_fencing(store) else {}
        store.save(st.id, [*history, *new], **kw)
        _log.info("session %s: stored the repair of its orphaned tool calls with the turn",
                  st.id)
        writer.delete(key)
        st.extend(history, new, st.current_revision())
        st.repaired = False
        return
    if committer is not None and writer.durable:
        with contextlib.suppress(StoreConflictError):  # then the slow path below
            revision = committer.commit_turn(
                st.id, new, expected_length=len(history), checkpoint_key=key,
                fence=fence, release=release and hold is not None,
            )
            if release and hold is not None:
                hold.released_by_commit()
            st.extend(history, new, revision)
            return
    kw = {"fence": fence} if fence is not None and supports_fencing(store) else {}
    appendable = st.appendable
    if appendable is not None:
        try:
            appendable.append(st.id, new, expected_length=len(history), **kw)
        except StoreConflictError as exc:
            _log.warning(
                "session %s: another writer stored %s messages where %s were expected; "
                "appending this turn after them",
                st.id, exc.actual_length, len(history),
            )
            history = _append_after_conflict(st, appendable, new, kw)
    else:
        store.save(st.id, [*history, *new], **kw)
    writer.delete(key)
    st.extend(history, new, st.current_revision())


def _append_after_conflict(
    st: SessionState, store: Appendable, new: tuple[Message, ...], kw: dict[str, Any]
) -> list[Message]:
    for _ in range(_CONFLICT_RETRIES):
        fresh = list(st.store.load(st.id) or [])
        try:
            store.append(st.id, new, expected_length=len(fresh), **kw)
        except StoreConflictError:
            continue
        return fresh
    raise StoreConflictError(
        f"session {st.id!r}: could not append the turn after {_CONFLICT_RETRIES} conflicts",
        session_id=st.id,
    )
