"""The file store's event-log primitives, under ``<sessions dir>/.events/``: a turn's rows
are appended to ``<turn>.log`` (one ``<seq> <json>`` line each, one ``write`` per batch,
never fsynced), its head is ``<turn>.head`` (JSON, replaced by rename) and a session's
latest turn is ``<session>.latest``. Readers in other processes poll the log's size; in
this process a condition variable wakes them."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import StoreUnavailableError
from ._events import TurnHead, TurnStatus

__all__ = ["FileEventOps"]

POLL_S = 0.005


class FileEventOps:
    """:class:`~lousho_sync.stores._events.EventOps` on a directory."""

    def __init__(self, dir: Path) -> None:
        self._dir = dir / ".events"
        self._cond = threading.Condition()
        self._gen = 0
        self._lock = threading.Lock()
        # what this process read of each log: (inode, offset, rows)
        self._cache: dict[str, tuple[int, int, list[tuple[int, str]]]] = {}

    def _fail(self, what: str, exc: OSError) -> StoreUnavailableError:
        return StoreUnavailableError(f"could not {what} in the file store at {self._dir}: "
                                     f"{exc}", path=str(self._dir))

    def _bump(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def _write_head(self, head: TurnHead) -> None:
        path = self._dir / f"{head.turn_id}.head"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({
            "session_id": head.session_id, "owner": head.owner, "started_at": head.started_at,
            "last_seq": head.last_seq, "status": head.status, "ended_at": head.ended_at,
            "rows": head.rows}))
        os.replace(tmp, path)

    def begin(self, head: TurnHead) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            old = self.head(head.turn_id)
            self._write_head(head if old is None else
                             TurnHead(**{**_fields(head), "rows": old.rows}))
            latest = self._dir / f"{head.session_id}.latest"
            tmp = latest.with_name(f"{latest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(head.turn_id)
            os.replace(tmp, latest)
        except OSError as exc:
            raise self._fail("begin a turn's event log", exc) from exc
        self._bump()

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool:
        try:
            with self._lock:
                head = self.head(turn_id)
                if head is not None and head.owner != owner:
                    return False  # taken over (checked, not locked, across processes)
                if rows:
                    data = "".join(f"{seq} {text}\n" for seq, text in rows).encode()
                    fd = os.open(self._dir / f"{turn_id}.log",
                                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    try:
                        os.write(fd, data)
                    finally:
                        os.close(fd)
                head = self.head(turn_id)
                if head is not None:
                    last = rows[-1][0] if rows else head.last_seq
                    self._write_head(TurnHead(**{
                        **_fields(head), "last_seq": last, "owner": owner, "status": status,
                        "ended_at": ended_at, "rows": head.rows + len(rows)}))
        except OSError as exc:
            raise self._fail("write events", exc) from exc
        self._bump()
        return True

    def head(self, turn_id: str) -> TurnHead | None:
        try:
            d: dict[str, Any] = json.loads((self._dir / f"{turn_id}.head").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreUnavailableError(
                f"could not read the event log of turn {turn_id!r} in the file store at "
                f"{self._dir}: {exc}", path=str(self._dir)) from exc
        return TurnHead(turn_id=turn_id, session_id=d["session_id"], owner=d["owner"],
                        started_at=d["started_at"], last_seq=d["last_seq"],
                        status=d["status"], ended_at=d["ended_at"], rows=d.get("rows", 0))

    def latest(self, session_id: str) -> str | None:
        try:
            return (self._dir / f"{session_id}.latest").read_text().strip() or None
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read a session's latest turn", exc) from exc

    def _rows(self, turn_id: str) -> list[tuple[int, str]]:
        path = self._dir / f"{turn_id}.log"
        try:
            with path.open("rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                with self._lock:
                    cached = self._cache.get(turn_id)
                    if cached is None or cached[0] != inode:
                        cached = (inode, 0, [])
                    _, offset, rows = cached
                    f.seek(offset)
                    data = f.read()
                    end = data.rfind(b"\n") + 1  # complete lines only
                    if end:
                        rows = rows + [_row(line) for line in data[:end].splitlines()]
                        offset += end
                    self._cache[turn_id] = (inode, offset, rows)
                    return rows
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._fail("read events", exc) from exc

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        rows = self._rows(turn_id)
        lo, hi = 0, len(rows)
        while lo < hi:
            mid = (lo + hi) // 2
            if rows[mid][0] <= after:
                lo = mid + 1
            else:
                hi = mid
        return rows[lo:lo + limit]

    def _size(self, turn_id: str) -> tuple[int, int]:
        try:
            st = os.stat(self._dir / f"{turn_id}.log")
            return st.st_ino, st.st_size
        except OSError:
            return 0, 0

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            gen = self._gen
        size = self._size(turn_id)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with self._cond:
                if self._gen != gen:
                    return
                self._cond.wait(min(POLL_S, left))
                if self._gen != gen:
                    return
            if self._size(turn_id) != size:
                return

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        later = [r for r in self._rows(turn_id) if r[0] > upto]
        path = self._dir / f"{turn_id}.log"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with self._lock:
                tmp.write_bytes("".join(f"{s} {t}\n" for s, t in [*rows, *later]).encode())
                os.replace(tmp, path)
                head = self.head(turn_id)
                if head is not None:
                    self._write_head(TurnHead(**{**_fields(head),
                                                 "rows": len(rows) + len(later)}))
        except OSError as exc:
            raise self._fail("bound a turn's event log", exc) from exc
        self._bump()

    def drop(self, turn_id: str) -> None:
        head = self.head(turn_id)
        for name in (f"{turn_id}.log", f"{turn_id}.head"):
            try:
                (self._dir / name).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._fail("remove a turn's event log", exc) from exc
        if head is not None and self.latest(head.session_id) == turn_id:
            try:
                (self._dir / f"{head.session_id}.latest").unlink()
            except FileNotFoundError:
                pass
        with self._lock:
            self._cache.pop(turn_id, None)

    def ended_before(self, when: float) -> list[str]:
        try:
            names = [n for n in os.listdir(self._dir) if n.endswith(".head")]
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            head = self.head(name[:-len(".head")])
            if head is not None and head.ended_at is not None and head.ended_at < when:
                out.append(head.turn_id)
        return out


def _row(line: bytes) -> tuple[int, str]:
    seq, _, text = line.partition(b" ")
    return int(seq), text.decode()


def _fields(head: TurnHead) -> dict[str, Any]:
    return {"turn_id": head.turn_id, "session_id": head.session_id, "owner": head.owner,
            "started_at": head.started_at, "last_seq": head.last_seq, "status": head.status,
            "ended_at": head.ended_at, "rows": head.rows}
