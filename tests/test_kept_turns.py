"""What a user was told about a turn is true (SPEC §16, §17 "A failed resume keeps the
turn"): a pending turn stays pending until it is finished or discarded; an error raised by a
call that first finished a pending turn carries that turn's result (``error.resumed``) and
says which turn it is about; a turn whose tool may have run is never forgotten."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _http_server import FakeServer, fixture_reply
from conftest import (
    REDIS_START_TIMEOUT,
    WAIT,
    _no_redis,
    _wait_for_ready,
    free_port,
    read_line,
    wait,
)
from test_cli import Chat, failing

from lousho_sync import (
    FileStore,
    LoushoError,
    MemorySessionStore,
    Message,
    PendingTurn,
    ProviderError,
    ScriptedProvider,
    SessionExistsError,
    Step,
    ToolCall,
    create_agent,
    tool,
)
from lousho_sync.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parent.parent


@tool
def look(x: str) -> str:
    """Look."""
    return "seen " + x


LOOK = Step(tool_calls=(ToolCall("l1", "look", {"x": "1"}),))


def users(messages: object) -> list[str]:
    return [m.text for m in messages if m.role == "user"]  # type: ignore[attr-defined]


@contextlib.contextmanager
def turn_in_child(db: Path, session_id: str, text: str) -> Iterator[None]:
    """A real child process runs a turn on the SQLite store ``db``; inside the block its
    first model call is running (the child holds the session's lease); then it is
    SIGKILLed: the turn is left pending, with no progress."""
    child = textwrap.dedent("""
        import sys, threading
        from lousho_sync import ScriptedProvider, create_agent
        from lousho_sync.sqlite import SqliteStore
        def model(request):
            print("IN MODEL", flush=True)
            threading.Event().wait(3600)
        agent = create_agent(provider=ScriptedProvider(default=model),
                             store=SqliteStore(sys.argv[1]))
        agent.session(id=sys.argv[2]).send(sys.argv[3])
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", child, str(db), session_id, text],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert read_line(proc) == "IN MODEL"
        yield
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            stream.close()


def crash_before_first_answer(db: Path, session_id: str, text: str) -> None:
    """A child's turn on ``db`` is SIGKILLed in its first model call: it pends."""
    with turn_in_child(db, session_id, text):
        pass


# --- 5. a failed resume keeps the turn ---------------------------------------------------------
def test_a_crashed_turn_stays_pending_when_resuming_it_fails(tmp_path: Path) -> None:
    # repro_crash_pending_deleted_by_failed_resume.py
    db = tmp_path / "a.db"
    crash_before_first_answer(db, "c", "remember this important request")
    prov = ScriptedProvider([Step(error=ProviderError("transient 500", retryable=True)),
                             Step(error=ProviderError("still 500", retryable=True))],
                            default="done")
    with SqliteStore(db) as store:
        session = create_agent(provider=prov, store=store).session(id="c")
        assert session.pending() == PendingTurn("interrupted")
        with pytest.raises(ProviderError) as failed:
            session.resume()
        assert failed.value.pending is True and "session.resume()" in str(failed.value)
        assert session.pending() == PendingTurn("interrupted")
        with pytest.raises(ProviderError) as again:  # and a second failure too
            session.resume()
        assert again.value.pending is True
        assert session.pending() == PendingTurn("interrupted")
        result = session.resume()
        assert result is not None and result.text == "done"
        assert users(session.messages) == ["remember this important request"]
        assert session.pending() is None


def test_chat_retry_keeps_a_crashed_turn_pending_when_it_fails(tmp_path: Path) -> None:
    crash_before_first_answer(tmp_path / "agent.db", "c1", "remember this")
    with FakeServer() as server:
        server.default = failing()
        chat = Chat(tmp_path, server)
        assert "a pending turn" in chat.expect("you> ")
        chat.type("/retry")
        out = chat.expect("you> ")
        assert "error:" in out and "a turn is pending (it did not finish)" in out
        chat.type("/retry")
        assert "a turn is pending (it did not finish)" in chat.expect("you> ")
        server.default = fixture_reply("openai_text_stream.sse")
        chat.type("/retry")
        assert "agent> Hello" in chat.expect("you> ")
        assert chat.exit() == 0
    with SqliteStore(tmp_path / "agent.db") as store:
        assert users(store.sessions.load("c1")) == ["remember this"]


# --- 6. the finished pending turn's answer reaches the caller ---------------------------------
def test_an_error_after_finishing_a_pending_turn_carries_its_result(tmp_path: Path) -> None:
    # repro_resumed_answer_lost_on_error.py
    prov = ScriptedProvider([LOOK, Step(error=ProviderError("down")), "It has shipped.",
                             Step(error=ProviderError("down again"))], default="fine")
    with SqliteStore(tmp_path / "a.db") as store:
        session = create_agent(provider=prov, tools=[look], store=store).session(id="u")
        with pytest.raises(ProviderError) as first:
            session.send("Where is A7?")
        assert first.value.pending is True and first.value.turn == "own"
        assert first.value.resumed is None
        with pytest.raises(ProviderError) as failed:
            session.send("And B8?")
        error = failed.value
        assert error.turn == "own" and error.pending is False  # B8 failed before progress
        assert error.resumed is not None and error.resumed.text == "It has shipped."
        assert users(error.resumed.messages) == ["Where is A7?"]
        assert session.pending() is None
        assert users(store.sessions.load("u")) == ["Where is A7?"]
        assert session.send("And B8?").text == "fine"
        assert users(store.sessions.load("u")) == ["Where is A7?", "And B8?"]


# --- 7. the error says which turn it is about -------------------------------------------------
def test_an_error_of_the_pending_turn_says_the_new_input_was_not_kept(tmp_path: Path) -> None:
    # repro_pending_refers_to_other_turn.py
    prov = ScriptedProvider([LOOK, Step(error=ProviderError("model down")),
                             Step(error=ProviderError("model still down"))], default="fine")
    with SqliteStore(tmp_path / "a.db") as store:
        session = create_agent(provider=prov, tools=[look], store=store).session(id="s")
        with pytest.raises(ProviderError):
            session.send("A")
        with pytest.raises(ProviderError) as failed:
            session.send("B")
        error = failed.value
        assert error.turn == "resumed" and error.pending is True and error.resumed is None
        assert "this call's own input was not started and not stored" in str(error)
        assert session.pending() == PendingTurn("interrupted")
        assert users(store.sessions.load("s") or ()) == []
        result = session.resume()
        assert result is not None and result.text == "fine"
        assert users(session.messages) == ["A"]  # B was never kept: the caller sends it again


# --- 3. a turn whose tool may have run is never forgotten -------------------------------------
FULL_DISK_CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    from lousho_sync import FileStore, LoushoError, ScriptedProvider, Step, create_agent, tool
    from lousho_sync.sqlite import SqliteStore
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    kind, root = sys.argv[1:]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    charges = []

    @tool(on_interrupted="report")
    def pay(amount: int) -> str:
        \"\"\"Charge the card (report if interrupted).\"\"\"
        charges.append(amount)
        if len(charges) == 1:  # the disk fills while the first charge runs
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        return f"charged {amount}"

    def model(request):
        last = request.messages[-1]
        if last.role == "user":
            return Step(tool_calls=[("pay", {"amount": 5})]) if last.text == "pay 5" else "Hi."
        return "Paid." if "charged" in last.text else "Not sure it was paid."

    store = SqliteStore(root + "/a.db") if kind == "sqlite" else FileStore(root + "/fs")
    agent = create_agent(provider=ScriptedProvider(default=model), tools=[pay], store=store)
    agent.session(id="s").send("hello")
    out = {}
    try:
        agent.session(id="s").send("pay 5")
    except LoushoError as exc:
        out["error"] = [type(exc).__name__, exc.pending, str(exc)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is back
    session = agent.session(id="s")
    out["pending"] = str(session.pending())
    result = session.resume()
    out["resumed"] = None if result is None else result.text
    out["charges"] = charges
    out["messages"] = [[m.role, m.text] for m in session.messages]
    print(json.dumps(out), flush=True)
""")


@pytest.mark.parametrize("kind", ["sqlite", "files"])
def test_a_full_disk_while_a_tool_runs_keeps_the_record_that_it_started(
    tmp_path: Path, kind: str
) -> None:
    # repro_diskfull_forgets_tool.py: a real child process whose file writes start failing
    # (RLIMIT_FSIZE, as a full disk) while an on_interrupted="report" tool runs
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, kind, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    name, pending, message = out["error"]
    assert name == "StoreUnavailableError" and pending is True
    assert "the turn is in doubt" in message and "a tool may have run" in message
    assert out["pending"] == "PendingTurn(status='interrupted', approval_id=None)"
    assert out["charges"] == [5]  # resuming reports the call in doubt; it never charges again
    assert out["resumed"] == "Not sure it was paid."
    roles = [role for role, _ in out["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert out["messages"][2] == ["user", "pay 5"] and "interrupted" in out["messages"][4][1]


# --- 2. a store gone while a tool runs: .pending tells the truth -------------------------------
class RedisServer:
    """A redis-server of this test's own (append-only file, fsync always) that the test
    kills (SIGKILL) and starts again on the same port and directory."""

    def __init__(self, directory: Path) -> None:
        pytest.importorskip("redis", reason="redis-py is not installed: "
                                            "pip install 'lousho[redis]'")
        binary = shutil.which("redis-server")
        if binary is None:
            _no_redis("no redis-server binary on PATH (apt-get install redis-server)")
        self.binary, self.directory, self.port = binary, directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
             str(self.directory), "--save", "", "--appendonly", "yes", "--appendfsync",
             "always", "--daemonize", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        _wait_for_ready(self.proc.stdout.fileno())

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=REDIS_START_TIMEOUT)
            assert proc.stdout is not None
            proc.stdout.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> object:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_redis_server_gone_while_a_tool_runs_leaves_the_turn_pending(
    redis_server: RedisServer,
) -> None:
    # repro_pending_false_but_kept.py
    from lousho_sync.redis import RedisStore

    started, gate = threading.Event(), threading.Event()

    @tool
    def slow(x: str) -> str:
        """Waits for the gate."""
        started.set()
        wait(gate, "the gate")
        return "looked " + x

    def model(request: object) -> object:
        last = list(request.messages)[-1]  # type: ignore[attr-defined]
        return Step(tool_calls=[("slow", {"x": "1"})]) if last.role == "user" else "ok"

    store = RedisStore(redis_server.url, prefix="gone:")
    agent = create_agent(provider=ScriptedProvider(default=model), tools=[slow], store=store)
    box: dict[str, object] = {}

    def turn() -> None:
        try:
            box["result"] = agent.session(id="s").send("question")
        except LoushoError as exc:
            box["error"] = exc

    thread = threading.Thread(target=turn)
    thread.start()
    wait(started, "the tool to start")
    redis_server.kill()
    gate.set()
    thread.join(WAIT)
    assert not thread.is_alive()
    error = box["error"]
    assert isinstance(error, LoushoError) and error.code == "LOUSHO_STORE_UNAVAILABLE"
    assert error.pending is True and "the turn is in doubt" in str(error)
    redis_server.start()
    session = agent.session(id="s")
    assert session.pending() == PendingTurn("interrupted")
    result = session.resume()
    assert result is not None and result.text == "ok"
    assert users(RedisStore(redis_server.url, prefix="gone:").sessions.load("s")) == ["question"]


# --- 4. PostgreSQL: a committed turn whose reply was lost is a success ------------------------
@pytest.mark.timeout(120)
def test_a_committed_turn_whose_reply_was_lost_is_a_success_on_postgres(
    postgres_url: str, postgres_schema: str
) -> None:
    # repro_pg_commit_reply_lost.py: the connection drops after the commit landed (and
    # released the lease); another process takes the lease before the store's retry
    from urllib.parse import urlsplit

    from _cut_proxy import CutProxy

    from lousho_sync.postgres import PostgresStore

    other = PostgresStore(postgres_url, schema=postgres_schema)  # a second process's store
    taken: list[int | None] = []
    proxy = CutProxy(urlsplit(postgres_url).port or 5432, lambda: taken.append(
        other.sessions.acquire_lease("s", owner="other-process", ttl_s=30, wait_s=0)))
    parts = urlsplit(postgres_url)
    url = parts._replace(netloc=parts.netloc.replace(f":{parts.port}", f":{proxy.port}"),
                         query="sslmode=disable").geturl()
    try:
        with PostgresStore(url, schema=postgres_schema) as store:
            agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
            agent.session(id="s").send("first")
            proxy.arm(b"WITH f AS (SELECT token FROM")  # the next commit_turn
            result = agent.session(id="s").send("second")
            assert proxy.cuts == 1 and taken and taken[0] is not None  # the lease was taken
            assert result.text == "ok" and result.finish_reason == "stop"
            other.sessions.release_lease("s", owner="other-process")
            assert agent.session(id="s").pending() is None
        assert users(other.sessions.load("s")) == ["first", "second"]
    finally:
        proxy.close()
        other.close()


# --- 10. the repair of orphaned tool calls is committed with the turn -------------------------
ORPHANED = [Message("user", "x"),
            Message("assistant", "", tool_calls=(ToolCall("c9", "look", {"x": "z"}),)),
            Message("user", "next?")]


def _store_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> object:
    if kind == "memory":
        return MemorySessionStore()
    if kind == "files":
        return FileStore(tmp_path / "f")
    if kind == "sqlite":
        return SqliteStore(tmp_path / "a.db")
    if kind == "redis":
        from lousho_sync.redis import RedisStore
        return RedisStore(request.getfixturevalue("redis_url"),
                          prefix=request.getfixturevalue("redis_prefix"))
    from lousho_sync.postgres import PostgresStore
    return PostgresStore(request.getfixturevalue("postgres_url"),
                         schema=request.getfixturevalue("postgres_schema"))


@pytest.mark.parametrize("kind", ["memory", "files", "sqlite", "redis", "postgres"])
def test_the_repair_of_an_orphaned_tool_call_lasts(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # repro_orphan_repair_lost.py and repro_undo_after_orphan_repair.py
    store: Any = _store_of(kind, tmp_path, request)
    sessions = getattr(store, "sessions", store)
    sessions.save("o", ORPHANED)
    prov = ScriptedProvider(default="ok")
    session = create_agent(provider=prov, tools=[look], store=store).session(id="o")
    with caplog.at_level(logging.WARNING):
        session.send("turn 1")
        session.send("turn 2")
    assert "another writer" not in caplog.text
    shape = ["user", "assistant(tool_calls)", "tool", "user", "user", "assistant", "user"]
    roles = [m.role + ("(tool_calls)" if m.tool_calls else "") for m in prov.requests[1].messages]
    assert roles == shape  # the second request still carries the call's (error) result
    stored = sessions.load("o")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "user", "user",
                                        "assistant", "user", "assistant"]
    assert stored[2].is_error and stored[2].tool_call_id == "c9"
    removed = session.undo()
    assert [m.text for m in removed] == ["turn 2", "ok"]
    assert users(sessions.load("o")) == ["x", "next?", "turn 1"]
    if hasattr(store, "close"):
        store.close()


# --- 9. fork refuses an id holding a pending or running turn ----------------------------------
def test_fork_refuses_an_id_whose_turn_pends_or_runs(tmp_path: Path) -> None:
    # repro_fork_onto_pending_turn.py and repro_fork_onto_running_turn.py
    paid: list[int] = []
    started, gate = threading.Event(), threading.Event()

    @tool(needs_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    def model(request: Any) -> Any:
        last = [m for m in request.messages if m.role == "user"][-1].text
        if last == "pay 7" and request.messages[-1].role == "user":
            return Step(tool_calls=[("pay", {"amount": 7})])
        if last == "slow":
            started.set()
            wait(gate, "the gate")
        return "ok"

    db = tmp_path / "a.db"
    with SqliteStore(db) as store:
        agent = create_agent(provider=ScriptedProvider(default=model), tools=[pay, look],
                             store=store)
        source = agent.session(id="src")
        source.send("source one")
        # a turn paused on an approval
        paused = agent.session(id="waits").send("pay 7")
        with pytest.raises(SessionExistsError, match="pending turn"):
            source.fork("waits")
        assert agent.session(id="waits").pending() is not None
        assert paused.approval_id is not None
        done = agent.approvals.resolve(id=paused.approval_id, approved=True)
        assert done is not None and done.text == "ok" and paid == [7]
        assert users(agent.session(id="waits").messages) == ["pay 7"]
        # a turn running in this process
        thread = threading.Thread(target=lambda: agent.session(id="runs").send("slow"))
        thread.start()
        wait(started, "the turn to start")
        try:
            with pytest.raises(SessionExistsError, match="running a turn"):
                source.fork("runs")
        finally:
            gate.set()
            thread.join(WAIT)
        assert [m.text for m in agent.session(id="runs").messages] == ["slow", "ok"]
        # a turn running in another process, then left pending by its crash
        with turn_in_child(db, "elsewhere", "child's question"), pytest.raises(
            SessionExistsError, match="running a turn"
        ):
            source.fork("elsewhere")
        with pytest.raises(SessionExistsError, match="pending turn"):
            source.fork("elsewhere")
        result = agent.session(id="elsewhere").resume()
        assert result is not None and users(result.messages) == ["child's question"]
        # a free id still forks
        fork = source.fork("free")
        assert users(fork.messages) == ["source one"]


# --- 12. lousho_aio's reader leaving: the same outcome as the sync twin -----------------------
def _twin_script() -> ScriptedProvider:
    return ScriptedProvider([Step(tool_calls=[("look", {"x": "1"})]),
                             Step(chunks=["Do", "ne", "."])])


def _leave_at(event: Any, seen: list[str], where: str) -> bool:
    seen.append(event.type)
    if where == "usage":  # the model asked for a tool; the reader has not seen tool.call
        return event.type == "usage"
    if where == "tool.call":
        return event.type == "tool.call"
    if where == "first text":
        return event.type == "text.delta"
    return event.type == "text.delta" and event.text == "."  # the whole answer seen


@pytest.mark.parametrize("where", ["usage", "tool.call", "first text", "last text"])
def test_an_aio_reader_leaving_gets_what_a_sync_reader_gets(where: str) -> None:
    # repro_aio_runs_tool_reader_left.py
    import asyncio

    import lousho_aio

    ran: list[str] = []

    @tool(name="look")
    def counted(x: str) -> str:
        """Look."""
        ran.append(x)
        return "seen " + x

    session = create_agent(provider=_twin_script(), tools=[counted]).session()
    run = session.stream("go")
    for event in run:
        if _leave_at(event, [], where):
            break
    sync = (run.result().finish_reason, len(ran), len(session.messages))
    ran.clear()

    async def aio() -> tuple[str, int, int]:
        session = lousho_aio.create_agent(provider=_twin_script(), tools=[counted]).session()
        run = session.stream("go")
        async for event in run:
            if _leave_at(event, [], where):
                break
        return (await run.result()).finish_reason, len(ran), len(await session.load())

    assert asyncio.run(aio()) == sync
    expected = {"usage": ("aborted", 0, 0), "tool.call": ("aborted", 0, 0),
                "first text": ("aborted", 1, 0), "last text": ("stop", 1, 4)}
    assert sync == expected[where]


# --- 13. with no store, a session lives as long as its agent ----------------------------------
def test_without_a_store_a_session_lives_as_long_as_its_agent() -> None:
    # repro_default_store_forgets_session.py (and an approval resolved after its session
    # object was dropped: repro_resolve_after_session_dropped.py)
    import gc

    paid: list[int] = []

    @tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Send money."""
        paid.append(amount)
        return f"sent {amount}"

    prov = ScriptedProvider(["hi", Step(tool_calls=[("transfer", {"amount": 5})]), "Sent.",
                             "still here"])
    agent = create_agent(provider=prov, tools=[transfer])
    first = agent.session(id="same")
    first.send("hello")
    del first
    gc.collect()
    again = agent.session(id="same")
    assert [m.text for m in again.messages] == ["hello", "hi"]
    paused = again.send("pay 5")
    assert paused.approval_id is not None
    del again
    gc.collect()
    done = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert done is not None and done.text == "Sent." and paid == [5]
    gc.collect()
    later = agent.session(id="same")
    assert users(later.messages) == ["hello", "pay 5"]
    assert later.send("and now?").text == "still here"
    assert agent.session(id="other").messages == ()  # sessions stay apart
