"""``lousho_sync.sqlite``: the SQLite store (imports ``sqlite3``; the package root does not).

See :class:`SqliteStore`.
"""

from __future__ import annotations

from .stores.sqlite import (
    SCHEMA_VERSION,
    SqliteApprovalStore,
    SqliteCheckpointStore,
    SqliteSessionStore,
    SqliteStore,
)

__all__ = [
    "SCHEMA_VERSION",
    "SqliteApprovalStore",
    "SqliteCheckpointStore",
    "SqliteSessionStore",
    "SqliteStore",
]
