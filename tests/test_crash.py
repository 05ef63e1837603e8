"""Crash tests: a real child process is SIGKILLed mid-turn; this process resumes it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _stress import CRASH_RANDOM_ROUNDS
from conftest import STORE_KINDS
from crash_child import FINAL_CHUNKS, SESSION, make_agent

HERE = Path(__file__).resolve().parent
# "redis" runs on the shared server, or is skipped with the reason; "encrypted-sqlite" is an
# EncryptedStore over SQLite (the children get its key through the environment)
KINDS = [*STORE_KINDS, "encrypted-sqlite"]

EXPECTED = [
    ("user", "go", ()),
    ("assistant", "", ("work-1",)),
    ("tool", "did 1", ()),
    ("assistant", "", ("work-2",)),
    ("tool", "did 2", ()),
    ("assistant", "".join(FINAL_CHUNKS), ()),
]


def _spawn(kind: str, root: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "crash_child.py"), kind, str(root), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    lines = []
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child ended before {marker!r}: {lines} {err}")
        lines.append(line.strip())
        if line.strip().startswith(marker):
            return lines


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _shape(messages: object) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(m.role, m.text, tuple(c.id for c in m.tool_calls)) for m in messages]  # type: ignore[attr-defined]


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _tool_log(root: Path) -> list[str]:
    p = root / "tools.log"
    return p.read_text().splitlines() if p.exists() else []


def _assert_no_orphans(messages: object) -> None:
    calls = [c.id for m in messages for c in m.tool_calls]  # type: ignore[attr-defined]
    results = [m.tool_call_id for m in messages if m.role == "tool"]  # type: ignore[attr-defined]
    assert sorted(calls) == sorted(results)


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_kill_during_a_tool_call_then_resume(kind: str, tmp_path: Path) -> None:
    proc = _spawn(kind, tmp_path, "tool")
    _read_until(proc, "BLOCKED")
    _kill(proc)
    session = make_agent(kind, tmp_path).session(id=SESSION)
    assert session.pending() is not None and session.pending().status == "interrupted"  # type: ignore[union-attr]
    result = session.resume()
    assert result is not None and result.text == "finished"
    assert _shape(session.messages) == EXPECTED
    # the tool that was running ran again (at least once) with the same call id
    assert _tool_log(tmp_path) == ["start work-1", "start work-1", "end work-1",
                                   "start work-2", "end work-2"]
    # the recorded model response (step 1) was not requested again
    assert _lines(tmp_path / "provider.log") == ["1", "2", "3"]


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_kill_after_a_tool_result_was_checkpointed_then_resume(kind: str, tmp_path: Path) -> None:
    proc = _spawn(kind, tmp_path, "after-result")
    _read_until(proc, "BLOCKED")
    _kill(proc)
    result = make_agent(kind, tmp_path).resume(SESSION)
    assert result is not None and result.text == "finished"
    session = make_agent(kind, tmp_path).session(id=SESSION)
    assert _shape(session.messages) == EXPECTED
    assert _tool_log(tmp_path) == ["start work-1", "end work-1", "start work-2", "end work-2"]
    assert _lines(tmp_path / "provider.log") == ["1", "2", "2", "3"]
    assert session.pending() is None


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_kill_while_the_model_streams_then_resume(kind: str, tmp_path: Path) -> None:
    proc = _spawn(kind, tmp_path, "stream")
    _read_until(proc, "BLOCKED")
    _kill(proc)
    session = make_agent(kind, tmp_path).session(id=SESSION)
    result = session.resume()
    assert result is not None and result.text == "finished"
    assert _shape(session.messages) == EXPECTED
    assert _tool_log(tmp_path) == ["start work-1", "end work-1", "start work-2", "end work-2"]
    assert _lines(tmp_path / "provider.log") == ["1", "2", "3", "3"]


EVENTS_PER_TURN = 14  # run.start … run.done for the scripted turn


@pytest.mark.stress
# a child per round (on PostgreSQL about 7 s each on 2 cores)
@pytest.mark.timeout(120 + 10 * (EVENTS_PER_TURN + CRASH_RANDOM_ROUNDS))
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_kill_at_random_points(kind: str, tmp_path: Path) -> None:
    """The child stops after each event until told to go on, so a kill after event k is
    the same point every time: every point once, then (``LOUSHO_STRESS=ci`` or ``long``,
    ``tests/_stress.py``) as many rounds at points drawn from ``LOUSHO_CRASH_SEED``."""
    seed = int(os.environ.get("LOUSHO_CRASH_SEED", "20261202"))
    rng = random.Random(seed)
    points = [*range(1, EVENTS_PER_TURN + 1),
              *(rng.randrange(1, EVENTS_PER_TURN + 1) for _ in range(CRASH_RANDOM_ROUNDS))]
    for i, kill_after in enumerate(points):
        root = tmp_path / f"r{i}"
        root.mkdir()
        print(f"seed={seed} round={i} kill after event {kill_after}")
        proc = _spawn(kind, root, "step")
        assert proc.stdin is not None
        seen = _read_until(proc, "EVENT")
        for _ in range(kill_after - 1):
            proc.stdin.write("\n")
            proc.stdin.flush()
            seen += _read_until(proc, "EVENT")
        _kill(proc)
        agent = make_agent(kind, root)
        try:  # one store a round, closed with it (39 unclosed PostgreSQL pools fill the server)
            agent.resume(SESSION)
            session = agent.session(id=SESSION)
            messages = session.messages
            pending = session.pending()
        finally:
            close = getattr(agent.store, "close", None)
            if close is not None:
                close()
        assert pending is None
        context = f"seed={seed} round={i} kill_after={kill_after} events={seen}"
        assert _shape(messages) == EXPECTED, context
        _assert_no_orphans(messages)
        log = _tool_log(root)
        for n in (1, 2):
            assert log.count(f"end work-{n}") <= 2, context
            assert log.count(f"start work-{n}") >= 1, context
        steps = _lines(root / "provider.log")
        for step in "123":
            assert 1 <= steps.count(step) <= 2, context
