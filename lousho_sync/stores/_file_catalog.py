"""The session catalog of the file session store (``Catalogued``): entries from the
sidecars, metadata, the history compaction keeps, atomic ``create`` and the ``list`` scan
that reads the sidecars and stats the transcripts."""

from __future__ import annotations

import builtins
import heapq
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..catalog import SessionInfo, SessionPage, check_list_args, check_metadata, page_from
from ..codec import dumps_messages
from ..errors import SessionExistsError
from ..ids import is_session_id
from ..messages import Message
from ..records import Fence
from ._common import validate_session_id
from ._file_layout import FileLayout, Rev, Row, messages_json, row_of
from .storage import unavailable

__all__ = ["FileCatalog"]


class FileCatalog(FileLayout):
    """The catalog methods of ``FileSessionStore``, each under the session's write lock
    where it writes."""

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
        body = messages_json(messages) if messages else None
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
        body = messages_json(messages) if messages else None
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
        rows: builtins.list[Row],
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
            row = row_of(sid, self._read_meta(sid, dir_fd) if sid in sidecars else None, rev)
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
        rows: builtins.list[Row] = []
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

