"""The lousho command end to end, as a user meets it: chat through piped stdin or a
pseudo-terminal against a real HTTP server on 127.0.0.1 speaking the OpenAI wire format,
and the sessions commands on real stores."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import queue
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from _http_server import FakeServer, Recorded, Reply, fixture_reply, json_reply

import lousho_sync
from lousho_sync import FileStore, ProviderError, ScriptedProvider, Step, create_agent
from lousho_sync.cli import open_store
from lousho_sync.messages import Message
from lousho_sync.sqlite import SqliteStore

WAIT = 30.0
KEY = "sk-test-chat-key-123456"


def failing() -> Reply:
    return json_reply({"error": {"message": "upstream broke", "type": "server_error"}}, 500,
                      {"Retry-After": "0"})


def env_for(server: FakeServer | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LOUSHO_MODEL"}
    env["OPENAI_API_KEY"] = KEY
    if server is not None:
        env["OPENAI_BASE_URL"] = server.url + "/v1"
    return env


class Chat:
    """``lousho chat`` in a child process (``python -m lousho_sync``), its stdout read by a
    thread."""

    def __init__(self, tmp: Path, server: FakeServer, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lousho_sync", "chat", "--model", "openai/gpt-4o-mini",
             "--store", str(tmp / "agent.db"), "--session", "c1", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env_for(server), cwd=tmp,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read(1), ""):  # type: ignore[union-attr]
            self.lines.put(chunk)

    def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, text: str) -> str:
        while text not in self.seen:
            try:
                self.seen += self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no {text!r} in {self.seen!r}") from None
        out, _, self.seen = self.seen.partition(text)
        return out + text

    def exit(self) -> int:
        self.type("/exit")
        return self.proc.wait(WAIT)


def lousho(*args: str, stdin: str = "", cwd: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lousho_sync", *args], input=stdin,
                          capture_output=True, text=True, timeout=WAIT, cwd=cwd,
                          env=env or env_for())


def stored(db: Path) -> Any:
    return create_agent(provider=ScriptedProvider(default="x"), store=SqliteStore(db))


def test_chat_streams_keeps_history_and_ctrl_c_aborts_a_turn(tmp_path: Path) -> None:
    got_second = threading.Event()

    def held(rec: Recorded) -> Reply:
        got_second.set()
        return Reply(200, {"Content-Type": "text/event-stream"},
                     chunks=[b'data: {"id":"x","object":"chat.completion.chunk","created":1,'
                             b'"model":"gpt-4o-mini","choices":[{"index":0,"delta":'
                             b'{"role":"assistant","content":"partial"},"finish_reason":null}]}'
                             b"\n\n"], hold=True)

    with FakeServer() as server:
        server.push(fixture_reply("openai_text_stream.sse"), held)
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.type("hi")
        answer = chat.expect("you> ")
        assert "agent> Hello" in answer
        chat.type("second question")
        assert got_second.wait(WAIT)
        chat.expect("partial")
        chat.proc.send_signal(signal.SIGINT)
        assert "[aborted: the transcript is unchanged]" in chat.expect("you> ")
        assert server.client_gone.wait(WAIT)  # the connection was closed on abort
        chat.type("/history")
        history = chat.expect("you> ")
        assert "user: hi" in history and "assistant: Hello" in history
        assert "second question" not in history and "partial" not in history
        assert chat.exit() == 0
    messages = stored(tmp_path / "agent.db").session(id="c1").messages
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].text.startswith("Hello")


def fail_after_progress(server: FakeServer) -> None:
    """The next turn: the model calls two tools (unknown here: error results, but progress
    that is checkpointed), then every request fails with HTTP 500."""
    server.push(fixture_reply("openai_parallel_tools_stream.sse"))
    server.default = failing()


def test_a_failed_turn_is_shown_pending_and_retry_prints_its_answer(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    with FakeServer() as server:
        fail_after_progress(server)
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.type("weather in Paris and Rome?")
        after = chat.expect("you> ")
        assert "error:" in after and "500" in after
        assert "a turn is pending (it did not finish): /retry finishes it" in after
        assert chat.exit() == 0

        # only a pending turn, no transcript yet: still listed, counted and shown
        table = lousho("sessions", "--store", str(db), "list")
        assert table.returncode == 0 and table.stdout.splitlines()[1].split() == [
            "c1", "0", "-", "-", "(pending", "turn:", "interrupted)"]
        as_json = json.loads(lousho("sessions", "--store", str(db), "list", "--json").stdout)
        assert as_json == [{"id": "c1", "messages": 0, "created_at": None, "updated_at": None,
                            "title": None, "metadata": {}, "pending": "interrupted"}]
        shown = lousho("sessions", "--store", str(db), "show", "c1")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("-- a pending turn, interrupted (not in the transcript ")
        assert "   user: weather in Paris and Rome?\n   assistant: " in shown.stdout

        server.default = fixture_reply("openai_text_stream.sse")
        chat = Chat(tmp_path, server)
        banner = chat.expect("you> ")
        assert "(0 messages and a pending turn)" in banner
        assert "/retry finishes it, /discard drops it" in banner
        chat.type("/retry")
        assert "agent> Hello" in chat.expect("you> ")
        chat.type("/retry")
        assert "(nothing is pending)" in chat.expect("you> ")
        chat.type("/history")
        history = chat.expect("you> ")
        assert "user: weather in Paris and Rome?" in history and "assistant: Hello" in history
        assert chat.exit() == 0
    messages = stored(db).session(id="c1").messages
    assert messages[0].text == "weather in Paris and Rome?" and messages[-1].text.startswith(
        "Hello")
    assert stored(db).session(id="c1").pending() is None


def test_a_new_message_first_finishes_the_pending_turn_and_prints_it(tmp_path: Path) -> None:
    with FakeServer() as server:
        fail_after_progress(server)
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.type("first")
        assert "a turn is pending" in chat.expect("you> ")
        server.default = fixture_reply("openai_text_stream.sse")
        chat.type("second")
        out = chat.expect("you> ")
        assert "(finishing the pending turn first)\nagent> Hello" in out
        assert out.count("agent> Hello") == 2  # the resumed answer, then the new one
        assert chat.exit() == 0
    users = [m.text for m in stored(tmp_path / "agent.db").session(id="c1").messages
             if m.role == "user"]
    assert users == ["first", "second"]


def test_a_turn_failing_before_any_progress_keeps_nothing(tmp_path: Path) -> None:
    with FakeServer() as server:
        server.default = failing()
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.type("lost")
        out = chat.expect("you> ")
        assert "error:" in out and "500" in out
        assert "(nothing of this turn was kept: the transcript is as it was)" in out
        assert "pending" not in out
        server.default = fixture_reply("openai_text_stream.sse")
        chat.type("again")
        out = chat.expect("you> ")
        assert out.count("agent> Hello") == 1 and "finishing" not in out
        chat.type("/history")
        history = chat.expect("you> ")
        assert "user: again" in history and "lost" not in history
        assert chat.exit() == 0


def test_discard_drops_the_pending_turn(tmp_path: Path) -> None:
    with FakeServer() as server:
        server.push(fixture_reply("openai_text_stream.sse"))
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.type("kept")
        chat.expect("you> ")
        fail_after_progress(server)
        chat.type("dropped")
        assert "a turn is pending" in chat.expect("you> ")
        chat.type("/discard")
        assert "(the pending turn was dropped; the transcript is as it was)" in chat.expect(
            "you> ")
        chat.type("/history")
        history = chat.expect("you> ")
        assert "user: kept" in history and "dropped" not in history
        assert "pending" not in history
        assert chat.exit() == 0


def test_chat_without_a_key_names_the_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "LOUSHO_MODEL")}
    proc = lousho("chat", cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stderr and "Traceback" not in proc.stderr


def read_until(fd: int, text: bytes, seen: bytearray) -> bytes:
    """Read the pseudo-terminal until ``text`` appears; returns what came before it."""
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], WAIT)
        if not ready:
            raise AssertionError(f"no {text!r} in {bytes(seen)!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            raise AssertionError(f"terminal closed before {text!r}; saw {bytes(seen)!r}")
        seen += chunk
    before, _, after = bytes(seen).partition(text)
    seen[:] = after
    return before


def wait_child(pid: int, fd: int, seen: bytearray) -> int:
    """Drain the terminal (into ``seen``) until the child exits; its exit code."""
    while True:
        ready, _, _ = select.select([fd], [], [], WAIT)
        if not ready:
            os.kill(pid, signal.SIGABRT)  # faulthandler prints every thread's stack
            ready, _, _ = select.select([fd], [], [], 5)
            with contextlib.suppress(OSError):
                seen += os.read(fd, 65536)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the chat did not exit: {bytes(seen).decode(errors='replace')}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def spawn_in_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "lousho_sync", *args], env)
    return pid, fd


def test_in_a_terminal_the_prompt_edits_lines_and_ctrl_c_exits_130(tmp_path: Path) -> None:
    pytest.importorskip("readline")
    with FakeServer() as server:
        server.default = fixture_reply("openai_text_stream.sse")
        pid, fd = spawn_in_terminal(
            ["chat", "--model", "openai/gpt-4o-mini", "--store", str(tmp_path / "a.db")],
            {**env_for(server), "PYTHONFAULTHANDLER": "1"}, tmp_path)
        seen = bytearray()
        read_until(fd, b"you> ", seen)
        os.write(fd, b"helo\x1b[Dl\r")  # left arrow, then insert: "hello"
        read_until(fd, b"agent> Hello", seen)
        read_until(fd, b"you> ", seen)
        os.write(fd, b"\x1b[A\r")  # up arrow: the previous line again, from the history
        read_until(fd, b"agent> Hello", seen)
        read_until(fd, b"you> ", seen)
        os.write(fd, b"\x03")  # Ctrl-C at the idle prompt
        code = wait_child(pid, fd, seen)
        rest = bytes(seen)
        assert code == 130
        assert b"Traceback" not in rest and b"KeyboardInterrupt" not in rest
        users = [r.json()["messages"][-1]["content"] for r in server.requests]
    os.close(fd)
    assert users == ["hello", "hello"]


def test_ctrl_c_at_a_piped_prompt_exits_130_without_a_traceback(tmp_path: Path) -> None:
    with FakeServer() as server:
        chat = Chat(tmp_path, server)
        chat.expect("you> ")
        chat.proc.send_signal(signal.SIGINT)
        assert chat.proc.wait(WAIT) == 130
        assert chat.proc.stderr is not None
        assert "Traceback" not in chat.proc.stderr.read()


def test_version() -> None:
    assert lousho_sync.__version__ == version("lousho")
    proc = lousho("--version")
    assert proc.returncode == 0 and proc.stdout == f"lousho {version('lousho')}\n"


# --- stores ---------------------------------------------------------------------------------
def problem(proc: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a store problem (exit 1, no traceback)."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("lousho: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("lousho: error: "), proc.stderr
    assert "you> " not in proc.stdout  # reported before the first prompt
    return lines[0]


def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path: Path) -> None:
    notes = tmp_path / "notadb.txt"
    notes.write_text("my notes\n")
    for args in (["chat", "--store", str(notes)], ["sessions", "--store", str(notes), "list"]):
        line = problem(lousho(*args, cwd=tmp_path))
        assert "is not a lousho store" in line and ".db file, a directory" in line
    assert notes.read_text() == "my notes\n"


def test_a_new_path_must_say_which_kind_of_store(tmp_path: Path) -> None:
    line = problem(lousho("chat", "--store", "new.txt", cwd=tmp_path))
    assert "new.db" in line and "trailing slash" in line and "redis://" in line
    assert list(tmp_path.iterdir()) == []
    proc = lousho("chat", "--store", "chats.sqlite", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "chats.sqlite").is_file()
    proc = lousho("chat", "--store", "files/", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "files").is_dir()


def test_read_only_commands_never_create_a_store(tmp_path: Path) -> None:
    for args in (["list"], ["show", "x"], ["delete", "x"], ["prune", "--older-than", "1d"]):
        line = problem(lousho("sessions", *args, cwd=tmp_path))
        assert "no store at './.lousho/agent.db'" in line
        line = problem(lousho("sessions", "--store", "missing.db", *args, cwd=tmp_path))
        assert "no store at 'missing.db'" in line
    assert list(tmp_path.iterdir()) == []


_READ_ONLY = (["list"], ["show", "x"], ["delete", "x"], ["undo", "x"], ["fork", "x", "y"],
              ["prune", "--older-than", "1d", "--yes"])


def test_sessions_commands_never_create_a_postgres_schema(
    tmp_path: Path, postgres_url: str, postgres_schema: str
) -> None:
    import psycopg

    typo = f"{postgres_url}?schema={postgres_schema}"
    for args in _READ_ONLY:
        line = problem(lousho("sessions", "--store", typo, *args, cwd=tmp_path))
        assert "no store at" in line and repr(postgres_schema) in line, line
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                             (postgres_schema,)).fetchone()
    assert found == (0,), "a read-only command created the schema"


def test_sessions_commands_never_write_a_redis_key(tmp_path: Path, redis_url: str) -> None:
    import redis

    url = redis_url.rsplit("/", 1)[0] + "/11"  # a database no other test writes
    client = redis.Redis.from_url(url)
    try:
        client.delete(*client.keys("lousho:*") or ["lousho:none"])
        for args in _READ_ONLY:
            line = problem(lousho("sessions", "--store", url, *args, cwd=tmp_path))
            assert "no store at" in line and "lousho:" in line, line
        assert client.keys("*") == []
    finally:
        client.close()


def test_sessions_commands_refuse_a_sqlite_file_that_is_not_a_lousho_store(
    tmp_path: Path,
) -> None:
    import sqlite3

    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    before = {p: p.read_bytes() for p in (other, empty)}
    for db in (other, empty):
        for args in _READ_ONLY:
            line = problem(lousho("sessions", "--store", str(db), *args, cwd=tmp_path))
            assert "no store at" in line and "not a lousho store" in line, line
    assert {p: p.read_bytes() for p in (other, empty)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "empty.db"]


def test_unreachable_and_unwritable_stores_fail_before_the_prompt(tmp_path: Path) -> None:
    with socket_closed_port() as port:
        line = problem(lousho("chat", "--store", f"redis://127.0.0.1:{port}/0", cwd=tmp_path))
    assert "Connection refused" in line or "connect" in line
    line = problem(lousho("chat", "--store", "/proc/self/lousho.db", cwd=tmp_path))
    assert "/proc/self/lousho.db" in line


def test_no_store_problem_shows_a_password(tmp_path: Path) -> None:
    secret = "Sup3rSecret-pw"
    with socket_closed_port() as port:
        stores = [f"redis://:{secret}@127.0.0.1:{port}/0",
                  f"redis://app:{secret}@127.0.0.1:{port}/0",
                  f"redis://:{secret}-with-@-in-it@127.0.0.1:{port}/0",
                  f"rediss://:{secret}@127.0.0.1:{port}/0",
                  f"postgresql://app:{secret}@127.0.0.1:{port}/db",
                  f"mysql://app:{secret}@127.0.0.1:{port}/db"]
        calls = [args for store in stores
                 for args in (["sessions", "--store", store, "list"],
                              ["sessions", "--store", store, "prune", "--older-than", "7d",
                               "--yes"],
                              ["chat", "--store", store])]
        # side by side: each PostgreSQL call waits out the store's retry window (~5 s)
        with ThreadPoolExecutor(max_workers=6) as pool:
            procs = list(pool.map(lambda args: lousho(*args, cwd=tmp_path), calls))
        for args, proc in zip(calls, procs, strict=True):
            line = problem(proc)
            assert "Sup3rSecret" not in proc.stderr + proc.stdout, (args, line)
            assert "in-it" not in line and f"127.0.0.1:{port}" in line, (args, line)


def read_only_command(directory: Path, args: list[str]) -> list[str]:
    """``args`` run with ``directory`` read-only: for root (who writes read-only files), in a
    private mount namespace where it is a read-only bind mount."""
    if os.geteuid() != 0:
        for path in [directory, *directory.iterdir()]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        return args
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=WAIT,
                           check=False) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("root, and no mount namespace to make a read-only directory in")
    quoted = " ".join(shlex.quote(a) for a in args)
    d = shlex.quote(str(directory))
    return ["unshare", "-m", "sh", "-c",
            f"mount --bind {d} {d} && mount -o remount,bind,ro {d} && exec {quoted}"]


def test_a_read_only_store_fails_before_the_prompt(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    stored(directory / "agent.db").session(id="c1").send("x")
    cmd = read_only_command(directory, [sys.executable, "-m", "lousho_sync", "chat", "--store",
                                        str(directory / "agent.db"), "--session", "c1"])
    try:
        proc = subprocess.run(cmd, input="hello\n", capture_output=True, text=True,
                              timeout=WAIT, env=env_for(), cwd=tmp_path)
    finally:
        for path in [directory, *directory.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    line = problem(proc)
    assert "cannot be written" in line and "agent.db" in line
    assert proc.stdout == ""  # no banner, no prompt
    assert [m.text for m in stored(directory / "agent.db").session(id="c1").messages] == [
        "x", "x"]


def test_an_encrypted_store_names_the_reason_and_opens_with_keys_from_the_environment(
    tmp_path: Path,
) -> None:
    from lousho_sync import EncryptedStore

    key = EncryptedStore.generate_key()
    db = tmp_path / "e.db"
    create_agent(provider=ScriptedProvider(default="secret answer"),
                 store=EncryptedStore(SqliteStore(db), keys=[key])
                 ).session(id="u1").send("secret question")
    for args in (["sessions", "--store", str(db), "list"],
                 ["sessions", "--store", str(db), "show", "u1"],
                 ["chat", "--store", str(db), "--session", "u1"]):
        line = problem(lousho(*args, stdin="plaintext now\n", cwd=tmp_path))
        assert "written through EncryptedStore" in line and "LOUSHO_ENCRYPTION_KEYS" in line
    env = {**env_for(), "LOUSHO_ENCRYPTION_KEYS": key}
    proc = lousho("sessions", "--store", str(db), "show", "u1", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "secret question" in proc.stdout and "secret answer" in proc.stdout
    reopened = EncryptedStore(SqliteStore(db), keys=[key]).sessions.load("u1")
    assert [m.text for m in reopened or []] == ["secret question", "secret answer"]


def test_a_redis_store_without_the_extra_names_it(tmp_path: Path) -> None:
    fake = tmp_path / "no_redis" / "redis"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named redis')\n")
    env = {**env_for(), "PYTHONPATH": str(fake.parent)}
    line = problem(lousho("chat", "--store", "redis://127.0.0.1:6379/0", env=env, cwd=tmp_path))
    assert "pip install 'lousho[redis]'" in line


class socket_closed_port:
    """A loopback port nobody listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port: int = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        pass


def listed_ids(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The ids of a ``lousho sessions list`` table (its first line is the header)."""
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.startswith("no sessions"):
        return []
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["ID", "MESSAGES", "UPDATED", "TITLE"]
    return [line.split()[0] for line in lines[1:]]


@pytest.mark.parametrize("kind", ["sqlite", "files"])
def test_sessions_list_shows_counts_titles_and_undo_fork(kind: str, tmp_path: Path) -> None:
    path = str(tmp_path / "agent.db") if kind == "sqlite" else str(tmp_path / "store") + "/"
    agent = create_agent(provider=ScriptedProvider(default="pong"), store=open_store(path))
    trip = agent.session(id="trip")
    trip.set_metadata({"title": "Oslo in May", "owner": "ana"})
    for text in ("flights?", "hotels?", "trains?"):
        trip.send(text)
    agent.session(id="notes").send("hi")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return lousho("sessions", "--store", path, *args)

    table = run("list").stdout.splitlines()
    assert [line.split()[:2] for line in table[1:]] == [["notes", "2"], ["trip", "6"]]
    assert table[1].rstrip().endswith("-") and table[2].rstrip().endswith("Oslo in May")
    rows = json.loads(run("list", "--json").stdout)
    assert [(r["id"], r["messages"], r["title"], r["pending"]) for r in rows] == [
        ("notes", 2, None, None), ("trip", 6, "Oslo in May", None)]
    assert rows[1]["metadata"] == {"title": "Oslo in May", "owner": "ana"}
    assert rows[0]["updated_at"] >= rows[1]["updated_at"] >= rows[1]["created_at"] > 0
    assert listed_ids(run("list", "--prefix", "tr")) == ["trip"]

    undone = run("undo", "trip", "--json")
    assert json.loads(undone.stdout) == {"undone": "trip", "turns": 1, "removed": 2,
                                         "messages": 4}
    assert run("undo", "trip", "2").stdout == "removed 2 turn(s), 4 messages, from trip (0 left)\n"
    too_many = run("undo", "trip")  # the data's limit, not the command line's: exit 1
    assert too_many.returncode == 1 and "holds 0 turn(s)" in too_many.stderr
    agent.session(id="trip").send("again?")
    forked = run("fork", "trip", "trip-2", "--json")
    assert json.loads(forked.stdout) == {"forked": "trip", "into": "trip-2", "messages": 2}
    again = run("fork", "trip", "trip-2")
    assert again.returncode == 1 and "'trip-2'" in again.stderr and "exists" in again.stderr
    auto = run("fork", "notes", "--at-turn", "0").stdout
    assert auto.startswith("forked notes into ") and auto.endswith(" (0 messages)\n")
    later = create_agent(provider=ScriptedProvider(default="pong"), store=open_store(path))
    assert later.session(id="trip-2").metadata == {
        "title": "Oslo in May", "owner": "ana", "forked_from": "trip"}
    assert [m.text for m in later.session(id="trip-2").messages] == ["again?", "pong"]
    assert listed_ids(run("list"))[0] != "trip"  # the forks are newer
    assert run("undo", "nobody").returncode == 1


@pytest.mark.parametrize("kind", ["sqlite", "files"])
def test_sessions_list_show_delete_prune(kind: str, tmp_path: Path) -> None:
    path = str(tmp_path / "agent.db") if kind == "sqlite" else str(tmp_path / "store") + "/"
    agent = create_agent(provider=ScriptedProvider(default="pong"), store=open_store(path))
    agent.session(id="alpha").send("ping")
    agent.session(id="beta").send("ping")

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return lousho("sessions", "--store", path, *args, stdin=stdin)

    assert listed_ids(run("list")) == ["beta", "alpha"]  # newest first
    assert run("show", "alpha").stdout.splitlines() == ["user: ping", "assistant: pong"]
    shown = json.loads(run("show", "alpha", "--json").stdout)
    assert shown == {"id": "alpha", "messages": 2, "pending": None, "transcript": [
        {"role": "user", "text": "ping", "tool_calls": []},
        {"role": "assistant", "text": "pong", "tool_calls": []}], "pending_turn": []}
    deleted = run("delete", "alpha", "--json")
    assert deleted.returncode == 0 and json.loads(deleted.stdout) == {"deleted": "alpha"}
    assert listed_ids(run("list")) == ["beta"]
    missing = run("show", "alpha")
    assert missing.returncode == 1 and "no session 'alpha'" in missing.stderr
    gone = run("delete", "alpha")
    assert gone.returncode == 1 and "no session 'alpha'" in gone.stderr and gone.stdout == ""
    bad = run("show", "../etc")
    assert bad.returncode == 2 and "^[A-Za-z0-9_-]{1,128}$" in bad.stderr
    assert run("frobnicate").returncode == 2  # usage

    refused = run("prune", "--older-than", "0s", stdin="n\n")
    assert refused.returncode == 1 and "nothing pruned" in refused.stderr
    assert "[y/N]" in refused.stderr and refused.stdout == ""
    assert run("prune", "--older-than", "0s").returncode == 1  # no answer: nothing either
    assert listed_ids(run("list")) == ["beta"]
    kept = run("prune", "--older-than", "7d", "--yes", "--json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout) == {"pruned": {"sessions": 0, "checkpoints": 0,
                                                  "approvals": 0}}
    confirmed = run("prune", "--older-than", "0s", stdin="y\n")
    assert confirmed.returncode == 0 and confirmed.stdout.startswith("pruned 1 sessions")
    assert run("list").stdout == f"no sessions in {path}\n"
    assert run("list", "--json").stdout == "[]\n"


def test_delete_removes_a_session_that_holds_only_a_pending_turn(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    agent = create_agent(provider=ScriptedProvider(
        [Step(tool_calls=[("nothing", {})]), Step(error=ProviderError("down"))]),
        store=SqliteStore(db))
    with pytest.raises(ProviderError):
        agent.session(id="p1").send("go")
    assert listed_ids(lousho("sessions", "--store", str(db), "list")) == ["p1"]
    assert lousho("sessions", "--store", str(db), "delete", "p1").stdout == "deleted p1\n"
    assert lousho("sessions", "--store", str(db), "list").stdout == f"no sessions in {db}\n"
    assert stored(db).session(id="p1").pending() is None


def test_file_store_prune_keeps_fresh_and_pending(tmp_path: Path) -> None:
    from lousho_sync import tool

    @tool(needs_approval=True)
    def pay() -> str:
        """Pay."""
        return "paid"

    store = FileStore(tmp_path)

    def model(request: Any) -> Step | str:
        last = list(request.messages)[-1]
        return Step(tool_calls=[("pay", {})]) if last.text == "pay" else "ok"

    agent = create_agent(provider=ScriptedProvider(default=model), tools=[pay], store=store)
    agent.session(id="old").send("x")
    agent.session(id="paused").send("pay")
    from test_store_contract import FileKit

    FileKit(tmp_path).age("session", "old", 2 * 86400)  # last written two days ago
    result = store.prune(older_than_s=86400)
    assert (result.sessions, result.approvals) == (1, 0)
    assert store.sessions.ids() == [] and len(agent.approvals.list()) == 1


# --- lousho sessions copy ---------------------------------------------------------------------


def _copy_env() -> dict[str, str]:
    """The child imports this checkout's lousho_sync (whatever cwd it runs in)."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**env_for(), "PYTHONPATH": root}


def _transcripts(store: Any, ids: list[str]) -> dict[str, Any]:
    return {sid: store.sessions.load(sid) for sid in ids}


def _fill_source(db: Path) -> SqliteStore:
    """alpha (2 messages), beta (4), other-1 (2), and p1 whose second turn stays pending."""
    store = SqliteStore(db)
    agent = create_agent(provider=ScriptedProvider(default="pong"), store=store)
    agent.session(id="alpha").send("ping")
    agent.session(id="beta").send("ping")
    agent.session(id="beta").send("ping again")
    agent.session(id="other-1").send("hello")
    pending = create_agent(provider=ScriptedProvider(
        ["first answer", Step(tool_calls=[("nothing", {})]), Step(error=ProviderError("down"))]),
        store=store)
    pending.session(id="p1").send("one")
    with pytest.raises(ProviderError):
        pending.session(id="p1").send("two")
    assert pending.session(id="p1").pending() is not None
    return store


def _check_copy(src: Path, target: str, dst: Any) -> None:
    """Copy everything from ``src`` to ``target`` (opened as ``dst``): the transcripts are
    equal, the pending turn stays behind, and a second run refuses and changes nothing."""
    source = _fill_source(src)
    ids = ["alpha", "beta", "other-1", "p1"]
    first = lousho("sessions", "copy", "--from", str(src), "--to", target, env=_copy_env())
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[:4] == ["copied alpha (2 messages)", "copied beta (4 messages)",
                         "copied other-1 (2 messages)", "copied p1 (2 messages)"]
    assert lines[4].startswith("copied 4 of 4 sessions from ")
    assert "pending turn" in first.stderr and "'p1'" in first.stderr  # said, not copied
    assert _transcripts(dst, ids) == _transcripts(source, ids)
    assert dst.checkpoints.keys("") == []  # the pending turn was not copied
    assert create_agent(provider=ScriptedProvider(default="x"), store=dst).session(
        id="p1").pending() is None

    dst.sessions.append("alpha", [Message("user", "written in the destination")],
                        expected_length=2)
    again = lousho("sessions", "copy", "--from", str(src), "--to", target, "--json",
                   env=_copy_env())
    assert again.returncode == 1
    doc = json.loads(again.stdout)
    assert doc["copied"] == [] and [r["id"] for r in doc["refused"]] == ids
    assert all("exists already" in r["reason"] for r in doc["refused"])
    assert again.stderr.count("lousho: error: session ") == 4
    assert len(dst.sessions.load("alpha")) == 3  # nothing overwritten
    source.close()


def test_sessions_copy_sqlite_to_sqlite(tmp_path: Path) -> None:
    dst_db = tmp_path / "new" / "dst.db"
    dst_db.parent.mkdir()
    with SqliteStore(dst_db) as dst:
        _check_copy(tmp_path / "src.db", str(dst_db), dst)


def test_sessions_copy_sqlite_to_postgres(
    tmp_path: Path, postgres_url: str, postgres_schema: str
) -> None:
    from lousho_sync.postgres import PostgresStore

    target = postgres_url + ("&" if "?" in postgres_url else "?") + f"schema={postgres_schema}"
    with PostgresStore(postgres_url, schema=postgres_schema) as dst:
        _check_copy(tmp_path / "src.db", target, dst)
        listed = lousho("sessions", "--store", target, "list", env=_copy_env())
        assert sorted(listed_ids(listed)) == ["alpha", "beta", "other-1", "p1"]


def test_sessions_copy_picks_by_prefix_or_ids_and_refuses_bad_choices(tmp_path: Path) -> None:
    src = tmp_path / "src.db"
    _fill_source(src).close()
    dst = tmp_path / "dst.db"

    def copy(*args: str) -> subprocess.CompletedProcess[str]:
        return lousho("sessions", "copy", "--from", str(src), "--to", str(dst), *args,
                      env=_copy_env())

    by_prefix = copy("--prefix", "other-")
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert by_prefix.stdout.splitlines()[-1].startswith("copied 1 of 1 sessions")
    missing = copy("beta", "nope")
    assert missing.returncode == 1
    assert "copied beta (4 messages)" in missing.stdout
    assert "session 'nope' not copied: no such session in the source" in missing.stderr
    with SqliteStore(dst) as store:
        assert store.sessions.ids() == ["beta", "other-1"]
    assert copy("--prefix", "a", "alpha").returncode == 2  # ids or --prefix
    assert copy("../etc").returncode == 2  # not a session id
    same = lousho("sessions", "copy", "--from", str(src), "--to", str(src), env=_copy_env())
    assert same.returncode == 2 and "same store" in same.stderr
    absent = lousho("sessions", "copy", "--from", str(tmp_path / "none.db"), "--to", str(dst),
                    env=_copy_env())
    assert absent.returncode == 1 and not (tmp_path / "none.db").exists()


def test_copy_sessions_keeps_metadata_and_history_between_catalog_stores() -> None:
    from lousho_sync._cli_store import copy_sessions
    from lousho_sync.stores.memory import memory_store

    src, dst = memory_store(), memory_store()
    old = [Message("user", "old question"), Message("assistant", "old answer")]
    src.sessions.create("s1", [Message("user", "summary")], metadata={"title": "Trip"},
                        history=old)
    src.sessions.set_metadata("tagged", {"owner": "ali"})  # metadata, no messages
    dst.sessions.save("taken", [Message("user", "mine")])
    src.sessions.save("taken", [Message("user", "theirs")])
    report = copy_sessions(src, dst, ["s1", "tagged", "taken"])
    assert report.copied == [("s1", 1), ("tagged", 0)]
    assert [sid for sid, _ in report.refused] == ["taken"]
    assert dst.sessions.history("s1") == old
    assert dst.sessions.info("s1").metadata == {"title": "Trip"}
    assert dst.sessions.info("tagged").metadata == {"owner": "ali"}
    assert dst.sessions.load("taken") == [Message("user", "mine")]


def test_copy_sessions_into_a_store_without_a_catalog_says_what_stayed_behind(
    tmp_path: Path,
) -> None:
    from lousho_sync._cli_store import copy_sessions
    from lousho_sync.stores.base import supports_catalog
    from lousho_sync.stores.memory import memory_store

    src = memory_store()
    src.sessions.create("s1", [Message("user", "hi")], metadata={"title": "T"})
    with SqliteStore(tmp_path / "dst.db") as dst:
        report = copy_sessions(src, dst, ["s1"])
        assert report.copied == [("s1", 1)]
        assert dst.sessions.load("s1") == [Message("user", "hi")]
        if supports_catalog(dst.sessions):  # a SqliteStore with the catalog keeps it all
            assert report.catalog_dropped == []
            assert dst.sessions.info("s1").metadata == {"title": "T"}
        else:
            assert report.catalog_dropped == ["s1"]
