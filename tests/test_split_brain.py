"""A lease holder stopped (SIGSTOP) inside a tool past its lease TTL: another process takes
the lease over and finishes the turn; when the stopped one continues, its next write is
refused (LeaseLostError) — the turn is stored once, never twice (fencing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import read_line
from stop_child import SESSION, make_agent

HERE = Path(__file__).resolve().parent
TTL_S = 1.0  # short, so the takeover waits about a second (no test waits for a 30 s TTL)


@pytest.mark.parametrize("tool", ["plain", "pay"])
@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_a_stopped_holder_past_its_lease_cannot_commit_after_the_new_owner(
    kind: str, tool: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "redis":
        location = f"{request.getfixturevalue('redis_url')}|lousho-split:{uuid.uuid4().hex[:12]}:"
    elif kind == "postgres":
        location = (f"{request.getfixturevalue('postgres_url')}|"
                    f"{request.getfixturevalue('postgres_schema')}")
    else:
        location = str(tmp_path)
    child = subprocess.Popen(
        [sys.executable, str(HERE / "stop_child.py"), kind, location, tool, str(TTL_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert read_line(child) == "IN_TOOL"
        os.kill(child.pid, signal.SIGSTOP)
        ran_here: list[str] = []
        agent = make_agent(kind, location, block=False, log=ran_here)
        # waits for the stopped holder's lease to expire, then finishes the turn here
        result = agent.session(id=SESSION, lease_ttl_s=TTL_S).resume()
        assert result is not None and result.text == "finished"
        os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert read_line(child) == "ERROR LOUSHO_LEASE_LOST"
        assert child.wait(30) == 0
        messages = agent.session(id=SESSION).load()
        calls = [c.id for m in messages for c in m.tool_calls]
        results = [m for m in messages if m.role == "tool"]
        assert calls == [f"{tool}-1"] and len(results) == 1
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        if tool == "pay":  # in doubt: reported, never run again
            assert ran_here == [] and results[0].is_error
            assert "may or may not have taken effect" in str(results[0].content)
        else:  # at least once: run again here, with the same call id
            assert ran_here == ["plain-1"] and results[0].content == "did plain-1 in parent"
        assert agent.session(id=SESSION).pending() is None
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(30)
