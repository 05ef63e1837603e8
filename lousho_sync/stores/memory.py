"""In-memory stores: for tests, scripts and the default agent."""

from __future__ import annotations

import builtins
import heapq
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..catalog import SessionInfo, SessionPage, check_list_args, check_metadata, page_from
from ..errors import SessionExistsError
from ..ids import check_storable_text
from ..messages import Message
from ._engine.approvals import ApprovalRules
from ._engine.checkpoints import CheckpointRules
from ._engine.commits import AppendRules
from ._memory_mail import MemoryMailOps
from ._memory_ops import MemoryApprovals, MemoryCheckpoints, MemoryCommits, MemoryState
from .base import AgentStore, Fence, StoreCapabilities

__all__ = [
    "InMemoryApprovalStore",
    "MemoryCheckpointStore",
    "MemorySessionStore",
    "memory_store",
]


_SESSIONS = StoreCapabilities(append=True, revision=True, catalog=True, mailbox=True)
_PART = StoreCapabilities()


class MemorySessionStore(AppendRules):
    """Transcripts in a dict, with the session catalog (metadata, times, the messages
    compaction replaced). Thread-safe (one lock guards the dicts).

    ``append`` is O(turn): the engine's commit rules over the memory commit primitive,
    which grows the stored list in place.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """Append, revision, the catalog and the mailbox, in this process."""
        return _SESSIONS

    def __init__(self) -> None:
        state = MemoryState()
        self._commits = MemoryCommits(state, keeps_objects=True)
        self._lock = state.lock
        self._data = state.transcripts
        self._revisions = state.revisions
        self._counter = state.counter
        self._times = state.times
        self._touch = state.touch
        self._metadata: dict[str, str] = {}
        self._history: dict[str, list[Message]] = {}
        self._mail = MemoryMailOps()

    def mail_ops(self) -> MemoryMailOps:
        """The session mailbox's primitives (what the shared stores keep for turn policies
        across processes), in memory."""
        return self._mail

    def load(self, id: str) -> list[Message] | None:
        """A copy of the stored transcript, or None."""
        with self._lock:
            messages = self._data.get(id)
            return None if messages is None else list(messages)

    def _drop_if_empty(self, id: str) -> None:
        if id not in self._data and id not in self._metadata:
            self._times.pop(id, None)
            self._history.pop(id, None)

    def _replace(self, id: str, messages: Sequence[Message]) -> None:
        if messages:
            self._data[id] = list(messages)
            self._revisions[id] = next(self._counter)
        else:
            self._data.pop(id, None)
            self._revisions.pop(id, None)
            self._history.pop(id, None)
        self._touch(id)
        self._drop_if_empty(id)

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript (empty: forget the transcript and the history; the
        metadata stays)."""
        check_storable_text(messages, f"a message for session {id!r}")
        with self._lock:
            self._replace(id, messages)

    def delete(self, id: str) -> None:
        """Forget the id: transcript, history and metadata."""
        with self._lock:
            self._metadata.pop(id, None)
            self._replace(id, ())

    def revision(self, id: str) -> object:
        """Changes whenever the transcript of ``id`` changes."""
        return self._revisions.get(id)

    def ids(self) -> builtins.list[str]:
        """Stored session ids (with a transcript or metadata), sorted."""
        with self._lock:
            return sorted(self._times)

    # --- the catalog (Catalogued) ---

    def _info(self, id: str) -> SessionInfo | None:
        times = self._times.get(id)
        if times is None:
            return None
        text = self._metadata.get(id)
        return SessionInfo(
            id=id,
            messages=len(self._data.get(id, ())),
            created_at=times[0],
            updated_at=times[1],
            metadata=json.loads(text) if text else {},
        )

    def info(self, id: str) -> SessionInfo | None:
        """The catalog entry of ``id``, or None."""
        with self._lock:
            return self._info(id)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` ({} removes it)."""
        text = check_metadata(metadata, id)
        with self._lock:
            if text == "{}":
                self._metadata.pop(id, None)
            else:
                self._metadata[id] = text
            self._touch(id)
            self._drop_if_empty(id)

    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced, oldest first."""
        with self._lock:
            return list(self._history.get(id, ()))

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """Add ``replaced`` to the history and replace the transcript, under one lock."""
        with self._lock:
            kept = list(self._history.get(id, ())) + list(replaced)
            self._replace(id, messages)
            if kept and id in self._data:
                self._history[id] = kept

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create ``id``; SessionExistsError when it has messages or metadata."""
        text = check_metadata(metadata or {}, id)
        with self._lock:
            if id in self._data or id in self._metadata:
                raise SessionExistsError(f"session {id!r} exists already in the memory store")
            if text != "{}":
                self._metadata[id] = text
            self._replace(id, messages)
            if history and id in self._data:
                self._history[id] = list(history)

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of the catalog, newest first (see :class:`~lousho_sync.stores.base.
        Catalogued`): O(sessions) per page, a scan of the times (no sort)."""
        start, limit, cursor = check_list_args(prefix, limit, after)
        with self._lock:
            keys = ((-t[1], id) for id, t in self._times.items() if id.startswith(start))
            if cursor is not None:
                upd, last = cursor
                keys = (k for k in keys if -k[0] < upd or (-k[0] == upd and k[1] > last))
            chosen = heapq.nsmallest(limit + 1, keys)
            infos = [self._info(id) for _, id in chosen]
        return page_from([i for i in infos if i is not None], limit)


class MemoryCheckpointStore(CheckpointRules):
    """Checkpoints in a dict (the frozen objects themselves: no JSON per save), through
    the engine's checkpoint rules. Thread-safe. Not fenced: one process needs no lease."""

    fenced = False

    @property
    def capabilities(self) -> StoreCapabilities:
        """Nothing beyond the protocol (no fencing)."""
        return _PART

    def __init__(self) -> None:
        self._ops = MemoryCheckpoints(MemoryState(), keeps_objects=True)


class InMemoryApprovalStore(ApprovalRules):
    """Approval records in a dict, through the engine's approval rules; ``resolve`` is
    atomic under one lock. Not fenced."""

    fenced = False

    @property
    def capabilities(self) -> StoreCapabilities:
        """Nothing beyond the protocol (no fencing)."""
        return _PART

    def __init__(self) -> None:
        self._ops = MemoryApprovals(MemoryState())


def memory_store() -> AgentStore:
    """A fresh in-memory AgentStore (sessions, checkpoints, approvals)."""
    return AgentStore(
        sessions=MemorySessionStore(),
        checkpoints=MemoryCheckpointStore(),
        approvals=InMemoryApprovalStore(),
    )
