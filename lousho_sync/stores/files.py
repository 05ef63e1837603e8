"""File-based stores: one machine, inspectable JSON files.

* :class:`FileStorage` — the :class:`~lousho_sync.stores.base.StorageService` over a root
  directory: atomic puts, a cross-process lock per key (in :mod:`.storage`, as the next two).
* :class:`FileSessionStore` — ``<dir>/<id>.json`` per session (one document), with
  ``append`` under a per-id file lock, a per-session lease and the session catalog.
* :class:`LocalStorageCheckpointStore` and :class:`StorageServiceApprovalStore` — checkpoints
  and approval records over any StorageService (``checkpoints/<key>.json``,
  ``approvals/<id>.json``).

Every write goes to a temp file in the same directory, is fsynced and renamed over the old
file, so a reader never sees half a file. Unreadable files raise
:class:`~lousho_sync.errors.StoreCorruptError` naming the path and are never modified by a
read.

A session's files in ``<dir>`` (session ids hold no ``.``, so the names never collide):

* ``<id>.json`` — the transcript ``{"v": 1, "messages": [...], "history_length": n}``: the
  truth for the messages. ``history_length`` (absent: 0) is how many messages of the
  history file are committed.
* ``<id>.history.json`` — the messages compaction replaced, ``{"v": 1, "messages": [...]}``,
  oldest first. Only its first ``history_length`` messages count: ``compact`` writes it
  before the transcript, so a crash between the two leaves the old transcript and history.
* ``<id>.meta.json`` — the catalog sidecar ``{"v": 1, "created_at", "updated_at",
  "metadata", "messages", "history_length", "transcript": [mtime_ns, size] | null}``: the
  truth for the metadata and the times; ``list``/``info`` read only it and a ``stat`` of the
  transcript. Written after the transcript, so when ``transcript`` does not match the
  transcript file (a crash between the two writes, or a writer of an older lousho) the
  transcript is counted instead and ``updated_at`` is at least its mtime.
* ``<id>.lock``, ``<id>.lease``, ``<id>.fence`` — the write lock, the lease and the fence
  token.

Sessions written before the catalog (no sidecar) keep working: they list with their
transcript's mtime as both times, counted from the transcript (nothing is written by a
read); their first write adds the sidecar. Deleting removes the sidecar first, so a crash
midway leaves such a transcript-only session, never a sidecar without its data.
"""

from __future__ import annotations

import builtins
import contextlib
import heapq
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import filelock

from .._message_form import (
    FORMAT_VERSION,
    as_mapping,
    check_version,
    decode,
    encode,
    field_of,
    load_message_list,
)
from ..catalog import SessionInfo, SessionPage, check_list_args, check_metadata, page_from
from ..codec import (
    dumps_messages,
    loads_messages,
    message_to_dict,
)
from ..errors import (
    InvalidInputError,
    SessionExistsError,
    StoreCorruptError,
)
from ..ids import is_session_id
from ..messages import Message
from ..results import PruneResult
from ._common import (
    check_length,
    check_older_than,
    check_owner,
    check_ttl,
    validate_session_id,
)
from ._events import prune_events
from ._expiry import expire_due
from ._file_events import FileEventOps
from ._file_mail import FileMailOps
from ._lease import make_owner, poll_until
from .base import Fence, StoreCapabilities, now
from .storage import (
    DEFAULT_LOCK_TIMEOUT_S,
    EncryptionMark,
    FileStorage,
    LocalStorageCheckpointStore,
    StorageServiceApprovalStore,
    atomic_write,
    file_lock,
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


@attrs.define(slots=True)
class _Lease:
    owner: str
    lock: filelock.BaseFileLock
    expires_at: float


Rev = tuple[int, int] | None
"""A transcript file's (mtime_ns, size), or None when there is none."""


@attrs.frozen(slots=True, kw_only=True)
class _Meta:
    """A session's catalog sidecar ``<id>.meta.json``, as read."""

    created_at: float
    updated_at: float
    metadata: dict[str, Any]
    messages: int
    history_length: int
    transcript: Rev


@attrs.frozen(slots=True)
class _Row:
    """A session's catalog entry; None counts: read them from the transcript (no sidecar,
    or one that does not match the transcript); ``stored``: the sidecar's counts, for a
    transcript that is not even JSON."""

    id: str
    created_at: float
    updated_at: float
    metadata: dict[str, Any]
    messages: int | None
    history_length: int | None
    stored: tuple[int, int] = (0, 0)


def _mtime(rev: tuple[int, int]) -> float:
    return rev[0] / 1e9


def _row(id: str, meta: _Meta | None, rev: Rev) -> _Row | None:
    """The catalog entry of ``id`` from its sidecar and its transcript's ``rev``: the
    sidecar when it describes that transcript, else the transcript is the truth."""
    if meta is None:
        if rev is None:
            return None
        t = _mtime(rev)  # written before the catalog: its mtime is all there is
        return _Row(id, t, t, {}, None, None)
    if meta.transcript == rev:
        if rev is None and not meta.metadata:
            return None
        return _Row(id, meta.created_at, meta.updated_at, meta.metadata, meta.messages,
                    meta.history_length)
    if rev is None:  # the transcript went after the sidecar was written
        return _Row(id, meta.created_at, meta.updated_at, meta.metadata, 0, 0) \
            if meta.metadata else None
    return _Row(id, meta.created_at, max(meta.updated_at, _mtime(rev)), meta.metadata,
                None, None, (meta.messages, meta.history_length))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _parse_meta(data: bytes) -> _Meta:
    try:
        d = decode(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise StoreCorruptError(f"not valid JSON: {exc}") from exc
    d = as_mapping(d, "the catalog sidecar")
    check_version(d, "the catalog sidecar")
    created, updated = d.get("created_at"), d.get("updated_at")
    messages, history = d.get("messages"), d.get("history_length", 0)
    metadata, transcript = d.get("metadata", {}), d.get("transcript")
    if not (_number(created) and _number(updated)):
        raise StoreCorruptError("'created_at' and 'updated_at' must be numbers")
    if not (_count(messages) and _count(history)):
        raise StoreCorruptError("'messages' and 'history_length' must be counts")
    if not isinstance(metadata, dict):
        raise StoreCorruptError("'metadata' is not a JSON object")
    rev: Rev = None
    if transcript is not None:
        if (not isinstance(transcript, list) or len(transcript) != 2
                or not all(_count(x) for x in transcript)):
            raise StoreCorruptError("'transcript' must be [mtime_ns, size] or null")
        rev = (transcript[0], transcript[1])
    assert isinstance(created, (int, float)) and isinstance(updated, (int, float))
    assert isinstance(messages, int) and isinstance(history, int)
    return _Meta(created_at=float(created), updated_at=float(updated), metadata=metadata,
                 messages=messages, history_length=history, transcript=rev)


def _loads_doc(data: bytes) -> tuple[list[Message], int]:
    """The messages and ``history_length`` of a transcript document."""
    try:
        d = decode(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise StoreCorruptError(f"the transcript is not valid JSON: {exc}") from exc
    d = as_mapping(d, "the transcript document")
    check_version(d, "the transcript")
    messages = list(load_message_list(field_of(d, "messages", "the transcript"), "messages"))
    history = d.get("history_length", 0)
    if not _count(history):
        raise StoreCorruptError(f"the transcript's 'history_length' is {history!r}, not a count")
    assert isinstance(history, int)
    return messages, history


def _messages_json(messages: Sequence[Message]) -> str:
    try:
        return encode([message_to_dict(m) for m in messages])
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"a transcript cannot be written as JSON: {exc}") from exc


def _doc(body: str, history_length: int) -> bytes:
    """The transcript document of the messages ``body`` (their JSON array); without
    ``history_length`` when 0, as before the catalog."""
    tail = f',"history_length":{history_length}' if history_length else ""
    return f'{{"v":{FORMAT_VERSION},"messages":{body}{tail}}}'.encode()


_SESSIONS = StoreCapabilities(lease=True, append=True, revision=True, catalog=True,
                              events=True, mailbox=True)
_STORE = attrs.evolve(_SESSIONS, prune=True)


class FileSessionStore:
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

    Thread-safe: file locks exclude threads too; ``_leases_lock`` guards the in-memory
    lease table (owner, file lock, expiry per id).
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """The lease (an OS file lock; writes take no fence), append, revision, the
        catalog, the event log and the mailbox."""
        return _SESSIONS

    def __init__(
        self, dir: str | os.PathLike[str], *, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    ) -> None:
        self._path = Path(dir)
        self._guard: Callable[[], None] | None = None  # FileStore's encryption mark
        self._lock_timeout_s = lock_timeout_s
        self._leases_lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}
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

    @property
    def _dir(self) -> Path:
        """The directory, for every file operation (the encryption mark is checked first)."""
        if self._guard is not None:
            self._guard()
        return self._path

    @property
    def dir(self) -> Path:
        """The directory holding the session files."""
        return self._path

    def path_for(self, id: str) -> Path:
        """The file of session ``id`` (InvalidSessionIdError for a bad id)."""
        return self._dir / f"{validate_session_id(id)}.json"

    def _meta_path(self, id: str) -> Path:
        return self._dir / f"{id}.meta.json"

    def _history_path(self, id: str) -> Path:
        return self._dir / f"{id}.history.json"

    def _lock(self, id: str) -> AbstractContextManager[None]:
        return file_lock(self._dir / f"{id}.lock", self._lock_timeout_s, id)

    def _where(self, id: str) -> str:
        return f"session {id!r} in the file store at {self._dir}"

    def _read_bytes(self, id: str, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise unavailable("read", path, exc, id) from exc

    def _read_doc(self, id: str, path: Path) -> tuple[list[Message], int] | None:
        data = self._read_bytes(id, path)
        if data is None:
            return None
        try:
            return _loads_doc(data)
        except StoreCorruptError as exc:
            raise StoreCorruptError(
                f"session file {path} cannot be read ({exc}); it was left as it is: "
                "repair or delete it",
                path=str(path),
                session_id=id,
            ) from exc

    def _read_meta(self, id: str, dir_fd: int | None = None) -> _Meta | None:
        """The sidecar of ``id`` (None when absent); ``dir_fd``: an open descriptor of the
        directory, so that ``list`` opens 10,000 sidecars without resolving their paths."""
        if dir_fd is None:
            data = self._read_bytes(id, self._meta_path(id))
        else:
            try:
                fd = os.open(f"{id}.meta.json", os.O_RDONLY, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise unavailable("read", self._meta_path(id), exc, id) from exc
            try:
                with open(fd, "rb", closefd=True) as f:
                    data = f.read()
            except OSError as exc:
                raise unavailable("read", self._meta_path(id), exc, id) from exc
        if data is None:
            return None
        try:
            return _parse_meta(data)
        except StoreCorruptError as exc:
            path = self._meta_path(id)
            raise StoreCorruptError(
                f"the catalog sidecar {path} of {self._where(id)} cannot be read ({exc}); it "
                "was left as it is: repair it, or delete it to keep the transcript without "
                "its metadata",
                path=str(path),
                session_id=id,
            ) from exc

    def _read_history(self, id: str) -> builtins.list[Message]:
        path = self._history_path(id)
        data = self._read_bytes(id, path)
        if data is None:
            return []
        try:
            return loads_messages(data)
        except StoreCorruptError as exc:
            raise StoreCorruptError(
                f"the history file {path} of {self._where(id)} cannot be read ({exc}); it was "
                "left as it is: repair or delete it",
                path=str(path),
                session_id=id,
            ) from exc

    def _write(self, id: str, path: Path, data: bytes) -> None:
        try:
            atomic_write(path, data)
        except OSError as exc:
            raise unavailable("write", path, exc, id) from exc

    def _unlink(self, id: str, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise unavailable("delete", path, exc, id) from exc

    def _rev(self, id: str, path: Path) -> Rev:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise unavailable("stat", path, exc, id) from exc
        return (st.st_mtime_ns, st.st_size)

    def _current(self, id: str) -> _Row | None:
        """The catalog entry of ``id`` (stat first: a write between the two shows as a
        sidecar that does not match, and the transcript is read)."""
        rev = self._rev(id, self.path_for(id))
        return _row(id, self._read_meta(id), rev)

    def _exists(self, id: str) -> bool:
        return any(p.exists() for p in (self.path_for(id), self._meta_path(id)))

    def _peek(self, id: str) -> tuple[int, int] | None:
        """The message count and ``history_length`` of the transcript, from its JSON without
        loading the messages (a damaged message still counts: ``load`` reports it); None
        when it is absent or not a transcript document."""
        data = self._read_bytes(id, self.path_for(id))
        if data is None:
            return None
        try:
            d = decode(data)
        except ValueError:
            return None
        messages = d.get("messages") if isinstance(d, dict) else None
        if not isinstance(messages, builtins.list):
            return None
        history = d.get("history_length", 0)
        return len(messages), history if _count(history) else 0

    def _messages(self, row: _Row) -> int:
        if row.messages is not None:
            return row.messages
        peek = self._peek(row.id)
        return row.stored[0] if peek is None else peek[0]

    def _history_length(self, row: _Row | None) -> int:
        if row is None:
            return 0
        if row.history_length is not None:
            return row.history_length
        peek = self._peek(row.id)
        return row.stored[1] if peek is None else peek[1]

    def _info(self, row: _Row) -> SessionInfo:
        return SessionInfo(id=row.id, messages=self._messages(row), created_at=row.created_at,
                           updated_at=row.updated_at, metadata=row.metadata)

    def _write_transcript(self, id: str, body: str, history_length: int) -> Rev:
        path = self.path_for(id)
        self._write(id, path, _doc(body, history_length))
        return self._rev(id, path)

    def _write_meta(
        self,
        id: str,
        row: _Row | None,
        *,
        messages: int,
        history_length: int,
        transcript: Rev,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Write the sidecar after a change (``row``: the entry before it, None for a new
        session; ``metadata`` None keeps the old). No transcript and no metadata: remove it."""
        if metadata is None:
            metadata = row.metadata if row is not None else {}
        path = self._meta_path(id)
        if transcript is None and not metadata:
            self._unlink(id, path)
            return
        t = now()
        doc: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "created_at": t if row is None else row.created_at,
            "updated_at": t,
            "messages": messages,
            "history_length": history_length,
            "transcript": None if transcript is None else [*transcript],
        }
        if metadata:
            doc["metadata"] = metadata
        self._write(id, path, encode(doc).encode())

    def _clear(self, id: str, row: _Row | None, *, keep_metadata: bool) -> None:
        """Remove the transcript and the history (and the metadata unless kept). The
        sidecar goes first, so a crash midway leaves a transcript-only session."""
        metadata = row.metadata if row is not None and keep_metadata else {}
        if not metadata:
            self._unlink(id, self._meta_path(id))
        self._unlink(id, self._history_path(id))
        self._unlink(id, self.path_for(id))
        if metadata:
            self._write_meta(id, row, messages=0, history_length=0, transcript=None)

    def load(self, id: str) -> builtins.list[Message] | None:
        """The stored transcript, or None; StoreCorruptError (file untouched) when unreadable."""
        doc = self._read_doc(id, self.path_for(id))
        return None if doc is None else doc[0]

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the transcript (the history stays); an empty sequence deletes the
        transcript and the history (the metadata stays)."""
        self.path_for(id)
        body = _messages_json(messages) if messages else None
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
                rev = self._write_transcript(id, _messages_json(stored), history)
                self._write_meta(id, row, messages=len(stored), history_length=history,
                                 transcript=rev)

    def revision(self, id: str) -> object:
        """A token that changes whenever the transcript file changes (not the metadata);
        None when absent."""
        path = self.path_for(id)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise unavailable("stat", path, exc, id) from exc
        return (st.st_mtime_ns, st.st_size, st.st_ino)

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
            raise unavailable("create", self._dir, exc, id) from exc

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
                    raise unavailable("lock", lease_path, exc, id) from exc
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
            atomic_write(path, str(token).encode())
        except OSError as exc:
            raise unavailable("write", path, exc, id) from exc
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

    # --- the catalog (Catalogued) -------------------------------------------------------

    def info(self, id: str) -> SessionInfo | None:
        """The catalog entry of ``id`` from its sidecar (the transcript is read only when
        there is no sidecar, or one that does not match it), or None."""
        row = self._current(validate_session_id(id))
        return None if row is None else self._info(row)

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` atomically (``{}`` removes it), creating the
        catalog entry when absent; the transcript and its revision are untouched."""
        self.path_for(id)
        new = json.loads(check_metadata(metadata, id))
        if not new and not self._exists(id):
            return
        with self._lock(id):
            row = self._current(id)
            rev = self._rev(id, self.path_for(id))
            if row is None:
                self._write_meta(id, None, messages=0, history_length=0, transcript=rev,
                                 metadata=new)
                return
            self._write_meta(id, row, messages=self._messages(row),
                             history_length=self._history_length(row), transcript=rev,
                             metadata=new)

    def history(self, id: str) -> builtins.list[Message]:
        """The messages compaction replaced in ``id``, oldest first ([] when none)."""
        row = self._current(validate_session_id(id))
        length = self._history_length(row)
        return self._read_history(id)[:length] if length else []

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """Add ``replaced`` to the history of ``id`` and replace its transcript, under the
        lock: the history file is written first and counts only once the transcript
        names its new length. ``fence`` is ignored (the file store does not fence)."""
        self.path_for(id)
        body = _messages_json(messages) if messages else None
        added = dumps_messages(replaced) if replaced else None  # checked before any write
        if body is None and not self._exists(id):
            return
        with self._lock(id):
            row = self._current(id)
            if body is None:
                self._clear(id, row, keep_metadata=True)
                return
            length = self._history_length(row)
            if added is not None:
                kept = self._read_history(id)[:length] + list(replaced)
                self._write(id, self._history_path(id), dumps_messages(kept).encode())
                length = len(kept)
            rev = self._write_transcript(id, body, length)
            self._write_meta(id, row, messages=len(messages), history_length=length,
                             transcript=rev)

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create ``id`` with a transcript, metadata and history under its lock;
        SessionExistsError (nothing written) when it has messages or metadata. (A crash
        between the transcript and the sidecar write leaves the transcript without its
        metadata.)"""
        self.path_for(id)
        new = json.loads(check_metadata(metadata or {}, id))
        body = _messages_json(messages) if messages else None
        kept = dumps_messages(history) if history and messages else None
        with self._lock(id):
            row = self._current(id)
            if row is not None and (row.metadata or self._messages(row)):
                raise SessionExistsError(
                    f"session {id!r} exists already in the file store at {self._dir}",
                    path=str(self.path_for(id)),
                    session_id=id,
                )
            if body is None and not new:
                return
            rev: Rev = None
            if body is not None:
                if kept is not None:
                    self._write(id, self._history_path(id), kept.encode())
                rev = self._write_transcript(id, body, len(history) if kept else 0)
            self._write_meta(id, None, messages=len(messages),
                             history_length=len(history) if kept else 0, transcript=rev,
                             metadata=new)

    def _prune(self, id: str, cutoff: float) -> bool:
        """Delete ``id`` if it was last updated before ``cutoff`` (checked under its lock)."""
        with self._lock(id):
            row = self._current(id)
            if row is None or row.updated_at >= cutoff:
                return False
            self._clear(id, row, keep_metadata=False)
            return True

    def _rows(
        self,
        transcripts: dict[str, os.DirEntry[str]],
        sidecars: set[str],
        cursor: tuple[float, str] | None,
        rows: builtins.list[_Row],
        dir_fd: int,
    ) -> None:
        """Add to ``rows`` the catalog entries after ``cursor`` of the sessions found."""
        for sid in transcripts.keys() | sidecars:
            rev: Rev = None
            entry = transcripts.get(sid)
            if entry is not None:
                try:
                    st = entry.stat()
                    rev = (st.st_mtime_ns, st.st_size)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise unavailable("stat", Path(entry.path), exc, sid) from exc
            row = _row(sid, self._read_meta(sid, dir_fd) if sid in sidecars else None, rev)
            if row is not None and (cursor is None or row.updated_at < cursor[0] or (
                    row.updated_at == cursor[0] and row.id > cursor[1])):
                rows.append(row)

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of the catalog, newest first (see :class:`~lousho_sync.stores.base.
        Catalogued`): reads the sidecars of the ids with ``prefix`` and stats their
        transcripts; only a session on the page without a matching sidecar is counted
        from its transcript."""
        prefix, limit, cursor = check_list_args(prefix, limit, after)
        transcripts: dict[str, os.DirEntry[str]] = {}
        sidecars: set[str] = set()
        try:
            with os.scandir(self._dir) as entries:
                for e in entries:
                    name = e.name
                    if not name.startswith(prefix) or not name.endswith(".json"):
                        continue
                    if name.endswith(".meta.json"):
                        if is_session_id(name[:-10]):
                            sidecars.add(name[:-10])
                    elif is_session_id(name[:-5]):
                        transcripts[name[:-5]] = e
        except FileNotFoundError:
            return SessionPage(())
        except OSError as exc:
            raise unavailable("list", self._dir, exc) from exc
        rows: builtins.list[_Row] = []
        try:
            dir_fd = os.open(self._dir, os.O_RDONLY)
        except OSError as exc:
            raise unavailable("list", self._dir, exc) from exc
        try:
            self._rows(transcripts, sidecars, cursor, rows, dir_fd)
        finally:
            os.close(dir_fd)
        ordered = heapq.nsmallest(limit + 1, rows, key=lambda r: (-r.updated_at, r.id))
        return page_from([self._info(r) for r in ordered], limit)


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

    def prune(self, older_than_s: float) -> PruneResult:
        """Delete sessions not updated within ``older_than_s`` seconds (their catalog
        ``updated_at``; transcript, history and metadata), checkpoints whose files were not
        modified that long and approvals resolved that long ago; pending approvals (with
        their session and the checkpoint of the turn they paused) are
        kept. Returns the counts."""
        check_older_than(older_than_s)
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
        return PruneResult(sessions, checkpoints, approvals)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"
