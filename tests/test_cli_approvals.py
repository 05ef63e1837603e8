"""``lousho approvals`` as an operator meets it, on every store the command opens (a SQLite
file, a file-store directory, Redis, PostgreSQL, and SQLite encrypted through
``$LOUSHO_ENCRYPTION_KEYS``): a turn paused in one process, the command run as a child
process (stdout, stderr and exit code read), and the decided turn continued by the command
with its answer printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from conftest import ENCRYPTION_KEY_VAR

from lousho_sync.cli import open_store

TESTS = Path(__file__).resolve().parent
WAIT = 60.0
APP = "approval_app:make_agent"


@attrs.define
class Where:
    """A store as ``--store`` names it, and the environment the command needs for it."""

    store: str
    env: dict[str, str]

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """``lousho ARGS`` run in the tests directory (where the app module sits)."""
        return subprocess.run([sys.executable, "-m", "lousho_sync", *args], capture_output=True,
                              text=True, timeout=WAIT, cwd=TESTS, env=self.child_env(**extra))

    def approvals(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.run("approvals", "--store", self.store, *args, **extra)

    def child_env(self, **extra: str) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items()
               if k not in ("LOUSHO_APP", "APPROVAL_APP_ARGS", "LOUSHO_ENCRYPTION_KEYS")}
        out.update(self.env)
        out.update(extra)
        return out

    def pause(self, session_id: str, **extra: str) -> str:
        """A turn of ``session_id`` paused on approval by another process; its approval id."""
        done = subprocess.run([sys.executable, "approval_app.py", self.store, session_id],
                              capture_output=True, text=True, timeout=WAIT, cwd=TESTS,
                              env=self.child_env(**extra))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def shown(self, aid: str) -> dict[str, object]:
        got = self.approvals("show", aid, "--json")
        assert got.returncode == 0, got.stderr
        value: dict[str, object] = json.loads(got.stdout)
        return value


@pytest.fixture(params=["sqlite", "files", "redis", "postgres", "encrypted-sqlite"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    kind = str(request.param)
    if kind in ("sqlite", "encrypted-sqlite"):
        env = ({"LOUSHO_ENCRYPTION_KEYS": os.environ[ENCRYPTION_KEY_VAR]}
               if kind.startswith("encrypted") else {})
        yield Where(str(tmp_path / "agent.db"), env)
    elif kind == "files":
        yield Where(str(tmp_path / "store") + "/", {})
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_url")
        yield Where(f"{url}?schema={request.getfixturevalue('postgres_schema')}", {})
    else:
        import redis

        base = request.getfixturevalue("redis_url").rsplit("/", 1)[0]
        url = f"{base}/7"  # a database of its own: the command's keys use the default prefix
        client = redis.Redis.from_url(url)
        client.flushdb()
        yield Where(url, {})
        client.flushdb()
        client.close()


def test_list_show_approve_and_the_turn_goes_on_in_the_command(where: Where) -> None:
    first = where.pause("team-a-1")
    second = where.pause("team-b-2", APPROVAL_APP_ARGS='{"amount": 70, "to": "eve"}')
    listed = where.approvals("list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "SESSION", "TOOL"]
    assert [line.split()[0] for line in lines[1:]] == [second, first]  # newest first
    assert "team-b-2" in lines[1] and "pay" in lines[1] and '"amount": 70' in lines[1]
    team = json.loads(where.approvals("list", "--session-prefix", "team-a-", "--json").stdout)
    assert [r["id"] for r in team] == [first]
    assert team[0]["arguments"] == {"amount": 5, "to": "bob"} and team[0]["status"] == "pending"
    assert team[0]["expires_at"] - team[0]["created_at"] == 3600

    shown = where.approvals("show", first)
    assert shown.returncode == 0 and "tool: pay" in shown.stdout
    assert "session_id: team-a-1" in shown.stdout and '"to": "bob"' in shown.stdout

    done = where.approvals("--app", APP, "approve", first, "--by", "alice",
                           "--reason", "known payee")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"approved {first} (by alice); the turn went on:",
                                        "outcome: paid 5 to bob"]
    record = where.shown(first)
    assert (record["status"], record["resolved_by"], record["reason"]) == (
        "approved", "alice", "known payee")

    again = where.approvals("--app", APP, "deny", first, "--by", "bob")
    assert again.returncode == 1 and again.stdout == ""
    assert f"approval {first!r} was already approved by alice" in again.stderr
    assert "known payee" in again.stderr and "Traceback" not in again.stderr

    denied = where.approvals("--app", APP, "deny", second, "--json", "--reason", "unknown payee")
    assert denied.returncode == 0, denied.stderr
    out = json.loads(denied.stdout)
    assert out["status"] == "denied" and out["finish_reason"] == "stop"
    assert out["text"] == "outcome: denied by a human: unknown payee"
    assert where.approvals("list").stdout == "no approval is pending\n"


def test_an_expired_request_is_denied_and_its_turn_goes_on(
    where: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    aid = where.pause("s1")
    for k, v in where.env.items():
        monkeypatch.setenv(k, v)
    store = open_store(where.store, create=False)
    try:  # its expiry long past, written as a store would have it
        record = store.approvals.get(aid)
        store.approvals.create(attrs.evolve(record, expires_at=1.0))
    finally:
        getattr(store, "close", lambda: None)()
    assert where.approvals("list").stdout == "no approval is pending\n"  # read: denied
    late = where.approvals("--app", APP, "approve", aid, "--by", "dan")
    assert late.returncode == 1
    assert "expired at 1970-01-01 00:00:01 UTC before anyone decided" in late.stderr
    assert late.stdout == ("outcome: denied: the request for approval expired before anyone "
                           "decided\n")
    record = where.shown(aid)
    assert (record["status"], record["reason"], record["resolved_by"]) == (
        "denied", "expired", None)


def test_the_app_can_come_from_the_environment_and_by_defaults_to_the_login(
    tmp_path: Path
) -> None:
    where = Where(str(tmp_path / "agent.db"), {})
    aid = where.pause("s1")
    done = where.approvals("approve", aid, LOUSHO_APP=APP, USER="carol", LOGNAME="carol")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "outcome: paid 5 to bob"
    assert where.shown(aid)["resolved_by"] == "carol"


def test_deciding_without_an_app_is_a_usage_error_and_decides_nothing(tmp_path: Path) -> None:
    where = Where(str(tmp_path / "agent.db"), {})
    aid = where.pause("s1")
    for action in ("approve", "deny"):
        got = where.approvals(action, aid)
        assert got.returncode == 2
        assert "needs --app MODULE:ATTR" in got.stderr and "Traceback" not in got.stderr
    bad = where.approvals("--app", "approval_app", "approve", aid)
    assert bad.returncode == 2 and "must be MODULE:ATTRIBUTE" in bad.stderr
    missing = where.approvals("--app", "no_such_mod:x", "approve", aid)
    assert missing.returncode == 2 and "cannot import 'no_such_mod'" in missing.stderr
    nothing = where.approvals("--app", "approval_app:nope", "deny", aid)
    assert nothing.returncode == 2 and "has no attribute 'nope'" in nothing.stderr
    not_agent = where.approvals("--app", "approval_app:pay", "deny", aid)
    assert not_agent.returncode == 2 and "calling pay(store=...) failed" in not_agent.stderr
    assert "Traceback" not in not_agent.stderr
    assert where.shown(aid)["status"] == "pending"
    unknown = where.approvals("show", "nope")
    assert unknown.returncode == 1 and "no approval has id 'nope'" in unknown.stderr
