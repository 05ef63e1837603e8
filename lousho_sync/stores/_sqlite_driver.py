"""Which SQLite library SqliteStore uses, and the WAL-reset bug guard.

The WAL-reset bug (SQLite 3.7.0 to 3.51.2; fixed in 3.51.3, backported to 3.44.6 and
3.50.7) is a data race between a checkpoint and another connection's commit that restarts
the WAL: the checkpoint misses the restart, records a wrong backfill count, and a later
checkpoint skips frames of a committed transaction, which corrupts the database. It needs
WAL mode and several connections that write and checkpoint: SqliteStore's multi-process use.

Two remedies, chosen per process:

- A fixed library, when asked. With the ``sqlite`` extra (``pip install 'lousho[sqlite]'``)
  the ``pysqlite3`` wheel brings its own, current SQLite; ``LOUSHO_SQLITE_DRIVER=pysqlite3``
  uses it. The default (``auto`` or ``sqlite3``) is the standard ``sqlite3`` module: two
  SQLite libraries in one process that open the same file break each other's POSIX locks
  (closing a file in one releases the other's locks), and a plain ``sqlite3.connect`` of the
  file anywhere in the process (an admin view, a health check) then loses acknowledged
  commits. So one process uses one library for every store (:func:`pin_driver`), and a
  store on ``pysqlite3`` refuses a file that the process already holds open otherwise.
- A checkpoint discipline that cannot race, used when the library in use is affected:
  every connection runs with ``wal_autocheckpoint = 0``, and the store checkpoints itself
  (``PASSIVE``) once the WAL passes :data:`CHECKPOINT_WAL_BYTES`, from a second connection
  while holding SQLite's own write lock (``BEGIN IMMEDIATE``), which every writer takes.
  No commit, hence no WAL restart, can run during a checkpoint. The checkpoint SQLite runs
  when the last connection closes holds an exclusive lock on the file, so it cannot race
  either. Being guarded, this is logged at INFO, not warned about. Programs other than
  lousho that write the same file are not covered: when the process already holds the file
  open through a connection of its own, a store warns (StoreDurabilityWarning).
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
    "check_not_open_elsewhere",
    "choose_driver",
    "pin_driver",
    "warn_unguarded_connection",
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
    environment variable, else ``auto``). ``auto`` and ``sqlite3`` take the standard
    module; ``pysqlite3`` the ``sqlite`` extra's (one library per process: see the module's
    notes)."""
    choice = (setting if setting is not None else os.environ.get(DRIVER_ENV, "auto")) or "auto"
    if choice not in ("auto", "sqlite3", "pysqlite3"):
        raise ConfigError(
            f"{DRIVER_ENV} must be 'auto', 'sqlite3' or 'pysqlite3', got {choice!r}"
        )
    if choice == "sqlite3":
        return stdlib
    if choice != "pysqlite3":
        return stdlib
    alternative = load_alternative()
    if alternative is None:
        raise ConfigError(
            f"{DRIVER_ENV}=pysqlite3 but pysqlite3 is not installed: "
            "pip install 'lousho[sqlite]'"
        )
    return alternative


_pinned: ModuleType | None = None
_pinned_pid = 0
_pin_lock = threading.Lock()


def pin_driver(path: str) -> ModuleType:
    """The library every SqliteStore of this process uses: :func:`choose_driver` the first
    time, the same module afterwards. A later different choice (``LOUSHO_SQLITE_DRIVER``
    changed while stores are in use) is a ConfigError naming both."""
    global _pinned, _pinned_pid
    chosen = choose_driver()
    with _pin_lock:
        if _pinned is None or _pinned_pid != os.getpid():
            _pinned, _pinned_pid = chosen, os.getpid()
        elif chosen is not _pinned:
            raise ConfigError(
                f"cannot open {path} through {chosen.__name__}: this process already uses "
                f"{_pinned.__name__} for SQLite stores, and two SQLite libraries in one "
                "process break each other's file locks (acknowledged commits are lost); "
                f"set {DRIVER_ENV} once, before the first store opens"
            )
        return _pinned


def _open_in_process(paths: tuple[str, ...]) -> bool:
    """Whether this process holds one of ``paths`` open (Linux's /proc; False elsewhere)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target in paths:
            return True
    return False


def check_not_open_elsewhere(driver: ModuleType, path: str) -> None:
    """Refuse ``path`` when ``driver`` is not the standard module and this process already
    holds the file (or its WAL) open while no SqliteStore of this process has it open:
    then another SQLite library (most likely the standard ``sqlite3`` module) has it, and
    the two would break each other's locks. Called before a store's first connection."""
    if driver is sqlite3:
        return
    real = os.path.realpath(path)
    if _open_in_process((real, real + "-wal", real + "-shm")):
        raise ConfigError(
            f"{path} is already open in this process through another SQLite library (most "
            f"likely the standard sqlite3 module), and this store uses {driver.__name__}: "
            "two SQLite libraries on one file in one process break each other's locks and "
            f"lose acknowledged commits. Close the other connection, or set {DRIVER_ENV}="
            "sqlite3 so that the store uses the standard module too"
        )


def warn_wal_reset_once(driver: ModuleType, path: str) -> None:
    """Say (once per process) that ``driver`` links a SQLite with the WAL-reset bug and that
    the checkpoint discipline guards against it: an INFO log record, nothing more, since
    the store's own connections are covered (see :func:`warn_unguarded_connection` for the
    case it cannot cover)."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    _log.info(
        "SQLite %s (used by %s, opened for %s) has the WAL-reset bug (fixed in SQLite "
        "3.51.3, 3.50.7 and 3.44.6); SqliteStore guards its own connections by "
        "checkpointing only while holding the write lock. Programs other than lousho that "
        "write the same file are not covered; a fixed SQLite: pip install 'lousho[sqlite]' "
        "and %s=pysqlite3", driver.sqlite_version, driver.__name__, path, DRIVER_ENV)


def warn_unguarded_connection(driver: ModuleType, path: str) -> None:
    """Warn (StoreDurabilityWarning) when ``driver`` links an affected SQLite and this
    process already holds ``path`` open through a connection that is not a SqliteStore's
    (the caller checks that none is): that connection's automatic checkpoints can race a
    store's commits, which the store cannot prevent. Linux only (``/proc``)."""
    if not wal_reset_affected(driver.sqlite_version_info):
        return
    real = os.path.realpath(path)
    if not _open_in_process((real, real + "-wal", real + "-shm")):
        return
    text = (
        f"{path} is already open in this process through a connection lousho did not make, "
        f"and SQLite {driver.sqlite_version} has the WAL-reset bug: that connection's "
        "automatic checkpoints can race the store's commits and corrupt the file, which "
        "SqliteStore cannot prevent. Write the file only through SqliteStore, or run "
        "PRAGMA wal_autocheckpoint=0 on that connection, or use a fixed SQLite (pip install "
        f"'lousho[sqlite]' and {DRIVER_ENV}=pysqlite3)."
    )
    _log.warning("%s", text)
    warnings.warn(text, StoreDurabilityWarning, stacklevel=5)


def reset_warning_for_tests() -> None:
    """Forget that the warning was issued (tests only)."""
    global _warned
    with _warn_lock:
        _warned = False
