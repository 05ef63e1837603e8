"""``lousho approvals`` as an operator meets it: a turn paused in one process, a real SQLite
file, the command run as a child process (stdout, stderr and exit code read), and the
decided turn continued by the command with its answer printed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WAIT = 60.0
APP = "approval_app:make_agent"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("LOUSHO_APP", "APPROVAL_APP_ARGS")}
    out.update(extra)
    return out


def lousho(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``lousho ARGS`` run in the tests directory (where the app module sits)."""
    return subprocess.run([sys.executable, "-m", "lousho_sync", *args], capture_output=True,
                          text=True, timeout=WAIT, cwd=TESTS, env=env(**extra))


def pause(db: Path, session_id: str, **extra: str) -> str:
    """A turn of ``session_id`` paused on approval by another process; the approval id."""
    done = subprocess.run([sys.executable, "approval_app.py", str(db), session_id],
                          capture_output=True, text=True, timeout=WAIT, cwd=TESTS,
                          env=env(**extra))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_list_show_approve_and_the_turn_goes_on_in_the_command(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    first = pause(db, "team-a-1")
    second = pause(db, "team-b-2", APPROVAL_APP_ARGS='{"amount": 70, "to": "eve"}')
    listed = lousho("approvals", "--store", str(db), "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "SESSION", "TOOL"]
    assert [line.split()[0] for line in lines[1:]] == [second, first]  # newest first
    assert "team-b-2" in lines[1] and "pay" in lines[1] and '"amount": 70' in lines[1]
    team = json.loads(lousho("approvals", "--store", str(db), "list", "--session-prefix",
                             "team-a-", "--json").stdout)
    assert [r["id"] for r in team] == [first]
    assert team[0]["arguments"] == {"amount": 5, "to": "bob"} and team[0]["status"] == "pending"
    assert team[0]["expires_at"] - team[0]["created_at"] == 3600

    shown = lousho("approvals", "--store", str(db), "show", first)
    assert shown.returncode == 0 and "tool: pay" in shown.stdout
    assert "session_id: team-a-1" in shown.stdout and '"to": "bob"' in shown.stdout

    done = lousho("approvals", "--store", str(db), "--app", APP, "approve", first,
                  "--by", "alice", "--reason", "known payee")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"approved {first} (by alice); the turn went on:",
                                        "outcome: paid 5 to bob"]
    record = json.loads(lousho("approvals", "--store", str(db), "show", first, "--json").stdout)
    assert (record["status"], record["resolved_by"], record["reason"]) == (
        "approved", "alice", "known payee")

    again = lousho("approvals", "--store", str(db), "--app", APP, "deny", first, "--by", "bob")
    assert again.returncode == 1 and again.stdout == ""
    assert f"approval {first!r} was already approved by alice" in again.stderr
    assert "known payee" in again.stderr and "Traceback" not in again.stderr

    denied = lousho("approvals", "--store", str(db), "--app", APP, "deny", second, "--json",
                    "--reason", "unknown payee", LOUSHO_USER="x")
    assert denied.returncode == 0, denied.stderr
    out = json.loads(denied.stdout)
    assert out["status"] == "denied" and out["finish_reason"] == "stop"
    assert out["text"] == "outcome: denied by a human: unknown payee"
    assert lousho("approvals", "--store", str(db), "list").stdout == "no approval is pending\n"


def test_the_app_can_come_from_the_environment_and_by_defaults_to_the_login(
    tmp_path: Path
) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "s1")
    done = lousho("approvals", "--store", str(db), "approve", aid, LOUSHO_APP=APP,
                  USER="carol", LOGNAME="carol")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "outcome: paid 5 to bob"
    record = json.loads(lousho("approvals", "--store", str(db), "show", aid, "--json").stdout)
    assert record["resolved_by"] == "carol"


def test_deciding_without_an_app_is_a_usage_error_and_decides_nothing(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "s1")
    for action in ("approve", "deny"):
        got = lousho("approvals", "--store", str(db), action, aid)
        assert got.returncode == 2
        assert "needs --app MODULE:ATTR" in got.stderr and "Traceback" not in got.stderr
    bad = lousho("approvals", "--store", str(db), "--app", "approval_app", "approve", aid)
    assert bad.returncode == 2 and "must be MODULE:ATTRIBUTE" in bad.stderr
    missing = lousho("approvals", "--store", str(db), "--app", "no_such_mod:x", "approve", aid)
    assert missing.returncode == 2 and "cannot import 'no_such_mod'" in missing.stderr
    nothing = lousho("approvals", "--store", str(db), "--app", "approval_app:nope", "deny", aid)
    assert nothing.returncode == 2 and "has no attribute 'nope'" in nothing.stderr
    record = json.loads(lousho("approvals", "--store", str(db), "show", aid, "--json").stdout)
    assert record["status"] == "pending"


def test_an_unknown_id_and_an_expired_request(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "s1")
    unknown = lousho("approvals", "--store", str(db), "show", "nope")
    assert unknown.returncode == 1 and "no approval has id 'nope'" in unknown.stderr
    with sqlite3.connect(db) as conn:  # its expiry long past, written as a store would
        conn.execute("UPDATE approvals SET json = json_set(json, '$.expires_at', 1.0)"
                     " WHERE id = ?", (aid,))
    late = lousho("approvals", "--store", str(db), "--app", APP, "approve", aid, "--by", "dan")
    assert late.returncode == 1
    assert "expired at 1970-01-01 00:00:01 UTC before anyone decided" in late.stderr
    assert late.stdout == ("outcome: denied: the request for approval expired before anyone "
                           "decided\n")
    record = json.loads(lousho("approvals", "--store", str(db), "show", aid, "--json").stdout)
    assert (record["status"], record["reason"], record["resolved_by"]) == (
        "denied", "expired", None)
