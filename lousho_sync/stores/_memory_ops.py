"""The memory store's primitives: the engine's lease, checkpoint, approval and commit
primitives over dicts in one :class:`MemoryState`, each one step under its lock.

The memory stores write through them (checkpoints, approvals, ``append``), and the engine's
rules are tested once against them: they are the engine's test double, so they keep every
outcome a shared backend returns (fence tokens, ``Stale``, ``Conflict``, resolve-once), also
the lease the memory stores do not offer (one process needs none).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs

from ..codec import approval_json_resolved_by, dumps_checkpoint, loads_message
from ..messages import Message
from ..records import ApprovalRecord, Checkpoint, now
from ._engine.backend import Backend
from ._engine.commits import CommitOp, Conflict, Stale

__all__ = ["MemoryApprovals", "MemoryCheckpoints", "MemoryCommits", "MemoryLeases",
           "MemoryState"]


class MemoryBackend(Backend):
    """Where the memory primitives run (for messages); never closed."""

    kind = "memory"
    store_class = "MemorySessionStore"


@attrs.define(slots=True)
class Held:
    """A lease: its owner, when it expires (``time.monotonic``), its token."""

    owner: str
    expires_at: float
    token: int


class MemoryState:
    """What the memory primitives keep, under ``lock``: per session the newest token, the
    lease, the transcript, its revision and times; checkpoints by key (the objects, or
    JSON text written as text);
    approval rows by id ([json, status, reason, resolved_at])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.backend: Backend = MemoryBackend("in the memory store")
        self.tokens: dict[str, int] = {}
        self.leases: dict[str, Held] = {}
        self.transcripts: dict[str, list[Message]] = {}
        self.revisions: dict[str, int] = {}
        self.times: dict[str, tuple[float, float]] = {}
        self.counter = itertools.count(1)
        self.checkpoints: dict[str, Checkpoint | str] = {}
        self.approvals: dict[str, list[Any]] = {}

    def refused(self, fenced_id: str | None, token: int) -> int:
        """The newest token of ``fenced_id`` when it is newer than ``token`` (0: allowed;
        call holding ``lock``)."""
        newest = self.tokens.get(fenced_id, 0) if fenced_id and token else 0
        return newest if newest > token else 0

    def touch(self, id: str) -> None:
        """Session ``id`` changed now (call holding ``lock``)."""
        t = now()
        self.times[id] = (self.times.get(id, (t, t))[0], t)

    def extend(self, id: str, messages: Sequence[Message]) -> int:
        """Append to the transcript of ``id``: its new revision (call holding ``lock``)."""
        transcript = self.transcripts.get(id)
        if transcript is None:
            transcript = self.transcripts[id] = []
        transcript.extend(messages)
        revision = self.revisions[id] = next(self.counter)
        self.touch(id)
        return revision


class _Ops:
    def __init__(self, state: MemoryState) -> None:
        self.state = state

    @property
    def backend(self) -> Backend:
        """Where the primitives run (for messages)."""
        return self.state.backend


class MemoryLeases(_Ops):
    """The lease primitives: a lease per session whose token only grows."""

    def _grant(self, id: str, owner: str, ttl_s: float) -> int:
        token = self.state.tokens[id] = self.state.tokens.get(id, 0) + 1
        self.state.leases[id] = Held(owner, time.monotonic() + ttl_s, token)
        return token

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        with self.state.lock:
            held = self.state.leases.get(id)
            if held is None or held.owner == owner or held.expires_at <= time.monotonic():
                return self._grant(id, owner, ttl_s)
            return held.owner

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        with self.state.lock:
            held = self.state.leases.get(id)
            return self._grant(id, owner, ttl_s) if held and held.owner == holder else 0

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        with self.state.lock:
            held = self.state.leases.get(id)
            if held is None or held.owner != owner:
                return False
            held.expires_at = time.monotonic() + ttl_s
            return True

    def release(self, id: str, owner: str) -> None:
        with self.state.lock:
            held = self.state.leases.get(id)
            if held is not None and held.owner == owner:
                del self.state.leases[id]

    def newest(self, id: str) -> int:
        with self.state.lock:
            return self.state.tokens.get(id, 0)

    def holder(self, id: str) -> str:
        with self.state.lock:
            held = self.state.leases.get(id)
            return held.owner if held and held.expires_at > time.monotonic() else ""


class MemoryCheckpoints(_Ops):
    """The checkpoint primitives: the JSON text by key, as a shared backend keeps it (the
    engine's test double: the rules' codec runs). With ``keeps_objects`` (the memory
    stores) the rules hand over and take back the checkpoints themselves through ``keep``
    and ``get_object``, no JSON; ``get`` gives the text either way."""

    def __init__(self, state: MemoryState, *, keeps_objects: bool = False) -> None:
        super().__init__(state)
        self.keeps_objects = keeps_objects

    def get(self, key: str) -> str | None:
        value = self.state.checkpoints.get(key)
        return value if value is None or isinstance(value, str) else dumps_checkpoint(value)

    def get_object(self, key: str) -> Checkpoint | str | None:
        return self.state.checkpoints.get(key)

    def put(self, key: str, session_id: str | None, text: str, fenced_id: str | None, token: int,
            checkpoint: Checkpoint) -> int:
        return self.keep(key, fenced_id, token, text)

    def keep(self, key: str, fenced_id: str | None, token: int,
             checkpoint: Checkpoint | str) -> int:
        # (also put's write of the text: the memory stores keep the object, once per step)
        state = self.state
        with state.lock:
            newest = state.refused(fenced_id, token) if token else 0
            if not newest:
                state.checkpoints[key] = checkpoint
            return newest

    def drop(self, key: str, fenced_id: str | None, token: int) -> int:
        state = self.state
        with state.lock:
            newest = state.refused(fenced_id, token) if token else 0
            if not newest:
                state.checkpoints.pop(key, None)
            return newest

    def keys(self, prefix: str) -> list[str]:
        with self.state.lock:
            return sorted(k for k in self.state.checkpoints if k.startswith(prefix))


class MemoryApprovals(_Ops):
    """The approval primitives: rows [json as created, status, reason, resolved_at] (the
    last three are the truth) and the creation time, for the order of ``pending``."""

    def __init__(self, state: MemoryState) -> None:
        super().__init__(state)
        self._created: dict[str, tuple[float, str | None]] = {}

    def put(self, record: ApprovalRecord, text: str, resolved: float | None,
            fenced_id: str | None, token: int) -> int:
        with self.state.lock:
            newest = self.state.refused(fenced_id, token) if token else 0
            if not newest:
                self.state.approvals[record.id] = [text, record.status, record.reason, resolved]
                self._created[record.id] = (record.created_at, record.session_id)
            return newest

    def row(self, id: str) -> Sequence[Any] | None:
        with self.state.lock:
            row = self.state.approvals.get(id)
            return None if row is None else tuple(row)

    def resolve(self, id: str, status: str, reason: str | None, at: float, by: str | None
                ) -> Sequence[Any] | str | None:
        with self.state.lock:
            row = self.state.approvals.get(id)
            if row is None:
                return None
            if row[1] != "pending":
                return str(row[1])
            text = row[0] if by is None else approval_json_resolved_by(row[0], by)
            row[:] = [text, status, reason, at]
            return tuple(row)

    def pending(self, session_id: str | None) -> list[tuple[str, Sequence[Any]]]:
        with self.state.lock:
            ids = [id for id, row in self.state.approvals.items() if row[1] == "pending"
                   and (session_id is None or self._created[id][1] == session_id)]
            ids.sort(key=lambda id: self._created[id][0])
            return [(id, tuple(self.state.approvals[id])) for id in ids]


class MemoryCommits(_Ops):
    """The commit primitive: the fence check, the length check, the messages, the
    checkpoint delete and the lease release in one step under the lock. It appends the
    messages of ``op.texts`` (the engine's test double: the rules' encoding runs), or with
    ``keeps_objects`` (the memory stores) ``op.messages`` themselves, frozen records the
    rules hand over without their JSON."""

    def __init__(self, state: MemoryState, *, keeps_objects: bool = False) -> None:
        super().__init__(state)
        self.keeps_objects = keeps_objects

    def commit(self, op: CommitOp) -> object:
        id, texts, expected_length, checkpoint_key, token, release, messages = op  # read once
        if texts and not self.keeps_objects:
            messages = [loads_message(t) for t in texts]
        state = self.state
        with state.lock:
            newest = state.refused(id, token) if token else 0
            if newest:
                return Stale(newest)
            actual = len(state.transcripts.get(id, ()))
            if actual != expected_length:
                return Conflict(actual)
            revision = state.extend(id, messages) if messages else state.revisions.get(id)
            if checkpoint_key is not None:
                state.checkpoints.pop(checkpoint_key, None)
            if release:
                held = state.leases.get(id)
                if held is not None and held.token == token:
                    del state.leases[id]
            return revision
