"""The types ``create_agent(store=...)`` and ``agent.session(store=...)`` accept."""

from __future__ import annotations

from typing import Protocol, TypeAlias

from .base import ApprovalStore, CheckpointStore, SessionStore

__all__ = ["AnyStore", "StoreBundle"]


class StoreBundle(Protocol):
    """A store of each kind (any may be None): ``AgentStore``, ``SqliteStore``,
    ``RedisStore``, ``FileStore``."""

    @property
    def sessions(self) -> SessionStore | None: ...

    @property
    def checkpoints(self) -> CheckpointStore | None: ...

    @property
    def approvals(self) -> ApprovalStore | None: ...


AnyStore: TypeAlias = StoreBundle | SessionStore
"""A bundle of stores, or a bare :class:`SessionStore`."""
