"""The StorageService stores: :class:`FileStorage` (bytes by key under a root directory:
atomic puts, a cross-process lock per key) and, over any StorageService, checkpoints
(:class:`LocalStorageCheckpointStore`, ``checkpoints/<key>.json``) and approval records
(:class:`StorageServiceApprovalStore`, ``approvals/<id>.json``); also the file helpers the
file session store shares (atomic writes, file locks, the encryption mark).

Every write goes to a temp file in the same directory, is fsynced and renamed over the old
file, so a reader never sees half a file. Unreadable files raise
:class:`~lousho_sync.errors.StoreCorruptError` naming the path and are never modified by a
read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import filelock

from ..codec import (
    dumps_approval,
    dumps_checkpoint,
    loads_approval,
    loads_checkpoint,
)
from ..errors import (
    ApprovalNotFoundError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from ._common import (
    encrypted_refusal,
)
from .base import ApprovalRecord, Checkpoint, StorageService, StoreCapabilities, resolved

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "EncryptionMark",
    "FileStorage",
    "LocalStorageCheckpointStore",
    "StorageServiceApprovalStore",
    "atomic_write",
    "file_lock",
    "unavailable",
]

logger = logging.getLogger("lousho_sync.stores.files")

_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}"
_KEY_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})?")
_NAME_RE = re.compile(_SEGMENT)
DEFAULT_LOCK_TIMEOUT_S = 30.0


def unavailable(action: str, path: Path, exc: OSError, session_id: str | None = None) -> Exception:
    reason = exc.strerror or str(exc)
    return StoreUnavailableError(
        f"cannot {action} {path}: {reason}", path=str(path), session_id=session_id
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - filesystems without directory fsync
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a fsynced temp file in the same directory.

    The file's mtime is set from the nanosecond clock, so revision tokens differ between
    two writes even when the filesystem's own timestamps are coarse.
    """
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            stamp = time.time_ns()
            os.utime(f.fileno(), ns=(stamp, stamp))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


@contextlib.contextmanager
def file_lock(lock_path: Path, timeout: float, session_id: str | None = None) -> Iterator[None]:
    # A fresh FileLock (own descriptor) per hold: flock then excludes other threads of this
    # process as well as other processes.
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(lock_path), thread_local=False)
        lock.acquire(timeout=timeout)
    except filelock.Timeout as exc:
        raise StoreUnavailableError(
            f"could not lock {lock_path} within {timeout} s: another process or thread holds "
            "it; retry later",
            path=str(lock_path),
            session_id=session_id,
        ) from exc
    except OSError as exc:
        raise unavailable("lock", lock_path, exc, session_id) from exc
    try:
        yield
    finally:
        lock.release()


def _folders(root: Path, prefix: str) -> list[str]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    return [
        e.name
        for e in entries
        if e.name.startswith(prefix) and _NAME_RE.fullmatch(e.name) and e.is_dir()
    ]


def _names(directory: Path, folder: str) -> list[str]:
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder + e.name for e in entries if _NAME_RE.fullmatch(e.name) and e.is_file()]


class EncryptionMark:
    """The file ``<root>/encrypted`` of a FileStore written through EncryptedStore: written
    at the first use after ``mark_encrypted``; a plain FileStore refuses a root that has it
    (checked once, at its first use). Thread-safe: ``lock`` guards the flags."""

    def __init__(self, root: Path) -> None:
        self.path = root / "encrypted"
        self.wrapped = False
        self.checked = False
        self.lock = threading.Lock()

    def mark(self) -> None:
        with self.lock:
            self.wrapped, self.checked = True, False

    def __call__(self) -> None:
        if self.checked:
            return
        with self.lock:
            if self.checked:
                return
            try:
                if self.wrapped:
                    if not self.path.exists():
                        atomic_write(self.path, b"written through lousho's EncryptedStore\n")
                elif self.path.exists():
                    root = str(self.path.parent)
                    raise encrypted_refusal(f"at {root}", path=root)
            except OSError as exc:
                raise unavailable("mark", self.path, exc) from exc
            self.checked = True


class FileStorage:
    """A :class:`~lousho_sync.stores.base.StorageService` over the directory ``root``.

    Keys are one name or ``folder/name`` (letters, digits, ``.``, ``_``, ``-``; a name does
    not start with ``.``; at most 200 characters each). ``root`` is created on the first
    put. Puts are atomic; ``lock(key)`` is a cross-process file lock on the hidden sibling
    ``.<name>.lock``, also exclusive between threads. Thread-safe: it holds no mutable
    state.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    ) -> None:
        self._root = Path(root)
        self._lock_timeout_s = lock_timeout_s
        self._guard: Callable[[], None] | None = None  # FileStore's encryption mark

    def __repr__(self) -> str:
        return f"FileStorage({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The root directory."""
        return self._root

    def path_for(self, key: str) -> Path:
        """The file that holds ``key`` (StoreError for a key that breaks the rule)."""
        if self._guard is not None:
            self._guard()
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise StoreError(
                f"invalid storage key {key!r} under {self._root}: a key is a name or "
                "folder/name of letters, digits, '.', '_' and '-', not starting with '.'",
                path=str(self._root),
            )
        return self._root / key

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        path = self.path_for(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise unavailable("read", path, exc) from exc

    def put(self, key: str, value: bytes) -> None:
        """Write ``value`` atomically (temp file, fsync, rename)."""
        path = self.path_for(key)
        try:
            atomic_write(path, value)
        except OSError as exc:
            raise unavailable("write", path, exc) from exc

    def delete(self, key: str) -> None:
        """Delete ``key`` (no error when absent)."""
        path = self.path_for(key)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise unavailable("delete", path, exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        if self._guard is not None:
            self._guard()
        folder, sep, _ = prefix.partition("/")
        try:
            if sep:
                if not _NAME_RE.fullmatch(folder):
                    return []
                keys = _names(self._root / folder, folder + "/")
            else:
                keys = _names(self._root, "")
                for name in _folders(self._root, prefix):
                    keys += _names(self._root / name, name + "/")
        except OSError as exc:
            raise unavailable("list", self._root, exc) from exc
        return sorted(k for k in keys if k.startswith(prefix))

    def lock(self, key: str) -> AbstractContextManager[None]:
        """Hold ``key``'s lock (across processes and threads) while the block runs;
        StoreUnavailableError when it cannot be had within ``lock_timeout_s``."""
        path = self.path_for(key)
        return file_lock(path.with_name(f".{path.name}.lock"), self._lock_timeout_s)


def _storage(storage: StorageService | str | os.PathLike[str]) -> StorageService:
    if isinstance(storage, (str, os.PathLike)):
        return FileStorage(storage)
    return storage


def _where(storage: StorageService, key: str) -> str | None:
    path_for: Any = getattr(storage, "path_for", None)
    return str(path_for(key)) if callable(path_for) else None


def _corrupt(storage: StorageService, key: str, what: str, exc: StoreCorruptError) -> Exception:
    path = _where(storage, key)
    return StoreCorruptError(
        f"{what} {path or repr(key)} cannot be read ({exc}); it was left as it is",
        path=path,
    )


_PART = StoreCapabilities()


class LocalStorageCheckpointStore:
    """A :class:`~lousho_sync.stores.base.CheckpointStore` over a StorageService (or a
    directory path, wrapped in :class:`FileStorage`): ``checkpoints/<key>.json``.

    Keys are storage names (letters, digits, ``.``, ``_``, ``-``). Thread-safe when the
    storage is.
    """

    _PREFIX = "checkpoints/"

    @property
    def capabilities(self) -> StoreCapabilities:
        """Nothing beyond the protocol (no fencing)."""
        return _PART

    def __init__(self, storage: StorageService | str | os.PathLike[str]) -> None:
        self._storage = _storage(storage)

    @property
    def storage(self) -> StorageService:
        """The underlying storage."""
        return self._storage

    def _key(self, key: str) -> str:
        return f"{self._PREFIX}{key}.json"

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None; StoreCorruptError when unreadable."""
        skey = self._key(key)
        data = self._storage.get(skey)
        if data is None:
            return None
        try:
            return loads_checkpoint(data)
        except StoreCorruptError as exc:
            raise _corrupt(self._storage, skey, "checkpoint", exc) from exc

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write (replace) the checkpoint atomically."""
        self._storage.put(self._key(key), dumps_checkpoint(checkpoint).encode())

    def delete(self, key: str) -> None:
        """Delete the checkpoint (no error when absent)."""
        self._storage.delete(self._key(key))

    def keys(self, prefix: str) -> list[str]:
        """Checkpoint keys starting with ``prefix``, sorted."""
        start = len(self._PREFIX)
        keys = (
            k[start:-5] for k in self._storage.list(self._PREFIX + prefix) if k.endswith(".json")
        )
        return sorted(k for k in keys if k.startswith(prefix))


_APPROVAL_ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class StorageServiceApprovalStore:
    """An :class:`~lousho_sync.stores.base.ApprovalStore` over a StorageService (or a
    directory path, wrapped in :class:`FileStorage`): ``approvals/<id>.json``.

    ``resolve`` takes ``storage.lock("approvals/<id>")`` and re-reads the record, so exactly
    one caller wins across threads and processes. Approval ids are 1 to 128 letters,
    digits, ``.``, ``_``, ``-`` (not starting with ``.``). Thread-safe when the storage is.
    """

    _PREFIX = "approvals/"

    @property
    def capabilities(self) -> StoreCapabilities:
        """Nothing beyond the protocol (no fencing)."""
        return _PART

    def __init__(self, storage: StorageService | str | os.PathLike[str]) -> None:
        self._storage = _storage(storage)

    @property
    def storage(self) -> StorageService:
        """The underlying storage."""
        return self._storage

    @staticmethod
    def _valid(id: object) -> bool:
        return isinstance(id, str) and _APPROVAL_ID_RE.fullmatch(id) is not None

    def _read(self, id: str) -> ApprovalRecord | None:
        key = f"{self._PREFIX}{id}.json"
        data = self._storage.get(key)
        if data is None:
            return None
        try:
            return loads_approval(data)
        except StoreCorruptError as exc:
            raise _corrupt(self._storage, key, "approval record", exc) from exc

    def create(self, record: ApprovalRecord) -> None:
        """Store ``record`` (replacing a record with the same id)."""
        if not self._valid(record.id):
            raise StoreError(
                f"invalid approval id {record.id!r}: an approval id is 1 to 128 letters, "
                "digits, '.', '_' or '-', not starting with '.'",
                session_id=record.session_id,
            )
        self._storage.put(f"{self._PREFIX}{record.id}.json", dumps_approval(record).encode())

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        return self._read(id) if self._valid(id) else None

    def resolve(
        self, id: str, *, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ApprovalRecord:
        """Resolve once across threads and processes (by ``by``): the winner gets the
        resolved record, later callers ApprovalAlreadyResolvedError; an unknown id
        ApprovalNotFoundError."""
        if not self._valid(id):
            raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
        with self._storage.lock(f"{self._PREFIX}{id}"):
            record = resolved(self._read(id), id, approved=approved, reason=reason, by=by)
            self._storage.put(f"{self._PREFIX}{id}.json", dumps_approval(record).encode())
        return record

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        records = []
        for key in self._storage.list(self._PREFIX):
            if not key.endswith(".json"):
                continue
            record = self._read(key[len(self._PREFIX) : -5])
            if (
                record is not None
                and record.status == "pending"
                and (session_id is None or record.session_id == session_id)
            ):
                records.append(record)
        return sorted(records, key=lambda r: (r.created_at, r.id))
