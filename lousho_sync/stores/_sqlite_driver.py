"""Which SQLite library SqliteStore uses, and the WAL-reset bug guard.

The WAL-reset bug (SQLite 3.7.0 to 3.51.2; fixed in 3.51.3, backported to 3.44.6 and
3.50.7) is a data race between a checkpoint and another connection's commit that restarts
the WAL: the checkpoint misses the restart, records a wrong backfill count, and a later
checkpoint skips frames of a committed transaction, which corrupts the database. It needs
WAL mode and several connections that write and checkpoint: SqliteStore's multi-process use.

Two remedies, chosen per process:

- A fixed library. With the ``sqlite`` extra (``pip install 'lousho[sqlite]'``) the
  ``pysqlite3`` wheel brings its own, current SQLite; it is used automatically when the
  standard ``sqlite3`` module links an affected library and ``pysqlite3`` does not.
  ``LOUSHO_SQLITE_DRIVER`` (``auto``, ``sqlite3`` or ``pysqlite3``) overrides the choice.
- A checkpoint discipline that cannot race, used when the library in use is affected:
  every connection runs with ``wal_autocheckpoint = 0``, and the store checkpoints itself
  (``PASSIVE``) once the WAL passes :data:`CHECKPOINT_WAL_BYTES`, from a second connection
  while holding SQLite's own write lock (``BEGIN IMMEDIATE``), which every writer takes.
  No commit, hence no WAL restart, can run during a checkpoint. The checkpoint SQLite runs
  when the last connection closes holds an exclusive lock on the file, so it cannot race
  either. Programs other than lousho that write the same file are not covered.
"""

from __future__ import annotations

import importlib
import logging
import os
import sqlite3
import threading
import warnings
from collections.abc import Callable
from types import ModuleType

from ..errors import ConfigError, StoreDurabilityWarning

__all__ = [
    "CHECKPOINT_WAL_BYTES",
    "DRIVER_ENV",
    "choose_driver",
    "warn_wal_reset_once",
    "wal_reset_affected",
]

_log = logging.getLogger(__name__)

DRIVER_ENV = "LOUSHO_SQLITE_DRIVER"
CHECKPOINT_WAL_BYTES = 4 * 1024 * 1024
"""The WAL size past which a store under the discipline checkpoints (SQLite's default
automatic checkpoint is at 1,000 pages, about 4 MiB)."""

_FIXED_IN = (3, 51, 3)
_BACKPORTS = ((3, 44, 6), (3, 50, 7))
_warned = False
_warn_lock = threading.Lock()


def wal_reset_affected(version: tuple[int, ...]) -> bool:
    """Whether SQLite ``version`` (e.g. ``sqlite3.sqlite_version_info``) has the WAL-reset
    bug: 3.7.0 up to 3.51.2, except 3.44.6+ in the 3.44 line and 3.50.7+ in the 3.50 line."""
    v = tuple(version[:3]) + (0,) * (3 - len(version[:3]))
    if v < (3, 7, 0) or v >= _FIXED_IN:
        return False
    return not any(v[:2] == fix[:2] and v >= fix for fix in _BACKPORTS)


def _load_pysqlite3() -> ModuleType | None:
    try:
        return importlib.import_module("pysqlite3.dbapi2")
    except ImportError:
        return None


def choose_driver(
    setting: str | None = None,
    *,
    stdlib: ModuleType = sqlite3,
    load_alternative: Callable[[], ModuleType | None] = _load_pysqlite3,
) -> ModuleType:
    """The DB-API module to use: ``setting`` (default: the ``LOUSHO_SQLITE_DRIVER``
    environment variable, else ``auto``). ``auto`` takes ``pysqlite3`` only when it is
    installed, unaffected by the WAL-reset bug, and the standard module is affected."""
    choice = (setting if setting is not None else os.environ.get(DRIVER_ENV, "auto")) or "auto"
    if choice not in ("auto", "sqlite3", "pysqlite3"):
        raise ConfigError(
            f"{DRIVER_ENV} must be 'auto', 'sqlite3' or 'pysqlite3', got {choice!r}"
        )
    if choice == "sqlite3":
        return stdlib
    alternative = load_alternative()
    if choice == "pysqlite3":
        if alternative is None:
            raise ConfigError(
                f"{DRIVER_ENV}=pysqlite3 but pysqlite3 is not installed: "
                "pip install 'lousho[sqlite]'"
            )
        return alternative
    if (
        alternative is not None
        and wal_reset_affected(stdlib.sqlite_version_info)
        and not wal_reset_affected(alternative.sqlite_version_info)
    ):
        return alternative
    return stdlib


def warn_wal_reset_once(driver: ModuleType, path: str) -> None:
    """Warn (once per process) that ``driver`` links a SQLite with the WAL-reset bug and
    that the checkpoint discipline is on."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    text = (
        f"SQLite {driver.sqlite_version} (used by {driver.__name__}, opened for {path}) has "
        "the WAL-reset bug, which can corrupt a WAL database shared by several connections "
        "(fixed in SQLite 3.51.3, 3.50.7 and 3.44.6). SqliteStore works around it by "
        "checkpointing only while holding the write lock; programs other than lousho that "
        "write the same file are not covered. Install a fixed SQLite with "
        "pip install 'lousho[sqlite]'."
    )
    _log.warning("%s", text)
    warnings.warn(text, StoreDurabilityWarning, stacklevel=4)


def reset_warning_for_tests() -> None:
    """Forget that the warning was issued (tests only)."""
    global _warned
    with _warn_lock:
        _warned = False
