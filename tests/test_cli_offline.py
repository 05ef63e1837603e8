"""The ``lousho`` command as a newcomer meets it, each case in a real child process whose
stdout, stderr and exit code are read: a chat offline on the scripted model, ``lousho demo``
piped into ``head``, an empty listing, a pending turn shown, JSON errors, exit codes that
tell a data error (1) from a usage error (2), a provider that refuses the key (a real HTTP
server on 127.0.0.1 answering 401), an empty ``--model`` and ``/compact`` with nothing to
compact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _http_server import FakeServer, json_reply

from lousho_sync import ProviderError, ScriptedProvider, Step, create_agent, tool
from lousho_sync.sqlite import SqliteStore

WAIT = 60.0


def offline_env(**extra: str) -> dict[str, str]:
    """The environment without any key, model or base URL: nothing can reach a provider."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "LOUSHO_MODEL"))}
    return {**env, **extra}


def lousho(*args: str, stdin: str = "", cwd: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lousho_sync", *args], input=stdin,
                          capture_output=True, text=True, timeout=WAIT, cwd=cwd,
                          env=env or offline_env())


def test_chat_with_the_scripted_model_works_offline_and_compacts(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    proc = lousho("chat", "--model", "scripted", "--store", str(db),
                  stdin="hello there\n/compact\n/exit\n", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "agent> (scripted) You said: hello there\n" in proc.stdout
    # a short transcript: nothing to compact, and the chat says so
    assert "(nothing was compacted: 2 messages, and compaction keeps the last 8)" in proc.stdout
    # a longer one compacts (the scripted model writes the summary)
    turns = "".join(f"message {i}\n" for i in range(6))
    proc = lousho("chat", "--model", "scripted", "--store", str(db), stdin=turns + "/compact\n",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(compacted 14 -> 9 messages)" in proc.stdout
    with SqliteStore(db) as store:
        messages = store.sessions.load("default")
    assert messages is not None and len(messages) == 9
    assert "scripted model" in messages[0].text


def test_an_empty_model_is_an_error_not_a_silent_default(tmp_path: Path) -> None:
    for env in (offline_env(), offline_env(LOUSHO_MODEL="scripted")):
        proc = lousho("chat", "--model", "", "--store", str(tmp_path / "a.db"), env=env,
                      cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.startswith("lousho: error: --model '' names no model")
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert not (tmp_path / "a.db").exists()


def test_lousho_demo_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    """The reader leaves after the line that names the crash child: the demo stops without a
    traceback, and the child it started does not outlive it."""
    proc = subprocess.Popen([sys.executable, "-m", "lousho_sync", "demo"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=offline_env())
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline()
        assert first.startswith("lousho demo")
        line = ""
        while "child process" not in line:
            line = proc.stdout.readline()
            assert line, "the demo ended before its crash step"
        child = int(line.split("child process ")[1].split(":")[0])
        proc.stdout.close()  # as `head` does once it has its lines
        assert proc.wait(WAIT) == 141  # 128 + SIGPIPE, as a shell reports it
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        proc.stderr.close()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    # and in a real shell pipeline, word for word
    shell = subprocess.run(["bash", "-c", f"{sys.executable} -m lousho_sync demo | head -1"],
                           capture_output=True, text=True, timeout=WAIT, cwd=tmp_path,
                           env=offline_env())
    assert shell.returncode == 0 and shell.stderr == ""
    assert shell.stdout.startswith("lousho demo") and shell.stdout.count("\n") == 1


def test_an_empty_listing_says_so(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    SqliteStore(db).close()
    proc = lousho("sessions", "--store", str(db), "list")
    assert proc.returncode == 0 and proc.stdout == f"no sessions in {db}\n"
    proc = lousho("sessions", "--store", str(db), "list", "--prefix", "trip-")
    assert proc.stdout == f"no sessions whose id starts with 'trip-' in {db}\n"
    assert lousho("sessions", "--store", str(db), "list", "--json").stdout == "[]\n"


@tool
def look_up(order: str) -> str:
    """An order's status."""
    return f"order {order}: shipped"


def test_sessions_show_shows_a_pending_turn(tmp_path: Path) -> None:
    db = tmp_path / "orders.db"
    script: list[Step | str] = ["First answer.", Step(tool_calls=[("look_up", {"order": "A7"})]),
              Step(error=ProviderError("the model's server is down"))]
    with SqliteStore(db) as store:
        session = create_agent(provider=ScriptedProvider(script), tools=[look_up],
                               store=store).session(id="u1")
        session.send("Hello")
        with pytest.raises(ProviderError):
            session.send("Where is order A7?")
    proc = lousho("sessions", "--store", str(db), "show", "u1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["user: Hello", "assistant: First answer."]
    assert lines[2].startswith("-- a pending turn, interrupted (not in the transcript until "
                               "it finishes: `lousho chat --store ")
    assert "/retry finishes it, /discard drops it" in lines[2]
    assert lines[3:] == ["   user: Where is order A7?",
                         "   assistant: look_up({'order': 'A7'})",
                         "   tool: order A7: shipped"]
    doc = json.loads(lousho("sessions", "--store", str(db), "show", "u1", "--json").stdout)
    assert doc["pending"] == "interrupted" and len(doc["transcript"]) == 2
    assert [m["role"] for m in doc["pending_turn"]] == ["user", "assistant", "tool"]
    assert doc["pending_turn"][1]["tool_calls"] == [{"name": "look_up",
                                                     "arguments": {"order": "A7"}}]


def _one_json_error(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    error = json.loads(lines[0])["error"]
    assert isinstance(error, dict) and error["exit_code"] == proc.returncode
    return error


def test_with_json_errors_are_json_and_data_errors_exit_1_usage_errors_2(
    tmp_path: Path,
) -> None:
    db = tmp_path / "a.db"
    with SqliteStore(db) as store:
        create_agent(provider=ScriptedProvider(default="ok"), store=store).session(
            id="s1").send("hi")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return lousho("sessions", "--store", str(db), *args)

    # data errors: exit 1
    missing = run("show", "nobody", "--json")
    assert missing.returncode == 1
    assert _one_json_error(missing)["code"] == "LOUSHO_SESSION_NOT_FOUND"
    too_many = run("undo", "s1", "3", "--json")
    assert too_many.returncode == 1
    assert "holds 1 turn(s)" in str(_one_json_error(too_many)["message"])
    assert run("undo", "s1", "3").returncode == 1
    beyond = run("fork", "s1", "s2", "--at-turn", "5")
    assert beyond.returncode == 1 and beyond.stderr.startswith("lousho: error: ")
    exists = run("fork", "s1", "s1", "--json")
    assert exists.returncode == 1 and _one_json_error(exists)["code"] == "LOUSHO_SESSION_EXISTS"
    # usage errors: exit 2, also those argparse finds
    bad_id = run("show", "not an id!", "--json")
    assert bad_id.returncode == 2
    assert _one_json_error(bad_id)["code"] == "LOUSHO_INVALID_SESSION_ID"
    zero = run("undo", "s1", "0", "--json")
    assert zero.returncode == 2
    assert "must be a whole number >= 1" in str(_one_json_error(zero)["message"])
    unknown = run("show", "--json", "--frobnicate")
    assert unknown.returncode == 2 and _one_json_error(unknown)["code"] == "LOUSHO_CLI_USAGE"
    plain = run("undo", "s1", "zero")
    assert plain.returncode == 2 and "usage:" in plain.stderr
    # a store problem: exit 1, JSON too
    nowhere = lousho("sessions", "--store", str(tmp_path / "nowhere.db"), "list", "--json")
    assert nowhere.returncode == 1 and _one_json_error(nowhere)["code"] == "LOUSHO_CLI_STORE"
    # nothing was changed by the refused commands
    with SqliteStore(db) as store:
        assert len(store.sessions.load("s1") or ()) == 2
        assert store.sessions.load("s2") is None


def test_a_refused_api_key_ends_the_chat_with_exit_1_and_a_hint(tmp_path: Path) -> None:
    with FakeServer() as server:
        server.default = json_reply({"error": {"message": "Incorrect API key provided",
                                               "type": "invalid_request_error",
                                               "code": "invalid_api_key"}}, 401)
        env = offline_env(OPENAI_API_KEY="sk-wrong-key-0000",
                          OPENAI_BASE_URL=server.url + "/v1")
        proc = lousho("chat", "--model", "openai/gpt-4o-mini", "--store",
                      str(tmp_path / "a.db"), stdin="hello\nagain\n", env=env, cwd=tmp_path)
        requests = len(server.requests)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "lousho: error: openai refused the API key (HTTP 401): check OPENAI_API_KEY (or chat "
        "offline with --model scripted); the transcript is as it was"]
    assert "sk-wrong-key" not in proc.stdout + proc.stderr
    assert requests == 1  # the second line was never sent: the chat ended
