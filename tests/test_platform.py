"""The lease liveness probe and the platform guards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from lousho_sync.stores import _lease

CHILD = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"


def _owner(pid: int) -> str:
    return f"{_lease.HOST}:{pid}:abc"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_probe_sees_a_live_owner_then_a_killed_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert _lease.owner_is_dead(_owner(child.pid)) is False
        assert child.poll() is None  # the probe delivered nothing
        os.kill(child.pid, signal.SIGKILL)
        if sys.platform.startswith("linux"):
            # Killed but not yet reaped: a zombie, which counts as dead.
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
            assert _lease._is_zombie(child.pid)
            assert _lease.owner_is_dead(_owner(child.pid)) is True
        child.wait(timeout=30)
        assert _lease.owner_is_dead(_owner(child.pid)) is True
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


def test_probe_never_calls_our_own_process_dead() -> None:
    assert _lease.owner_is_dead(_owner(os.getpid())) is False
    assert _lease.owner_is_dead(f"other-host:{os.getpid() + 1}:x") is False
    assert _lease.owner_is_dead(f"{_lease.HOST}:notapid:x") is False
    assert _lease.owner_is_dead(f"{_lease.HOST}:{2**70}:x") is True


def test_the_probe_on_this_platform() -> None:
    expected = "_windows_pid_alive" if sys.platform == "win32" else "_posix_pid_alive"
    assert _lease._pid_alive.__name__ == expected
