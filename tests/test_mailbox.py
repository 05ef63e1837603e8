"""The session mailbox (SPEC §17): ``"queue"``, ``"rollback"`` and ``abort_turn()`` from a
process that does not own the running turn, with real processes sharing one store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import read_line
from crash_child import make_store

from lousho_sync import ScriptedProvider, create_agent

HERE = Path(__file__).resolve().parent
MAILBOX_KINDS = ["sqlite", "files", "redis", "postgres", "encrypted-sqlite"]  # with a mailbox


def _spawn(role: str, kind: str, root: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, str(HERE / "mail_child.py"), role, kind, str(root)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert read_line(p) == "ready", p.stderr.read() if p.stderr else ""
    return p


def _go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


def _result(p: subprocess.Popen[str]) -> Any:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _owner_in_tool(kind: str, root: Path, role: str = "owner") -> subprocess.Popen[str]:
    owner = _spawn(role, kind, root)
    _go(owner)
    assert read_line(owner) == "IN_TOOL"
    return owner


def _messages(kind: str, root: Path) -> list[tuple[str, str]]:
    s = create_agent(provider=ScriptedProvider(default="x"),
                     store=make_store(kind, root)).session(id="mailbox")
    return [(m.role, m.text) for m in s.messages]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_queue_from_another_process_joins_the_running_turn(kind: str, tmp_path: Path) -> None:
    procs = [_owner_in_tool(kind, tmp_path)]
    try:
        procs.append(_spawn("queue", kind, tmp_path))
        _go(procs[1])
        a, b = _result(procs[0]), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["text"] == "saw: A,B" and a["joined"] is False
    assert b["joined"] is True and b["run_id"] == a["run_id"] and b["text"] == a["text"]
    assert b["messages"] == a["messages"]
    # one turn: B's message after the step's tool result, then the answer that saw it
    assert _messages(kind, tmp_path) == [("user", "A"), ("assistant", ""), ("tool", "held"),
                                         ("user", "B"), ("assistant", "saw: A,B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_rollback_from_another_process_drops_the_turn_and_runs_next(
    kind: str, tmp_path: Path
) -> None:
    procs = [_owner_in_tool(kind, tmp_path)]
    try:
        procs.append(_spawn("rollback", kind, tmp_path))
        _go(procs[1])
        a, b = _result(procs[0]), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["finish"] == "aborted" and b["text"] == "saw: B" and b["joined"] is False
    assert _messages(kind, tmp_path) == [("user", "B"), ("assistant", "saw: B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_abort_turn_from_another_process_stops_the_turn(kind: str, tmp_path: Path) -> None:
    procs = [_owner_in_tool(kind, tmp_path)]
    try:
        procs.append(_spawn("abort", kind, tmp_path))
        _go(procs[1])
        a, b = _result(procs[0]), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert b == {"asked": True} and a["finish"] == "aborted"
    assert _messages(kind, tmp_path) == []
    token = make_store(kind, tmp_path).sessions.fence_token("mailbox")
    idle = _spawn("abort", kind, tmp_path)  # no turn runs now: nothing to abort
    _go(idle)
    assert _result(idle) == {"asked": False}
    # asking took no lease: the fence token of the session is the one A's turn had
    assert make_store(kind, tmp_path).sessions.fence_token("mailbox") == token


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_abort_on_a_run_attached_in_another_process_stops_the_turn(
    kind: str, tmp_path: Path
) -> None:
    procs = [_owner_in_tool(kind, tmp_path, "startowner")]
    try:
        procs.append(_spawn("attachabort", kind, tmp_path))
        _go(procs[1])
        a, b = _result(procs[0]), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["finish"] == "aborted" and b == {"finish": "aborted"}
    assert _messages(kind, tmp_path) == []


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_steer_from_another_process_makes_a_silent_model_call_again(
    kind: str, tmp_path: Path
) -> None:
    owner = _spawn("steerowner", kind, tmp_path)
    procs = [owner]
    try:
        _go(owner)
        assert read_line(owner) == "IN_CALL"  # A's model call has emitted nothing yet
        procs.append(_spawn("steer", kind, tmp_path))
        _go(procs[1])
        a, b = _result(owner), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["text"] == "saw: A,B" and b["joined"] is True and b["run_id"] == a["run_id"]
    assert _messages(kind, tmp_path) == [("user", "A"), ("user", "B"),
                                         ("assistant", "saw: A,B")]
