"""PostgresStore's own behaviour (the shared behaviour is in test_store_contract.py): errors
that never show the password, the schema version, schemas side by side, several processes
creating the schema at once, a dropped connection, and a server restarted mid-run.

Runs on the server of the ``postgres_url`` fixture (skipped with the reason when there is
none; failing under ``CI``). The restart test restarts the server only when
``LOUSHO_TEST_POSTGRES_CTL`` says how (tests/conftest.py sets it for the server it starts)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import WAIT, approval, assistant, free_port, texts, user

from lousho_sync import LoushoError, ScriptedProvider, create_agent
from lousho_sync.errors import (
    ConfigError,
    StoreCorruptError,
    StoreTooNewError,
    StoreUnavailableError,
)
from lousho_sync.stores._lease import make_owner

TIMEOUT = 60.0


@pytest.fixture
def store(postgres_url: str, postgres_schema: str) -> Iterator[Any]:
    from lousho_sync.postgres import PostgresStore

    s = PostgresStore(postgres_url, schema=postgres_schema)
    yield s
    s.close()


def _sql(url: str, text: str, *params: object) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


def _reachable(exc: BaseException) -> Iterator[object]:
    """Every object reachable from ``exc`` through causes, contexts, args and attributes."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, BaseException):
            todo += [obj.__cause__, obj.__context__, *obj.args, *vars(obj).values()]
        elif isinstance(obj, list | tuple | set | frozenset):
            todo += list(obj)
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo += list(vars(obj).values())


def test_an_unreachable_server_names_the_address_never_the_password() -> None:
    from lousho_sync.postgres import PostgresStore

    port = free_port()  # closed: nothing listens there
    store = PostgresStore(f"postgresql://alice:s3cr3t-pw@127.0.0.1:{port}/app",
                          connect_timeout_s=1)
    assert store.address == f"postgresql://alice@127.0.0.1:{port}/app"
    assert "s3cr3t" not in repr(store)
    for call in (lambda: store.sessions.load("s1"),
                 lambda: store.approvals.resolve("a1", approved=True),
                 lambda: store.acquire_lease("s1", owner=make_owner(), ttl_s=1, wait_s=0)):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        err = info.value
        assert store.address in str(err) and err.address == store.address
        assert err.code == "LOUSHO_STORE_UNAVAILABLE"
        for obj in _reachable(err):
            assert not (isinstance(obj, str) and "s3cr3t" in obj), obj
            assert not (isinstance(obj, bytes) and b"s3cr3t" in obj), obj
    store.close()


def test_bad_configuration_is_refused_without_quoting_it(postgres_url: str) -> None:
    from lousho_sync.postgres import PostgresStore

    for schema in ("", "Bad-Name", "1abc", 'x"; DROP TABLE y; --', "a" * 64):
        with pytest.raises(ConfigError):
            PostgresStore(postgres_url, schema=schema)
    with pytest.raises(ConfigError) as info:
        PostgresStore("postgresql://u:s3cr3t@host:notaport:x/db?bogus==")
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(ConfigError):
        PostgresStore(postgres_url, min_size=3, max_size=2)


def test_a_newer_schema_is_refused_naming_both_versions(
    store: Any, postgres_url: str, postgres_schema: str
) -> None:
    from lousho_sync.postgres import SCHEMA_VERSION, PostgresStore

    store.sessions.save("s1", [user("a")])
    _sql(postgres_url, f'UPDATE "{postgres_schema}".schema_version SET version = %s',
         SCHEMA_VERSION + 1)
    with PostgresStore(postgres_url, schema=postgres_schema) as newer, pytest.raises(
        StoreTooNewError
    ) as info:
        newer.sessions.load("s1")
    text = str(info.value)
    assert f"version {SCHEMA_VERSION + 1}" in text and f"version {SCHEMA_VERSION}" in text
    assert "upgrade lousho" in text


def test_schemas_keep_stores_apart(store: Any, postgres_url: str, postgres_schema: str) -> None:
    from lousho_sync.postgres import PostgresStore

    store.sessions.save("s1", [user("mine")])
    with PostgresStore(postgres_url, schema=postgres_schema + "_other") as other:
        assert other.sessions.load("s1") is None
        other.sessions.save("s1", [user("theirs")])
        assert texts(store.sessions.load("s1")) == ["mine"]
        assert texts(other.sessions.load("s1")) == ["theirs"]


OPEN_AT_ONCE = """
import sys
from lousho_sync.postgres import PostgresStore
from lousho_sync.messages import Message
url, schema, who = sys.argv[1:4]
print("ready", flush=True)
sys.stdin.readline()
with PostgresStore(url, schema=schema) as store:
    store.sessions.append(who, [Message("user", who)], expected_length=0)
    print("ok", flush=True)
"""


def test_processes_creating_the_schema_at_once_do_not_race(
    postgres_url: str, postgres_schema: str
) -> None:
    from conftest import run_together

    from lousho_sync.postgres import PostgresStore

    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, postgres_url,
                               postgres_schema, f"p{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(6)]
    outs = run_together(procs)
    assert [o.split() for o, _ in outs] == [["ok"]] * 6  # run_together read "ready"
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        assert store.sessions.ids() == [f"p{i}" for i in range(6)]


def test_a_row_that_is_not_a_message_names_no_content(
    store: Any, postgres_url: str, postgres_schema: str
) -> None:
    store.sessions.save("s1", [user("a"), assistant("b")])
    _sql(postgres_url, f'UPDATE "{postgres_schema}".messages SET json = %s WHERE seq = 1',
         '{"role": "my private text"')
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.load("s1")
    assert "message 1" in str(info.value) and store.address in str(info.value)
    for obj in _reachable(info.value):
        assert not (isinstance(obj, str) and "my private text" in obj)


@pytest.mark.parametrize("gone", [0, 2, 4])
def test_a_missing_row_is_named_wherever_it_was(
    store: Any, postgres_url: str, postgres_schema: str, gone: int
) -> None:
    """The first, a middle or the last message row deleted behind the store's back: the
    load refuses the transcript (never a shorter one) and says rows are missing."""
    store.sessions.save("s1", [user(str(i)) for i in range(5)])
    store.sessions.save("s2", [user("kept")])
    _sql(postgres_url, f'DELETE FROM "{postgres_schema}".messages WHERE seq = %s AND'
         f' session_key = (SELECT key FROM "{postgres_schema}".sessions WHERE id = %s)',
         gone, "s1")
    with pytest.raises(StoreCorruptError, match=r"records 5 messages but 4 rows .*missing"):
        store.sessions.load("s1")
    assert texts(store.sessions.load("s2")) == ["kept"]


def test_a_dropped_connection_is_replaced_and_the_call_succeeds(
    store: Any, postgres_url: str
) -> None:
    """The server ends the store's connections (as a restart or a proxy would): the next
    calls run on new connections, and none of them is applied twice."""
    store.sessions.append("s1", [user("a")], expected_length=0)
    store.approvals.create(approval("a1"))
    _sql(postgres_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
         " WHERE application_name = 'lousho' AND pid <> pg_backend_pid()")
    store.sessions.append("s1", [assistant("b")], expected_length=1)
    assert texts(store.sessions.load("s1")) == ["a", "b"]
    assert store.approvals.resolve("a1", approved=True).status == "approved"


def test_a_retried_commit_or_resolve_sees_its_own_write(store: Any) -> None:
    """A retry after a lost reply: the same one-off token finds its own write instead of a
    conflict (or the loss of a race it won)."""
    from lousho_sync.stores._postgres_ops import append_rows

    db = store._db
    store.sessions.save("s1", [user("a")])
    texts_ = ['{"role":"user","content":"b"}']

    def append(c: Any) -> object:
        with c.transaction():
            return append_rows(db, c, "s1", texts_, 1, "op-1")

    first = db.run("append", append)
    assert db.run("append", append) == first  # the retry: no second copy, no conflict
    assert texts(store.sessions.load("s1")) == ["a", "b"]


# --- the session catalog (schema version 2) -------------------------------------------------


def test_a_version_1_schema_is_migrated_and_its_sessions_catalogued(
    postgres_url: str, postgres_schema: str
) -> None:
    """A store written by schema version 1 (no catalog columns, no history table) is
    migrated forward on first use: its sessions load, are listed with created_at =
    updated_at, and take metadata and compaction."""
    from lousho_sync.postgres import SCHEMA_VERSION, PostgresStore
    from lousho_sync.stores._postgres_db import _MIGRATIONS

    s = f'"{postgres_schema}"'
    _sql(postgres_url, f"CREATE SCHEMA {s}")
    for statement in _MIGRATIONS[1]:
        _sql(postgres_url, statement.replace("{s}", s))
    _sql(postgres_url, f"CREATE TABLE {s}.schema_version (version integer NOT NULL)")
    _sql(postgres_url, f"INSERT INTO {s}.schema_version VALUES (1)")
    for key, (id, when) in enumerate([("old-a", 1000.25), ("old-b", 2000.5)], start=1):
        _sql(postgres_url, f"INSERT INTO {s}.sessions (key, id, length, revision, updated_at)"
             " VALUES (%s, %s, 2, 3, %s)", key, id, when)
        for seq, text in enumerate([f"{id} q", f"{id} a"]):
            role = "user" if seq == 0 else "assistant"
            _sql(postgres_url, f"INSERT INTO {s}.messages VALUES (%s, %s, %s)", key, seq,
                 f'{{"role":"{role}","content":"{text}"}}')
    _sql(postgres_url, f"SELECT setval(pg_get_serial_sequence('{s}.sessions', 'key'), 2)")

    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        assert texts(store.sessions.load("old-a")) == ["old-a q", "old-a a"]
        assert _sql(postgres_url, f"SELECT version FROM {s}.schema_version") == [
            (SCHEMA_VERSION,)]
        info = store.sessions.info("old-a")
        assert (info.messages, info.created_at, info.updated_at, info.metadata) == (
            2, 1000.25, 1000.25, {})
        assert [i.id for i in store.sessions.list()] == ["old-b", "old-a"]
        assert store.sessions.revision("old-a") == (1, 3)
        store.sessions.set_metadata("old-a", {"title": "kept"})
        store.sessions.compact("old-a", [user("summary")], replaced=[user("old-a q")])
        assert texts(store.sessions.history("old-a")) == ["old-a q"]
        assert [i.id for i in store.sessions.list()] == ["old-a", "old-b"]
        assert store.sessions.info("old-a").title == "kept"
        assert store.sessions.info("old-a").created_at == 1000.25
        store.sessions.append("new", [user("n")], expected_length=0)  # the key sequence goes on
        assert store.sessions.ids() == ["new", "old-a", "old-b"]


def test_damaged_metadata_or_history_names_the_session_never_the_content(
    store: Any, postgres_url: str, postgres_schema: str
) -> None:
    s = f'"{postgres_schema}"'
    store.sessions.save("s1", [user("a")])
    store.sessions.set_metadata("s1", {"title": "t"})
    for bad in ('{"title": "my private text"', '["my private text"]', '"my private text"'):
        _sql(postgres_url, f"UPDATE {s}.sessions SET metadata = %s WHERE id = 's1'", bad)
        for call in (lambda: store.sessions.info("s1"), lambda: store.sessions.list()):
            with pytest.raises(StoreCorruptError) as info:
                call()
            err = info.value
            assert "'s1'" in str(err) and "metadata" in str(err) and store.address in str(err)
            assert err.session_id == "s1"
            for obj in _reachable(err):
                assert not (isinstance(obj, str) and "my private text" in obj), obj
        assert texts(store.sessions.load("s1")) == ["a"]  # the transcript still reads
    store.sessions.set_metadata("s1", {"title": "mended"})  # a write replaces the damage
    assert store.sessions.info("s1").title == "mended"

    store.sessions.compact("s1", [user("sum")], replaced=[user("a"), user("b")])
    _sql(postgres_url, f"UPDATE {s}.history SET json = %s WHERE seq = 1", "my private text")
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.history("s1")
    assert "history message 1" in str(info.value) and "'s1'" in str(info.value)
    for obj in _reachable(info.value):
        assert not (isinstance(obj, str) and "my private text" in obj), obj
    _sql(postgres_url, f"DELETE FROM {s}.history WHERE seq = 0")
    with pytest.raises(StoreCorruptError, match="rows are missing"):
        store.sessions.history("s1")


def test_list_is_one_index_scan_and_reads_no_message(store: Any, postgres_url: str,
                                                     postgres_schema: str) -> None:
    s = f'"{postgres_schema}"'
    store.sessions.ids()  # create the schema
    _sql(postgres_url, f"INSERT INTO {s}.sessions (id, length, revision, created_at,"
         " updated_at) SELECT 's' || g, 3, 1, g, g FROM generate_series(1, 10000) g")
    _sql(postgres_url, f"ANALYZE {s}.sessions")
    page = store.sessions.list(limit=100)
    page = store.sessions.list(limit=100, after=page.next)
    assert [i.id for i in page][:2] == ["s9900", "s9899"] and page.items[0].messages == 3
    plan = " ".join(r[0] for r in _sql(
        postgres_url, f"EXPLAIN SELECT id, length, created_at, updated_at, metadata FROM"
        f" {s}.sessions WHERE updated_at <= %s AND (updated_at < %s OR id > %s)"
        " ORDER BY updated_at DESC, id LIMIT 101", 9900.0, 9900.0, "s9900"))
    assert "Index Scan" in plan and "sessions_by_update" in plan and "Sort" not in plan, plan
    assert "messages" not in plan


def test_a_retried_compaction_sees_its_own_write(store: Any) -> None:
    from lousho_sync.stores.postgres import _replace

    db = store._db
    store.sessions.save("s1", [user("a"), user("b")])

    def replace(c: Any) -> object:
        with c.transaction():
            return _replace(db, c, "s1", ['{"role":"user","content":"sum"}'], "op-1")

    assert db.run("compact", replace) is not None
    assert db.run("compact", replace) is None  # the retry: it landed, nothing rewritten
    assert texts(store.sessions.load("s1")) == ["sum"]


# --- the server restarted mid-run ------------------------------------------------------------


def _restart_command() -> list[str]:
    ctl = os.environ.get("LOUSHO_TEST_POSTGRES_CTL")
    if not ctl:
        pytest.skip("LOUSHO_TEST_POSTGRES_CTL is not set: this test restarts the server only "
                    "when told how (tests/conftest.py sets it for the server it starts)")
    command = [*shlex.split(ctl), "restart", "-m", "fast", "-w", "-t", "60"]
    if os.geteuid() == 0:  # pg_ctl refuses root: run it as the server's owner
        command = ["runuser", "-u", "postgres", "--", *command]
    return command


@pytest.mark.timeout(300)
def test_a_server_restart_loses_no_acknowledged_turn(
    postgres_url: str, postgres_schema: str
) -> None:
    from lousho_sync.postgres import PostgresStore

    command = _restart_command()
    store = PostgresStore(postgres_url, schema=postgres_schema)
    agent = create_agent(provider=ScriptedProvider(default=lambda r: "re: " + r.messages[-1].text),
                         store=store)
    acked: list[str] = []
    failures: list[str] = []
    enough_before = threading.Event()
    enough_after = threading.Event()
    restarted = threading.Event()
    stop = threading.Event()

    def sender() -> None:
        session = agent.session(id="s1")
        i = 0
        while not stop.is_set():
            text = f"m{i}"
            i += 1
            try:
                session.send(text)
            except LoushoError as exc:  # raised during the restart: the next call retries
                failures.append(exc.code)
                continue
            acked.append(text)
            if len(acked) >= 20:
                enough_before.set()
            if restarted.is_set() and len(acked) - mark[0] >= 20:
                enough_after.set()

    mark = [0]  # how many turns were acknowledged when the restart finished
    thread = threading.Thread(target=sender)
    thread.start()
    try:
        assert enough_before.wait(WAIT * 3), "no turns before the restart"
        # no pipes: the restarted server inherits them and would hold them open
        out = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, timeout=TIMEOUT)
        assert out.returncode == 0, "pg_ctl restart failed"
        mark[0] = len(acked)
        restarted.set()
        assert enough_after.wait(TIMEOUT), f"no turns after the restart ({failures})"
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    session = agent.session(id="s1")
    session.resume()  # a turn that raised during the restart may be pending: finish it
    stored = [m.text for m in session.load() if m.role == "user"]
    assert len(stored) == len(set(stored)), "a turn was stored twice"
    assert [t for t in acked if t not in stored] == [], "an acknowledged turn was lost"
    store.close()


def _lousho(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lousho_sync", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def test_the_cli_lists_sessions_of_a_postgres_store(
    store: Any, postgres_url: str, postgres_schema: str
) -> None:
    # ?schema= picks the store's schema (the CLI's default is "lousho"; a test's own keeps
    # it apart from other runs on the same server)
    url = postgres_url + ("&" if "?" in postgres_url else "?") + f"schema={postgres_schema}"
    store.sessions.save("cli-listed", [user("hi")])
    out = _lousho("sessions", "--store", url, "list")
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == ["cli-listed"]
    shown = _lousho("sessions", "--store", url, "show", "cli-listed")
    assert shown.returncode == 0 and shown.stdout == "user: hi\n", shown.stderr


def test_the_cli_reports_a_down_server_in_one_line_without_the_password() -> None:
    port = free_port()
    out = _lousho("sessions", "--store", f"postgresql://al:s3cr3t@127.0.0.1:{port}/db", "list")
    assert out.returncode != 0
    assert "s3cr3t" not in out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], out.stderr


class _OutageProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that can go away: :meth:`down`
    closes its port and every connection through it (the server is unreachable), :meth:`up`
    listens on the same port again."""

    def __init__(self, target: int) -> None:
        import socket

        self._socket = socket
        self._target = target
        self._open: list[Any] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._serve()

    def _serve(self) -> None:
        listener = self._listener

        def accept() -> None:
            while True:
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                server = self._socket.create_connection(("127.0.0.1", self._target))
                self._open += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def _pipe(self, src: Any, dst: Any) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        self._close(src, dst)

    def _close(self, *socks: Any) -> None:
        for s in socks:
            try:
                s.shutdown(self._socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def down(self) -> None:
        self._close(self._listener)  # (shut down first: that wakes the accept() blocked on it)
        self._close(*self._open)
        self._open = []

    def up(self) -> None:
        self._listener = self._socket.create_server(("127.0.0.1", self.port))
        self._serve()


def test_an_outage_fails_calls_within_pool_timeout_and_the_first_call_after_it_succeeds(
    postgres_url: str, postgres_schema: str
) -> None:
    from urllib.parse import urlsplit

    from lousho_sync.postgres import PostgresStore

    with pytest.raises(ConfigError, match="pool_timeout_s must be > 0"):
        PostgresStore(postgres_url, pool_timeout_s=0)
    parts = urlsplit(postgres_url)
    proxy = _OutageProxy(parts.port or 5432)
    url = parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
    store = PostgresStore(url, schema=postgres_schema, connect_timeout_s=1.0, pool_timeout_s=1.0)
    try:
        store.sessions.save("a", [user("x")])
        proxy.down()
        # the outage lasts while these calls fail, each after the pool_timeout_s it was
        # given; meanwhile the pool's reconnection backoff would grow past several seconds
        for _ in range(6):
            with pytest.raises(StoreUnavailableError, match="reachable"):
                store.sessions.load("a")
        proxy.up()
        assert texts(store.sessions.load("a")) == ["x"]  # at once, not after the backoff
    finally:
        store.close()
        proxy.down()


def test_a_process_that_never_closes_its_store_exits_without_waiting_on_the_pool(
    postgres_url: str, postgres_schema: str
) -> None:
    """A script that forgets ``close()`` exits at once: the store closes its pool at exit,
    while the pool's threads still run (psycopg_pool's own finaliser, run during interpreter
    shutdown, waited 5 s per thread and printed "couldn't stop thread" on Python 3.13)."""
    script = (
        "import sys\n"
        "from lousho_sync.postgres import PostgresStore\n"
        "store = PostgresStore(sys.argv[1], schema=sys.argv[2])\n"
        "store.sessions.save('s', [])\n"
        "print(store.sessions.load('s'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, postgres_url, postgres_schema],
                          capture_output=True, text=True, timeout=WAIT * 3)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("[]", "None")
    assert "couldn't stop thread" not in done.stderr, done.stderr


def test_a_dropped_store_is_collected_and_its_listening_thread_ends(
    postgres_url: str, postgres_schema: str
) -> None:
    """The store's LISTEN thread (event-log readers and mailbox owners wait on it) holds the
    store weakly: a store dropped without ``close()`` is collected, and the thread ends."""
    import gc
    import weakref

    from lousho_sync.postgres import PostgresStore

    before = set(threading.enumerate())
    store = PostgresStore(postgres_url, schema=postgres_schema)
    session = create_agent(provider=ScriptedProvider(default="ok"), store=store).session(
        id="dropped")
    assert session.send("hi").text == "ok"  # its turn's mailbox watcher subscribed
    store.sessions.event_ops().wait("no-such-turn", -1, 0.01)  # an event-log reader did
    listening = [t for t in threading.enumerate()
                 if t not in before and t.name.startswith("lousho-listen")]
    watchers = [t for t in threading.enumerate()
                if t not in before and t.name == "lousho-mailbox"]
    assert len(listening) == 1
    dropped, its_db = weakref.ref(store), weakref.ref(store._db)
    del store, session
    for t in watchers:  # a watcher ends a while after its last turn
        t.join(TIMEOUT)
    gc.collect()
    assert dropped() is None and its_db() is None  # (its pool closed by its finaliser)
    listening[0].join(TIMEOUT)
    assert not listening[0].is_alive()


def _idle_limit(store: Any) -> str:
    return str(store._db.run("read a setting", lambda c: c.execute(
        "SHOW idle_in_transaction_session_timeout").fetchone()[0]))


def test_the_server_ends_a_stores_session_idle_in_a_transaction(
    store: Any, postgres_url: str, postgres_schema: str
) -> None:
    """A client stopped inside a transaction would keep its rows locked (a takeover of
    its turn would wait for it): the store's sessions carry
    idle_in_transaction_session_timeout, 10 s unless the conninfo's options set it."""
    from lousho_sync.postgres import PostgresStore

    assert _idle_limit(store) == "10s"
    sep = "&" if "?" in postgres_url else "?"
    own = f"{postgres_url}{sep}options=-c%20idle_in_transaction_session_timeout%3D2500"
    with PostgresStore(own, schema=postgres_schema) as mine:
        assert _idle_limit(mine) == "2500ms"
