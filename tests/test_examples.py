"""The examples in examples/ run offline and print what the README says they do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, tmp_path: Path) -> str:
    env = {**os.environ, "LOUSHO_DB": str(tmp_path / "agent.db")}
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_quickstart(tmp_path: Path) -> None:
    out = run("quickstart.py", tmp_path).splitlines()
    assert out[1] == "You have said 2 thing(s); the first was 'My name is Ali.'."
    assert "[calling get_weather]" in out and out[-1] == "8 messages in the transcript"


def test_flask_app(tmp_path: Path) -> None:
    out = run("flask_app.py", tmp_path).splitlines()
    assert out == ["Message 1 received: Hello (2 messages stored)",
                   "Message 2 received: How are you? (4 messages stored)"]
    # the sessions are durable: a second run continues the same conversation
    assert run("flask_app.py", tmp_path).splitlines()[0].startswith("Message 3 received")


def test_django_view(tmp_path: Path) -> None:
    pytest.importorskip("django")
    out = run("django_view.py", tmp_path).splitlines()
    assert out == ["1 message(s) so far; latest: Hi there",
                   "2 message(s) so far; latest: Still here"]


def test_approvals(tmp_path: Path) -> None:
    out = run("approvals.py", tmp_path).splitlines()
    assert out[0].startswith("awaiting-approval: approval ")
    assert out[1:] == ["pending: transfer({'amount': 250.0, 'to': 'Bob'})",
                       "Result: sent 250.00 to Bob", "4 messages stored"]


def test_asyncio_app(tmp_path: Path) -> None:
    out = run("asyncio_app.py", tmp_path).splitlines()
    assert out == ["turn 1: you said 'hello'"] * 3 + ["turn 2: you said 'again'"]
