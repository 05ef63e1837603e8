"""File-based stores: one machine, inspectable JSON files.

* :class:`FileStorage` — the :class:`~lousho_sync.stores.base.StorageService` over a root
  directory: atomic puts, a cross-process lock per key.
* :class:`FileSessionStore` — ``<dir>/<id>.json`` per session (one document), with
  ``append`` under a per-id file lock and a per-session lease.
* :class:`LocalStorageCheckpointStore` and :class:`StorageServiceApprovalStore` — checkpoints
  and approval records over any StorageService (``checkpoints/<key>.json``,
  ``approvals/<id>.json``).

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
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import filelock

from ..codec import (
    dumps_approval,
    dumps_checkpoint,
    dumps_messages,
    loads_approval,
    loads_checkpoint,
    loads_messages,
)
from ..errors import (
    ApprovalNotFoundError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from ..ids import is_session_id
from ..messages import Message
from ..results import PruneResult
from ._common import check_length, check_older_than, check_owner, check_ttl, validate_session_id
from ._lease import make_owner, poll_until
from .base import ApprovalRecord, Checkpoint, StorageService, resolved

__all__ = [
    "FileSessionStore",
    "FileStore",
    "FileStorage",
    "LocalStorageCheckpointStore",
    "StorageServiceApprovalStore",
]

logger = logging.getLogger(__name__)

_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}"
_KEY_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})?")
_NAME_RE = re.compile(_SEGMENT)
_DEFAULT_LOCK_TIMEOUT_S = 30.0


def _unavailable(action: str, path: Path, exc: OSError, session_id: str | None = None) -> Exception:
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


def _atomic_write(path: Path, data: bytes) -> None:
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
def _file_lock(lock_path: Path, timeout: float, session_id: str | None = None) -> Iterator[None]:
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
        raise _unavailable("lock", lock_path, exc, session_id) from exc
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


class FileStorage:
    """A :class:`~lousho_sync.stores.base.StorageService` over the directory ``root``.

    Keys are one name or ``folder/name`` (letters, digits, ``.``, ``_``, ``-``; a name does
    not start with ``.``; at most 200 characters each). ``root`` is created on the first
    put. Puts are atomic; ``lock(key)`` is a cross-process file lock on the hidden sibling
    ``.<name>.lock``, also exclusive between threads. Thread-safe: it holds no mutable
    state.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, lock_timeout_s: float = _DEFAULT_LOCK_TIMEOUT_S
    ) -> None:
        self._root = Path(root)
        self._lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"FileStorage({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The root directory."""
        return self._root

    def path_for(self, key: str) -> Path:
        """The file that holds ``key`` (StoreError for a key that breaks the rule)."""
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
            raise _unavailable("read", path, exc) from exc

    def put(self, key: str, value: bytes) -> None:
        """Write ``value`` atomically (temp file, fsync, rename)."""
        path = self.path_for(key)
        try:
            _atomic_write(path, value)
        except OSError as exc:
            raise _unavailable("write", path, exc) from exc

    def delete(self, key: str) -> None:
        """Delete ``key`` (no error when absent)."""
        path = self.path_for(key)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _unavailable("delete", path, exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
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
            raise _unavailable("list", self._root, exc) from exc
        return sorted(k for k in keys if k.startswith(prefix))

    def lock(self, key: str) -> AbstractContextManager[None]:
        """Hold ``key``'s lock (across processes and threads) while the block runs;
        StoreUnavailableError when it cannot be had within ``lock_timeout_s``."""
        path = self.path_for(key)
        return _file_lock(path.with_name(f".{path.name}.lock"), self._lock_timeout_s)


@attrs.define(slots=True)
class _Lease:
    owner: str
    lock: filelock.BaseFileLock
    expires_at: float


class FileSessionStore:
    """Transcripts as ``<dir>/<id>.json`` (one ``{"v": 1, "messages": [...]}`` document).

    ``dir`` is created on first save. Writes are atomic (temp file, fsync, rename) and
    ``save``/``append``/``delete`` take the cross-process file lock ``<dir>/<id>.lock``, so
    ``append`` (which rewrites the whole file: O(transcript)) never loses a turn. The lease
    is an OS file lock on ``<dir>/<id>.lease``: it dies with its process, so a dead
    holder's lease is taken over at once. Between processes a live holder keeps the lease
    until it releases it; inside one process an owner that has not renewed within
    ``ttl_s`` is taken over.

    Every acquisition returns a fence token, one more than the last, kept in
    ``<dir>/<id>.fence`` (``fence_token``). The writes take no ``fence=``: the OS lock already
    keeps a stopped holder's rivals out, so there is no split brain.

    Thread-safe: file locks exclude threads too; ``_leases_lock`` guards the in-memory
    lease table (owner, file lock, expiry per id).
    """

    def __init__(
        self, dir: str | os.PathLike[str], *, lock_timeout_s: float = _DEFAULT_LOCK_TIMEOUT_S
    ) -> None:
        self._dir = Path(dir)
        self._lock_timeout_s = lock_timeout_s
        self._leases_lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}

    def __repr__(self) -> str:
        return f"FileSessionStore({str(self._dir)!r})"

    @property
    def dir(self) -> Path:
        """The directory holding the session files."""
        return self._dir

    def path_for(self, id: str) -> Path:
        """The file of session ``id`` (InvalidSessionIdError for a bad id)."""
        return self._dir / f"{validate_session_id(id)}.json"

    def _lock(self, id: str) -> AbstractContextManager[None]:
        return _file_lock(self._dir / f"{id}.lock", self._lock_timeout_s, id)

    def _read(self, id: str, path: Path) -> list[Message] | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unavailable("read", path, exc, id) from exc
        try:
            return loads_messages(data)
        except StoreCorruptError as exc:
            raise StoreCorruptError(
                f"session file {path} cannot be read ({exc}); it was left as it is: "
                "repair or delete it",
                path=str(path),
                session_id=id,
            ) from exc

    def _write(self, id: str, path: Path, data: bytes) -> None:
        try:
            _atomic_write(path, data)
        except OSError as exc:
            raise _unavailable("write", path, exc, id) from exc

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript, or None; StoreCorruptError (file untouched) when unreadable."""
        return self._read(id, self.path_for(id))

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript; an empty sequence deletes the file."""
        path = self.path_for(id)
        data = dumps_messages(messages).encode() if messages else None
        if data is None and not path.exists():
            return  # nothing to forget: no directory or lock file is created
        with self._lock(id):
            if data is None:
                self._unlink(id, path)
            else:
                self._write(id, path, data)

    def delete(self, id: str) -> None:
        """Forget session ``id`` (no error when absent)."""
        self.save(id, ())

    def _unlink(self, id: str, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _unavailable("delete", path, exc, id) from exc

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add a turn's messages under the per-id lock; StoreConflictError when the stored
        transcript does not hold exactly ``expected_length`` messages."""
        path = self.path_for(id)
        with self._lock(id):
            stored = self._read(id, path) or []
            check_length(id, expected_length, len(stored), f"in {path}", path=str(path))
            if messages:
                stored.extend(messages)
                self._write(id, path, dumps_messages(stored).encode())

    def revision(self, id: str) -> object:
        """A token that changes whenever the file changes; None when absent."""
        path = self.path_for(id)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unavailable("stat", path, exc, id) from exc
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def ids(self) -> list[str]:
        """The ids of the stored sessions, sorted."""
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _unavailable("list", self._dir, exc) from exc
        return sorted(
            n[:-5] for n in names if n.endswith(".json") and is_session_id(n[:-5])
        )

    # --- lease -------------------------------------------------------------------------

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Take the lease of ``id`` for ``owner``, waiting up to ``wait_s`` seconds: the new
        fence token (greater than every token handed out before for ``id``, also when
        ``owner`` already held it), or None when not taken in time.

        A live holder, even a stopped one, keeps the others out (the OS lock dies with its
        process only), so two processes never hold the lease at once.
        """
        lease_path = self._dir / f"{validate_session_id(id)}.lease"
        check_owner(owner)
        check_ttl(ttl_s)
        got: list[int] = []
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unavailable("create", self._dir, exc, id) from exc

        def attempt() -> bool:
            with self._leases_lock:
                held = self._leases.get(id)
                clock = time.monotonic()
                if held is not None:
                    if held.owner != owner and held.expires_at > clock:
                        return False
                    if held.owner != owner:
                        logger.warning(
                            "lease of session %r taken over from %s (not renewed in time)",
                            id,
                            held.owner,
                        )
                    got.append(self._next_token(id))
                    held.owner = owner
                    held.expires_at = clock + ttl_s
                    return True
                lock = filelock.FileLock(str(lease_path), thread_local=False)
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    return False
                except OSError as exc:
                    raise _unavailable("lock", lease_path, exc, id) from exc
                try:
                    got.append(self._next_token(id))
                except BaseException:
                    lock.release()
                    raise
                self._leases[id] = _Lease(owner, lock, clock + ttl_s)
                return True

        return got[0] if poll_until(attempt, wait_s) else None

    def _fence_path(self, id: str) -> Path:
        return self._dir / f"{id}.fence"

    def _next_token(self, id: str) -> int:
        """Write and return the session's next fence token (the caller holds the lease's
        OS lock, so no other process writes it meanwhile)."""
        token = self.fence_token(id) + 1
        path = self._fence_path(id)
        try:
            _atomic_write(path, str(token).encode())
        except OSError as exc:
            raise _unavailable("write", path, exc, id) from exc
        return token

    def fence_token(self, id: str) -> int:
        """The newest fence token handed out for ``id`` (0 when none), from
        ``<dir>/<id>.fence``."""
        path = self._fence_path(validate_session_id(id))
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

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s``; False when ``owner`` no longer holds it."""
        validate_session_id(id)
        check_ttl(ttl_s)
        with self._leases_lock:
            held = self._leases.get(id)
            if held is None or held.owner != owner:
                return False
            held.expires_at = time.monotonic() + ttl_s
            return True

    def release_lease(self, id: str, *, owner: str) -> None:
        """Release the lease if ``owner`` holds it (otherwise nothing happens)."""
        validate_session_id(id)
        with self._leases_lock:
            held = self._leases.get(id)
            if held is None or held.owner != owner:
                return
            del self._leases[id]
            try:
                held.lock.release()
            except OSError as exc:  # the descriptor is closed either way
                logger.warning("releasing the lease of session %r failed: %s", id, exc)


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


class LocalStorageCheckpointStore:
    """A :class:`~lousho_sync.stores.base.CheckpointStore` over a StorageService (or a
    directory path, wrapped in :class:`FileStorage`): ``checkpoints/<key>.json``.

    Keys are storage names (letters, digits, ``.``, ``_``, ``-``). Thread-safe when the
    storage is.
    """

    _PREFIX = "checkpoints/"

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

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once across threads and processes: the winner gets the resolved record,
        later callers ApprovalAlreadyResolvedError; an unknown id ApprovalNotFoundError."""
        if not self._valid(id):
            raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
        with self._storage.lock(f"{self._PREFIX}{id}"):
            record = resolved(self._read(id), id, approved=approved, reason=reason)
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


class FileStore:
    """The three file stores under one directory, usable as an agent's ``store``:
    ``<root>/sessions`` (FileSessionStore) and ``<root>/state`` (a FileStorage holding the
    checkpoints and approvals). Adds ``prune``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        storage = FileStorage(self.root / "state")
        self.sessions = FileSessionStore(self.root / "sessions")
        self.checkpoints = LocalStorageCheckpointStore(storage)
        self.approvals = StorageServiceApprovalStore(storage)

    def prune(self, older_than_s: float) -> PruneResult:
        """Delete sessions and checkpoints whose files were not modified within
        ``older_than_s`` seconds and approvals resolved that long ago; pending approvals are
        kept. Returns the counts."""
        check_older_than(older_than_s)
        cutoff = time.time() - older_than_s
        sessions = 0
        owner = make_owner()
        for sid in self.sessions.ids():
            with contextlib.suppress(FileNotFoundError):
                if self.sessions.path_for(sid).stat().st_mtime >= cutoff:
                    continue
                # a session whose lease is held (a turn running somewhere) is kept
                if not self.sessions.acquire_lease(sid, owner=owner, ttl_s=30.0, wait_s=0):
                    continue
                try:
                    self.sessions.delete(sid)
                    sessions += 1
                finally:
                    self.sessions.release_lease(sid, owner=owner)
        checkpoints = 0
        storage = self.checkpoints.storage
        assert isinstance(storage, FileStorage)
        for key in self.checkpoints.keys(""):
            path = storage.path_for(f"checkpoints/{key}.json")
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    self.checkpoints.delete(key)
                    checkpoints += 1
        approvals = 0
        for key in storage.list("approvals/"):
            if not key.endswith(".json"):
                continue
            record = self.approvals.get(key[len("approvals/") : -5])
            if (record is not None and record.status != "pending"
                    and record.resolved_at is not None and record.resolved_at < cutoff):
                storage.delete(key)
                approvals += 1
        return PruneResult(sessions, checkpoints, approvals)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"
