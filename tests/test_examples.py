"""The examples in examples/ run offline, print what the README says they do, and print the
same again on a second run (each writes to a temporary directory of its own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lousho_sync import session_id_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, tmp_path: Path) -> str:
    """The example's output; run twice, it must print the same and leave nothing behind in
    the working directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOUSHO_DB", "LOUSHO_MODEL")}
    outputs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    # the same, but for the approval id (new on each run)
    same = [re.sub(r"approval \S+", "approval <id>", out) for out in outputs]
    assert same[0] == same[1]
    assert list(tmp_path.iterdir()) == []
    return outputs[0]


def test_quickstart(tmp_path: Path) -> None:
    out = run("quickstart.py", tmp_path).splitlines()
    assert out[1] == "You have said 2 thing(s); the first was 'My name is Ali.'."
    assert "[calling get_weather]" in out and out[-1] == "8 messages in the transcript"


def test_flask_app(tmp_path: Path) -> None:
    out = run("flask_app.py", tmp_path).splitlines()
    assert out == ["Message 1 received: Hello", "Message 2 received: How are you?",
                   f"4 messages in session {session_id_for('ali@example.com')}"]


def test_django_view(tmp_path: Path) -> None:
    pytest.importorskip("django")
    out = run("django_view.py", tmp_path).splitlines()
    assert out == ["1 message(s) so far; latest: Hi there",
                   "2 message(s) so far; latest: Still here",
                   f"4 messages in session {session_id_for('tenant:7/ali')}"]


def test_approvals(tmp_path: Path) -> None:
    out = run("approvals.py", tmp_path).splitlines()
    assert out[0].startswith("awaiting-approval: approval ")
    assert out[1:] == ["pending: transfer({'amount': 250.0, 'to': 'Bob'})",
                       "Result: sent 250.00 to Bob", "4 messages stored"]


def test_asyncio_app(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    out = run("asyncio_app.py", tmp_path).splitlines()
    assert out == ["turn 1: you said 'hello'"] * 3 + [
        "turn 2: you said 'again'", f"4 messages in session {session_id_for('user0')}"]
