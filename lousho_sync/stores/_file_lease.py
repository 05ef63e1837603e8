"""The file session store's lease primitives (:class:`~._engine.leases.LeaseOps`): an OS
file lock on ``<dir>/<id>.lease`` and the fence token in ``<dir>/<id>.fence``.

The OS lock dies with its process, so a dead holder's lease is free at once (``take``
takes it; there is never a holder to ``take_over``). Between processes a live holder keeps
the lease until it releases it; inside one process an owner that has not renewed within
``ttl_s`` is taken over. The rules (checks, polling) are :class:`~._engine.leases.
LeaseRules`'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import filelock

from ..errors import StoreCorruptError
from ._engine.backend import Backend
from .storage import atomic_write, unavailable

__all__ = ["FileLeaseOps"]

logger = logging.getLogger("lousho_sync.stores.files")


@attrs.define(slots=True)
class _Held:
    owner: str
    lock: filelock.BaseFileLock
    expires_at: float


def _try_lock(path: Path, id: str) -> filelock.BaseFileLock | None:
    """The OS lock on ``path``, taken; None when another process holds it."""
    lock = filelock.FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return None
    except OSError as exc:
        raise unavailable("lock", path, exc, id) from exc
    return lock


class _FileBackend(Backend):
    kind = "file"
    store_class = "FileSessionStore"


class FileLeaseOps:
    """Lease primitives over the session files in ``dir()`` (called for every use: it
    checks the store's encryption mark). Thread-safe: ``_lock`` guards the table of the
    leases this process holds (owner, OS lock, expiry per id)."""

    def __init__(self, dir: Callable[[], Path], path: Path) -> None:
        self._dir = dir
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._backend = _FileBackend(f"in the file store at {path}", path=str(path))

    @property
    def backend(self) -> Backend:
        """Where the leases are (for messages)."""
        return self._backend

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        """Take the lease when this process holds it for ``owner`` or expired, or when the
        OS lock is free: the new token; else the holder ("" when another process holds
        the OS lock)."""
        directory = self._dir()
        lease_path = directory / f"{id}.lease"
        with self._lock:
            held = self._held.get(id)
            clock = time.monotonic()
            if held is not None:
                if held.owner != owner and held.expires_at > clock:
                    return held.owner
                if held.owner != owner:
                    logger.warning("lease of session %r taken over from %s (not renewed in "
                                   "time)", id, held.owner)
                token = self._next_token(directory, id)
                held.owner = owner
                held.expires_at = clock + ttl_s
                return token
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise unavailable("create", directory, exc, id) from exc
            lock = _try_lock(lease_path, id)
            if lock is None:
                return ""
            try:
                token = self._next_token(directory, id)
            except BaseException:
                lock.release()
                raise
            self._held[id] = _Held(owner, lock, clock + ttl_s)
            return token

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        """0: a dead process holds no OS lock, so ``take`` already took its lease."""
        return 0

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease; False when this process does not hold it for ``owner``."""
        with self._lock:
            held = self._held.get(id)
            if held is None or held.owner != owner:
                return False
            held.expires_at = time.monotonic() + ttl_s
            return True

    def release(self, id: str, owner: str) -> None:
        """Release the OS lock if ``owner`` holds the lease (the token stays)."""
        with self._lock:
            held = self._held.get(id)
            if held is None or held.owner != owner:
                return
            del self._held[id]
            try:
                held.lock.release()
            except OSError as exc:  # the descriptor is closed either way
                logger.warning("releasing the lease of session %r failed: %s", id, exc)

    def holder(self, id: str) -> str:
        """The owner holding an unexpired lease of ``id`` in this process; "(another
        process)" when another process holds the OS lock (tried and let go at once: no
        token is handed out); "" when none (a dead process holds no OS lock)."""
        lease_path = self._dir() / f"{id}.lease"
        with self._lock:
            held = self._held.get(id)
            if held is not None:
                return held.owner if held.expires_at > time.monotonic() else ""
            if not lease_path.exists():
                return ""
            lock = _try_lock(lease_path, id)
            if lock is None:
                return "(another process)"
            lock.release()
            return ""

    def newest(self, id: str) -> int:
        """The newest token handed out for ``id`` (0 when none), from ``<id>.fence``."""
        return self._read_token(self._dir(), id)

    def _next_token(self, directory: Path, id: str) -> int:
        """Write and return the session's next token (the caller holds the lease's OS lock,
        so no other process writes it meanwhile)."""
        token = self._read_token(directory, id) + 1
        path = directory / f"{id}.fence"
        try:
            atomic_write(path, str(token).encode())
        except OSError as exc:
            raise unavailable("write", path, exc, id) from exc
        return token

    @staticmethod
    def _read_token(directory: Path, id: str) -> int:
        path = directory / f"{id}.fence"
        try:
            text = path.read_text("ascii").strip()
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise StoreCorruptError(
                f"fence token file {path} cannot be read ({exc}); it was left as it is",
                path=str(path),
                session_id=id,
            ) from exc
        if not text.isdigit():
            raise StoreCorruptError(
                f"fence token file {path} holds {text[:40]!r}, not a number; it was left as "
                "it is: repair it (a number at least as large as any token handed out)",
                path=str(path),
                session_id=id,
            )
        return int(text)

