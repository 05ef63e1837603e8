"""Helpers shared by the stores that offer a per-session lease.

An owner is ``"<host>:<pid>:<uuid>"``. A lease held by an owner on this host whose pid is no
longer alive may be taken over at once; any other lease only once it expires.

The liveness probe sends no signal: on POSIX (Linux, macOS) ``os.kill(pid, 0)`` only checks
that the process exists (a Linux zombie counts as dead); on Windows, where ``os.kill`` would
deliver Ctrl-C, the process is opened with ``OpenProcess`` and its exit code read.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable

__all__ = ["HOST", "make_owner", "owner_is_dead", "poll_until"]

_log = logging.getLogger(__name__)

HOST = socket.gethostname().replace(":", "_")


def make_owner() -> str:
    """A fresh owner string for this process."""
    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex}"


def owner_is_dead(owner: str) -> bool:
    """True when ``owner`` ran on this host and its process no longer exists."""
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    if _pid_alive(pid):
        return False
    _log.debug("lease owner %s is dead (pid %d is gone): its lease may be taken over", owner,
               pid)
    return True


def _posix_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: an existence check, nothing is delivered
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by another user
    except OverflowError:
        return False
    return not _is_zombie(pid)


def _windows_pid_alive(pid: int) -> bool:  # pragma: no cover - Windows only
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined, unused-ignore]
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    kernel32.GetExitCodeProcess.argtypes = (wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD))
    kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
    process_query_limited_information = 0x1000
    still_active = 259
    error_access_denied = 5
    handle = kernel32.OpenProcess(process_query_limited_information, False, pid)
    if not handle:
        # No such process (ERROR_INVALID_PARAMETER), or one we may not open: it exists.
        return bool(ctypes.get_last_error() == error_access_denied)  # type: ignore[attr-defined, unused-ignore]
    try:
        code = wintypes.DWORD()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True  # cannot tell: treat as alive (the lease then expires normally)
        return code.value == still_active
    finally:
        kernel32.CloseHandle(handle)


_pid_alive = _windows_pid_alive if sys.platform == "win32" else _posix_pid_alive


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0] == b"Z"
    except (OSError, IndexError):
        return False


def poll_until(attempt: Callable[[], bool], wait_s: float) -> bool:
    """Call ``attempt`` until it returns True or ``wait_s`` seconds pass (short backoff)."""
    deadline = time.monotonic() + max(wait_s, 0.0)
    delay = 0.001
    while True:
        if attempt():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)
