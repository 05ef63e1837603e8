"""Several real processes sharing one store: turns, leases, policies and approvals."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from crash_child import make_store
from test_crash import KINDS

from lousho_sync import ModelRequest, ScriptedProvider, SessionBusyError, create_agent

HERE = Path(__file__).resolve().parent
TIMEOUT = 120


class Child:
    def __init__(self, mode: str, kind: str, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "proc_child.py"), mode, kind, str(root), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.expect("READY")

    def expect(self, marker: str) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != marker:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"expected {marker!r}, got {line!r}; stderr: {err}")
        return line

    def send_line(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self) -> Any:
        out, err = self.proc.communicate(timeout=TIMEOUT)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


def echo(request: ModelRequest) -> str:
    return "re: " + list(request.messages)[-1].text


def _check_transcript(messages: Any, labels: dict[str, int]) -> None:
    users = [m.text for m in messages if m.role == "user"]
    assert len(users) == sum(labels.values()) and len(set(users)) == len(users)
    for i, m in enumerate(messages):  # user, answer, user, answer: no turn split
        if i % 2 == 0:
            assert m.role == "user"
        else:
            assert m.role == "assistant" and m.text == "re: " + messages[i - 1].text
    for label, count in labels.items():
        mine = [u for u in users if u.startswith(f"{label}-m")]
        assert mine == [f"{label}-m{j}" for j in range(count)]


def test_4_processes_x_25_turns_on_one_file_session(tmp_path: Path) -> None:
    children = [Child("turns", "files", tmp_path, "shared", f"p{i}", "25") for i in range(4)]
    for c in children:
        c.send_line()
    assert [c.result() for c in children] == [{"ok": 25}] * 4
    messages = create_agent(provider=ScriptedProvider(default=echo),
                            store=make_store("files", tmp_path)).session(id="shared").messages
    _check_transcript(messages, {f"p{i}": 25 for i in range(4)})


@pytest.mark.skipif("sqlite" not in KINDS, reason="SqliteStore not available")
def test_4_processes_x_50_turns_on_one_sqlite_database(tmp_path: Path) -> None:
    ids = ["shared", "shared", "shared", "own"]
    children = [Child("turns", "sqlite", tmp_path, sid, f"p{i}", "50")
                for i, sid in enumerate(ids)]
    for c in children:
        c.send_line()
    assert [c.result() for c in children] == [{"ok": 50}] * 4
    agent = create_agent(provider=ScriptedProvider(default=echo),
                         store=make_store("sqlite", tmp_path))
    _check_transcript(agent.session(id="shared").messages, {"p0": 50, "p1": 50, "p2": 50})
    _check_transcript(agent.session(id="own").messages, {"p3": 50})


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_reject_and_wait_across_processes(kind: str, tmp_path: Path) -> None:
    holder = Child("hold", kind, tmp_path, "s")
    holder.send_line()
    holder.expect("IN-TURN")  # the child's turn holds the session's lease now
    rejecter = Child("reject", kind, tmp_path, "s")
    rejecter.send_line()
    assert rejecter.result() == {"busy": True}
    agent = create_agent(provider=ScriptedProvider(default=echo), store=make_store(kind, tmp_path))
    with pytest.raises(SessionBusyError):
        agent.session(id="s", turn_policy="reject").send("here too")
    # wait runs after the other process's turn, as its own turn ("queue" from another process
    # joins the running turn through the session's mailbox: tests/test_mailbox.py)
    queued = agent.session(id="s", turn_policy="wait")
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(queued.send("after the child")))
    t.start()
    holder.send_line()
    assert holder.result() == {"text": "held answer"}
    t.join(TIMEOUT)
    assert [m.text for m in queued.messages] == [
        "from the child", "held answer", "after the child", "re: after the child"]


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_an_approval_paused_in_one_process_is_resolved_in_another(
    kind: str, tmp_path: Path
) -> None:
    pauser = Child("pause", kind, tmp_path, "acct-1")
    pauser.send_line()
    paused = pauser.result()
    assert paused["finish"] == "awaiting-approval"
    racers = [Child("resolve", kind, tmp_path, paused["approval_id"]) for _ in range(2)]
    for r in racers:
        r.send_line()
    outcomes = [r.result() for r in racers]
    assert sorted(o["won"] for o in outcomes) == [False, True]
    winner = next(o for o in outcomes if o["won"])
    assert winner["text"] == "Paid Bo."
    agent = create_agent(provider=ScriptedProvider(default="x"), store=make_store(kind, tmp_path))
    session = agent.session(id="acct-1")
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert session.messages[2].text == "sent 5.0 to Bo"
    assert session.pending() is None


@pytest.mark.parametrize("kind", ["postgres"], indirect=True)
def test_4_processes_x_50_turns_on_one_postgres_session(kind: str, tmp_path: Path) -> None:
    children = [Child("turns", kind, tmp_path, "shared", f"p{i}", "50") for i in range(4)]
    for c in children:
        c.send_line()
    assert [c.result() for c in children] == [{"ok": 50}] * 4
    agent = create_agent(provider=ScriptedProvider(default=echo), store=make_store(kind, tmp_path))
    _check_transcript(agent.session(id="shared").messages, {f"p{i}": 50 for i in range(4)})


@pytest.mark.parametrize("kind", ["postgres"], indirect=True)
def test_8_processes_race_to_resolve_one_approval(kind: str, tmp_path: Path) -> None:
    pauser = Child("pause", kind, tmp_path, "acct-1")
    pauser.send_line()
    paused = pauser.result()
    assert paused["finish"] == "awaiting-approval"
    racers = [Child("resolve", kind, tmp_path, paused["approval_id"]) for _ in range(8)]
    for r in racers:
        r.send_line()
    outcomes = [r.result() for r in racers]
    assert sorted(o["won"] for o in outcomes) == [False] * 7 + [True]
    agent = create_agent(provider=ScriptedProvider(default="x"), store=make_store(kind, tmp_path))
    session = agent.session(id="acct-1")
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert session.messages[2].text == "sent 5.0 to Bo"
    assert session.pending() is None
