"""The file store's mailbox primitives, under ``<sessions dir>/.mail/``: one file per mail,
``<session>~<arrival ns>-<id>.mail``, written whole then renamed into place; taking it is a
rename to ``.taken`` (exactly one process wins a rename), so no lock is needed. An owner in
another process notices new mail by listing the directory."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from ..errors import StoreUnavailableError
from ._mail import Mail

__all__ = ["FileMailOps"]


def _safe(mail_id: str) -> str:
    return mail_id.replace(":", "_")


class FileMailOps:
    """:class:`~lousho_sync.stores._mail.MailOps` on a directory."""

    def __init__(self, dir: Path) -> None:
        self._dir = dir / ".mail"

    def _fail(self, what: str, exc: OSError) -> StoreUnavailableError:
        return StoreUnavailableError(f"could not {what} in the file store at {self._dir}: "
                                     f"{exc}", path=str(self._dir))

    def _names(self) -> list[str]:
        try:
            return os.listdir(self._dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._fail("list the mailbox", exc) from exc

    def post(self, session_id: str, mail_id: str, kind: str, data: str,
             posted_at: float, poster: str = "") -> None:
        body = json.dumps({"mail_id": mail_id, "session_id": session_id, "kind": kind,
                           "data": data, "posted_at": posted_at, "poster": poster})
        name = f"{session_id}~{time.time_ns():020d}-{_safe(mail_id)}.mail"
        tmp = self._dir / f".{uuid.uuid4().hex}.tmp"
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(body, encoding="utf-8")
            os.replace(tmp, self._dir / name)
        except OSError as exc:
            raise self._fail("post to a session's mailbox", exc) from exc

    def take(self, session_ids: Sequence[str]) -> list[Mail]:
        wanted = set(session_ids)
        names = sorted((n for n in self._names()
                        if n.endswith(".mail") and n.partition("~")[0] in wanted),
                       key=lambda n: n.partition("~")[2])
        out: list[Mail] = []
        for n in names:
            taken = self._dir / f"{n[:-5]}.taken"
            try:
                os.rename(self._dir / n, taken)  # exactly one process wins
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._fail("take a mail", exc) from exc
            m = self._read(taken, len(out))
            if m is not None:
                out.append(m)
        return out

    def line(self, session_id: str) -> list[Mail]:
        names = sorted((n for n in self._names() if n.endswith((".mail", ".taken"))
                        and n.partition("~")[0] == session_id),
                       key=lambda n: n.partition("~")[2])
        out: list[Mail] = []
        for i, n in enumerate(names):
            m = self._read(self._dir / n, i)
            if m is None and n.endswith(".mail"):  # taken meanwhile
                m = self._read(self._dir / f"{n[:-5]}.taken", i)
            if m is not None:
                out.append(m)
        return out

    @staticmethod
    def _read(path: Path, seq: int) -> Mail | None:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # taken (renamed) or dropped meanwhile
        return Mail(seq, str(d["mail_id"]), str(d["session_id"]), str(d["kind"]),
                    str(d["data"]), float(d["posted_at"]), str(d.get("poster", "")))

    def drop(self, mail_id: str, session_id: str = "") -> None:
        tail = f"-{_safe(mail_id)}."
        for n in self._names():
            if tail in n:
                try:
                    os.unlink(self._dir / n)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise self._fail("drop a mail", exc) from exc

    def prune(self, before: float) -> int:
        count = 0
        for n in self._names():
            if not n.endswith((".mail", ".taken")):
                continue
            m = self._read(self._dir / n, 0)
            if m is not None and m.posted_at >= before:
                continue
            try:
                os.unlink(self._dir / n)
            except FileNotFoundError:
                continue  # taken (renamed) or dropped meanwhile: another look next time
            except OSError as exc:
                raise self._fail("prune the mailbox", exc) from exc
            count += 1
        return count

    def version(self) -> int:
        return hash(frozenset(n for n in self._names() if n.endswith(".mail")))
