"""The lousho command end to end: chat through piped stdin against a real HTTP server on
127.0.0.1 speaking the OpenAI wire format, and sessions on real stores."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from _http_server import FakeServer, Recorded, Reply, fixture_reply

from lousho_sync import ScriptedProvider, create_agent
from lousho_sync.cli import open_store

WAIT = 30.0


class Chat:
    """``lousho chat`` in a child process, its stdout read by a thread."""

    def __init__(self, tmp: Path, server: FakeServer, *extra: str) -> None:
        env = {**os.environ, "OPENAI_BASE_URL": server.url + "/v1",
               "OPENAI_API_KEY": "sk-test-chat-key-123456"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lousho_sync.cli", "chat", "--model", "openai/gpt-4o-mini",
             "--store", str(tmp / "agent.db"), "--session", "c1", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=tmp,
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
        chat.type("/exit")
        assert chat.proc.wait(WAIT) == 0
    stored = create_agent(provider=ScriptedProvider(default="x"),
                          store=open_store(str(tmp_path / "agent.db"))).session(id="c1")
    assert [m.role for m in stored.messages] == ["user", "assistant"]
    assert stored.messages[1].text.startswith("Hello")


def test_chat_without_a_key_names_the_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "LOUSHO_MODEL")}
    proc = subprocess.run([sys.executable, "-m", "lousho_sync.cli", "chat"], input="",
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=WAIT)
    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stderr


@pytest.mark.parametrize("kind", ["sqlite", "files"])
def test_sessions_list_show_delete_prune(kind: str, tmp_path: Path) -> None:
    path = str(tmp_path / ("agent.db" if kind == "sqlite" else "store"))
    agent = create_agent(provider=ScriptedProvider(default="pong"), store=open_store(path))
    agent.session(id="alpha").send("ping")
    agent.session(id="beta").send("ping")

    def lousho(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lousho_sync.cli", "sessions", "--store",
                               path, *args], capture_output=True, text=True, timeout=WAIT)

    assert lousho("list").stdout.split() == ["alpha", "beta"]
    assert lousho("show", "alpha").stdout.splitlines() == ["user: ping", "assistant: pong"]
    assert lousho("delete", "alpha").returncode == 0
    assert lousho("list").stdout.split() == ["beta"]
    missing = lousho("show", "alpha")
    assert missing.returncode == 1 and "no session 'alpha'" in missing.stderr
    bad = lousho("show", "../etc")
    assert bad.returncode == 2 and "^[A-Za-z0-9_-]{1,128}$" in bad.stderr
    pruned = lousho("prune", "--older-than", "7d")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("pruned 0 sessions")
    assert lousho("list").stdout.split() == ["beta"]


def test_file_store_prune_keeps_fresh_and_pending(tmp_path: Path) -> None:
    from lousho_sync import FileStore, Step, tool

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
    old = store.sessions.path_for("old")
    os.utime(old, (1, 1))  # last written in 1970
    result = store.prune(older_than_s=86400)
    assert (result.sessions, result.approvals) == (1, 0)
    assert store.sessions.ids() == [] and len(agent.approvals.list()) == 1
