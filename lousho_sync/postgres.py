"""``lousho_sync.postgres``: the PostgreSQL store (imports psycopg; the package root does not).

Install the extra: ``pip install 'lousho[postgres]'``. See :class:`PostgresStore`.
"""

from __future__ import annotations

from .stores.postgres import (
    SCHEMA_VERSION,
    PostgresApprovalStore,
    PostgresCheckpointStore,
    PostgresSessionStore,
    PostgresStore,
)

__all__ = [
    "SCHEMA_VERSION",
    "PostgresApprovalStore",
    "PostgresCheckpointStore",
    "PostgresSessionStore",
    "PostgresStore",
]
