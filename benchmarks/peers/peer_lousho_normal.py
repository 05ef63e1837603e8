"""lousho on ``SqliteStore(path, synchronous="normal")``: no fsync per commit (WAL still
makes every commit atomic; the last commits can be lost on power failure, not on a crash)."""

from __future__ import annotations

from pathlib import Path

from .common import Storage
from .peer_lousho import _Backend

NAME = "lousho normal"
DISTRIBUTION = "lousho"
STORAGES: tuple[Storage, ...] = ("sqlite",)


def open_backend(storage: Storage, path: Path) -> _Backend:
    """lousho with a SqliteStore at ``path`` in synchronous="normal" mode."""
    return _Backend(storage, path, synchronous="normal")
