"""SqliteStore: real SQLite files in tmp_path and real processes: its file header, schema
version, journal and synchronous settings, rows, and processes sharing one file. The
behaviour every store shares is tested once per store in test_store_contract.py."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import approval, assistant, checkpoint, read_line, run_together, texts, user

from lousho_sync.codec import dumps_checkpoint, dumps_message
from lousho_sync.errors import ConfigError, StoreCorruptError, StoreTooNewError
from lousho_sync.records import Fence
from lousho_sync.sqlite import SCHEMA_VERSION, SqliteStore
from lousho_sync.stores._lease import make_owner

TIMEOUT = 60.0


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db_path: Path):
    with SqliteStore(db_path) as s:
        yield s


def raw(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection to the store's file (to age rows, read counts)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    return conn


# --- rows ------------------------------------------------------------------------------------


def test_replaced_deleted_and_pruned_sessions_leave_no_message_rows(
    store: SqliteStore, db_path: Path
) -> None:
    store.sessions.save("s1", [user("hi"), assistant("hello")])
    store.sessions.save("s1", [user("only")])
    store.sessions.save("s2", [user("x")])
    store.sessions.save("s1", [])
    store.sessions.delete("s2")
    with raw(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    store.sessions.save("old", [user("a"), user("b")])
    store.sessions.save("new", [user("c")])
    with raw(db_path) as conn:  # two hours ago, written directly: no waiting
        conn.execute("UPDATE sessions SET updated_at = updated_at - 7200 WHERE id = 'old'")
    assert store.prune(3600).sessions == 1
    with raw(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1


# --- opening, versions, files ----------------------------------------------------------------


def test_new_file_schema_wal_and_parent_dir(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "lousho.db"
    with SqliteStore(path) as s:
        s.sessions.save("s1", [user("kept")])
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    with SqliteStore(path, synchronous="normal") as s:
        assert texts(s.sessions.load("s1")) == ["kept"]


def test_not_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 50
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        SqliteStore(path)
    assert str(path) in str(info.value) and info.value.path == str(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_damaged_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 20
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        SqliteStore(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = raw(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 41}")
    conn.close()
    with pytest.raises(StoreTooNewError) as info:
        SqliteStore(path)
    message = str(info.value)
    assert str(path) in message and info.value.path == str(path)
    assert f"version {SCHEMA_VERSION + 41}" in message and f"version {SCHEMA_VERSION}" in message
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 41
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    conn.close()


# The schema of version 1, as the first release wrote it.
SCHEMA_1 = (
    "CREATE TABLE sessions (key INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " length INTEGER NOT NULL, revision INTEGER NOT NULL, updated_at REAL NOT NULL)",
    "CREATE TABLE messages (id INTEGER PRIMARY KEY, json TEXT NOT NULL)",
    "CREATE TABLE checkpoints (key TEXT PRIMARY KEY, session_id TEXT, json TEXT NOT NULL,"
    " updated_at REAL NOT NULL) WITHOUT ROWID",
    "CREATE TABLE approvals (id TEXT PRIMARY KEY, session_id TEXT, status TEXT NOT NULL,"
    " reason TEXT, json TEXT NOT NULL, created_at REAL NOT NULL, resolved_at REAL)"
    " WITHOUT ROWID",
    "CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL,"
    " expires_at REAL NOT NULL) WITHOUT ROWID",
)


def test_a_version_1_file_is_migrated_on_open_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = raw(path)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in SCHEMA_1:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions VALUES (1, 's1', 2, 3, 100.0)")
    for seq, m in enumerate([user("a"), assistant("b")]):
        conn.execute("INSERT INTO messages VALUES (?, ?)", ((1 << 32) + seq, dumps_message(m)))
    conn.execute("INSERT INTO checkpoints VALUES ('s1.turn-2', 's1', ?, 100.0)",
                 (dumps_checkpoint(checkpoint("s1.turn-2")),))
    conn.execute("INSERT INTO leases VALUES ('s1', 'old-host:1:x', 50.0)")  # long expired
    conn.execute("INSERT INTO leases VALUES ('s2', ?, ?)", (make_owner(), 9e12))  # held
    conn.close()
    with SqliteStore(path) as store:
        assert texts(store.sessions.load("s1")) == ["a", "b"]
        assert store.sessions.revision("s1") == (1, 3)
        assert store.checkpoints.keys("s1.") == ["s1.turn-2"]
        assert store.sessions.fence_token("s1") == 0
        assert store.sessions.acquire_lease("s2", owner=make_owner(), ttl_s=60, wait_s=0) is None
        token = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=60, wait_s=0)
        assert token == 1
        store.commit_turn("s1", [user("c")], expected_length=2, checkpoint_key="s1.turn-2",
                          fence=Fence("s1", token), release=True)
        assert texts(store.sessions.load("s1")) == ["a", "b", "c"]
        assert store.checkpoints.keys("s1.") == []
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert conn.execute("SELECT owner, token FROM leases WHERE session_id = 's1'").fetchone() == (
        "", 1)  # released, the token kept
    conn.close()
    with SqliteStore(path) as again:  # opening a migrated file changes nothing
        assert again.sessions.fence_token("s1") == 1
        assert texts(again.sessions.load("s1")) == ["a", "b", "c"]


# Version 2 added the lease's fence token.
SCHEMA_2 = (*SCHEMA_1, "ALTER TABLE leases ADD COLUMN token INTEGER NOT NULL DEFAULT 0")


def test_a_version_2_file_gets_the_catalog_on_open(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    conn = raw(path)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in SCHEMA_2:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    stored = {"old": (1, 100.25, ["a", "b"]), "new": (2, 200.5, ["c"]), "tie": (3, 200.5, ["d"])}
    for id, (key, updated_at, words) in stored.items():
        conn.execute("INSERT INTO sessions VALUES (?, ?, ?, 7, ?)",
                     (key, id, len(words), updated_at))
        for seq, word in enumerate(words):
            conn.execute("INSERT INTO messages VALUES (?, ?)",
                         ((key << 32) + seq, dumps_message(user(word))))
    conn.execute("INSERT INTO leases VALUES ('old', '', 0, 4)")  # released, token 4
    conn.close()
    with SqliteStore(path) as store:
        sessions = store.sessions
        page = sessions.list()
        assert [(i.id, i.messages, i.created_at, i.updated_at, dict(i.metadata))
                for i in page] == [
            ("new", 1, 200.5, 200.5, {}), ("tie", 1, 200.5, 200.5, {}),
            ("old", 2, 100.25, 100.25, {})]
        assert page.next is None
        assert [i.id for i in sessions.list(limit=1, after=sessions.list(limit=1).next)] == [
            "tie"]
        assert texts(sessions.load("old")) == ["a", "b"]
        assert sessions.revision("old") == (1, 7) and sessions.fence_token("old") == 4
        assert sessions.history("old") == [] and sessions.ids() == ["new", "old", "tie"]
        sessions.append("old", [assistant("e")], expected_length=2)
        sessions.set_metadata("new", {"title": "kept"})
        info = sessions.info("old")
        assert info is not None and info.created_at == 100.25 and info.updated_at > 200.5
        assert info.messages == 3
        assert [i.id for i in sessions.list()] == ["new", "old", "tie"]
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT id FROM sessions"
                        " ORDER BY updated_at DESC, id LIMIT 5").fetchall()
    assert "sessions_by_update" in str(plan) and "TEMP B-TREE" not in str(plan)
    conn.close()
    with SqliteStore(path) as again:  # opening a migrated file changes nothing
        info = again.sessions.info("new")
        assert info is not None and info.title == "kept" and info.messages == 1
        assert texts(again.sessions.load("old")) == ["a", "b", "e"]


def test_list_reads_no_message_row_and_keeps_exact_times(store: SqliteStore,
                                                         db_path: Path) -> None:
    for i in range(5):
        store.sessions.save(f"s{i}", [user("x")] * (i + 1))
    store.sessions.set_metadata("only-meta", {"title": "t"})
    with raw(db_path) as conn:  # message rows gone: list and info count from the catalog
        conn.execute("UPDATE sessions SET updated_at = 1234.5678901234567 WHERE id = 's3'")
        conn.execute("DELETE FROM messages")
    infos = {i.id: i for i in store.sessions.list()}
    assert {k: i.messages for k, i in infos.items()} == {
        "s0": 1, "s1": 2, "s2": 3, "s3": 4, "s4": 5, "only-meta": 0}
    assert infos["s3"].updated_at == 1234.5678901234567
    assert [i.id for i in store.sessions.list(prefix="s", limit=10)][-1] == "s3"
    assert len(store.sessions.list(prefix="nope")) == 0
    assert len(store.sessions.list(prefix="s 3")) == 0  # no id can hold a space
    assert store.sessions.load("only-meta") is None
    assert store.sessions.revision("only-meta") is None


def test_replaced_history_keeps_its_order_and_leaves_no_rows(store: SqliteStore,
                                                             db_path: Path) -> None:
    store.sessions.save("s", [user("a"), user("b"), user("c")])
    store.sessions.compact("s", [user("sum1"), user("c")], replaced=[user("a"), user("b")])
    store.sessions.compact("s", [user("sum2")], replaced=[user("sum1"), user("c")])
    assert texts(store.sessions.history("s")) == ["a", "b", "sum1", "c"]
    assert texts(store.sessions.load("s")) == ["sum2"]
    store.sessions.save("s", [])
    assert store.sessions.history("s") == [] and store.sessions.info("s") is None
    with raw(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM history").fetchone()[0] == 0


@pytest.mark.parametrize("stored", [
    "{not json", "[1, 2]", "42", sqlite3.Binary(b"{\"t\": \"\xff\"}"),
])
def test_damaged_metadata_is_store_corrupt_naming_the_session(
    store: SqliteStore, db_path: Path, stored: object
) -> None:
    store.sessions.save("ok", [user("a")])
    store.sessions.save("bad", [user("secret words")])
    store.sessions.set_metadata("bad", {"title": "t"})
    with raw(db_path) as conn:
        conn.execute("UPDATE sessions SET metadata = ? WHERE id = 'bad'", (stored,))
    for call in (lambda: store.sessions.info("bad"), store.sessions.list):
        with pytest.raises(StoreCorruptError) as info:
            call()
        message = str(info.value)
        assert "'bad'" in message and str(db_path) in message and "metadata" in message
        assert info.value.session_id == "bad" and info.value.path == str(db_path)
        assert "not json" not in message and "secret" not in message
    assert store.sessions.info("ok") is not None
    assert texts(store.sessions.load("bad")) == ["secret words"]  # the transcript still reads


def test_damaged_history_is_store_corrupt_naming_the_session(store: SqliteStore,
                                                             db_path: Path) -> None:
    store.sessions.save("s", [user("a"), user("b")])
    store.sessions.compact("s", [user("sum")], replaced=[user("a"), user("b")])
    with raw(db_path) as conn:
        conn.execute("UPDATE history SET json = '{secret' WHERE id & 4294967295 = 1")
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.history("s")
    assert "'s'" in str(info.value) and "history message 1" in str(info.value)
    assert "secret" not in str(info.value) and info.value.session_id == "s"


def test_memory_store_is_private_and_works() -> None:
    with SqliteStore(":memory:") as a, SqliteStore(":memory:") as b:
        a.sessions.append("s1", [user("a")], expected_length=0)
        assert texts(a.sessions.load("s1")) == ["a"]
        assert b.sessions.load("s1") is None
        assert a.path == ":memory:"


def test_synchronous_setting_is_checked(db_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        SqliteStore(db_path, synchronous="off")  # type: ignore[arg-type]
    assert "'off'" in str(info.value) and "full" in str(info.value)
    assert not db_path.exists()


# --- real processes --------------------------------------------------------------------------

WORKER = r"""
import sys
from lousho_sync.errors import ApprovalAlreadyResolvedError, StoreConflictError
from lousho_sync.messages import Message
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores._lease import make_owner

path, mode, name = sys.argv[1], sys.argv[2], sys.argv[3]
store = SqliteStore(path)
if mode == "hold":
    ok = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=3600, wait_s=0)
    print("held" if ok else "refused", flush=True)
    sys.stdin.readline()  # until killed
    sys.exit(0)
print("ready", flush=True)
sys.stdin.readline()
if mode == "append":
    conflicts = 0
    for i in range(50):
        sid = "shared" if i % 2 == 0 else "own-" + name
        for _ in range(10000):
            length = len(store.sessions.load(sid) or [])
            try:
                store.sessions.append(
                    sid, [Message("user", f"{name}-{i}"), Message("assistant", "ok")],
                    expected_length=length,
                )
                break
            except StoreConflictError:
                conflicts += 1
        else:
            raise SystemExit("gave up")
    print("done", conflicts, flush=True)
elif mode == "resolve":
    try:
        store.approvals.resolve("a1", approved=True, reason=name)
        print("won", flush=True)
    except ApprovalAlreadyResolvedError:
        print("lost", flush=True)
store.close()
"""


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_four_processes_append_without_losing_turns(db_path: Path) -> None:
    SqliteStore(db_path).close()  # created and migrated once, like a deployment would
    names = ["p0", "p1", "p2", "p3"]
    results = run_together([_spawn(str(db_path), "append", n) for n in names])
    for stdout, stderr in results:
        assert stdout.startswith("done")
        assert "locked" not in stderr and "locked" not in stdout
    with SqliteStore(db_path) as s:
        shared = s.sessions.load("shared")
        assert shared is not None and len(shared) == 4 * 25 * 2
        users = [m.content for m in shared[0::2]]
        assert all(m.content == "ok" for m in shared[1::2])  # turns never interleave
        assert sorted(users) == sorted(f"{n}-{i}" for n in names for i in range(0, 50, 2))
        for n in names:
            own = s.sessions.load(f"own-{n}")
            assert texts(own)[0::2] == [f"{n}-{i}" for i in range(1, 50, 2)]


def test_eight_processes_resolve_one_approval_once(db_path: Path) -> None:
    with SqliteStore(db_path) as s:
        s.approvals.create(approval("a1"))
    results = run_together([_spawn(str(db_path), "resolve", f"w{i}") for i in range(8)])
    said = [stdout.strip() for stdout, _ in results]
    assert sorted(said) == ["lost"] * 7 + ["won"]
    with SqliteStore(db_path) as s:
        record = s.approvals.get("a1")
    assert record is not None and record.status == "approved"
    assert record.reason == f"w{said.index('won')}"


def test_lease_of_killed_process_is_taken_over_at_once(store: SqliteStore, db_path: Path) -> None:
    child = _spawn(str(db_path), "hold", "holder")
    try:
        assert read_line(child) == "held"
        me = make_owner()
        assert not store.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=TIMEOUT)
        assert store.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        assert not store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=TIMEOUT)


CRASH_WORKER = r"""
import os, sys
from lousho_sync import ScriptedProvider, create_agent, tool
from lousho_sync.providers.scripted import Step
from lousho_sync.sqlite import SqliteStore

path, mode = sys.argv[1], sys.argv[2]

@tool
def charge(amount: int) -> str:
    "Charge the card."
    if mode == "crash":
        os._exit(17)  # the process dies while the tool runs
    return f"charged {amount}"

store = SqliteStore(path)
if mode == "crash":
    provider = ScriptedProvider([Step(tool_calls=[("charge", {"amount": 5})]), "unused"])
else:
    provider = ScriptedProvider(["done"])
session = create_agent(provider=provider, tools=[charge], store=store).session(id="buyer")
if mode == "crash":
    session.send("buy it")
else:
    print(session.pending().status, flush=True)
    result = session.resume()
    print(result.text, flush=True)
"""


def test_turn_crashed_in_one_process_resumes_in_another(db_path: Path) -> None:
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CRASH_WORKER, str(db_path), mode],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    crashed = run("crash")
    assert crashed.returncode == 17, crashed.stderr
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split("\n")[:2] == ["interrupted", "done"]
    with SqliteStore(db_path) as s:
        messages = s.sessions.load("buyer")
        assert messages is not None
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[2].content == "charged 5"
        assert s.checkpoints.keys("") == []


# --- packaging, fork -------------------------------------------------------------------------


def test_package_root_does_not_import_sqlite3() -> None:
    code = "import sys, lousho_sync; print('sqlite3' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_open_from_forked_child_uses_its_own_connection(store: SqliteStore) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    store.sessions.save("s1", [user("parent")])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: use the inherited store, report, exit without cleanup
        code = 1
        try:
            store.sessions.append("s1", [user("child")], expected_length=1)
            code = 0
        finally:
            os.write(write, b"x")
            os._exit(code)
    os.close(write)
    ready, _, _ = select.select([read], [], [], TIMEOUT)
    os.close(read)
    assert ready
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert texts(store.sessions.load("s1")) == ["parent", "child"]
