"""The skeleton every backend connection shares: the lock, the closed flag, the fork guard,
where the store is (for messages), and ONE table translating the driver's errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ...errors import StoreClosedError, StoreCorruptError, StoreError

__all__ = ["Backend", "Translation", "text_of"]


def text_of(value: object) -> str:
    """A stored value as str; UnicodeDecodeError (a ValueError) for bad bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@attrs.frozen(slots=True)
class Translation:
    """One row of a backend's error table: a driver error ``matches`` (an exception class,
    or a predicate) becomes ``error``; ``note`` is added in parentheses after the driver's
    text, or replaces that text when ``hide_detail`` (it may quote a stored value)."""

    matches: type[BaseException] | tuple[type[BaseException], ...] | Callable[
        [BaseException], bool]
    error: type[StoreError]
    note: str = ""
    hide_detail: bool = False

    def applies(self, exc: BaseException) -> bool:
        """Whether this row is the one for ``exc``."""
        if isinstance(self.matches, type | tuple):
            return isinstance(exc, self.matches)
        return self.matches(exc)


class Backend:
    """A backend's connection state. Thread-safe: ``lock`` guards ``closed`` (and what a
    subclass adds). A subclass sets ``kind`` ("SQLite"), ``store_class``, ``where`` ("in
    the SQLite store at …"), ``path`` or ``address``, ``secret`` (scrubbed from driver
    texts) and ``table``; it opens its connections in ``reopen`` and closes them in
    ``shut``."""

    kind = ""
    store_class = ""
    table: Sequence[Translation] = ()

    def __init__(self, where: str, *, path: str | None = None, address: str | None = None,
                 secret: str | None = None) -> None:
        self.where = where
        self.path = path
        self.address = address
        self.secret = secret
        self.lock = threading.Lock()
        self.closed = False
        self.pid = os.getpid()

    # --- the skeleton -------------------------------------------------------------------
    def place(self, session_id: str | None = None) -> dict[str, Any]:
        """The keywords every error of this store carries."""
        return {"path": self.path, "address": self.address, "session_id": session_id}

    def check_open(self, session_id: str | None) -> None:
        """StoreClosedError once closed; after a fork, ``reopen`` (call holding ``lock``)."""
        if self.closed:
            raise StoreClosedError(
                f"the {self.kind} store at {self.path or self.address}"
                f"{self.closed_detail} is closed: open a new {self.store_class}",
                **self.place(session_id),
            )
        if self.pid != os.getpid():  # forked: never share the parent's connections
            self.pid = os.getpid()
            self.reopen()

    closed_detail = ""
    """Text after the address in the closed message (PostgreSQL names its schema)."""

    def reopen(self) -> None:
        """Drop the connections inherited over a fork (called holding ``lock``)."""

    def shut(self) -> None:
        """Close the connections (called once, not holding ``lock``; a connection inherited
        over a fork is the parent's: leave it)."""

    def close(self) -> None:
        """Close (idempotent)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.shut()

    # --- errors -------------------------------------------------------------------------
    def detail(self, exc: BaseException | str) -> str:
        """The driver's text of ``exc``, with the secret scrubbed."""
        text = str(exc)
        return text.replace(self.secret, "***") if self.secret else text

    def translate(self, exc: BaseException, what: str, session_id: str | None = None
                  ) -> StoreError:
        """The lousho error for a driver error, from the first row of ``table`` that
        applies (a plain StoreError when none does)."""
        for row in self.table:
            if row.applies(exc):
                if row.hide_detail:
                    return row.error(f"could not {what} {self.where}: {row.note}",
                                     **self.place(session_id))
                text = f"could not {what} {self.where}: {self.detail(exc)}"
                note = f" ({row.note})" if row.note else ""
                return row.error(text + note, **self.place(session_id))
        return StoreError(f"could not {what} {self.where}: {self.detail(exc)}",
                          **self.place(session_id))

    def unreadable(self, what: str, exc: BaseException | str, session_id: str | None = None
                   ) -> StoreCorruptError:
        """A StoreCorruptError for a stored ``what`` that cannot be read (raise it
        unchained: a codec error's cause holds the stored text)."""
        return StoreCorruptError(
            f"{what} {self.where} cannot be read (it was left as it was): {exc}",
            **self.place(session_id),
        )
