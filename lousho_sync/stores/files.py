"""File-based stores: one machine, inspectable JSON files.

* :class:`FileStorage` — the :class:`~lousho_sync.stores.base.StorageService` over a root
  directory: atomic puts, a cross-process lock per key (in :mod:`.storage`, as the next two).
* :class:`FileSessionStore` — ``<dir>/<id>.json`` per session (one document), with
  ``append`` under a per-id file lock, a per-session lease and the session catalog. Its
  files and their formats are in :mod:`._file_layout`, the catalog in :mod:`._file_catalog`,
  the lease's primitives in :mod:`._file_lease`.
* :class:`LocalStorageCheckpointStore` and :class:`StorageServiceApprovalStore` — checkpoints
  and approval records over any StorageService (``checkpoints/<key>.json``,
  ``approvals/<id>.json``).

Writes are atomic and reads never modify a file (see :mod:`.storage`).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from ..errors import StoreCorruptError
from ..ids import is_session_id
from ..messages import Message
from ..results import PruneResult
from ._common import check_length, check_older_than
from ._engine.leases import LeaseRules
from ._events import prune_events
from ._expiry import expire_due
from ._file_catalog import FileCatalog
from ._file_events import FileEventOps
from ._file_layout import messages_json
from ._file_lease import FileLeaseOps
from ._file_mail import FileMailOps
from ._key_expiry import DEFAULT_KEY_TTL_S, check_key_ttl, tidy
from ._lease import make_owner
from .base import StoreCapabilities
from .storage import (
    DEFAULT_LOCK_TIMEOUT_S,
    EncryptionMark,
    FileStorage,
    LocalStorageCheckpointStore,
    StorageServiceApprovalStore,
    unavailable,
)

__all__ = [
    "FileSessionStore",
    "FileStore",
    "FileStorage",
    "LocalStorageCheckpointStore",
    "StorageServiceApprovalStore",
]

logger = logging.getLogger(__name__)


_SESSIONS = StoreCapabilities(lease=True, lease_query=True, append=True, revision=True,
                              catalog=True, events=True, mailbox=True)
_STORE = attrs.evolve(_SESSIONS, prune=True)


class FileSessionStore(FileCatalog, LeaseRules):
    """Transcripts as ``<dir>/<id>.json``, with the catalog (times, metadata, history) in
    the sidecars ``<id>.meta.json`` and ``<id>.history.json`` (the layout is in the module
    docstring).

    ``dir`` is created on first save. Writes are atomic (temp file, fsync, rename) and every
    write takes the cross-process file lock ``<dir>/<id>.lock``, so ``append`` (which
    rewrites the whole file: O(transcript)) never loses a turn, and the transcript, its
    history and its sidecar change together. ``list`` and ``info`` read the small sidecars
    and ``stat`` the transcripts, never the transcripts (except sessions written before the
    catalog, or after a crash between two writes, which are counted from the transcript).

    The lease is an OS file lock on ``<dir>/<id>.lease``: it dies with its process, so a
    dead holder's lease is taken over at once. Between processes a live holder keeps the
    lease until it releases it; inside one process an owner that has not renewed within
    ``ttl_s`` is taken over.

    Every acquisition returns a fence token, one more than the last, kept in
    ``<dir>/<id>.fence`` (``fence_token``). The writes take no ``fence=`` (``compact``
    accepts and ignores it): the OS lock already keeps a stopped holder's rivals out, so
    there is no split brain.

    Thread-safe: file locks exclude threads too; the lease primitives guard their table of
    held leases with a lock. The lease rules (checks, polling) are ``LeaseRules``'.
    """

    _leases: FileLeaseOps

    @property
    def capabilities(self) -> StoreCapabilities:
        """The lease (an OS file lock; writes take no fence), append, revision, the
        catalog, the event log and the mailbox."""
        return _SESSIONS

    def __init__(
        self, dir: str | os.PathLike[str], *, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    ) -> None:
        super().__init__(dir, lock_timeout_s)
        self._leases = FileLeaseOps(lambda: self._dir, self._path)
        self._events = FileEventOps(self._path)
        self._mail = FileMailOps(self._path)

    def event_ops(self) -> FileEventOps:
        """The event log's primitives (``start()``/``attach()``): files under
        ``<dir>/.events/``."""
        return self._events

    def mail_ops(self) -> FileMailOps:
        """The session mailbox's primitives (turn policies across processes): files under
        ``<dir>/.mail/``."""
        return self._mail

    def __repr__(self) -> str:
        return f"FileSessionStore({str(self._path)!r})"

    def load(self, id: str) -> builtins.list[Message] | None:
        """The stored transcript, or None; StoreCorruptError (file untouched) when unreadable."""
        doc = self._read_doc(id, self.path_for(id))
        return None if doc is None else doc[0]

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript (the history stays); an empty sequence deletes the
        transcript and the history (the metadata stays)."""
        self.path_for(id)
        body = messages_json(messages) if messages else None
        if body is None and not self._exists(id):
            return  # nothing to forget: no directory or lock file is created
        with self._lock(id):
            row = self._current(id)
            if body is None:
                self._clear(id, row, keep_metadata=True)
                return
            history = self._history_length(row)
            rev = self._write_transcript(id, body, history)
            self._write_meta(id, row, messages=len(messages), history_length=history,
                             transcript=rev)

    def delete(self, id: str) -> None:
        """Forget session ``id``: transcript, history and metadata (no error when absent)."""
        if not self._exists(id) and not self._history_path(id).exists():
            return
        with self._lock(id):
            self._clear(id, None, keep_metadata=False)

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add a turn's messages under the per-id lock; StoreConflictError when the stored
        transcript does not hold exactly ``expected_length`` messages."""
        path = self.path_for(id)
        with self._lock(id):
            stored, history = self._read_doc(id, path) or ([], 0)
            check_length(id, expected_length, len(stored), f"in {path}", path=str(path))
            if messages:
                row = self._current(id)
                stored.extend(messages)
                rev = self._write_transcript(id, messages_json(stored), history)
                self._write_meta(id, row, messages=len(stored), history_length=history,
                                 transcript=rev)

    def revision(self, id: str) -> object:
        """A token that changes whenever the transcript file changes (not the metadata);
        None when absent."""
        st = self._stat(id, self.path_for(id))
        return None if st is None else (st.st_mtime_ns, st.st_size, st.st_ino)

    def ids(self) -> builtins.list[str]:
        """The ids of the stored sessions (with a transcript or metadata), sorted."""
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise unavailable("list", self._dir, exc) from exc
        found = {n[:-5] for n in names if n.endswith(".json") and is_session_id(n[:-5])}
        for n in names:
            sid = n[:-10]
            if n.endswith(".meta.json") and sid not in found and is_session_id(sid):
                try:
                    if self._current(sid) is None:
                        continue  # a sidecar left without transcript or metadata
                except StoreCorruptError:
                    pass  # listed, so that it can be seen and deleted
                found.add(sid)
        return sorted(found)


class FileStore:
    """The three file stores under one directory, usable as an agent's ``store``:
    ``<root>/sessions`` (FileSessionStore) and ``<root>/state`` (a FileStorage holding the
    checkpoints and approvals). Adds ``prune``."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """Its sessions' capabilities and ``prune`` (no fencing, no ``commit_turn``)."""
        return _STORE

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._mark = EncryptionMark(self.root)
        storage = FileStorage(self.root / "state")
        storage._guard = self._mark
        self.sessions = FileSessionStore(self.root / "sessions")
        self.sessions._guard = self._mark
        self.checkpoints = LocalStorageCheckpointStore(storage)
        self.approvals = StorageServiceApprovalStore(storage)

    def mark_encrypted(self) -> None:
        """Called by EncryptedStore: mark the root (the file ``encrypted``, at the next
        use) as written through it, and accept this object's use."""
        self._mark.mark()

    def prune(self, older_than_s: float, *,
              idempotency_ttl_s: float = DEFAULT_KEY_TTL_S) -> PruneResult:
        """Delete sessions not updated within ``older_than_s`` seconds (their catalog
        ``updated_at``; transcript, history and metadata), checkpoints whose files were not
        modified that long and approvals resolved that long ago; pending approvals (with
        their session and the checkpoint of the turn they paused) are
        kept. Returns the counts.
        Then drops mail older than ``MAIL_TTL_S`` (600 s) from the session mailbox and the
        idempotency keys older than ``idempotency_ttl_s`` (default 24 h; pass the largest
        ``idempotency_ttl_s`` your sessions use) from the transcripts (``mails``,
        ``keys``: the transcripts rewritten, which counts as their update)."""
        check_older_than(older_than_s)
        check_key_ttl(idempotency_ttl_s)
        prune_events(self.sessions.event_ops())  # finished turns past event_ttl_s
        expire_due(self.approvals)
        cutoff = time.time() - older_than_s
        # a pending approval keeps its session and the checkpoint of the turn it paused
        waiting = self.approvals.list_pending()
        keep_sessions = {r.session_id for r in waiting}
        keep_checkpoints = {r.checkpoint_key for r in waiting}
        sessions = 0
        owner = make_owner()
        for sid in self.sessions.ids():
            if sid in keep_sessions:
                continue
            try:
                row = self.sessions._current(sid)
            except StoreCorruptError as exc:
                logger.warning("prune skipped session %r: %s", sid, exc)
                continue
            if row is None or row.updated_at >= cutoff:
                continue
            # a session whose lease is held (a turn running somewhere) is kept
            if not self.sessions.acquire_lease(sid, owner=owner, ttl_s=30.0, wait_s=0):
                continue
            try:
                sessions += self.sessions._prune(sid, cutoff)
            finally:
                self.sessions.release_lease(sid, owner=owner)
        checkpoints = 0
        storage = self.checkpoints.storage
        assert isinstance(storage, FileStorage)
        for key in self.checkpoints.keys(""):
            if key in keep_checkpoints:
                continue
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
        return tidy(PruneResult(sessions, checkpoints, approvals), self.sessions,
                    idempotency_ttl_s)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"
