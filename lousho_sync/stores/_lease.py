"""Helpers shared by the stores that offer a per-session lease.

An owner is ``"<host>:<pid>:<uuid>"``. A lease held by an owner on this host whose pid is no
longer alive may be taken over at once; any other lease only once it expires.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable

__all__ = ["HOST", "make_owner", "owner_is_dead", "poll_until"]

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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


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
