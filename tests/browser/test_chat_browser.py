"""The chat page of examples/flask_app.py in a real browser: headless Chromium (selenium)
against the example served by ``flask run`` in a child process on 127.0.0.1, a real SQLite
file, the model answering a word every ``PACE_S`` seconds.

1. a TCP proxy in front of the server cuts the event stream three times mid-answer: the
   page's EventSource reconnects by itself (sending Last-Event-ID), and the page ends with
   the committed answer, exactly once;
2. the page is reloaded mid-turn: it re-attaches and shows the whole answer;
3. two tabs on one session show the same live answer;
4. under gunicorn with 4 workers (SQLite, PostgreSQL), a turn started by one worker's POST
   is streamed to the page by another worker (the access log names each request's worker);
5. the gunicorn worker that runs the turn is SIGKILLed mid-answer: another worker takes the
   turn over, the page shows a ``step.reset`` and still ends with the committed answer, once;
6. the README's Flask section, copied with the page beside it, survives three cuts too.

Skipped with the reason, or failing under CI, as tests/browser/test_inbox_browser.py is; a
failing test saves each browser's screenshot, page and console log there.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import test_inbox_browser
from conftest import free_port
from test_inbox_browser import WAIT, Browsers, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
browsers = test_inbox_browser.browsers  # the fixture: headless Chromium, artifacts on failure
PACE_S = 0.1
QUESTION = " ".join(f"word{i}" for i in range(50))


class CutProxy:
    """Forwards every connection to ``port``; the first ``cuts`` responses to a
    ``GET .../events`` are cut (both sockets closed) right after ``after`` frames holding
    ``marker`` (text deltas) went through, in the middle of the next such frame."""

    def __init__(self, port: int, cuts: int, after: int,
                 marker: bytes = b"event: text.delta") -> None:
        self._target = port
        self._after = after
        self._marker = marker
        self._lock = threading.Lock()
        self.to_cut = cuts
        self.cut = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [client, upstream]
            state = {"events": False}
            threading.Thread(target=self._up, args=(client, upstream, state),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, state),
                             daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if chunk.startswith((b"GET ", b"POST ")):
                    state["events"] = chunk.startswith(b"GET ") and b"/events" in \
                        chunk.split(b"\r\n", 1)[0]
                dst.sendall(chunk)
        self._close(src, dst)

    def _down(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                cut_at = None
                if state["events"]:
                    at = chunk.find(self._marker)
                    while at >= 0:
                        if seen == self._after:  # the next such frame: cut before it
                            with self._lock:
                                if self.to_cut > 0:
                                    self.to_cut -= 1
                                    self.cut += 1
                                    cut_at = at
                            break
                        seen += 1
                        at = chunk.find(self._marker, at + 1)
                dst.sendall(chunk if cut_at is None else chunk[:cut_at])
                if cut_at is not None:
                    break
        self._close(src, dst)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._listener.close()
        self._close(*self._sockets)


@contextlib.contextmanager
def served(tmp: Path) -> Iterator[int]:
    """examples/flask_app.py by ``flask run`` in a child process; its port."""
    port = free_port()
    env = {**os.environ, "LOUSHO_DB": str(tmp / "chat.db"),
           "LOUSHO_EXAMPLE_PACE_S": str(PACE_S), "PYTHONPATH": str(ROOT)}
    env.pop("LOUSHO_MODEL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", str(ROOT / "examples" / "flask_app.py"),
         "run", "--port", str(port)], env=env, cwd=tmp,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # flask prints where it listens
            if f"127.0.0.1:{port}".encode() in line:
                break
        else:
            pytest.fail(f"the example did not start (exit {proc.wait()})")
        threading.Thread(target=lambda: [None for _ in proc.stdout or ()],  # drain
                         daemon=True).start()
        yield port
    finally:
        proc.terminate()
        proc.wait(WAIT)


def committed(port: int, user: str) -> list[dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("GET", f"/chat/{quote(user)}")
    messages: list[dict[str, Any]] = json.loads(conn.getresponse().read())["messages"]
    conn.close()
    return messages


def open_chat(driver: Any, port: int, user: str) -> None:
    driver.get(f"http://127.0.0.1:{port}/?user={quote(user)}")
    wait_for(driver, lambda d: d.execute_script(
        "return document.documentElement.dataset.chatReady") == "1", "the chat page")


def send(driver: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "message").send_keys(text)
    driver.find_element(By.ID, "send").click()


def answer_shown(driver: Any) -> str:
    return str(driver.execute_script("return document.getElementById('answer').textContent"))


def wait_done(driver: Any) -> None:
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.done") == "stop",
             "the end of the turn")


def assistant_texts(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#transcript li.assistant")]


def test_the_page_reconnects_after_three_cuts_and_shows_the_answer_once(
    browsers: Browsers, tmp_path: Path
) -> None:
    with served(tmp_path) as port:
        proxy = CutProxy(port, cuts=3, after=3)
        try:
            driver = browsers.open()
            open_chat(driver, proxy.port, "ali")
            send(driver, QUESTION)
            wait_done(driver)
            assert proxy.cut == 3
            assert int(driver.execute_script("return document.body.dataset.opens")) >= 4
        finally:
            proxy.close()
        answer = committed(port, "ali")[-1]
        assert answer["role"] == "assistant"
        assert answer["text"] == f"Message 1 received: {QUESTION}"
        assert assistant_texts(driver) == [answer["text"]]
        body = driver.execute_script("return document.body.textContent")
        assert body.count(answer["text"]) == 1
        assert answer_shown(driver) == ""


def test_a_reload_mid_turn_reattaches_and_shows_the_whole_answer(
    browsers: Browsers, tmp_path: Path
) -> None:
    with served(tmp_path) as port:
        driver = browsers.open()
        open_chat(driver, port, "bo")
        send(driver, QUESTION)
        wait_for(driver, lambda d: "word3" in answer_shown(d), "a part of the answer")
        driver.refresh()
        open_chat(driver, port, "bo")
        # read from the turn's start: the text shown before the reload is back, then the rest
        wait_for(driver, lambda d: answer_shown(d).startswith("Message 1 received: word0 word1")
                 and "word20" in answer_shown(d), "the whole answer so far after the reload")
        wait_done(driver)
        answer = committed(port, "bo")[-1]["text"]
        assert answer == f"Message 1 received: {QUESTION}"
        assert assistant_texts(driver) == [answer]


def test_two_tabs_show_the_same_live_answer(browsers: Browsers, tmp_path: Path) -> None:
    with served(tmp_path) as port:
        first, second = browsers.open(), browsers.open()
        open_chat(first, port, "cy")
        send(first, QUESTION)
        wait_for(first, lambda d: "word2" in answer_shown(d), "a part of the answer")
        open_chat(second, port, "cy")  # opened mid-turn: it follows the same turn
        wait_for(second, lambda d: "word10" in answer_shown(d), "the live answer")
        turn = first.execute_script("return document.body.dataset.turn")
        assert second.execute_script("return document.body.dataset.turn") == turn
        for driver in (first, second):
            wait_done(driver)
        answer = committed(port, "cy")[-1]["text"]
        assert assistant_texts(first) == assistant_texts(second) == [answer]


# --- under gunicorn: 4 worker processes share the store ------------------------------------


class Gunicorn:
    """examples/flask_app.py under gunicorn with 4 workers (threads for the event streams,
    no keep-alive: each request takes a fresh connection, so any worker may serve it); the
    access log names the worker process that served each request."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
        self.port = free_port()
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-w", "4", "--threads", "8", "--keep-alive",
             "0", "-b", f"127.0.0.1:{self.port}", "--chdir", str(ROOT / "examples"),
             "--access-logfile", "-", "--access-logformat", "served %(p)s %(m)s %(U)s %(s)s",
             "flask_app:app"], env=env, cwd=tmp, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(lambda: sum("Booting worker" in line for line in self.lines) >= 4,
                      "4 workers")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    def wait_for(self, condition: Any, what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: condition() or "<exited>" in self.lines,
                                          timeout=WAIT) or "<exited>" in self.lines:
                pytest.fail(f"gunicorn: no {what}:\n" + "\n".join(self.lines[-40:]))

    def served(self, method: str, path_start: str) -> list[str]:
        """The worker pids that served ``method`` requests whose path starts so, in order."""
        with self._changed:
            return [line.split()[1].strip("<>") for line in self.lines
                    if line.startswith("served ")
                    and line.split()[2] == method and line.split()[3].startswith(path_start)]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(WAIT)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_under_gunicorn_another_worker_streams_the_turn(
    kind: str, browsers: Browsers, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOUSHO_EXAMPLE_PACE_S": "0.02"}
    env.pop("LOUSHO_MODEL", None)
    env.pop("LOUSHO_POSTGRES_URL", None)
    if kind == "postgres":
        env["LOUSHO_POSTGRES_URL"] = request.getfixturevalue("postgres_url")
        env["LOUSHO_POSTGRES_SCHEMA"] = request.getfixturevalue("postgres_schema")
    else:
        env["LOUSHO_DB"] = str(tmp_path / "chat.db")
    server = Gunicorn(tmp_path, env)
    try:
        driver = browsers.open()
        open_chat(driver, server.port, "dee")
        crossed = 0
        for n in range(1, 9):  # until a turn was started by one worker and streamed by another
            question = f"question {n} " + " ".join(f"w{i}" for i in range(10))
            send(driver, question)
            wait_for(driver, lambda d, n=n: len(assistant_texts(d)) == n, f"answer {n}")
            answer = committed(server.port, "dee")[-1]["text"]
            assert answer == f"Message {n} received: {question}"
            assert assistant_texts(driver)[-1] == answer
            server.wait_for(lambda n=n: len(server.served("GET", "/chat/dee/events")) >= n,
                            "access log line of the event stream")
            posted = server.served("POST", "/chat/dee")[-1]
            streamed = server.served("GET", "/chat/dee/events")[-1]
            crossed += posted != streamed
            if crossed:
                break
        assert crossed, "every turn was streamed by the worker that started it"
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_worker_running_the_turn_is_killed_and_the_page_still_ends_whole(
    kind: str, browsers: Browsers, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOUSHO_EXAMPLE_PACE_S": "0.1"}
    env.pop("LOUSHO_MODEL", None)
    env.pop("LOUSHO_POSTGRES_URL", None)
    if kind == "postgres":
        env["LOUSHO_POSTGRES_URL"] = request.getfixturevalue("postgres_url")
        env["LOUSHO_POSTGRES_SCHEMA"] = request.getfixturevalue("postgres_schema")
    else:
        env["LOUSHO_DB"] = str(tmp_path / "chat.db")
    server = Gunicorn(tmp_path, env)
    try:
        driver = browsers.open()
        open_chat(driver, server.port, "eve")
        send(driver, QUESTION)
        wait_for(driver, lambda d: "word5" in answer_shown(d), "a part of the answer")
        server.wait_for(lambda: bool(server.served("POST", "/chat/eve")), "the POST's line")
        runner = int(server.served("POST", "/chat/eve")[-1])  # it drives the turn
        os.kill(runner, signal.SIGKILL)  # mid-answer
        wait_done(driver)
        resets = driver.execute_script("return document.body.dataset.resets")
        assert resets is not None and int(resets) >= 1, "no step.reset reached the page"
        answer = committed(server.port, "eve")[-1]
        assert (answer["role"], answer["text"]) == ("assistant",
                                                    f"Message 1 received: {QUESTION}")
        assert assistant_texts(driver) == [answer["text"]]
        body = driver.execute_script("return document.body.textContent")
        assert body.count(answer["text"]) == 1
    finally:
        server.stop()


def test_the_readme_flask_app_with_the_page_survives_dropped_connections(
    browsers: Browsers, tmp_path: Path
) -> None:
    """What a user gets who copies the README's Flask section and the page beside it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_readme import PYTHON_BLOCKS

    (block,) = [code for heading, code in PYTHON_BLOCKS
                if heading.startswith("Streaming an answer over HTTP")]
    (tmp_path / "chat.py").write_text(block)
    (tmp_path / "chat.html").write_text((ROOT / "examples" / "static" / "chat.html").read_text())
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "chat.py", "run",
                             "--port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if f"127.0.0.1:{port}".encode() in line:
                break
        else:
            pytest.fail(f"the README app did not start (exit {proc.wait()})")
        threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
        # every event stream is cut after its first frame, three times
        proxy = CutProxy(port, cuts=3, after=1, marker=b"\nevent: ")
        try:
            driver = browsers.open()
            open_chat(driver, proxy.port, "reader")
            send(driver, "Hi")
            wait_done(driver)
            assert proxy.cut == 3
        finally:
            proxy.close()
        answer = committed(port, "reader")[-1]
        assert (answer["role"], answer["text"]) == ("assistant", "Hello from lousho.")
        assert assistant_texts(driver) == ["Hello from lousho."]
        body = driver.execute_script("return document.body.textContent")
        assert body.count("Hello from lousho.") == 1
    finally:
        proc.terminate()
        proc.wait(WAIT)
