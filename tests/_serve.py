"""``lousho serve`` in a child process for tests: a real HTTP server on 127.0.0.1 (a free
port), a real SQLite file, the app of ``approval_app.py``; and pausing turns in other
processes."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
WAIT = 60.0
TOKEN = "test-token-0123456789abcdef"
APP = "approval_app:make_agent"


def read_line(proc: subprocess.Popen[str], timeout: float = WAIT) -> str:
    """The child's next stdout line, stripped; fails when it says nothing in time.

    A thread per process reads its stdout into a queue: ``select`` on the pipe would miss a
    second line already read into the file object's buffer with the first."""
    assert proc.stdout is not None
    with _readers_lock:
        lines = _readers.get(proc.pid)
        if lines is None:
            lines = _readers[proc.pid] = queue.Queue()
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError("the child process said nothing in time") from None
    assert line is not None, "the child process closed its output"
    return line.strip()


_readers: dict[int, queue.Queue[str | None]] = {}
_readers_lock = threading.Lock()


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOUSHO_APP", "APPROVAL_APP_ARGS", "LOUSHO_SERVE_TOKEN")}
    env.update(extra)
    return env


def pause(db: Path, session_id: str, text: str = "pay bob", metadata: str = "",
          **extra: str) -> str:
    """A turn of ``session_id`` paused on approval by another process; the approval id."""
    done = subprocess.run(
        [sys.executable, "approval_app.py", str(db), session_id, text, metadata],
        capture_output=True, text=True, timeout=WAIT, cwd=TESTS, env=child_env(**extra))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Served:
    """``lousho serve --store DB [--app APP] --port 0`` with the token from the environment;
    ``url`` is where it listens (ends with "/"). A context manager: stopped (SIGTERM) at the
    end."""

    def __init__(self, db: Path, *, app: str | None = APP, token: str = TOKEN) -> None:
        argv = [sys.executable, "-m", "lousho_sync", "serve", "--store", str(db), "--port", "0"]
        if app is not None:
            argv += ["--app", app]
        self.token = token
        self.proc = subprocess.Popen(argv, cwd=TESTS, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=child_env(LOUSHO_SERVE_TOKEN=token))
        first = read_line(self.proc)
        assert first.startswith("lousho serve: listening on http://127.0.0.1:"), (
            first + (self.proc.stderr.read() if self.proc.stderr else ""))
        self.url = first.rsplit(" ", 1)[1]

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> str:
        """Stop the server; its stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err
