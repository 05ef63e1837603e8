"""``lousho_sync.redis``: the Redis store (imports redis-py; the package root does not).

Install the extra: ``pip install 'lousho[redis]'``. See :class:`RedisStore`.
"""

from __future__ import annotations

from .stores.redis import (
    LAYOUT_VERSION,
    RedisApprovalStore,
    RedisCheckpointStore,
    RedisSessionStore,
    RedisStore,
)

__all__ = [
    "LAYOUT_VERSION",
    "RedisApprovalStore",
    "RedisCheckpointStore",
    "RedisSessionStore",
    "RedisStore",
]
