"""A file session store's files, read and written: where each file of a session is, the
transcript document and the catalog sidecar (their formats and checks), the per-id write
lock, and atomic writes. :class:`FileLayout` is what ``FileSessionStore`` stands on.

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
  token (the last two in :mod:`._file_lease`).

Sessions written before the catalog (no sidecar) keep working: they list with their
transcript's mtime as both times, counted from the transcript (nothing is written by a
read); their first write adds the sidecar. Deleting removes the sidecar first, so a crash
midway leaves such a transcript-only session, never a sidecar without its data.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs

from .._message_form import (
    FORMAT_VERSION,
    as_mapping,
    check_version,
    decode,
    encode,
    field_of,
    load_message_list,
)
from ..catalog import SessionInfo
from ..codec import loads_messages, message_to_dict
from ..errors import InvalidInputError, StoreCorruptError
from ..messages import Message
from ..records import now
from ._common import validate_session_id
from .storage import atomic_write, file_lock, unavailable

__all__ = ["FileLayout", "Meta", "Rev", "Row", "doc_bytes", "is_count", "loads_doc",
           "messages_json", "parse_meta", "row_of"]

Rev = tuple[int, int] | None
"""A transcript file's (mtime_ns, size), or None when there is none."""


@attrs.frozen(slots=True, kw_only=True)
class Meta:
    """A session's catalog sidecar ``<id>.meta.json``, as read."""

    created_at: float
    updated_at: float
    metadata: dict[str, Any]
    messages: int
    history_length: int
    transcript: Rev


@attrs.frozen(slots=True)
class Row:
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


def mtime_of(rev: tuple[int, int]) -> float:
    return rev[0] / 1e9


def row_of(id: str, meta: Meta | None, rev: Rev) -> Row | None:
    """The catalog entry of ``id`` from its sidecar and its transcript's ``rev``: the
    sidecar when it describes that transcript, else the transcript is the truth."""
    if meta is None:
        if rev is None:
            return None
        t = mtime_of(rev)  # written before the catalog: its mtime is all there is
        return Row(id, t, t, {}, None, None)
    if meta.transcript == rev:
        if rev is None and not meta.metadata:
            return None
        return Row(id, meta.created_at, meta.updated_at, meta.metadata, meta.messages,
                    meta.history_length)
    if rev is None:  # the transcript went after the sidecar was written
        return Row(id, meta.created_at, meta.updated_at, meta.metadata, 0, 0) \
            if meta.metadata else None
    return Row(id, meta.created_at, max(meta.updated_at, mtime_of(rev)), meta.metadata,
                None, None, (meta.messages, meta.history_length))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _document(data: bytes, invalid: str, what: str, version_of: str) -> Mapping[str, Any]:
    """The JSON object of a session file, its version checked (StoreCorruptError)."""
    try:
        d = decode(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise StoreCorruptError(f"{invalid}: {exc}") from exc
    d = as_mapping(d, what)
    check_version(d, version_of)
    return d


def parse_meta(data: bytes) -> Meta:
    d = _document(data, "not valid JSON", "the catalog sidecar", "the catalog sidecar")
    created, updated = d.get("created_at"), d.get("updated_at")
    messages, history = d.get("messages"), d.get("history_length", 0)
    metadata, transcript = d.get("metadata", {}), d.get("transcript")
    if not (_number(created) and _number(updated)):
        raise StoreCorruptError("'created_at' and 'updated_at' must be numbers")
    if not (is_count(messages) and is_count(history)):
        raise StoreCorruptError("'messages' and 'history_length' must be counts")
    if not isinstance(metadata, dict):
        raise StoreCorruptError("'metadata' is not a JSON object")
    rev: Rev = None
    if transcript is not None:
        if (not isinstance(transcript, list) or len(transcript) != 2
                or not all(is_count(x) for x in transcript)):
            raise StoreCorruptError("'transcript' must be [mtime_ns, size] or null")
        rev = (transcript[0], transcript[1])
    assert isinstance(created, (int, float)) and isinstance(updated, (int, float))
    assert isinstance(messages, int) and isinstance(history, int)
    return Meta(created_at=float(created), updated_at=float(updated), metadata=metadata,
                 messages=messages, history_length=history, transcript=rev)


def loads_doc(data: bytes) -> tuple[list[Message], int]:
    """The messages and ``history_length`` of a transcript document."""
    d = _document(data, "the transcript is not valid JSON", "the transcript document",
                  "the transcript")
    messages = list(load_message_list(field_of(d, "messages", "the transcript"), "messages"))
    history = d.get("history_length", 0)
    if not is_count(history):
        raise StoreCorruptError(f"the transcript's 'history_length' is {history!r}, not a count")
    assert isinstance(history, int)
    return messages, history


def messages_json(messages: Sequence[Message]) -> str:
    try:
        return encode([message_to_dict(m) for m in messages])
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"a transcript cannot be written as JSON: {exc}") from exc


def doc_bytes(body: str, history_length: int) -> bytes:
    """The transcript document of the messages ``body`` (their JSON array); without
    ``history_length`` when 0, as before the catalog."""
    tail = f',"history_length":{history_length}' if history_length else ""
    return f'{{"v":{FORMAT_VERSION},"messages":{body}{tail}}}'.encode()


class FileLayout:
    """The files of the sessions in one directory (see the module docstring): paths, reads
    that name the damaged file, atomic writes under the per-id lock ``<dir>/<id>.lock``,
    and the catalog entry of a session from its sidecar and its transcript's ``stat``."""

    def __init__(self, dir: str | os.PathLike[str], lock_timeout_s: float) -> None:
        self._path = Path(dir)
        self._guard: Callable[[], None] | None = None  # FileStore's encryption mark
        self._lock_timeout_s = lock_timeout_s

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
            return loads_doc(data)
        except StoreCorruptError as exc:
            raise self._damaged(id, path, f"session file {path}", exc) from exc

    @staticmethod
    def _damaged(id: str, path: Path, name: str, exc: StoreCorruptError,
                 advice: str = "repair or delete it") -> StoreCorruptError:
        """The error for the file ``name`` (at ``path``) that ``exc`` says is damaged."""
        return StoreCorruptError(
            f"{name} cannot be read ({exc}); it was left as it is: {advice}",
            path=str(path),
            session_id=id,
        )

    def _read_meta(self, id: str, dir_fd: int | None = None) -> Meta | None:
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
            return parse_meta(data)
        except StoreCorruptError as exc:
            path = self._meta_path(id)
            raise self._damaged(
                id, path, f"the catalog sidecar {path} of {self._where(id)}", exc,
                "repair it, or delete it to keep the transcript without its metadata",
            ) from exc

    def _read_history(self, id: str) -> builtins.list[Message]:
        path = self._history_path(id)
        data = self._read_bytes(id, path)
        if data is None:
            return []
        try:
            return loads_messages(data)
        except StoreCorruptError as exc:
            raise self._damaged(id, path, f"the history file {path} of {self._where(id)}",
                                exc) from exc

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

    def _stat(self, id: str, path: Path) -> os.stat_result | None:
        try:
            return os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise unavailable("stat", path, exc, id) from exc

    def _rev(self, id: str, path: Path) -> Rev:
        st = self._stat(id, path)
        return None if st is None else (st.st_mtime_ns, st.st_size)

    def _current(self, id: str) -> Row | None:
        """The catalog entry of ``id`` (stat first: a write between the two shows as a
        sidecar that does not match, and the transcript is read)."""
        rev = self._rev(id, self.path_for(id))
        return row_of(id, self._read_meta(id), rev)

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
        return len(messages), history if is_count(history) else 0

    def _messages(self, row: Row) -> int:
        if row.messages is not None:
            return row.messages
        peek = self._peek(row.id)
        return row.stored[0] if peek is None else peek[0]

    def _history_length(self, row: Row | None) -> int:
        if row is None:
            return 0
        if row.history_length is not None:
            return row.history_length
        peek = self._peek(row.id)
        return row.stored[1] if peek is None else peek[1]

    def _info(self, row: Row) -> SessionInfo:
        return SessionInfo(id=row.id, messages=self._messages(row), created_at=row.created_at,
                           updated_at=row.updated_at, metadata=row.metadata)

    def _write_transcript(self, id: str, body: str, history_length: int) -> Rev:
        path = self.path_for(id)
        self._write(id, path, doc_bytes(body, history_length))
        return self._rev(id, path)

    def _write_meta(
        self,
        id: str,
        row: Row | None,
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

    def _clear(self, id: str, row: Row | None, *, keep_metadata: bool) -> None:
        """Remove the transcript and the history (and the metadata unless kept). The
        sidecar goes first, so a crash midway leaves a transcript-only session."""
        metadata = row.metadata if row is not None and keep_metadata else {}
        if not metadata:
            self._unlink(id, self._meta_path(id))
        self._unlink(id, self._history_path(id))
        self._unlink(id, self.path_for(id))
        if metadata:
            self._write_meta(id, row, messages=0, history_length=0, transcript=None)

